"""One schema node's own keywords put into the normal form both backends enforce as written.

The normal form (`json_schema` builds it, `schema_merge` keeps it): a node is `{}` (any value), a
`$ref` alone, an `anyOf` alone, an `enum` / `const` alone, or one `type` with only the keywords of
that type. Where a backend would drop one of two keywords (a `pattern` beside `maxLength`, a
`format` beside a `pattern`) the two are folded into one; a format the backend cannot enforce is an
annotation, as JSON Schema says, and is dropped; OpenAPI's own formats become the ranges they mean.
Children (`properties`, `items`, ...) arrive already normalised; `False` may stand for a child
that accepts nothing, and is resolved here."""
from __future__ import annotations

import math
import re
from typing import Any, Optional, Protocol

from radixserve.grammar.number_bounds import LARGEST
from radixserve.grammar.regex_rewrite import RegexRefused, rewrite_pattern
from radixserve.grammar.schema_support import SchemaSupport
from radixserve.grammar.spec import canonical_json

FAMILIES: dict[str, frozenset[str]] = {
    "string": frozenset({"minLength", "maxLength", "pattern", "format"}),
    "number": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "format"}),
    "object": frozenset({"properties", "required", "additionalProperties", "patternProperties",
                         "propertyNames", "minProperties", "maxProperties"}),
    "array": frozenset({"items", "prefixItems", "minItems", "maxItems"}),
}
FAMILY_OF = {"string": "string", "number": "number", "integer": "number", "object": "object", "array": "array"}
LOCAL_KEYWORDS = frozenset().union(*FAMILIES.values()) | {"type"}

INT64 = (-2 ** 63, 2 ** 63 - 1)
# OpenAPI's integer formats, as the ranges they mean
INTEGER_FORMATS = {
    "int8": (-2 ** 7, 2 ** 7 - 1), "int16": (-2 ** 15, 2 ** 15 - 1), "int32": (-2 ** 31, 2 ** 31 - 1),
    "int64": INT64, "uint8": (0, 2 ** 8 - 1), "uint16": (0, 2 ** 16 - 1), "uint32": (0, 2 ** 32 - 1),
    "uint64": (0, 2 ** 64 - 1),
}
# OpenAPI's `byte`: base64 text
BASE64 = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"


class Unsatisfiable(Exception):
    """No value satisfies this node (an anyOf branch that goes, or a refusal at the top)."""

    def __init__(self, keyword: str, pointer: str, reason: str):
        super().__init__(reason)
        self.keyword, self.pointer, self.reason = keyword, pointer, reason


class Context(Protocol):
    support: SchemaSupport

    def refuse(self, keyword: str, pointer: str, reason: str) -> Any: ...
    def note(self, keyword: str, pointer: str, action: str, exact: bool) -> None: ...
    def merge(self, a: Any, b: Any, pointer: str) -> Any: ...


def any_of(branches: list, pointer: str) -> Any:
    """The normal form of an anyOf: flattened, without duplicates; `{}` if a branch is."""
    flat, seen = [], set()
    for b in branches:
        for sub in (b["anyOf"] if isinstance(b, dict) and set(b) == {"anyOf"} else [b]):
            if sub is False:
                continue
            if sub == {}:
                return {}
            key = canonical_json(sub)
            if key not in seen:
                seen.add(key)
                flat.append(sub)
    if not flat:
        raise Unsatisfiable("anyOf", pointer, "no branch can be satisfied")
    return flat[0] if len(flat) == 1 else {"anyOf": flat}


def local(node: dict, pointer: str, ctx: Context) -> Any:
    """The normal form of a node holding only local keywords (its children normalised)."""
    declared = node.get("type")
    keywords = {k: v for k, v in node.items() if k != "type"}
    if declared is None:
        families = [f for f in ("object", "array", "string", "number")
                    if any(k in FAMILIES[f] - {"format"} for k in keywords)]
        if not families:
            if "format" in keywords:
                ctx.note("format", pointer, f"format {keywords['format']!r} without a type ignored", True)
            return {}
        # keywords of one type say what the author meant; the other types would pass unchecked
        ctx.note("type", pointer, f"type {'/'.join(families)} inferred from the keywords", False)
        declared = families
    types = [declared] if isinstance(declared, str) else list(dict.fromkeys(declared))
    if "number" in types and "integer" in types:
        types.remove("integer")
    branches = []
    for t in types:
        own = {k: v for k, v in keywords.items() if k in FAMILIES.get(FAMILY_OF.get(t, ""), ())}
        try:
            branches.append(_typed(t, own, pointer, ctx))
        except Unsatisfiable:
            if len(types) == 1:
                raise
    return any_of(branches, pointer)


def _typed(t: str, kw: dict, pointer: str, ctx: Context) -> Any:
    if t in ("string",):
        return _string(kw, pointer, ctx)
    if t in ("number", "integer"):
        return _number(t, kw, pointer, ctx)
    if t == "object":
        return _object(kw, pointer, ctx)
    if t == "array":
        return _array(kw, pointer, ctx)
    return {"type": t}


# ---- strings -------------------------------------------------------------------------------
def _string(kw: dict, pointer: str, ctx: Context) -> dict:
    out: dict[str, Any] = {"type": "string"}
    fmt, pattern = kw.get("format"), kw.get("pattern")
    min_len, max_len = kw.get("minLength", 0), kw.get("maxLength")
    if max_len is not None and min_len > max_len:
        raise Unsatisfiable("minLength", pointer, "minLength is above maxLength")
    if fmt == "byte" and pattern is None:
        pattern, fmt = BASE64, None
        ctx.note("format", pointer, "format 'byte' enforced as base64", False)
    if fmt is not None:
        if fmt in ctx.support.enforced_formats and pattern is None and min_len == 0 and max_len is None:
            out["format"] = fmt
        else:
            why = "beside a pattern or a length" if fmt in ctx.support.enforced_formats else "unknown to the backend"
            ctx.note("format", pointer, f"format {fmt!r} ({why}) ignored as an annotation", True)
    if pattern is not None:
        try:
            rewritten = rewrite_pattern(pattern, min_len, max_len)
        except RegexRefused as e:
            return ctx.refuse("pattern", pointer, f"pattern {pattern!r}: {e}")
        out["pattern"] = rewritten.text
        for what in rewritten.notes:
            ctx.note("pattern", pointer, what, rewritten.exact)
        return out
    if min_len:
        out["minLength"] = min_len
    if max_len is not None:
        out["maxLength"] = max_len
    return out


# ---- numbers -------------------------------------------------------------------------------
def _number(t: str, kw: dict, pointer: str, ctx: Context) -> dict:
    kw = dict(kw)
    fmt = kw.pop("format", None)
    stepped = kw.get("multipleOf") not in (None, 1)
    if fmt in INTEGER_FORMATS and ctx.support.enforces_ranges and not stepped:
        lo, hi = INTEGER_FORMATS[fmt]
        kw["minimum"] = max(kw.get("minimum", lo), lo)
        kw["maximum"] = min(kw.get("maximum", hi), hi)
        t = "integer"
        ctx.note("format", pointer, f"format {fmt!r} enforced as an integer range", False)
    elif fmt == "utc-millisec":
        t = "integer"
        ctx.note("format", pointer, "format 'utc-millisec' enforced as an integer", False)
    elif fmt is not None:
        ctx.note("format", pointer, f"format {fmt!r} ignored as an annotation", True)
    step = kw.get("multipleOf")
    if step is not None and float(step).is_integer():
        t, kw["multipleOf"] = "integer", int(step)  # a multiple of an integer is an integer
    elif step is not None and t == "integer" and (1 / step).is_integer():
        del kw["multipleOf"]  # every integer is a multiple of 1/n
    elif step is not None and ctx.support.multiple_of_integers_only:
        return ctx.refuse("multipleOf", pointer, f"'multipleOf' on a non-integer type ({ctx.support.backend} "
                                                 "enforces it on integers only)")
    if t == "integer":
        return _integer_range(kw, pointer, ctx)
    return _number_range(kw, pointer, ctx)


def _integer_range(kw: dict, pointer: str, ctx: Context) -> dict:
    out: dict[str, Any] = {"type": "integer"}
    if "multipleOf" in kw:
        out["multipleOf"] = kw["multipleOf"]
    if not ctx.support.enforces_ranges:  # the bounds were refused by keyword already
        out.update((ctx.support.digit_keywords or {}).get("integer", {}))
        return out
    # inclusive integer bounds: the same integers, and xgrammar takes no float bound
    lows = [math.ceil(kw["minimum"])] if "minimum" in kw else []
    lows += [math.floor(kw["exclusiveMinimum"]) + 1] if "exclusiveMinimum" in kw else []
    highs = [math.floor(kw["maximum"])] if "maximum" in kw else []
    highs += [math.ceil(kw["exclusiveMaximum"]) - 1] if "exclusiveMaximum" in kw else []
    if not lows and not highs:
        return out  # digits bounded by the backend's number rule (not beside a multipleOf)
    lo, hi = max(lows, default=None), min(highs, default=None)
    if lo is not None and hi is not None and lo > hi:
        raise Unsatisfiable("minimum", pointer, f"no integer lies in [{lo}, {hi}]")
    if "multipleOf" in out:
        return _multiples(out["multipleOf"], lo, hi, pointer, ctx)
    # at most 16 digits, as unranged integers; further only where the schema demands it
    clo, chi = max(-LARGEST if lo is None else lo, -LARGEST), min(LARGEST if hi is None else hi, LARGEST)
    if clo > chi:
        clo, chi = max(INT64[0] if lo is None else lo, INT64[0]), min(INT64[1] if hi is None else hi, INT64[1])
        if clo > chi:
            keyword = "minimum" if lo is not None and lo > INT64[1] else "maximum"
            return ctx.refuse(keyword, pointer, f"integer bounds [{lo}, {hi}] lie beyond the 64-bit integers "
                                                "this server can generate")
    if (clo, chi) != (lo, hi):
        ctx.note("minimum", pointer, f"integer range narrowed to [{clo}, {chi}]", False)
    out["minimum"], out["maximum"] = clo, chi
    return out


# at most this many multiples are spelled out as an enum when the range is too wide to keep
MAX_ENUMERATED_MULTIPLES = 1024


def _multiples(step: int, lo: Optional[int], hi: Optional[int], pointer: str, ctx: Context) -> dict:
    """An integer multipleOf beside a range, in a form the backend keeps both of."""
    span = ctx.support.multiple_of_max_span
    if lo is not None and hi is not None:
        first, last = -(-lo // step) * step, (hi // step) * step
        if first > last:
            raise Unsatisfiable("multipleOf", pointer, f"no multiple of {step} lies in [{lo}, {hi}]")
        if span is None or hi - lo <= span:
            return {"type": "integer", "multipleOf": step, "minimum": lo, "maximum": hi}
        if (last - first) // step < MAX_ENUMERATED_MULTIPLES:
            return {"enum": list(range(first, last + 1, step))}
    if span is None:
        return {"type": "integer", "multipleOf": step, **({"minimum": lo} if lo is not None else {}),
                **({"maximum": hi} if hi is not None else {})}
    return ctx.refuse("multipleOf", pointer, f"'multipleOf' beside a range wider than {span} ({ctx.support.backend} "
                                             f"would drop the multipleOf)")


def _number_range(kw: dict, pointer: str, ctx: Context) -> dict:
    out: dict[str, Any] = {"type": "number"}
    bounds = {k: kw[k] for k in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum") if k in kw}
    if not ctx.support.enforces_ranges:  # the bounds were refused by keyword already
        return {**out, **(ctx.support.digit_keywords or {}).get("number", {})}
    if not bounds:
        return out  # digits bounded by the backend's number rule
    low = _tighter(bounds, "minimum", "exclusiveMinimum", max)
    high = _tighter(bounds, "maximum", "exclusiveMaximum", min)
    if low is not None and high is not None and (low[1] > high[1] or (low[1] == high[1] and
                                                                     ("exclusive" in low[0] or "exclusive" in high[0]))):
        raise Unsatisfiable("minimum", pointer, "no number lies between the bounds")
    if low is not None and low[1] > LARGEST:
        return ctx.refuse(low[0], pointer, f"lower bound {low[1]} lies beyond the 16-digit numbers this server generates")
    if high is not None and high[1] < -LARGEST:
        return ctx.refuse(high[0], pointer, f"upper bound {high[1]} lies beyond the 16-digit numbers this server generates")
    if low is None or low[1] < -LARGEST:
        low = ("minimum", -LARGEST)
        ctx.note("minimum", pointer, f"number range given the lower bound {-LARGEST}", False)
    if high is None or high[1] > LARGEST:
        high = ("maximum", LARGEST)
        ctx.note("maximum", pointer, f"number range given the upper bound {LARGEST}", False)
    out[low[0]], out[high[0]] = low[1], high[1]
    return out


def _tighter(bounds: dict, inclusive: str, exclusive: str, pick) -> Optional[tuple[str, float]]:
    """The tighter of an inclusive and an exclusive bound (the exclusive one on a tie)."""
    present = [(k, bounds[k]) for k in (exclusive, inclusive) if k in bounds]
    if not present:
        return None
    best = pick(v for _, v in present)
    return next((k, v) for k, v in present if v == best)


# ---- objects -------------------------------------------------------------------------------
def matching(patterns: dict, name: str) -> list:
    """The patternProperties subschemas that apply to property `name` (a pattern is a search)."""
    return [sub for pattern, sub in patterns.items() if re.search(pattern, name)]


def _object(kw: dict, pointer: str, ctx: Context) -> dict:
    props = dict(kw.get("properties", {}))
    required = list(dict.fromkeys(kw.get("required", [])))
    additional = kw.get("additionalProperties")
    patterns = dict(kw.get("patternProperties", {}))
    for name, sub in list(props.items()):
        # patternProperties apply to declared properties too; the backends only read `properties`
        for pattern_schema in matching(patterns, name):
            try:
                sub = False if sub is False else ctx.merge(sub, pattern_schema, pointer)
            except Unsatisfiable:
                sub = False
        props[name] = sub
    for name in required:
        if name in props:
            continue
        # an undeclared required property may hold whatever the rest of the object allows
        matched = matching(patterns, name)
        if matched:
            sub = matched[0]
            for other in matched[1:]:
                sub = ctx.merge(sub, other, pointer)
        elif additional is False:
            raise Unsatisfiable("required", pointer, f"required property '{name}' is not declared in 'properties' "
                                                     "and 'additionalProperties' is false: no object satisfies it")
        else:
            sub = {} if additional is None else additional
        props[name] = sub
    for name, sub in list(props.items()):
        if sub is not False:
            continue
        if name in required:
            raise Unsatisfiable("required", pointer, f"required property '{name}' accepts no value")
        if additional is False and not matching(patterns, name):
            del props[name]  # left to additionalProperties: false, which forbids it just the same
        else:
            # the pointer of the object: a merge may have made the property false
            ctx.refuse("properties", pointer, f"property '{name}' has the schema false (a forbidden property), "
                                              "which cannot be enforced here")
    for pattern, sub in patterns.items():
        if sub is False:
            ctx.refuse("patternProperties", pointer, f"patternProperties {pattern!r}: a false subschema cannot be "
                                                     "enforced here")
    if kw.get("propertyNames") is False:
        ctx.refuse("propertyNames", pointer, "a false subschema cannot be enforced here")
    min_p, max_p = kw.get("minProperties", 0), kw.get("maxProperties")
    if max_p is not None and max(min_p, len(required)) > max_p:
        raise Unsatisfiable("maxProperties", pointer, "more properties are required than maxProperties allows")
    if additional is None and min_p > len(props) and not patterns:
        # the backends generate no undeclared property unless additionalProperties says so
        additional = {}
    out: dict[str, Any] = {"type": "object"}
    if props:
        out["properties"] = props
    if required:
        out["required"] = required
    if additional is not None:
        out["additionalProperties"] = additional
    if patterns:
        out["patternProperties"] = patterns
    if kw.get("propertyNames") not in (None, {}):
        out["propertyNames"] = kw["propertyNames"]
    if min_p:
        out["minProperties"] = min_p
    if max_p is not None:
        out["maxProperties"] = max_p
    return out


# ---- arrays --------------------------------------------------------------------------------
def _array(kw: dict, pointer: str, ctx: Context) -> dict:
    prefix = list(kw.get("prefixItems", []))
    items = kw.get("items")
    min_i, max_i = kw.get("minItems", 0), kw.get("maxItems")
    if False in prefix:  # no array reaches that position
        prefix, items = prefix[:prefix.index(False)], False
    if items is False:
        max_i = len(prefix) if max_i is None else min(max_i, len(prefix))
    if max_i is not None and min_i > max_i:
        raise Unsatisfiable("minItems", pointer, "minItems is above the most items the array may hold")
    if ctx.support.prefix_items_only and prefix and min_i > len(prefix):
        ctx.refuse("minItems", pointer, f"'minItems' beyond 'prefixItems' ({ctx.support.backend} generates the "
                                        "prefix items only)")
    out: dict[str, Any] = {"type": "array"}
    if prefix:
        out["prefixItems"] = prefix
    if items is not None and items != {}:
        out["items"] = items
    if min_i:
        out["minItems"] = min_i
    if max_i is not None:
        out["maxItems"] = max_i
    return out

