"""What each backend enforces of JSON Schema, and the refusal every unenforceable schema raises.

Found by compiling one schema per keyword (and per pair of keywords) and trying a violating and a
valid string: tests/test_grammar_backends.py and tests/test_json_schema_normalise.py keep the
refused ones honest. What both backends drop is rewritten by the normaliser instead (`anyOf` next
to other keywords, `pattern` next to lengths, `enum` next to anything, the dependency keywords on
closed objects), so it is not listed here."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from radixserve.grammar.number_bounds import OUTLINES_DIGIT_KEYWORDS
from radixserve.grammar.schema_refs import escape
from radixserve.grammar.spec import GrammarError

# Assertions that neither backend turns into grammar rules.
UNENFORCED_BY_ALL = frozenset({
    "not", "if", "then", "else", "uniqueItems", "contains", "minContains", "maxContains", "$dynamicRef", "$recursiveRef",
    "unevaluatedProperties", "unevaluatedItems",
})


class SchemaRefusal(GrammarError):
    """A schema that cannot be enforced exactly. `keyword` and `pointer` (a JSON pointer into the
    schema as the request sent it, to the subschema holding the keyword) say where; the message
    repeats them for people. `location` points at the refused keyword itself."""

    def __init__(self, keyword: str, pointer: str, reason: str, where: str = "json_schema",
                 location: Optional[str] = None):
        self.keyword = keyword
        self.pointer = pointer or "/"
        self.reason = reason
        self.location = location if location is not None else f"{self.pointer.rstrip('/')}/{escape(keyword)}"
        super().__init__(f"{where}: {reason} at {self.pointer}")


@dataclass(frozen=True)
class SchemaSupport:
    """What one backend enforces of JSON Schema."""
    backend: str
    unenforced_keywords: frozenset[str]
    enforced_formats: frozenset[str]
    # minimum / maximum are enforced (then one-sided ranges get a far side, so digits stay bounded)
    enforces_ranges: bool
    multiple_of_integers_only: bool = True
    # prefixItems: the backend generates exactly the prefix (then minItems beyond it is refused)
    prefix_items_only: bool = False
    # digits of unranged numbers bounded by these keywords (type -> keywords) in the normal form
    digit_keywords: Optional[Mapping[str, Mapping[str, int]]] = None
    # integer multipleOf is kept beside a range only this wide (a wider or one-sided range makes
    # the backend drop the multipleOf); None: no such limit
    multiple_of_max_span: Optional[int] = None

    def check(self, schema: Any, pointer: str = "") -> None:
        """Raise SchemaRefusal for a normalised `schema` that uses what this backend would drop.
        A safety net: the normaliser refuses these where they stand in the original schema, so
        a pointer from here (into the normal form) means a normaliser bug."""
        if not isinstance(schema, Mapping):
            return
        for kw in schema:
            if kw in self.unenforced_keywords:
                raise SchemaRefusal(kw, pointer, f"unsupported keyword '{kw}' ({self.backend} cannot enforce it)")
        for kw, value in schema.items():
            if kw in ("properties", "patternProperties", "$defs"):
                for name, sub in value.items():
                    self.check(sub, f"{pointer}/{kw}/{name.replace('~', '~0').replace('/', '~1')}")
            elif kw in ("anyOf", "prefixItems"):
                for i, sub in enumerate(value):
                    self.check(sub, f"{pointer}/{kw}/{i}")
            elif kw in ("items", "additionalProperties", "propertyNames"):
                self.check(value, f"{pointer}/{kw}")


XGRAMMAR_SUPPORT = SchemaSupport(
    backend="xgrammar",
    unenforced_keywords=UNENFORCED_BY_ALL,
    enforced_formats=frozenset({
        "date", "time", "date-time", "duration", "email", "hostname", "ipv4", "ipv6", "uri",
        "uri-reference", "uri-template", "json-pointer", "relative-json-pointer", "uuid",
    }),
    enforces_ranges=True,
    multiple_of_integers_only=True,  # it warns and drops multipleOf on numbers
    multiple_of_max_span=5000,       # "range + multipleOf combination not yet supported" past ~5000-10000
)

# Its schema-to-regex drops number bounds, multipleOf, the property-count and property-name rules
# and items after prefixItems; it turns the formats below into regexes (others raise).
OUTLINES_SUPPORT = SchemaSupport(
    backend="outlines-core",
    unenforced_keywords=UNENFORCED_BY_ALL | {
        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
        "patternProperties", "propertyNames", "maxProperties", "minProperties",
    },
    enforced_formats=frozenset({"date", "time", "date-time", "email", "uri", "uuid"}),
    enforces_ranges=False,
    multiple_of_integers_only=False,  # refused outright above
    prefix_items_only=True,
    digit_keywords=OUTLINES_DIGIT_KEYWORDS,
)
