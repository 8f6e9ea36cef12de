"""What a request asks its output to follow: a `GrammarSpec` (kind + payload) with a canonical
cache key, and `GrammarError`, the one error every invalid or unenforceable spec raises."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence, Union, get_args

GrammarKind = Literal["json_schema", "json_object", "regex", "ebnf", "choice", "structural_tag"]
GRAMMAR_KINDS: frozenset[str] = frozenset(get_args(GrammarKind))


class GrammarError(ValueError):
    """A spec that is invalid or that the selected backend cannot enforce. The message starts with
    the spec kind and names the problem (the API returns it as HTTP 400 before any token)."""


def canonical_json(value: Any) -> str:
    """One text per JSON value whatever its key order or spacing: the cache key of dict payloads."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class StructuralTag:
    """One tagged region: after `begin` the body must match `schema`, then `end` closes it."""
    begin: str
    schema: Union[Mapping[str, Any], bool]
    end: str


@dataclass(frozen=True)
class StructuralTagSpec:
    """Free text until one of `triggers` appears; each trigger starts (is a prefix of) the `begin`
    of at least one tag, whose body is then schema-constrained up to its `end` (xgrammar's
    "triggered tags" format). `at_least_one` forbids a reply without a tag (tool_choice=required);
    `stop_after_first` ends the output after the first tag."""
    tags: tuple[StructuralTag, ...]
    triggers: tuple[str, ...]
    at_least_one: bool = False
    stop_after_first: bool = False

    @classmethod
    def from_dict(cls, payload: Mapping[str, Any]) -> "StructuralTagSpec":
        if not isinstance(payload, Mapping):
            raise GrammarError("structural_tag: payload must be an object with 'tags' and 'triggers'")
        unknown = set(payload) - {"tags", "triggers", "at_least_one", "stop_after_first"}
        if unknown:
            raise GrammarError(f"structural_tag: unknown field {sorted(unknown)[0]!r}")
        raw_tags, triggers = payload.get("tags"), payload.get("triggers")
        if not isinstance(raw_tags, Sequence) or isinstance(raw_tags, str) or not raw_tags:
            raise GrammarError("structural_tag: 'tags' must be a non-empty list")
        if (not isinstance(triggers, Sequence) or isinstance(triggers, str) or not triggers
                or not all(isinstance(t, str) and t for t in triggers)):
            raise GrammarError("structural_tag: 'triggers' must be a non-empty list of non-empty strings")
        tags = []
        for i, tag in enumerate(raw_tags):
            if not isinstance(tag, Mapping) or set(tag) - {"begin", "schema", "end"}:
                raise GrammarError(f"structural_tag: tags[{i}] must be an object with begin, schema, end")
            begin, schema, end = tag.get("begin"), tag.get("schema"), tag.get("end")
            if not isinstance(begin, str) or not begin or not isinstance(end, str):
                raise GrammarError(f"structural_tag: tags[{i}] needs a non-empty string 'begin' and a string 'end'")
            if isinstance(schema, str):
                schema = _parse_json(schema, f"structural_tag: tags[{i}].schema")
            if not isinstance(schema, (Mapping, bool)):
                raise GrammarError(f"structural_tag: tags[{i}].schema must be a JSON schema object")
            if not any(begin.startswith(t) for t in triggers):
                raise GrammarError(f"structural_tag: tags[{i}].begin {begin!r} starts with none of the triggers")
            tags.append(StructuralTag(begin, schema, end))
        return cls(tuple(tags), tuple(triggers), bool(payload.get("at_least_one", False)),
                   bool(payload.get("stop_after_first", False)))

    def to_dict(self) -> dict[str, Any]:
        return {"tags": [{"begin": t.begin, "schema": t.schema, "end": t.end} for t in self.tags],
                "triggers": list(self.triggers), "at_least_one": self.at_least_one,
                "stop_after_first": self.stop_after_first}


@dataclass(frozen=True, eq=False)
class GrammarSpec:
    """A constraint on one request's output. Build it with the class methods; `payload` is
    normalised (JSON text parsed, lists made tuples) and `key` is (kind, canonical text)."""
    kind: GrammarKind
    payload: Any = None
    key: tuple[str, str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in GRAMMAR_KINDS:
            raise GrammarError(f"unknown grammar kind {self.kind!r} (known: {', '.join(sorted(GRAMMAR_KINDS))})")
        payload = _normalise(self.kind, self.payload)
        object.__setattr__(self, "payload", payload)
        object.__setattr__(self, "key", (self.kind, _canonical_text(self.kind, payload)))

    # Equality and hashing go through the canonical key: the same schema with its keys in another
    # order is the same grammar (and the same cache entry).
    def __eq__(self, other: object) -> bool:
        return isinstance(other, GrammarSpec) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    @classmethod
    def json_schema(cls, schema: Union[str, Mapping[str, Any], bool]) -> "GrammarSpec":
        return cls("json_schema", schema)

    @classmethod
    def json_object(cls) -> "GrammarSpec":
        return cls("json_object")

    @classmethod
    def regex(cls, pattern: str) -> "GrammarSpec":
        return cls("regex", pattern)

    @classmethod
    def ebnf(cls, grammar: str) -> "GrammarSpec":
        return cls("ebnf", grammar)

    @classmethod
    def choice(cls, options: Sequence[str]) -> "GrammarSpec":
        return cls("choice", options)

    @classmethod
    def structural_tag(cls, payload: Union[Mapping[str, Any], StructuralTagSpec]) -> "GrammarSpec":
        return cls("structural_tag", payload)


def _parse_json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise GrammarError(f"{where}: not valid JSON: {e}") from None


def _normalise(kind: str, payload: Any) -> Any:
    if kind == "json_schema":
        if isinstance(payload, str):
            payload = _parse_json(payload, "json_schema")
        if not isinstance(payload, (Mapping, bool)):
            raise GrammarError("json_schema: the schema must be a JSON object (or boolean)")
        return payload
    if kind == "json_object":
        if payload is not None:
            raise GrammarError("json_object: takes no payload (use json_schema for a schema)")
        return None
    if kind in ("regex", "ebnf"):
        if not isinstance(payload, str) or not payload.strip():
            raise GrammarError(f"{kind}: must be a non-empty string")
        return payload
    if kind == "choice":
        if (isinstance(payload, (str, bytes)) or not isinstance(payload, Sequence) or not payload
                or not all(isinstance(o, str) for o in payload)):
            raise GrammarError("choice: must be a non-empty list of strings")
        return tuple(payload)
    # structural_tag
    return payload if isinstance(payload, StructuralTagSpec) else StructuralTagSpec.from_dict(payload)


def _canonical_text(kind: str, payload: Any) -> str:
    if kind in ("regex", "ebnf"):
        return payload
    if kind == "json_object":
        return ""
    if kind == "structural_tag":
        return canonical_json(payload.to_dict())
    return canonical_json(list(payload) if kind == "choice" else payload)

