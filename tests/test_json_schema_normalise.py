"""The JSON-schema normalisation pass (grammar/json_schema.py) on the shapes real-world schemas
have: what JSON Schema does not call for refusing is rewritten, every `$ref` target is checked
wherever it lives, and what stays refused names its keyword and JSON pointer as data."""
from __future__ import annotations

import jsonschema
import pytest

from radixserve.grammar.json_schema import normalise_json_schema, validator_class
from radixserve.grammar.number_bounds import LARGEST
from radixserve.grammar.schema_support import OUTLINES_SUPPORT, XGRAMMAR_SUPPORT, SchemaRefusal


def normal(schema, support=XGRAMMAR_SUPPORT):
    return normalise_json_schema(schema, support).schema


def refusal(schema, support=XGRAMMAR_SUPPORT) -> SchemaRefusal:
    with pytest.raises(SchemaRefusal) as info:
        normalise_json_schema(schema, support)
    return info.value


def accepts(schema, value) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(value)


# ---- formats -------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["path", "date-type", "jsonpath", "expose", "idn-email", "password", "binary"])
def test_unknown_format_is_an_annotation(fmt):
    assert normal({"type": "string", "format": fmt}) == {"type": "string"}


@pytest.mark.parametrize("fmt,lo,hi", [("int32", -2 ** 31, 2 ** 31 - 1), ("int64", -LARGEST, LARGEST)])
def test_openapi_integer_formats_are_ranges(fmt, lo, hi):
    assert normal({"type": "integer", "format": fmt}) == {"type": "integer", "minimum": lo, "maximum": hi}


def test_utc_millisec_is_an_integer_and_float_double_are_numbers():
    assert normal({"type": "number", "format": "utc-millisec"})["type"] == "integer"
    assert normal({"type": "number", "format": "double"}) == {"type": "number"}
    assert normal({"type": "number", "format": "float"}) == {"type": "number"}


def test_byte_format_is_base64():
    pattern = normal({"type": "string", "format": "byte"})["pattern"]
    assert accepts({"type": "string", "pattern": pattern}, "aGVsbG8=")
    assert not accepts({"type": "string", "pattern": pattern}, "not base64!")


def test_format_beside_a_length_yields_to_the_length():
    # the backend would keep the format and drop the length: the format, an annotation, goes
    assert normal({"type": "string", "format": "date", "maxLength": 10}) == {"type": "string", "maxLength": 10}


def test_outlines_core_treats_openapi_integer_formats_as_annotations():
    # it cannot enforce ranges; its own digit keywords bound the integer instead
    assert normal({"type": "integer", "format": "int32"}, OUTLINES_SUPPORT) == {"type": "integer", "maxDigits": 16}


# ---- $ref ----------------------------------------------------------------------------------
def test_ref_siblings_are_merged_into_the_target():
    schema = {"definitions": {"tags": {"type": "array", "items": {"type": "string"}}},
              "type": "object", "properties": {"t": {"$ref": "#/definitions/tags", "maxItems": 3,
                                                     "type": "array", "id": "tags"}}}
    assert normal(schema)["properties"]["t"] == {"type": "array", "items": {"type": "string"}, "maxItems": 3}


def test_ref_siblings_around_a_recursive_target_keep_the_reference():
    schema = {"$defs": {"node": {"type": "object", "properties": {"kids": {
        "type": "array", "items": {"$ref": "#/$defs/node"}}}}},
        "$ref": "#/$defs/node", "required": ["kids"]}
    out = normal(schema)
    assert out["required"] == ["kids"]
    assert out["properties"]["kids"]["items"] == {"$ref": "#/$defs/node"}
    assert out["$defs"]["node"]["properties"]["kids"]["items"] == {"$ref": "#/$defs/node"}


def test_ref_into_a_nonstandard_key_is_followed_and_checked():
    gateway = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name", "sku"]}
    schema = {"resourceDefinitions": {"gateway": gateway}, "type": "object",
              "properties": {"gw": {"$ref": "#/resourceDefinitions/gateway"}}, "required": ["gw"]}
    out = normal(schema)
    # the undeclared required property is enforced, not dropped
    assert out["$defs"]["gateway"]["required"] == ["name", "sku"]
    assert out["$defs"]["gateway"]["properties"]["sku"] == {}
    closed = {**gateway, "additionalProperties": False}
    error = refusal({**schema, "resourceDefinitions": {"gateway": closed}})
    assert (error.keyword, error.pointer) == ("required", "/resourceDefinitions/gateway")


def test_ref_outside_the_schema_is_refused_by_pointer():
    error = refusal({"type": "object", "properties": {"a": {"$ref": "other.json#/definitions/a"}}})
    assert (error.keyword, error.pointer) == ("$ref", "/properties/a")


def test_ref_by_anchor_and_by_root_id():
    schema = {"$id": "https://example.com/s.json", "$defs": {"n": {"$anchor": "num", "type": "integer"}},
              "type": "object", "properties": {"a": {"$ref": "#num"},
                                               "b": {"$ref": "https://example.com/s.json#/$defs/n"}}}
    out = normal(schema)
    assert out["$defs"][out["properties"]["a"]["$ref"].split("/")[-1]]["type"] == "integer"


# ---- required ------------------------------------------------------------------------------
def test_required_property_not_declared_may_hold_any_value():
    assert normal({"type": "object", "required": ["a"]}) == {
        "type": "object", "properties": {"a": {}}, "required": ["a"]}


def test_required_property_not_declared_takes_additional_properties_schema():
    out = normal({"type": "object", "required": ["a"], "additionalProperties": {"type": "integer"}})
    assert out["properties"]["a"] == {"type": "integer"}


def test_required_property_forbidden_by_additional_properties_is_unsatisfiable():
    error = refusal({"type": "object", "properties": {"x": {"type": "object", "required": ["a"],
                                                            "additionalProperties": False}}})
    assert (error.keyword, error.pointer) == ("required", "/properties/x")
    assert "unsatisfiable" in str(error)


def test_pattern_properties_apply_to_declared_properties_too():
    out = normal({"type": "object", "properties": {"a1": {"type": "integer"}, "b": {"type": "string"}},
                  "patternProperties": {"^a": {"minimum": 0, "maximum": 9}}})
    assert out["properties"]["a1"] == {"type": "integer", "minimum": 0, "maximum": 9}
    error = refusal({"type": "object", "required": ["stages"], "properties": {"stages": {"type": "array"}},
                     "patternProperties": {"^[a-z]+$": {"type": "object"}}})
    assert error.keyword == "required" and "unsatisfiable" in str(error)


# ---- allOf ---------------------------------------------------------------------------------
def test_all_of_merges_properties_and_required_and_intersects_ranges():
    schema = {"allOf": [
        {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}}, "required": ["a"]},
        {"type": "object", "properties": {"a": {"maximum": 10}, "b": {"type": "string", "maxLength": 5}},
         "required": ["b"]},
        {"properties": {"b": {"minLength": 2}}},
    ]}
    out = normal(schema)
    assert out["required"] == ["a", "b"]
    assert out["properties"]["a"] == {"type": "integer", "minimum": 0, "maximum": 10}
    assert out["properties"]["b"] == {"type": "string", "minLength": 2, "maxLength": 5}


def test_all_of_with_disjoint_types_is_unsatisfiable():
    error = refusal({"allOf": [{"type": "string"}, {"type": "integer"}]})
    assert error.keyword == "type" and "unsatisfiable" in str(error)


def test_all_of_with_two_patterns_is_refused_as_not_exact():
    error = refusal({"allOf": [{"type": "string", "pattern": "^a+$"}, {"type": "string", "pattern": "^.{2}$"}]})
    assert (error.keyword, error.pointer) == ("pattern", "/")


def test_all_of_additional_properties_false_meets_other_properties():
    schema = {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False},
                        {"properties": {"b": {"type": "string"}}}]}
    # b is forbidden by the first subschema, and not required: it is left out
    assert normal(schema) == {"type": "object", "properties": {"a": {"type": "integer"}},
                              "additionalProperties": False}


# ---- anyOf / oneOf / enum --------------------------------------------------------------------
def test_any_of_siblings_are_pushed_into_its_branches():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
              "anyOf": [{"required": ["a"]}, {"required": ["b"]}]}
    out = normal(schema)
    assert [b["required"] for b in out["anyOf"]] == [["a"], ["b"]]
    assert all(b["properties"] == schema["properties"] for b in out["anyOf"])


def test_one_of_with_a_const_tag_in_each_branch_is_enforced_as_any_of():
    schema = {"type": "object", "oneOf": [
        {"properties": {"kind": {"const": "a"}, "x": {"type": "integer"}}, "required": ["kind"]},
        {"properties": {"kind": {"const": "b"}, "y": {"type": "string"}}, "required": ["kind"]}]}
    assert len(normal(schema)["anyOf"]) == 2


def test_one_of_mutually_exclusive_keys_of_a_closed_object_is_exact():
    schema = {"type": "object", "additionalProperties": False,
              "properties": {"uses": {"type": "string"}, "run": {"type": "string"}, "name": {"type": "string"}},
              "oneOf": [{"required": ["uses"]}, {"required": ["run"]}]}
    result = normalise_json_schema(schema, XGRAMMAR_SUPPORT)
    assert result.exact
    assert [sorted(b["properties"]) for b in result.schema["anyOf"]] == [["name", "uses"], ["name", "run"]]
    assert refusal({**schema, "additionalProperties": True}).keyword == "oneOf"


def test_enum_is_filtered_by_its_siblings():
    assert normal({"type": "string", "enum": ["a", "bb", "ccc", 4], "maxLength": 2}) == {"enum": ["a", "bb"]}
    assert normal({"enum": [1, 20], "maximum": 5}) == {"const": 1}


def test_type_list_becomes_one_branch_per_type():
    assert normal({"type": ["string", "null"], "maxLength": 3}) == {
        "anyOf": [{"type": "string", "maxLength": 3}, {"type": "null"}]}


# ---- patterns ------------------------------------------------------------------------------
def test_anchored_alternatives_are_rewritten():
    result = normalise_json_schema({"type": "string", "pattern": "^a$|^b$"}, XGRAMMAR_SUPPORT)
    assert result.schema["pattern"] == "^(?:a|b)$" and result.exact


def test_pattern_and_lengths_are_folded_into_one_pattern():
    out = normal({"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63})
    assert set(out) == {"type", "pattern"}
    assert accepts(out, "a" * 63) and not accepts(out, "a" * 64) and not accepts(out, "-a")


@pytest.mark.parametrize("pattern", ["(?=a)a", r"\bword", "a^b", "(a)\\1"])
def test_pattern_the_backends_cannot_enforce_is_refused_by_pointer(pattern):
    error = refusal({"type": "object", "properties": {"p": {"type": "string", "pattern": pattern}}})
    assert (error.keyword, error.pointer) == ("pattern", "/properties/p")


# ---- numbers -------------------------------------------------------------------------------
def test_integer_bound_past_64_bits_is_clamped():
    assert normal({"type": "integer", "minimum": 0, "maximum": 2 ** 64}) == {
        "type": "integer", "minimum": 0, "maximum": LARGEST}


def test_integer_bounds_beyond_64_bits_are_refused_in_plain_words():
    error = refusal({"type": "integer", "minimum": 2 ** 70})
    assert error.keyword == "minimum" and "64-bit" in str(error)


def test_integer_multiple_of_beside_a_wide_range_is_spelled_out_or_refused():
    # xgrammar drops a multipleOf beside a range wider than ~5000 or a one-sided one
    assert normal({"type": "integer", "multipleOf": 3, "minimum": 0, "maximum": 30})["multipleOf"] == 3
    assert normal({"type": "integer", "multipleOf": 1000, "minimum": 0, "maximum": 100000}) == {
        "enum": list(range(0, 100001, 1000))}
    assert refusal({"type": "integer", "multipleOf": 5, "minimum": 0}).keyword == "multipleOf"
    assert normal({"type": "integer", "multipleOf": 5}) == {"type": "integer", "multipleOf": 5}


def test_min_properties_beyond_the_declared_ones_allows_undeclared_ones():
    assert normal({"type": "object", "minProperties": 1}) == {
        "type": "object", "additionalProperties": {}, "minProperties": 1}


def test_one_sided_number_range_gets_its_far_side():
    assert normal({"type": "number", "exclusiveMinimum": 0}) == {
        "type": "number", "exclusiveMinimum": 0, "maximum": LARGEST}
    assert normal({"type": "number"}) == {"type": "number"}  # digits bounded by the backend's rule


def test_draft4_boolean_exclusive_bounds_are_read_as_draft4():
    schema = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer",
              "minimum": 0, "exclusiveMinimum": True, "maximum": 9}
    assert normal(schema) == {"type": "integer", "minimum": 1, "maximum": 9}


# ---- dependencies ----------------------------------------------------------------------------
CLOSED = {"type": "object", "additionalProperties": False,
          "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "boolean"}}}
EVERY_SUBSET = [{k: v for i, (k, v) in enumerate({"a": 1, "b": "x", "c": True}.items()) if mask >> i & 1}
                for mask in range(8)]


def _agree(original, normal_form):
    reference = validator_class(original)(original)
    return [value for value in EVERY_SUBSET if reference.is_valid(value) != accepts(normal_form, value)]


@pytest.mark.parametrize("keyword,value", [
    ("dependentRequired", {"a": ["b"], "c": ["a", "b"]}),
    ("dependentSchemas", {"a": {"required": ["b"]}, "c": {"properties": {"a": {"maximum": 0}}}}),
])
def test_dependent_keywords_on_a_closed_object_are_rewritten_exactly(keyword, value):
    schema = {**CLOSED, keyword: value}
    result = normalise_json_schema(schema, XGRAMMAR_SUPPORT)
    assert _agree(schema, result.schema) == []
    assert all(note.exact for note in result.notes if note.keyword == keyword)


@pytest.mark.parametrize("value", [{"a": ["b"]}, {"a": {"required": ["c"]}}])
def test_draft07_dependencies_in_either_form_are_rewritten_exactly(value):
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", **CLOSED, "dependencies": value}
    result = normalise_json_schema(schema, XGRAMMAR_SUPPORT)
    assert _agree(schema, result.schema) == []
    assert [n.exact for n in result.notes if n.keyword == "dependencies"] == [True]


def test_dependencies_on_an_open_object_admit_only_declared_properties_and_say_so():
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "loop": {"type": "array"}},
              "dependencies": {"loop": ["name"]}}
    result = normalise_json_schema(schema, XGRAMMAR_SUPPORT)
    assert accepts(result.schema, {"loop": [], "name": "x"}) and accepts(result.schema, {"name": "x"})
    assert not accepts(result.schema, {"loop": []})
    assert [n.exact for n in result.notes if n.keyword == "dependencies"] == [False]


def test_a_dependency_on_a_required_property_only_adds_its_requirement():
    schema = {**CLOSED, "required": ["a"], "dependentRequired": {"a": ["c"]}}
    assert normal(schema) == normal({**CLOSED, "required": ["a", "c"]})


# ---- what stays refused --------------------------------------------------------------------
@pytest.mark.parametrize("schema,keyword,pointer", [
    ({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": {"type": "integer"},
      "dependencies": {"a": ["b"]}}, "dependencies", "/"),
    ({"type": "object", "properties": {"l": {"type": "array", "uniqueItems": True}}}, "uniqueItems", "/properties/l"),
    ({"oneOf": [{"type": "integer"}, {"type": "integer", "minimum": 3}]}, "oneOf", "/"),
    ({"type": "object", "properties": {"x": {"type": "number", "multipleOf": 0.5}}}, "multipleOf", "/properties/x"),
    ({"type": "object", "properties": {"x": False}}, "properties", "/"),
    ({"not": {"type": "string"}}, "not", "/"),
    ({"type": "integer", "minimum": "five"}, "type", "/minimum"),
])
def test_refusal_names_keyword_and_pointer(schema, keyword, pointer):
    error = refusal(schema)
    assert (error.keyword, error.pointer) == (keyword, pointer)
    assert str(error).startswith("json_schema: ") and str(error).endswith(f"at {pointer}")


def test_outlines_core_refuses_what_it_would_drop():
    assert refusal({"type": "object", "minProperties": 1}, OUTLINES_SUPPORT).keyword == "minProperties"
    error = refusal({"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "integer"},
                     "minItems": 2}, OUTLINES_SUPPORT)
    assert error.keyword == "minItems"


# ---- $ref siblings follow the schema's draft ---------------------------------------------------
DATOS = {"datos": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}


@pytest.mark.parametrize("draft", ["http://json-schema.org/draft-04/schema#", "http://json-schema.org/draft-06/schema#",
                                   "http://json-schema.org/draft-07/schema#"])
def test_drafts_before_2019_ignore_the_siblings_of_a_ref(draft):
    schema = {"$schema": draft, "definitions": DATOS, "type": "object",
              "properties": {"d": {"type": "string", "$ref": "#/definitions/datos"}}, "required": ["d"]}
    result = normalise_json_schema(schema, XGRAMMAR_SUPPORT)
    assert result.exact
    assert accepts(result.schema, {"d": {"n": 1}}) and not accepts(result.schema, {"d": "text"})


def test_with_no_draft_named_compatible_ref_siblings_still_merge():
    schema = {"definitions": DATOS, "$ref": "#/definitions/datos", "maxProperties": 1}
    out = normal(schema)
    assert out["maxProperties"] == 1 and out["required"] == ["n"]


@pytest.mark.parametrize("named", [{}, {"$schema": "https://json-schema.org/draft/2020-12/schema"}])
def test_a_ref_sibling_that_nothing_could_satisfy_is_dropped_never_refused(named):
    schema = {**named, "definitions": DATOS, "type": "object",
              "properties": {"d": {"type": "string", "$ref": "#/definitions/datos"}}}
    result = normalise_json_schema(schema, XGRAMMAR_SUPPORT)
    assert not result.exact and any(n.keyword == "$ref" and "dropped" in n.action for n in result.notes)
    assert accepts(result.schema, {"d": {"n": 1}}) and not accepts(result.schema, {"d": "text"})


# ---- oneOf is exact as anyOf where no value can match two branches ------------------------------
def obj(props: dict, required: list, closed: bool = False) -> dict:
    return {"type": "object", "properties": props, "required": required, **({"additionalProperties": False} if closed else {})}


@pytest.mark.parametrize("branches", [
    [{"enum": ["a", "b"]}, {"enum": ["c"]}],                                          # disjoint values
    [{"const": True}, {"const": 1}],                                                  # true is not 1
    [obj({"kind": {"enum": ["x", "y"]}, "n": {"type": "integer"}}, ["kind", "n"]),
     obj({"kind": {"enum": ["z"]}, "s": {"type": "string"}}, ["kind"])],              # an enum tag
    [obj({"a": {"type": "string"}}, ["a"], closed=True), obj({"b": {"type": "string"}}, ["b"], closed=True)],
    [obj({"a": {"type": "string"}}, ["a"], closed=True), obj({"b": {"type": "string"}}, ["b"])],
], ids=["enum", "true-vs-1", "enum-tag", "closed-objects", "key-the-other-forbids"])
def test_one_of_with_pairwise_disjoint_branches_is_accepted_exactly(branches):
    result = normalise_json_schema({"oneOf": branches}, XGRAMMAR_SUPPORT)
    assert result.exact


@pytest.mark.parametrize("branches", [
    [{"enum": ["a", "b"]}, {"enum": ["b", "c"]}],
    [{"const": 1}, {"const": 1.0}],
    [obj({}, ["a"]), obj({}, ["b"])],                                                 # {a, b} matches both
    [obj({"kind": {"enum": ["x", "y"]}}, ["kind"]), obj({"kind": {"enum": ["y"]}}, ["kind"])],
], ids=["shared-value", "1-is-1.0", "open-objects", "shared-tag"])
def test_one_of_whose_branches_may_overlap_is_still_refused(branches):
    assert refusal({"oneOf": branches}).keyword == "oneOf"


def test_one_of_branches_are_judged_with_their_parents_keywords():
    # apart, the branches overlap (an object without `kind` matches both); the parent requires `kind`
    schema = {"type": "object", "required": ["kind"], "properties": {"kind": {"type": "string"}},
              "oneOf": [{"properties": {"kind": {"const": "x"}}}, {"properties": {"kind": {"const": "y"}}}]}
    assert normalise_json_schema(schema, XGRAMMAR_SUPPORT).exact
    assert refusal({"oneOf": schema["oneOf"]}).keyword == "oneOf"
