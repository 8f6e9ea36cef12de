"""JSON-schema checks run before compiling: the schema must be valid against its metaschema, and
must not use a keyword the backend would silently drop. A dropped keyword means output that the
schema rejects, so it is refused by name instead (`SchemaSupport` lists what a backend enforces)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional

from jsonschema import exceptions as jsonschema_errors
from jsonschema import validators

from radixserve.grammar.regex_check import check_regex
from radixserve.grammar.spec import GrammarError

# Keywords that assert nothing: always fine, also next to "$ref".
ANNOTATION_KEYWORDS = frozenset({
    "title", "description", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly",
    "$schema", "$id", "$anchor", "$defs", "definitions", "$vocabulary", "contentEncoding",
    "contentMediaType", "contentSchema",
})

# Keywords whose values are subschemas, by shape.
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_VALUES = ("additionalProperties", "items", "contains", "not", "if", "then", "else", "propertyNames",
                  "unevaluatedProperties", "unevaluatedItems", "additionalItems")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")

# Assertions that neither backend turns into grammar rules (checked against what each accepts).
UNENFORCED_BY_ALL = frozenset({
    "not", "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies",
    "uniqueItems", "contains", "minContains", "maxContains", "$dynamicRef", "$recursiveRef",
})


@dataclass(frozen=True)
class SchemaSupport:
    """What one backend enforces of JSON Schema."""
    backend: str
    unenforced_keywords: frozenset[str]
    enforced_formats: frozenset[str]
    multiple_of_integers_only: bool = True


def check_json_schema(schema: Any, support: SchemaSupport, where: str = "json_schema") -> None:
    """Raise GrammarError naming the first problem: invalid against the metaschema, or a keyword,
    format, pattern or combination `support.backend` cannot enforce."""
    _check_metaschema(schema, where)
    if isinstance(schema, Mapping):
        _SchemaWalker(schema, support, where).walk(schema, "")


def _check_metaschema(schema: Any, where: str) -> None:
    cls = validators.validator_for(schema, default=validators.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema_errors.SchemaError as e:
        raise GrammarError(f"{where}: invalid schema: {e.message} at {_pointer(e.absolute_path)}") from None


def _pointer(parts) -> str:
    text = "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)
    return text or "/"


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


class _SchemaWalker:
    def __init__(self, root: Mapping[str, Any], support: SchemaSupport, where: str):
        self.root = root
        self.support = support
        self.where = where

    def fail(self, path: str, problem: str) -> GrammarError:
        return GrammarError(f"{self.where}: {problem} at {path or '/'}")

    def walk(self, schema: Any, path: str) -> None:
        if not isinstance(schema, Mapping):
            return  # true / false
        self.check_keywords(schema, path)
        for sub, sub_path in self.subschemas(schema, path):
            self.walk(sub, sub_path)

    def subschemas(self, schema: Mapping[str, Any], path: str) -> Iterator[tuple[Any, str]]:
        for kw in _SCHEMA_MAPS:
            if isinstance(schema.get(kw), Mapping):
                for name, sub in schema[kw].items():
                    yield sub, f"{path}/{kw}/{_pointer([name])[1:]}"
        for kw in _SCHEMA_VALUES:
            if isinstance(schema.get(kw), (Mapping, bool)):
                yield schema[kw], f"{path}/{kw}"
        for kw in _SCHEMA_LISTS:
            if isinstance(schema.get(kw), list):
                for i, sub in enumerate(schema[kw]):
                    yield sub, f"{path}/{kw}/{i}"

    def check_keywords(self, schema: Mapping[str, Any], path: str) -> None:
        backend = self.support.backend
        for kw, value in schema.items():
            if kw in self.support.unenforced_keywords and not (kw == "uniqueItems" and value is False):
                raise self.fail(path, f"unsupported keyword '{kw}' ({backend} cannot enforce it)")
        if "$ref" in schema:
            ref = schema["$ref"]
            if not ref.startswith("#"):
                raise self.fail(path, f"'$ref' {ref!r} is not a reference inside this schema")
            siblings = sorted(set(schema) - ANNOTATION_KEYWORDS - {"$ref"})
            if siblings:
                raise self.fail(path, f"'$ref' with sibling keyword '{siblings[0]}' ({backend} ignores "
                                      "siblings of $ref; wrap them in allOf with one entry each)")
        if isinstance(schema.get("required"), list):
            declared = schema.get("properties") or {}
            missing = [name for name in schema["required"] if name not in declared]
            if missing:
                raise self.fail(path, f"required property '{missing[0]}' is not declared in 'properties'")
        if isinstance(schema.get("allOf"), list) and len(schema["allOf"]) > 1:
            raise self.fail(path, f"'allOf' with more than one subschema ({backend} cannot enforce it)")
        if isinstance(schema.get("oneOf"), list) and len(schema["oneOf"]) > 1:
            self.check_one_of(schema["oneOf"], path)
        if "multipleOf" in schema and self.support.multiple_of_integers_only and schema.get("type") != "integer":
            raise self.fail(path, f"'multipleOf' on a non-integer type ({backend} enforces it on integers only)")
        fmt = schema.get("format")
        if isinstance(fmt, str) and fmt not in self.support.enforced_formats:
            raise self.fail(path, f"format '{fmt}' is not enforced by {backend} "
                                  f"(enforced: {', '.join(sorted(self.support.enforced_formats))})")
        if isinstance(schema.get("pattern"), str):
            check_regex(schema["pattern"], where=f"{self.where}: pattern at {path or '/'}")
        for name in schema.get("patternProperties") or {}:
            check_regex(name, where=f"{self.where}: patternProperties key at {path or '/'}")

    # ---- oneOf: backends enforce it as anyOf, which is only the same when branches cannot overlap
    def check_one_of(self, branches: list, path: str) -> None:
        types = [self.json_types(b) for b in branches]
        if all(t is not None for t in types) and all(
                not (types[i] & types[j]) for i in range(len(types)) for j in range(i + 1, len(types))):
            return
        if self.discriminated(branches):
            return
        raise self.fail(path, "'oneOf' whose branches may overlap (enforced as anyOf, an output could "
                              "match two branches); use anyOf, or give each branch a distinct type or const tag")

    def resolve(self, schema: Any, depth: int = 0) -> Any:
        while isinstance(schema, Mapping) and isinstance(schema.get("$ref"), str) and depth < 16:
            schema = self.lookup(schema["$ref"])
            depth += 1
        return schema

    def lookup(self, ref: str) -> Any:
        if not ref.startswith("#"):
            return None
        node: Any = self.root
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, Mapping) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return None
        return node

    def json_types(self, schema: Any, depth: int = 0) -> Optional[frozenset[str]]:
        """The JSON types a schema admits ("integer" counted as "number"), None when unknown."""
        schema = self.resolve(schema)
        if schema is False:
            return frozenset()
        if not isinstance(schema, Mapping) or depth > 8:
            return None
        if "const" in schema:
            return frozenset({_json_type(schema["const"])})
        if isinstance(schema.get("enum"), list):
            return frozenset(_json_type(v) for v in schema["enum"])
        declared = schema.get("type")
        if declared is not None:
            names = [declared] if isinstance(declared, str) else list(declared)
            return frozenset("number" if n == "integer" else n for n in names)
        for kw in ("anyOf", "oneOf"):
            if isinstance(schema.get(kw), list):
                parts = [self.json_types(b, depth + 1) for b in schema[kw]]
                return None if any(p is None for p in parts) else frozenset().union(*parts)
        return None

    def discriminated(self, branches: list) -> bool:
        """Every branch is an object that requires one shared property fixed to a distinct const."""
        resolved = [self.resolve(b) for b in branches]
        if not all(isinstance(b, Mapping) for b in resolved):
            return False
        candidates = set.intersection(*(set(b.get("required") or []) for b in resolved))
        for name in sorted(candidates):
            tags = []
            for branch in resolved:
                prop = self.resolve((branch.get("properties") or {}).get(name))
                if isinstance(prop, Mapping) and "const" in prop:
                    tags.append(prop["const"])
                elif isinstance(prop, Mapping) and isinstance(prop.get("enum"), list) and len(prop["enum"]) == 1:
                    tags.append(prop["enum"][0])
                else:
                    break
            else:
                keys = [repr(t) for t in tags]
                if len(set(keys)) == len(keys):
                    return True
        return False
