"""The exact merge of two normalised schemas: one schema accepting what both accept (`allOf`, a
`$ref` beside other keywords, an `anyOf` beside other keywords). Properties and `required` are
unions, types, ranges and lengths intersections. Where the result could not be exact (two
different patterns, patternProperties meeting another side's additionalProperties) it refuses;
where nothing can satisfy both it raises `Unsatisfiable`, which drops an anyOf branch."""
from __future__ import annotations

import math
from typing import Any, Protocol

from radixserve.grammar.schema_keywords import Context, Unsatisfiable, any_of, local, matching

# a merge of two anyOfs multiplies their branches; past this it is refused rather than built
MAX_BRANCHES = 64


class MergeContext(Context, Protocol):
    def inline(self, node: Any) -> Any: ...
    def is_valid(self, value: Any, node: Any, pointer: str) -> bool: ...


def merge_all(nodes: list, pointer: str, ctx: MergeContext) -> Any:
    result: Any = {}
    for node in nodes:
        result = merge(result, node, pointer, ctx)
    return result


def merge(a: Any, b: Any, pointer: str, ctx: MergeContext) -> Any:
    """`pointer`: where the merge was asked for (the allOf, the $ref, the anyOf), which every
    refusal names: the merged children have no place of their own in the original."""
    if a is False or b is False:
        return False
    a, b = ctx.inline(a), ctx.inline(b)
    if a == {}:
        return b
    if b == {} or a == b:
        return a
    if "anyOf" in a or "anyOf" in b:
        return _merge_any_of(a.get("anyOf", [a]), b.get("anyOf", [b]), pointer, ctx)
    for values_side, other in ((a, b), (b, a)):
        if "enum" in values_side or "const" in values_side:
            values = values_side["enum"] if "enum" in values_side else [values_side["const"]]
            kept = [v for v in values if ctx.is_valid(v, other, pointer)]
            if not kept:
                raise Unsatisfiable("enum", pointer, "no enum value satisfies the other subschemas")
            return {"const": kept[0]} if len(kept) == 1 else {"enum": kept}
    kind = _meet(a["type"], b["type"])
    if kind is None:
        raise Unsatisfiable("type", pointer, f"types {a['type']!r} and {b['type']!r} have no value in common")
    merged: dict[str, Any] = {"type": kind}
    if kind in ("number", "integer"):
        merged.update(_numbers(a, b, pointer, ctx))
    elif kind == "string":
        merged.update(_strings(a, b, pointer, ctx))
    elif kind == "array":
        merged.update(_arrays(a, b, pointer, ctx))
    elif kind == "object":
        merged.update(_objects(a, b, pointer, ctx))
    return local(merged, pointer, ctx)


def _merge_any_of(left: list, right: list, pointer: str, ctx: MergeContext) -> Any:
    if len(left) * len(right) > MAX_BRANCHES:
        return ctx.refuse("anyOf", pointer, f"combining these alternatives needs {len(left) * len(right)} branches "
                                            f"(at most {MAX_BRANCHES})")
    branches = []
    for x in left:
        for y in right:
            try:
                branches.append(merge(x, y, pointer, ctx))
            except Unsatisfiable:
                pass
    return any_of(branches, pointer)


def _meet(a: str, b: str):
    if a == b:
        return a
    if {a, b} == {"integer", "number"}:
        return "integer"
    return None


def _numbers(a: dict, b: dict, pointer: str, ctx: MergeContext) -> dict:
    out: dict[str, Any] = {}
    for key, pick in (("minimum", max), ("exclusiveMinimum", max), ("maximum", min), ("exclusiveMaximum", min)):
        values = [s[key] for s in (a, b) if key in s]
        if values:
            out[key] = pick(values)
    steps = [s["multipleOf"] for s in (a, b) if "multipleOf" in s]
    if len(steps) == 2 and steps[0] != steps[1]:
        if all(float(x).is_integer() for x in steps):
            out["multipleOf"] = math.lcm(int(steps[0]), int(steps[1]))
        elif (max(steps) / min(steps)).is_integer():
            out["multipleOf"] = max(steps)
        else:
            ctx.refuse("multipleOf", pointer, "two multipleOf values whose common multiples are not one multipleOf")
    elif steps:
        out["multipleOf"] = steps[0]
    return out


def _tighter_bounds(a: dict, b: dict, low: str, high: str, out: dict) -> None:
    """The larger of the lower bounds and the smaller of the upper ones either side sets."""
    lows = [s[low] for s in (a, b) if low in s]
    highs = [s[high] for s in (a, b) if high in s]
    if lows:
        out[low] = max(lows)
    if highs:
        out[high] = min(highs)


def _merge_subschema(a: dict, b: dict, key: str, pointer: str, ctx: MergeContext, out: dict) -> None:
    """Both sides' subschema under `key` (absent: anything), merged, where either side has one."""
    if key in a or key in b:
        out[key] = _sub(a.get(key, {}), b.get(key, {}), pointer, ctx)


def _strings(a: dict, b: dict, pointer: str, ctx: MergeContext) -> dict:
    out: dict[str, Any] = {}
    _tighter_bounds(a, b, "minLength", "maxLength", out)
    patterns = list(dict.fromkeys(s["pattern"] for s in (a, b) if "pattern" in s))
    if len(patterns) > 1:
        ctx.refuse("pattern", pointer, "two different patterns cannot be combined into one exactly")
    if patterns:
        out["pattern"] = patterns[0]
    formats = list(dict.fromkeys(s["format"] for s in (a, b) if "format" in s))
    if len(formats) == 1:
        out["format"] = formats[0]
    return out


def _arrays(a: dict, b: dict, pointer: str, ctx: MergeContext) -> dict:
    def at(s: dict, i: int) -> Any:
        prefix = s.get("prefixItems", [])
        return prefix[i] if i < len(prefix) else s.get("items", {})

    length = max(len(a.get("prefixItems", [])), len(b.get("prefixItems", [])))
    out: dict[str, Any] = {}
    prefix = [_sub(at(a, i), at(b, i), pointer, ctx) for i in range(length)]
    if prefix:
        out["prefixItems"] = prefix
    _merge_subschema(a, b, "items", pointer, ctx, out)
    _tighter_bounds(a, b, "minItems", "maxItems", out)
    return out


def _objects(a: dict, b: dict, pointer: str, ctx: MergeContext) -> dict:
    for x, y in ((a, b), (b, a)):
        extra_patterns = set(y.get("patternProperties", {})) - set(x.get("patternProperties", {}))
        if extra_patterns and x.get("additionalProperties", {}) != {}:
            # a name matching only y's pattern escapes x's additionalProperties once merged
            ctx.refuse("patternProperties", pointer, "patternProperties of one subschema beside additionalProperties "
                                                     "of another cannot be merged exactly")
    names = list(dict.fromkeys([*a.get("properties", {}), *b.get("properties", {})]))
    out: dict[str, Any] = {}
    if names:
        out["properties"] = {n: _sub(_effective(a, n, pointer, ctx), _effective(b, n, pointer, ctx),
                                     pointer, ctx) for n in names}
    required = list(dict.fromkeys([*a.get("required", []), *b.get("required", [])]))
    if required:
        out["required"] = required
    _merge_subschema(a, b, "additionalProperties", pointer, ctx, out)
    patterns = dict(a.get("patternProperties", {}))
    for key, sub in b.get("patternProperties", {}).items():
        patterns[key] = _sub(patterns[key], sub, pointer, ctx) if key in patterns else sub
    if patterns:
        out["patternProperties"] = patterns
    _merge_subschema(a, b, "propertyNames", pointer, ctx, out)
    _tighter_bounds(a, b, "minProperties", "maxProperties", out)
    return out


def _effective(s: dict, name: str, pointer: str, ctx: MergeContext) -> Any:
    """What `s` demands of property `name`: its declaration and the patterns that match it, or
    else its additionalProperties."""
    parts = [s["properties"][name]] if name in s.get("properties", {}) else []
    parts += matching(s.get("patternProperties", {}), name)
    if not parts:
        parts = [s.get("additionalProperties", {})]
    return merge_all(parts, pointer, ctx)


def _sub(x: Any, y: Any, pointer: str, ctx: MergeContext) -> Any:
    """A child's merge; an unsatisfiable child becomes False, for the parent to resolve."""
    try:
        return merge(x, y, pointer, ctx)
    except Unsatisfiable:
        return False
