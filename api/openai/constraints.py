"""Every structured-output spelling a request may use, mapped onto one `GrammarSpec`.

OpenAI `response_format`, vLLM `structured_outputs` and `guided_*`, SGLang top-level `regex` /
`ebnf` / `json_schema`: a request may use one of them; two is a 400, never a silent choice.
"""
from __future__ import annotations

import json
from functools import partial
from typing import Any, Callable, Optional

from radixserve.api.errors import RequestFields, bad_request, refusal_error
from radixserve.api.openai.protocol import GenerationRequest
from radixserve.grammar.spec import GrammarError, GrammarSpec
from radixserve.runtime.engine_client import EngineRefusal

Builder = Callable[[], GrammarSpec]


def _response_format(req: GenerationRequest) -> Optional[Builder]:
    rf = req.response_format
    if rf is None or rf.type == "text":
        return None
    if rf.type == "json_object":
        return GrammarSpec.json_object
    if rf.json_schema is None or rf.json_schema.schema_ is None:
        raise bad_request("response_format.json_schema.schema: required when type is json_schema",
                          param="response_format.json_schema")
    schema = rf.json_schema.schema_
    return lambda: GrammarSpec.json_schema(schema)  # strict or not, the schema is always enforced


def _structured_outputs(req: GenerationRequest) -> Optional[Builder]:
    so = req.structured_outputs
    if so is None:
        return None
    builders: dict[str, Builder] = {}
    if so.json_ is not None:
        builders["json"] = lambda: GrammarSpec.json_schema(so.json_)
    if so.regex is not None:
        builders["regex"] = lambda: GrammarSpec.regex(so.regex)
    if so.choice is not None:
        builders["choice"] = lambda: GrammarSpec.choice(so.choice)
    if so.grammar is not None:
        builders["grammar"] = lambda: GrammarSpec.ebnf(so.grammar)
    if so.json_object:
        builders["json_object"] = GrammarSpec.json_object
    if so.structural_tag is not None:
        builders["structural_tag"] = lambda: GrammarSpec.structural_tag(_parse_tag(so.structural_tag))
    if len(builders) > 1:
        raise bad_request(f"structured_outputs: set only one of {', '.join(sorted(builders))}",
                          param="structured_outputs")
    return next(iter(builders.values()), None)


def _parse_tag(payload):
    if isinstance(payload, str):
        try:
            return json.loads(payload)
        except json.JSONDecodeError as e:
            raise GrammarError(f"structural_tag: not valid JSON: {e}") from None
    return payload


# SGLang's and vLLM's top-level constraint fields, and the kind of grammar each one holds
_TOP_LEVEL_FIELDS: dict[str, Callable[[Any], GrammarSpec]] = {
    "regex": GrammarSpec.regex, "ebnf": GrammarSpec.ebnf, "json_schema": GrammarSpec.json_schema,
    "guided_json": GrammarSpec.json_schema, "guided_regex": GrammarSpec.regex,
    "guided_choice": GrammarSpec.choice, "guided_grammar": GrammarSpec.ebnf,
}


def _top_level(req: GenerationRequest) -> dict[str, Builder]:
    """The top-level constraint fields that are set, by field name."""
    return {name: partial(build, getattr(req, name)) for name, build in _TOP_LEVEL_FIELDS.items()
            if getattr(req, name) is not None}


def request_constraint(req: GenerationRequest,
                       extra: Optional[tuple[str, Builder]] = None) -> tuple[Optional[GrammarSpec], Optional[str]]:
    """The request's one constraint and the field it came from (or (None, None)). `extra` is a
    constraint from elsewhere in the request (tools) that counts against the one allowed."""
    found: dict[str, Builder] = {}
    for name, make in (("response_format", _response_format), ("structured_outputs", _structured_outputs)):
        builder = make(req)
        if builder is not None:
            found[name] = builder
    found.update(_top_level(req))
    if extra is not None:
        found[extra[0]] = extra[1]
    if not found:
        return None, None
    if len(found) > 1:
        names = sorted(found)
        raise bad_request(f"{names[1]}: only one structured-output constraint per request "
                          f"(got {', '.join(names)})", param=names[1], code="conflicting_constraints")
    field, build = next(iter(found.items()))
    try:
        return build(), field
    except GrammarError as e:  # as the engine would refuse it: one mapping for both
        raise refusal_error(EngineRefusal.of_grammar(e), RequestFields(constraint=field)) from None

