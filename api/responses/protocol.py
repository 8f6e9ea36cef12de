"""`POST /v1/responses` request body as pydantic models, strict like api/openai/protocol.py: unknown
fields are refused, types are not coerced, and the JSON Schema served in /openapi.json states
what is enforced.

Input items accept exactly the fields this server puts in its own output items (and OpenAI's
optional ones that carry no meaning here: `id`, `status`, `annotations`, `logprobs`), so a
client may send a previous response's output back as input, as agent frameworks do.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import ConfigDict, Discriminator, Field, Tag, field_validator

from radixserve.api.openai.protocol import (MAX_STOP_STRINGS, MAX_TEMPERATURE, CacheSalt, FunctionDefinition, Int,
                                     JsonSchema, PromptCacheKey, PromptCacheRetention, StopString, TokenBudget,
                                     _Strict, schema_only)

ItemStatus = Literal["in_progress", "completed", "incomplete"]
JsonText = Annotated[str, schema_only(contentMediaType="application/json")]


# ---- input items -----------------------------------------------------------------------------
class InputText(_Strict):
    type: Literal["input_text"]
    text: str


class OutputText(_Strict):
    """A previous answer's text, sent back; annotations and logprobs are accepted and ignored."""
    type: Literal["output_text"]
    text: str
    annotations: Optional[list[Any]] = None
    logprobs: Optional[list[Any]] = None


def _by_type(tags: dict[str, str], default: str):
    """A discriminator reading `type` into a hyphenated tag: api/errors.py leaves such tags out of
    the field path it reports (`input[0].role`, not `input[0].message.role`). An unknown type
    goes to `default`, whose model then names the field and the types it takes."""
    def tag(value: Any) -> str:
        kind = value.get("type", default) if isinstance(value, dict) else getattr(value, "type", default)
        return tags.get(kind, default) if isinstance(kind, str) else default
    return Discriminator(tag)


ContentPart = Annotated[Union[Annotated[InputText, Tag("input-text")], Annotated[OutputText, Tag("output-text")]],
                        _by_type({"input_text": "input-text", "output_text": "output-text"}, "input-text")]


def _joined(content: Union[list[Any], str]) -> str:
    """A string, or text parts joined by newlines."""
    return content if isinstance(content, str) else "\n".join(part.text for part in content)


class MessageItem(_Strict):
    """A message; `type` may be left out (OpenAI's "easy input message")."""
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Union[list[ContentPart], str]   # list first: its errors are the ones reported
    id: Optional[str] = None
    status: Optional[ItemStatus] = None

    @property
    def text(self) -> str:
        return _joined(self.content)


class FunctionCallItem(_Strict):
    """A tool call the model made earlier: `call_id` pairs it with its output."""
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: JsonText
    id: Optional[str] = None
    status: Optional[ItemStatus] = None


class FunctionCallOutputItem(_Strict):
    type: Literal["function_call_output"]
    call_id: str
    output: Union[list[InputText], str]
    id: Optional[str] = None
    status: Optional[ItemStatus] = None

    @property
    def text(self) -> str:
        return _joined(self.output)


# A message may leave out its type, so an item without one is a message.
InputItem = Annotated[Union[Annotated[MessageItem, Tag("message-item")],
                            Annotated[FunctionCallItem, Tag("function-call")],
                            Annotated[FunctionCallOutputItem, Tag("function-call-output")]],
                      _by_type({"message": "message-item", "function_call": "function-call",
                                "function_call_output": "function-call-output"}, "message-item")]


# ---- tools and text format -------------------------------------------------------------------
class FunctionTool(_Strict):
    """Responses spell a function tool flat: name and parameters beside `type`."""
    type: Literal["function"]
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None

    def as_chat_function(self) -> FunctionDefinition:
        kw: dict[str, Any] = {"name": self.name, "description": self.description, "strict": self.strict}
        if self.parameters is not None:
            kw["parameters"] = self.parameters
        return FunctionDefinition(**kw)


class NamedFunctionChoice(_Strict):
    type: Literal["function"]
    name: str


ToolChoice = Union[Literal["none", "auto", "required"], NamedFunctionChoice]


class TextFormatText(_Strict):
    type: Literal["text"]


class TextFormatJsonObject(_Strict):
    type: Literal["json_object"]


class TextFormatJsonSchema(_Strict):
    type: Literal["json_schema"]
    name: str
    schema_: JsonSchema = Field(alias="schema")
    description: Optional[str] = None
    strict: Optional[bool] = None


TextFormat = Annotated[Union[Annotated[TextFormatText, Tag("text-format")],
                             Annotated[TextFormatJsonObject, Tag("json-object")],
                             Annotated[TextFormatJsonSchema, Tag("json-schema")]],
                       _by_type({"text": "text-format", "json_object": "json-object", "json_schema": "json-schema"},
                                "text-format")]


class TextConfig(_Strict):
    format: Optional[TextFormat] = None


# ---- the request -----------------------------------------------------------------------------
def _tool_choice_needs_tools(schema: dict[str, Any]) -> None:
    # api/openai/tools.py plan_tools: a tool_choice other than none needs tools
    schema["allOf"] = [
        {"if": {"required": ["tool_choice"], "properties": {"tool_choice": {"not": {"enum": [None, "none"]}}}},
         "then": {"required": ["tools"], "properties": {"tools": {"type": "array", "minItems": 1}}}},
    ]


class ResponsesRequest(_Strict):
    model_config = ConfigDict(json_schema_extra=_tool_choice_needs_tools)

    model: Optional[str] = None
    input: Union[Annotated[list[InputItem], Field(min_length=1)], str]
    instructions: Optional[str] = None
    previous_response_id: Optional[str] = None
    store: bool = True
    stream: bool = False
    max_output_tokens: Optional[TokenBudget] = None
    temperature: Optional[Annotated[float, Field(ge=0.0, json_schema_extra={"maximum": MAX_TEMPERATURE})]] = None
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    seed: Optional[Int] = None
    stop: Optional[Union[StopString, Annotated[list[StopString], schema_only(maxItems=MAX_STOP_STRINGS)]]] = None
    tools: Optional[list[FunctionTool]] = None
    tool_choice: Optional[ToolChoice] = None
    parallel_tool_calls: Optional[bool] = None
    text: Optional[TextConfig] = None
    metadata: Optional[dict[str, str]] = None
    user: Optional[str] = None
    cache_salt: Optional[CacheSalt] = None
    prompt_cache_key: Optional[PromptCacheKey] = None
    prompt_cache_retention: Optional[PromptCacheRetention] = None
    # Extra output this server cannot add (logprobs, encrypted reasoning...); clients such as the
    # Agents SDK always send the field, mostly empty.
    include: Optional[Annotated[list[str], schema_only(maxItems=0)]] = None
    # "auto" would drop the start of a conversation that outgrows the context: refused instead.
    truncation: Optional[Literal["disabled"]] = None

    @field_validator("include")
    @classmethod
    def _nothing_included(cls, value: Optional[list[str]]) -> Optional[list[str]]:
        if value:
            raise ValueError(f"{value[0]!r} is not supported by this server (it adds no extra output)")
        return value
