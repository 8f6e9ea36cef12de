"""Property tests of the normalisation pass against jsonschema, the reference: over generated
schemas in real-world shapes (allOf, $ref with siblings into any key, undeclared required,
OpenAPI formats, anchored alternatives, patterns beside lengths, one-sided ranges, anyOf beside
other keywords, oneOf with distinct types or mutually exclusive keys, enums beside other keywords,
dependencies in both drafts' spellings, recursion), every instance
the normalised schema accepts, the original accepts (under the original's draft); where the pass
says the rewrite is exact, the two agree on instances near the boundary too. A refusal points at a
place that exists in the original schema."""
from __future__ import annotations

import json
import string

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from jsonschema import validators

from radixserve.grammar.json_schema import normalise_json_schema, validator_class
from radixserve.grammar.schema_support import OUTLINES_SUPPORT, XGRAMMAR_SUPPORT, SchemaRefusal

PATTERNS = ["^[a-z]+$", "^a$|^b$", "^(foo|bar)-[0-9]{2}$", "[0-9]+", "^x", "^[A-Z][a-z]*$|^$",
            "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "^(?:ab|c)*$", "^.{2,}$"]
STRING_FORMATS = ["date", "uuid", "byte", "path", "jsonpath", "email", "binary"]
NUMBER_FORMATS = ["int32", "int64", "utc-millisec", "double", "float", "date-type"]
NAMES = ["a", "b", "c", "d"]
LOCATIONS = ["$defs", "definitions", "resourceDefinitions"]

SETTINGS = settings(max_examples=150, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                           HealthCheck.data_too_large])

# ---- schemas -------------------------------------------------------------------------------
small_ints = st.integers(-20, 20)
strings = st.fixed_dictionaries({"type": st.just("string")}, optional={
    "minLength": st.integers(0, 3), "maxLength": st.integers(2, 8), "pattern": st.sampled_from(PATTERNS),
    "format": st.sampled_from(STRING_FORMATS)})
integers = st.fixed_dictionaries({"type": st.just("integer")}, optional={
    "minimum": small_ints | st.just(-2 ** 70), "maximum": small_ints | st.just(2 ** 64),
    "exclusiveMinimum": small_ints, "multipleOf": st.sampled_from([1, 2, 3]),
    "format": st.sampled_from(NUMBER_FORMATS)})
numbers = st.fixed_dictionaries({"type": st.just("number")}, optional={
    "minimum": st.floats(-20, 20, allow_nan=False), "exclusiveMaximum": st.floats(-20, 20, allow_nan=False),
    "multipleOf": st.just(1), "format": st.sampled_from(NUMBER_FORMATS)})
misc = st.sampled_from([
    {"type": "boolean"}, {"type": "null"}, {}, True, {"enum": ["x", 1, None, "yy"]}, {"const": 3},
    {"type": ["string", "null"], "maxLength": 4}, {"enum": ["a", "bb", "ccc", 4], "maxLength": 2},
    {"type": ["integer", "string"], "minimum": 0, "minLength": 1}, {"minimum": 2},
])
refs = st.builds(lambda loc, name, extra: {"$ref": f"#/{loc}/{name}", **extra},
                 st.sampled_from(LOCATIONS), st.sampled_from(["d1", "d2", "tree"]),
                 st.sampled_from([{}, {}, {"description": "x"}, {"maxLength": 3}, {"type": "object"},
                                  {"required": ["a"]}, {"maxItems": 2}, {"id": "x"}, {"type": "string"}]))
# the drafts a schema may name: draft-07 ignores a $ref's siblings, 2020-12 (and no $schema) merges them
_SINCE_2019 = ('"prefixItems"', '"dependentRequired"', '"dependentSchemas"', '"unevaluated', '"minContains"')
DRAFTS = [None, None, "http://json-schema.org/draft-07/schema#", "https://json-schema.org/draft/2020-12/schema"]


def _extend(children):
    objects = st.builds(
        lambda props, req, extra: {"type": "object", "properties": props, "required": req, **extra},
        st.dictionaries(st.sampled_from(NAMES), children, max_size=3),
        st.lists(st.sampled_from(NAMES + ["z"]), max_size=2, unique=True),
        st.sampled_from([{}, {"additionalProperties": False}, {"additionalProperties": {"type": "integer"}},
                         {"additionalProperties": True}, {"minProperties": 1}, {"maxProperties": 2},
                         {"patternProperties": {"^x": {"type": "string"}}},
                         {"patternProperties": {"^[ab]$": {"type": "integer", "maximum": 5}}}]))
    arrays = st.builds(lambda items, extra: {"type": "array", "items": items, **extra}, children,
                       st.sampled_from([{}, {"minItems": 1}, {"maxItems": 2}, {"minItems": 1, "maxItems": 3}]))
    tuples = st.builds(lambda prefix, rest: {"type": "array", "prefixItems": prefix, **rest},
                       st.lists(children, min_size=1, max_size=2), st.sampled_from([{}, {"items": False}]))
    all_of = st.lists(children, min_size=1, max_size=3).map(lambda subs: {"allOf": subs})
    any_of = st.builds(lambda subs, extra: {"anyOf": subs, **extra}, st.lists(children, min_size=1, max_size=3),
                       st.sampled_from([{}, {"type": "object"}, {"type": "string", "maxLength": 3},
                                        {"minimum": 0}]))
    one_of = st.lists(st.sampled_from([strings, integers, st.just({"type": "boolean"}),
                                       st.just({"type": "null"})]), min_size=2, max_size=3, unique=True) \
        .flatmap(lambda strats: st.tuples(*strats)).map(lambda subs: {"oneOf": list(subs)})
    choice = st.builds(lambda props: {"type": "object", "properties": props, "anyOf": [
        {"required": ["a"]}, {"required": ["b"], "properties": {"b": {"type": "integer"}}}]},
        st.dictionaries(st.sampled_from(NAMES), children, max_size=2))
    exclusive = st.builds(lambda props, req: {"type": "object", "properties": props, "required": req,
                                              "additionalProperties": False,
                                              "oneOf": [{"required": ["a"]}, {"required": ["b"]}]},
                          st.dictionaries(st.sampled_from(NAMES), children, max_size=3),
                          st.lists(st.sampled_from(NAMES), max_size=1))
    dependent = st.builds(
        lambda props, extra, dep: {"type": "object", "properties": props, **extra, **dep},
        st.dictionaries(st.sampled_from(NAMES), children, min_size=1, max_size=4),
        st.sampled_from([{}, {"additionalProperties": False}, {"additionalProperties": False, "required": ["b"]}]),
        st.sampled_from([{"dependentRequired": {"a": ["b"]}}, {"dependentRequired": {"a": ["b", "c"], "b": ["d"]}},
                         {"dependentSchemas": {"b": {"required": ["a"]}}}, {"dependencies": {"a": ["c"]}},
                         {"dependencies": {"c": {"properties": {"a": {"type": "integer"}}}}}]))
    return objects | arrays | tuples | all_of | any_of | one_of | choice | exclusive | dependent


subschemas = st.recursive(strings | integers | numbers | misc, _extend, max_leaves=6)
with_refs = st.recursive(strings | integers | numbers | misc | refs, _extend, max_leaves=6)


@st.composite
def documents(draw):
    """A schema whose $refs go to definitions under one of several keys, one of them recursive."""
    loc = draw(st.sampled_from(LOCATIONS))
    root = draw(with_refs)
    if root is True:
        root = {}
    defs = {"d1": draw(subschemas), "d2": draw(subschemas),
            "tree": {"type": "object", "properties": {"v": {"type": "integer"}, "next": {"$ref": f"#/{loc}/tree"}}}}
    root = _relocate(root, loc)
    draft = draw(st.sampled_from(DRAFTS))
    if draft and "draft-07" in draft and any(k in json.dumps([root, defs]) for k in _SINCE_2019):
        draft = None   # its 2020-12 keywords would mean something else under draft-07
    return {**root, loc: defs, **({"$schema": draft} if draft else {})}


def _relocate(node, loc):
    """Every $ref made to point under `loc`."""
    if isinstance(node, dict):
        out = {k: _relocate(v, loc) for k, v in node.items()}
        if "$ref" in out:
            out["$ref"] = f"#/{loc}/{out['$ref'].rsplit('/', 1)[1]}"
        return out
    if isinstance(node, list):
        return [_relocate(v, loc) for v in node]
    return node


# ---- instances of a normalised schema --------------------------------------------------------
json_values = st.recursive(st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=3),
                           lambda c: st.lists(c, max_size=2) | st.dictionaries(st.text(max_size=2), c, max_size=2),
                           max_leaves=4)


def instances(node, defs, depth=0):
    if node is True or node == {}:
        return json_values
    if node is False or depth > 6:
        return st.nothing()
    if "$ref" in node:
        return st.deferred(lambda: instances(defs[node["$ref"].rsplit("/", 1)[1]], defs, depth + 1))
    if "anyOf" in node:
        return st.one_of([instances(b, defs, depth + 1) for b in node["anyOf"]])
    if "const" in node:
        return st.just(node["const"])
    if "enum" in node:
        return st.sampled_from(node["enum"])
    kind = node["type"]
    if kind == "string":
        if "pattern" in node:
            return st.from_regex(node["pattern"], fullmatch=True)
        return st.text(string.ascii_letters, min_size=node.get("minLength", 0), max_size=node.get("maxLength", 6))
    if kind == "integer":
        lo, hi = node.get("minimum", -10 ** 16 + 1), node.get("maximum", 10 ** 16 - 1)
        step = node.get("multipleOf", 1)
        return st.integers(-(-lo // step), hi // step).map(lambda k: k * step)
    if kind == "number":
        return st.floats(float(node.get("minimum", node.get("exclusiveMinimum", -1e16))),
                         float(node.get("maximum", node.get("exclusiveMaximum", 1e16))),
                         exclude_min="exclusiveMinimum" in node, exclude_max="exclusiveMaximum" in node,
                         allow_nan=False, allow_infinity=False)
    if kind == "object":
        props, required = node.get("properties", {}), node.get("required", [])
        optional = {k: instances(v, defs, depth + 1) for k, v in props.items() if k not in required}
        return st.fixed_dictionaries({k: instances(props[k], defs, depth + 1) for k in required},
                                     optional=optional if depth < 4 else {})
    if kind == "array":
        prefix = [instances(p, defs, depth + 1) for p in node.get("prefixItems", [])]
        items = node.get("items", {})
        rest = st.just([]) if items is False or depth >= 4 else st.lists(instances(items, defs, depth + 1), max_size=3)
        return st.tuples(st.tuples(*prefix), rest).map(lambda pr: list(pr[0]) + pr[1])
    return st.just(None) if kind == "null" else st.booleans()


def near(value):
    """Values next to `value`: a key dropped or added, a number moved, a string grown."""
    out = [value, None, "s", 7, 2.5, [], {}]
    if isinstance(value, dict):
        out += [{k: v for k, v in value.items() if k != drop} for drop in value]
        out += [{**value, "z": 1}, {**value, "xa": "s"}]
        out += [{**value, k: None} for k in value]
    elif isinstance(value, list):
        out += [value[:-1], value + value[:1], value + [None]]
    elif isinstance(value, bool):
        out.append(not value)
    elif isinstance(value, (int, float)):
        out += [value + 1, value - 1, value * 10, value + 0.5]
    elif isinstance(value, str):
        out += [value + "x", value[:-1], "", value + "\n"]
    return out


def _normalise(schema, support):
    try:
        return normalise_json_schema(schema, support)
    except SchemaRefusal as e:
        assert e.keyword and _exists(schema, e.pointer), (e.keyword, e.pointer)
        return None


def _exists(schema, pointer: str) -> bool:
    node = schema
    for part in ([] if pointer == "/" else pointer.split("/")[1:]):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False
    return True


def reading(schema, result):
    """The original's validator under its draft; where a $ref sibling was dropped because nothing
    satisfied it merged (never a refusal for that), the older drafts' reading, which ignores it."""
    if any(n.keyword == "$ref" and "dropped" in n.action for n in result.notes):
        return validators.Draft7Validator(schema)
    return validator_class(schema)(schema)


# ---- the properties ------------------------------------------------------------------------
@SETTINGS
@given(schema=documents(), data=st.data())
def test_every_instance_of_the_normalised_schema_is_valid_under_the_original(schema, data):
    result = _normalise(schema, XGRAMMAR_SUPPORT)
    if result is None:
        return
    normalised = validators.Draft202012Validator(result.schema)
    original = reading(schema, result)
    defs = result.schema.get("$defs", {})
    for _ in range(3):
        value = data.draw(instances(result.schema, defs))
        assume(normalised.is_valid(value))  # the generator above is simpler than the schemas
        assert original.is_valid(value), (value, result.schema)


@SETTINGS
@given(schema=documents(), data=st.data())
def test_exact_rewrites_accept_the_same_instances(schema, data):
    result = _normalise(schema, XGRAMMAR_SUPPORT)
    assume(result is not None and result.exact)
    normalised = validators.Draft202012Validator(result.schema)
    original = validator_class(schema)(schema)
    defs = result.schema.get("$defs", {})
    seeds = [data.draw(instances(result.schema, defs)), data.draw(json_values)]
    for value in [v for seed in seeds for v in near(seed)]:
        assert original.is_valid(value) == normalised.is_valid(value), (value, result.schema)


@SETTINGS
@given(schema=documents())
def test_outlines_core_normal_form_is_no_looser_than_xgrammars(schema):
    # the same pass serves both: what it accepts for outlines-core it accepts for xgrammar
    if _normalise(schema, OUTLINES_SUPPORT) is not None:
        assert _normalise(schema, XGRAMMAR_SUPPORT) is not None
