"""The one normalisation pass every JSON schema goes through before a backend sees it.

It follows every `$ref` wherever its target lives (`#/resourceDefinitions/...` as well as
`#/$defs/...`) and hoists each target into `$defs` once, so a recursive schema stays recursive. It
merges `allOf` and the siblings of a `$ref` into one schema, pushes the siblings of an `anyOf` into
its branches, turns a `oneOf` whose branches cannot overlap into an `anyOf`, filters an `enum` by
its siblings, and puts each node's own keywords in the normal form of `schema_keywords`. What it
cannot rewrite exactly it refuses with a `SchemaRefusal` naming the keyword and its JSON pointer.

Every value the normalised schema accepts, the original accepts too (tests/
test_json_schema_properties.py checks it against jsonschema); `exact` says whether the converse holds
(it does not where a number range was narrowed to 16 digits, a type inferred, a search pattern
anchored)."""
from __future__ import annotations

import json
import logging
import re
import warnings
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from jsonschema import exceptions as jsonschema_errors
from jsonschema import validators

from radixserve.grammar.regex_rewrite import RegexRefused, parse as parse_regex
from radixserve.grammar.schema_keywords import LOCAL_KEYWORDS, Unsatisfiable, any_of, local
from radixserve.grammar.schema_merge import MAX_BRANCHES, merge, merge_all
from radixserve.grammar.schema_refs import RefProblem, SchemaDocument, escape
from radixserve.grammar.schema_support import SchemaRefusal, SchemaSupport

log = logging.getLogger("radixserve.grammar")

_DRAFTS = (("draft-03", 3), ("draft-04", 4), ("draft-06", 6), ("draft-07", 7), ("2019-09", 2019), ("2020-12", 2020))
_STRUCTURE = frozenset({"$ref", "allOf", "anyOf", "oneOf", "enum", "const"})
_CHILD_MAPS = ("properties", "patternProperties")
_CHILD_VALUES = ("additionalProperties", "items", "propertyNames")


@dataclass(frozen=True)
class Note:
    """One rewrite the pass made: `exact` False where it narrowed what is accepted."""
    keyword: str
    pointer: str
    action: str
    exact: bool


@dataclass(frozen=True)
class NormalisedSchema:
    schema: Any          # the normal form, with the hoisted `$defs`
    exact: bool          # accepts exactly what the original accepts
    notes: tuple[Note, ...]
    draft: int           # of the original: 4, 6, 7, 2019 or 2020


def draft_of(schema: Any) -> int:
    uri = schema.get("$schema", "") if isinstance(schema, Mapping) else ""
    return next((n for name, n in _DRAFTS if name in uri), 2020)


def validator_class(schema: Any):
    """jsonschema's validator for the schema's own draft (2020-12 when it names none it knows)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # an unknown $schema URI
        return validators.validator_for(schema, default=validators.Draft202012Validator)


def normalise_json_schema(schema: Any, support: SchemaSupport, where: str = "json_schema") -> NormalisedSchema:
    """The normal form of `schema` for `support.backend`, or SchemaRefusal."""
    cls = validator_class(schema)
    try:
        cls.check_schema(schema)
    except jsonschema_errors.SchemaError as e:
        pointer = "".join(f"/{escape(str(p))}" for p in e.absolute_path)
        # `keyword` is the metaschema's that caught it; the invalid value itself is at `pointer`
        raise SchemaRefusal(str(e.validator), pointer, f"invalid schema: {e.message}", where,
                            location=pointer) from None
    return _Normaliser(schema, cls, support, where).run()


class _Normaliser:
    def __init__(self, root: Any, cls, support: SchemaSupport, where: str):
        self.root, self.cls, self.support, self.where = root, cls, support, where
        self.draft = draft_of(root)
        # drafts 4 to 7 ignore every keyword beside a `$ref`; only a schema that names one of them
        # gets that reading (with no `$schema`, 2020-12's merge)
        self.ref_alone = isinstance(root, Mapping) and "$schema" in root and self.draft <= 7
        self.defs: dict[str, Optional[dict]] = {}  # name -> normal form (None while being built)
        self.names: dict[str, str] = {}            # pointer of a $ref target -> its name in $defs
        self.locations: dict[str, str] = {}        # and back
        self.inlining: list[str] = []
        self.notes: list[Note] = []
        self.document = SchemaDocument(root)
        self._root_validator = None

    def run(self) -> NormalisedSchema:
        try:
            top = self.node(self.root, "")
        except Unsatisfiable as e:
            raise SchemaRefusal(e.keyword, e.pointer, f"the schema is unsatisfiable: {e.reason}", self.where) from None
        if top is False:
            raise SchemaRefusal("false", "", "the schema is false: no value satisfies it", self.where, location="")
        out = dict(top)
        defs = self.reachable(out)
        if defs:
            out["$defs"] = defs
        self.support.check(out)
        for n in self.notes:
            log.debug("json_schema %s at %s: %s", n.keyword, n.pointer or "/", n.action)
        return NormalisedSchema(out, all(n.exact for n in self.notes), tuple(self.notes), self.draft)

    def reachable(self, top: Any) -> dict:
        """The hoisted definitions that `top` uses (some were hoisted only to be merged inline)."""
        used: dict[str, Any] = {}
        stack = [top]
        while stack:
            node = stack.pop()
            if isinstance(node, dict):
                ref = node.get("$ref")
                if isinstance(ref, str) and ref.startswith("#/$defs/"):
                    name = ref[len("#/$defs/"):]
                    if name not in used:
                        used[name] = self.defs[name]
                        stack.append(used[name])
                stack.extend(v for k, v in node.items() if k not in ("enum", "const"))
            elif isinstance(node, list):
                stack.extend(node)
        return {name: self.defs[name] for name in self.defs if name in used}

    # ---- the Context that schema_keywords and schema_merge use -----------------------------
    def refuse(self, keyword: str, pointer: str, reason: str):
        raise SchemaRefusal(keyword, pointer, reason, self.where)

    def note(self, keyword: str, pointer: str, action: str, exact: bool) -> None:
        self.notes.append(Note(keyword, pointer or "/", action, exact))

    def merge(self, a: Any, b: Any, pointer: str) -> Any:
        return merge(a, b, pointer, self)

    def inline(self, node: Any) -> Any:
        """A `$ref` node replaced by its target's normal form (one level: refs inside it stay)."""
        seen = 0
        while isinstance(node, dict) and "$ref" in node and seen < 32:
            node = self.body(self.locations[node["$ref"].rsplit("/", 1)[1]])
            seen += 1
        return node

    def is_valid(self, value: Any, node: Any, pointer: str) -> bool:
        done = {k: v for k, v in self.defs.items() if v is not None}
        try:
            return validators.Draft202012Validator({**node, "$defs": done}).is_valid(value)
        except Exception:  # a reference into a definition still being built
            return self.refuse("enum", pointer, "enum values cannot be checked against a recursive schema")

    # ---- nodes -----------------------------------------------------------------------------
    def node(self, raw: Any, pointer: str, within: Any = None) -> Any:
        """The normal form of the subschema `raw` found at `pointer` (False for `false`).
        `within`: the type of the schema whose allOf / anyOf / oneOf holds it, which a subschema
        without its own type takes on (exactly: it is merged with that schema)."""
        if raw is True:
            return {}
        if raw is False:
            return False
        if "$ref" in raw and self.ref_alone:
            if len(raw) > 1:
                self.note("$ref", pointer, "sibling keywords of $ref ignored, as this draft says", True)
            return self.reference(raw["$ref"], pointer)
        raw = self.upgrade(raw, pointer)
        if "enum" in raw or "const" in raw:
            return self.enum(raw, pointer)
        dependencies = self.pop_dependencies(raw)
        for kw in raw:
            if kw in self.support.unenforced_keywords:
                self.refuse(kw, pointer, f"unsupported keyword '{kw}' ({self.support.backend} cannot enforce it)")
        own = {k: v for k, v in raw.items() if k in LOCAL_KEYWORDS}
        if within is not None and own and "type" not in own:
            own["type"] = within
        inner = raw.get("type", within)
        if "$ref" in raw and not own and not (set(raw) & {"allOf", "anyOf", "oneOf"}):
            return self.reference(raw["$ref"], pointer)
        parts = [local(self.children(own, pointer), pointer, self)] if own else []
        if "$ref" in raw:
            target = self.body(self.locate(raw["$ref"], pointer))
            try:
                parts = [merge_all(parts + [target], pointer, self)]
            except Unsatisfiable:   # never refused for a sibling alone: older drafts ignore them
                self.note("$ref", pointer, "sibling keywords of $ref dropped: with them nothing satisfies the "
                          "schema (drafts before 2019-09 ignore them)", False)
                parts = [target]
        parts += [self.node(sub, f"{pointer}/allOf/{i}", inner) for i, sub in enumerate(raw.get("allOf", []))]
        result = merge_all(parts, pointer, self)
        for kw in ("oneOf", "anyOf"):
            if kw in raw:
                branches = [self.node(sub, f"{pointer}/{kw}/{i}", inner) for i, sub in enumerate(raw[kw])]
                if kw == "oneOf":
                    exclusive = self.exclusive_keys(result, raw[kw], pointer)
                    if exclusive is not None:
                        result = exclusive
                        continue
                merged = []
                for branch in branches:
                    try:
                        merged.append(merge(result, branch, f"{pointer}/{kw}", self))
                    except Unsatisfiable:
                        pass
                if kw == "oneOf":   # the branches as the value meets them: with the parent's keywords
                    self.check_one_of(merged, pointer)
                result = any_of(merged, f"{pointer}/{kw}")
        for dependency in dependencies:
            result = self.depend(result, *dependency, pointer)
        return result

    # ---- dependencies ----------------------------------------------------------------------
    @staticmethod
    def pop_dependencies(raw: dict) -> list[tuple[str, str, Any]]:
        """Take dependentRequired / dependentSchemas / dependencies (draft 4-7: either form) out of
        `raw`: (keyword, trigger property, required names or subschema)."""
        found = []
        for kw in ("dependentRequired", "dependentSchemas", "dependencies"):
            if kw in raw:   # `dependencies` is draft 4-7's; read in any draft, it asks no more than it says
                for key, need in raw.pop(kw).items():
                    found.append((kw, key, need))
        return found

    def depend(self, node: Any, kw: str, key: str, need: Any, pointer: str) -> Any:
        """If `key` is present, `need` (names that must be present too, or a subschema) holds:
        anyOf [key absent, key present and `need`], on each branch of an object's anyOf. Absent is
        left out of the properties of an object closed to undeclared ones (the backends cannot
        forbid one property of an open object)."""
        entry = f"{pointer}/{kw}/{escape(key)}"
        node = self.inline(node)
        branches = node["anyOf"] if isinstance(node, dict) and set(node) == {"anyOf"} else [node]
        if 2 * len(branches) > MAX_BRANCHES:
            return self.refuse(kw, pointer, f"'{kw}' here needs {2 * len(branches)} alternatives (at most {MAX_BRANCHES})")
        present = ({"type": "object", "required": [key, *need]} if isinstance(need, list)
                   else merge({"type": "object", "required": [key]}, self.node(need, entry, "object"), entry, self))
        out, closed = [], True
        for branch in branches:
            branch = self.inline(branch)
            if branch is False:
                continue
            if (not isinstance(branch, dict) or branch.get("type") != "object" or branch.get("patternProperties")
                    or branch.get("additionalProperties", False) is not False):
                return self.refuse(kw, pointer, f"'{kw}' is enforced only on objects of type object whose other "
                                                f"properties are not allowed (additionalProperties: false)")
            closed = closed and branch.get("additionalProperties") is False
            if key not in branch.get("required", []):
                out.append({**branch, "additionalProperties": False,
                            "properties": {n: v for n, v in branch.get("properties", {}).items() if n != key}})
            try:
                out.append(merge(branch, present, entry, self))
            except Unsatisfiable:
                pass
        # exact where the object was closed and the keyword is the draft's; otherwise narrower than
        # the schema (no undeclared properties, which strict generation never writes anyway)
        exact = closed and (self.draft <= 7) == (kw == "dependencies")
        self.note(kw, entry, f"rewritten as anyOf over the presence of {key!r}", exact)
        return any_of(out, pointer)

    def upgrade(self, raw: Mapping[str, Any], pointer: str) -> dict:
        """Older drafts' spellings in 2020-12's; keywords that assert nothing here dropped."""
        raw = dict(raw)
        if self.draft <= 4:
            for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
                if isinstance(raw.get(exclusive), bool):
                    if raw.pop(exclusive) and bound in raw:
                        raw[exclusive] = raw.pop(bound)
        if "divisibleBy" in raw and self.draft <= 3:
            raw["multipleOf"] = raw.pop("divisibleBy")
        if self.draft <= 2019 and isinstance(raw.get("items"), list):
            raw["prefixItems"] = raw.pop("items")
            if "additionalItems" in raw:
                raw["items"] = raw.pop("additionalItems")
        raw.pop("additionalItems", None)  # without a list of items it applies to nothing
        if raw.get("uniqueItems") is False:
            del raw["uniqueItems"]
        applicators = set(raw) & {"$ref", "allOf", "anyOf", "oneOf", "if", "not", "dependentSchemas"}
        for kw, plain in (("unevaluatedProperties", "additionalProperties"), ("unevaluatedItems", "items")):
            # with nothing else evaluating, "unevaluated" is "additional"
            if kw in raw and not applicators:
                value = raw.pop(kw)
                raw.setdefault(plain, value)
        return raw

    def children(self, own: dict, pointer: str) -> dict:
        out = dict(own)
        for kw in _CHILD_MAPS:
            if kw in own:
                if kw == "patternProperties":
                    for key in own[kw]:
                        self.check_key_pattern(key, f"{pointer}/{kw}")
                out[kw] = {name: self.node(sub, f"{pointer}/{kw}/{escape(name)}") for name, sub in own[kw].items()}
        for kw in _CHILD_VALUES:
            if kw in own:
                out[kw] = self.node(own[kw], f"{pointer}/{kw}")
        if "prefixItems" in own:
            out["prefixItems"] = [self.node(sub, f"{pointer}/prefixItems/{i}") for i, sub in enumerate(own["prefixItems"])]
        return out

    def check_key_pattern(self, pattern: str, pointer: str) -> None:
        try:
            parse_regex(pattern)
        except RegexRefused as e:
            self.refuse("patternProperties", pointer, f"pattern {pattern!r}: {e}")

    def enum(self, raw: dict, pointer: str) -> Any:
        values = raw["enum"] if "enum" in raw else [raw["const"]]
        if "const" in raw and "enum" in raw:
            values = [raw["const"]] if raw["const"] in raw["enum"] else []
        rest = {k: v for k, v in raw.items() if k not in ("enum", "const")}
        if rest:  # the values the other keywords let through: exact, whatever those keywords are
            check = self.root_validator().evolve(schema=rest)
            try:
                values = [v for v in values if check.is_valid(v)]
            except Exception as e:  # an unresolvable reference
                self.refuse("enum", pointer, f"enum values cannot be checked against their siblings: {e}")
        if not values:
            raise Unsatisfiable("enum", pointer, "no enum value satisfies the other keywords")
        return {"const": values[0]} if len(values) == 1 else {"enum": list(values)}

    def root_validator(self):
        if self._root_validator is None:
            self._root_validator = self.cls(self.root)
        return self._root_validator

    # ---- oneOf -----------------------------------------------------------------------------
    def check_one_of(self, branches: list, pointer: str) -> None:
        """oneOf is enforced as anyOf, the same only where no value can match two branches: every
        pair must be disjoint by type, by const / enum values, by a required property whose values
        differ, or by a property one requires and the other forbids."""
        resolved = [self.inline(b) for b in branches]
        for i in range(len(resolved)):
            for j in range(i + 1, len(resolved)):
                if not self.disjoint(resolved[i], resolved[j]):
                    self.refuse("oneOf", pointer, f"'oneOf' whose branches may overlap (enforced as anyOf, an output "
                                                  f"could match two branches: {i} and {j}); use anyOf, or give each "
                                                  f"branch a distinct type or const tag")

    def disjoint(self, a: Any, b: Any) -> bool:
        """Whether no value satisfies both normal-form schemas (False where it cannot tell)."""
        if a is False or b is False:
            return True
        ta, tb = self.json_types(a), self.json_types(b)
        if ta is not None and tb is not None and not (ta & tb):
            return True
        va, vb = _values(a), _values(b)
        if va is not None and vb is not None and not (va & vb):
            return True
        if not (isinstance(a, dict) and isinstance(b, dict) and a.get("type") == b.get("type") == "object"):
            return False
        for x, y in ((a, b), (b, a)):
            for name in x.get("required", []):
                if _forbids(y, name):
                    return True
                if name in y.get("required", []) and self.disjoint(
                        self.inline(x.get("properties", {}).get(name, {})),
                        self.inline(y.get("properties", {}).get(name, {}))):
                    return True
        return False

    def exclusive_keys(self, parent: Any, raw_branches: list, pointer: str) -> Optional[Any]:
        """`oneOf: [{required: [a]}, {required: [b]}]` on a closed object: exactly one of the
        keys. Exact as an anyOf whose branch for `a` leaves `b` out of the properties, which the
        closed object then forbids. None where that shape is not there."""
        keys = []
        for raw in raw_branches:
            required = raw.get("required") if isinstance(raw, Mapping) else None
            if (not isinstance(required, list) or len(required) != 1
                    or set(raw) - {"required", "title", "description", "$comment"}):
                return None
            keys.append(required[0])
        parent = self.inline(parent)
        if (len(set(keys)) != len(keys) or not isinstance(parent, dict) or parent.get("type") != "object"
                or parent.get("additionalProperties") is not False or parent.get("patternProperties")):
            return None
        branches = []
        for key in keys:
            props = {n: v for n, v in parent.get("properties", {}).items() if n == key or n not in keys}
            try:
                branches.append(merge({**parent, "properties": props}, {"type": "object", "required": [key]}, pointer, self))
            except Unsatisfiable:
                pass
        return any_of(branches, f"{pointer}/oneOf")

    def json_types(self, node: Any, depth: int = 0) -> Optional[frozenset]:
        """The JSON types a normal-form node admits ("integer" as "number"); None when any."""
        node = self.inline(node)
        if node is False:
            return frozenset()
        if node == {} or depth > 8:
            return None
        if "const" in node or "enum" in node:
            values = node.get("enum", [node.get("const")])
            return frozenset(_json_type(v) for v in values)
        if "anyOf" in node:
            parts = [self.json_types(b, depth + 1) for b in node["anyOf"]]
            return None if None in parts else frozenset().union(*parts)
        kinds = node.get("type")
        if kinds is None:
            return None
        return frozenset("number" if t == "integer" else t for t in (kinds if isinstance(kinds, list) else [kinds]))

    # ---- references ------------------------------------------------------------------------
    def locate(self, ref: str, pointer: str) -> str:
        try:
            return self.document.locate(ref)
        except RefProblem as e:
            return self.refuse("$ref", pointer, str(e))

    def resolve(self, location: str) -> Any:
        return self.document.resolve(location)

    def reference(self, ref: str, pointer: str) -> dict:
        """A `$ref` alone: its target normalised once into `$defs`, referred to by name."""
        location = self.locate(ref, pointer)
        name = self.names.get(location)
        if name is None:
            name = self.unique_name(location)
            self.names[location], self.locations[name] = name, location
            self.defs[name] = None
            target = self.node(self.resolve(location), location)
            if target is False:
                self.refuse("$ref", pointer, f"'$ref' {ref!r} names a false schema: nothing satisfies it")
            if target == {"$ref": f"#/$defs/{name}"}:
                self.refuse("$ref", pointer, f"'$ref' {ref!r} refers to itself and to nothing else")
            self.defs[name] = target
        return {"$ref": f"#/$defs/{name}"}

    def body(self, location: str) -> Any:
        """The target at `location` normalised where it is used, to be merged with siblings;
        a target that needs itself expanded to be merged is refused."""
        if location in self.inlining:
            self.refuse("$ref", location, "a recursive reference merged with sibling keywords would need "
                                          "itself expanded without end")
        self.inlining.append(location)
        try:
            return self.inline(self.node(self.resolve(location), location))
        finally:
            self.inlining.pop()

    def unique_name(self, location: str) -> str:
        last = location.rsplit("/", 1)[-1].replace("~1", "/").replace("~0", "~") or "root"
        base = re.sub(r"[^A-Za-z0-9_]", "_", last)[:48] or "def"
        name, i = base, 1
        while name in self.locations:
            i += 1
            name = f"{base}_{i}"
        return name


def _values(node: Any) -> Optional[frozenset]:
    """The values a const / enum node admits, as JSON compares them (1 == 1.0, true != 1); None
    for any other node."""
    if not isinstance(node, dict) or not ("const" in node or "enum" in node):
        return None
    return frozenset(_json_key(v) for v in node.get("enum", [node.get("const")]))


def _json_key(value: Any) -> tuple:
    kind = _json_type(value)
    if kind == "number":
        return kind, float(value)   # two distinct huge integers may share a float: then "not disjoint"
    return kind, json.dumps(value, sort_keys=True)


def _forbids(node: dict, name: str) -> bool:
    """Whether the object schema `node` admits no property `name`."""
    props = node.get("properties", {})
    if name in props:
        return props[name] is False
    return node.get("additionalProperties") is False and not node.get("patternProperties")


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"
