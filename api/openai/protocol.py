"""OpenAI request bodies as pydantic models, with the vLLM / SGLang extras their users send.

Unknown fields are refused (400 naming the field) rather than ignored: a constraint or sampling
option this server does not know must never be dropped silently. Types are strict: `"5"` is not an
integer and `1` is not a boolean, as the OpenAPI document says. Ranges that OpenAI documents are
checked here; the rest (e.g. the temperature ceiling, stop token ids) by `SamplingParams.validate`.

The JSON Schema of each model (served in /openapi.json) states every constraint the server
enforces, including those checked further down the line: `schema_only(...)` adds a keyword to the
schema and leaves the check (and its wording) where it was. Limits that depend on the loaded model
carry a `MODEL_LIMIT` marker that api/shell/openapi.py turns into a `maximum` once the model is known.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, field_validator, model_validator
from pydantic_core import PydanticCustomError

from radixserve.runtime.sampling_params import MAX_CACHE_SALT

MAX_N = 128
MAX_TOP_LOGPROBS = 20
MAX_TEMPERATURE = 100.0       # SamplingParams.validate's ceilings
MAX_REPETITION_PENALTY = 10.0
MAX_STOP_STRINGS = 16

# JSON Schema keyword naming a limit of the loaded model: "vocab_size" (a token id is below it) or
# "max_new_tokens" (what the context and the KV pool leave after a one-token prompt).
MODEL_LIMIT = "x-model-limit"

JsonSchema = Union[dict[str, Any], bool]

NOT_NULL = {"not": {"type": "null"}}


BODY_FIELD_ERROR = "body_field"


def body_field_error(field: str, message: str) -> PydanticCustomError:
    """A whole-body check's failure naming its field as data (api/errors.py reads `ctx["field"]`)."""
    return PydanticCustomError(BODY_FIELD_ERROR, "{field}: " + message, {"field": field})



def schema_only(**keywords: Any) -> Any:
    """JSON Schema keywords for a constraint that is enforced elsewhere (which words the error)."""
    return Field(json_schema_extra=keywords)


StopString = Annotated[str, schema_only(minLength=1)]
def _whole_number(value: Any) -> Any:
    # JSON Schema counts 2.0 as an integer, and so does the document; strict mode alone would not.
    return int(value) if isinstance(value, float) and value.is_integer() else value


def integer(**constraints: Any) -> Any:
    """An int type with Field constraints that takes 2.0 as 2. (The converter goes outside the
    constraints: wrapped the other way round, pydantic writes them into the schema unconverted.)"""
    return Annotated[int, Field(**constraints), BeforeValidator(_whole_number)]


Int = integer()
TokenId = integer(json_schema_extra={"minimum": 0, MODEL_LIMIT: "vocab_size"})
TokenBudget = integer(ge=1, json_schema_extra={MODEL_LIMIT: "max_new_tokens"})
TopLogprobs = integer(ge=0, le=MAX_TOP_LOGPROBS)
# Regex and grammar text: GrammarSpec refuses an empty or all-blank one before compiling.
GrammarText = Annotated[str, schema_only(pattern=r"\S")]


def _at_most_one(names: list[str], is_set: Optional[dict[str, dict]] = None) -> dict[str, Any]:
    """JSON Schema: no two of these properties are set (a property holding null is not set)."""
    is_set = is_set or {}
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    return {"not": {"anyOf": [{"required": [a, b], "properties": {a: is_set.get(a, NOT_NULL),
                                                                  b: is_set.get(b, NOT_NULL)}}
                              for a, b in pairs]}}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)


# ---- messages --------------------------------------------------------------------------------
class FunctionCall(_Strict):
    name: str
    # JSON text (api/openai/chat_prompt.py refuses any other); a schema can only say so as an annotation.
    arguments: Annotated[str, schema_only(contentMediaType="application/json")] = "{}"


class AssistantToolCall(_Strict):
    id: Optional[str] = None
    type: Literal["function"] = "function"
    function: FunctionCall


# `content`: a string or a list of parts, of which only text parts are supported.
_TEXT_PART = {"type": "object", "title": "TextPart", "required": ["type", "text"],
              "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}
_MESSAGE_CONTENT = {"anyOf": [{"type": "string"},
                              {"type": "array", "items": {"anyOf": [{"type": "string"}, _TEXT_PART]}},
                              {"type": "null"}]}


def _message_roles(schema: dict[str, Any]) -> None:
    """One shape per role: every message needs content, except an assistant message that carries
    tool calls instead (the `_content_or_tool_calls` check)."""
    def needs_content(role: str) -> dict[str, Any]:
        return {"title": f"{role} message", "required": ["role", "content"],
                "properties": {"role": {"const": role}, "content": NOT_NULL}}

    assistant = {"title": "assistant message", "required": ["role"], "properties": {"role": {"const": "assistant"}},
                 "anyOf": [{"required": ["content"], "properties": {"content": NOT_NULL}},
                           {"required": ["tool_calls"], "properties": {"tool_calls": {"type": "array", "minItems": 1}}}]}
    schema["oneOf"] = [needs_content("system"), needs_content("developer"), needs_content("user"), assistant,
                       needs_content("tool")]


class ChatMessage(BaseModel):
    """One message; `content` is normalised to a string (text parts joined) or None."""
    # Other fields are ignored: e.g. `refusal`, `audio` echoed back by clients.
    model_config = ConfigDict(extra="ignore", strict=True, json_schema_extra=_message_roles)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Annotated[Optional[str], WithJsonSchema(_MESSAGE_CONTENT)] = None
    name: Optional[str] = None
    tool_calls: Optional[list[AssistantToolCall]] = None
    tool_call_id: Optional[str] = None

    @field_validator("content", mode="before")
    @classmethod
    def _join_text_parts(cls, value: Any) -> Any:
        if value is None or isinstance(value, str):
            return value
        if not isinstance(value, list):
            raise ValueError("must be a string or a list of text parts")
        texts = []
        for i, part in enumerate(value):
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ValueError(f"part {i} has type {kind!r}; only text parts are supported")
        return "\n".join(texts)

    @model_validator(mode="after")
    def _content_or_tool_calls(self) -> "ChatMessage":
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content is required (only an assistant message with tool_calls may omit it)")
        return self


# ---- tools -----------------------------------------------------------------------------------
class FunctionDefinition(_Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: Optional[str] = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: Optional[bool] = None


class ToolDefinition(_Strict):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"] = "function"
    function: NamedFunction


ToolChoice = Union[Literal["none", "auto", "required"], NamedToolChoice]


# ---- constraints -----------------------------------------------------------------------------
class JsonSchemaFormat(_Strict):
    name: str = "response"
    description: Optional[str] = None
    schema_: Optional[JsonSchema] = Field(default=None, alias="schema")
    strict: Optional[bool] = None


def _json_schema_needs_schema(schema: dict[str, Any]) -> None:
    # api/openai/constraints.py: type json_schema without json_schema.schema is a 400
    schema["anyOf"] = [
        {"properties": {"type": {"enum": ["text", "json_object"]}}},
        {"required": ["json_schema"],
         "properties": {"type": {"const": "json_schema"},
                        "json_schema": {"type": "object", "required": ["schema"],
                                        "properties": {"schema": {"type": ["object", "boolean"]}}}}},
    ]


class ResponseFormat(_Strict):
    model_config = ConfigDict(json_schema_extra=_json_schema_needs_schema)

    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None


class StructuredOutputs(_Strict):
    """vLLM's `structured_outputs`: at most one of these may be set."""
    model_config = ConfigDict(json_schema_extra=lambda schema: schema.update(_at_most_one(
        ["json", "regex", "choice", "grammar", "json_object", "structural_tag"],
        {"json_object": {"const": True}})))

    json_: Optional[Union[JsonSchema, str]] = Field(default=None, alias="json")
    regex: Optional[GrammarText] = None
    choice: Optional[Annotated[list[str], schema_only(minItems=1)]] = None
    grammar: Optional[GrammarText] = None
    json_object: Optional[bool] = None
    structural_tag: Optional[Union[dict[str, Any], str]] = None


# Requests share cached prefixes only with requests of the same salt (vLLM's `cache_salt`).
CacheSalt = Annotated[str, Field(min_length=1, max_length=MAX_CACHE_SALT)]
# OpenAI's: a name for requests that share a prefix (metrics by key; one replica per key), and how
# long a cached prefix is kept: in memory, LRU, or `24h` in the disk tier (needs --cache-dir).
PromptCacheKey = Annotated[str, Field(min_length=1, max_length=MAX_CACHE_SALT)]
PromptCacheRetention = Annotated[Literal["in_memory", "24h"], Field(json_schema_extra={MODEL_LIMIT: "retentions"})]


class StreamOptions(_Strict):
    include_usage: bool = False


# ---- requests --------------------------------------------------------------------------------
class GenerationRequest(_Strict):
    """Fields shared by chat and text completions."""
    model: Optional[str] = None
    max_tokens: Optional[TokenBudget] = None
    temperature: Optional[Annotated[float, Field(ge=0.0, json_schema_extra={"maximum": MAX_TEMPERATURE})]] = None
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    n: integer(ge=1, le=MAX_N) = 1
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    stop: Optional[Union[StopString, Annotated[list[StopString], schema_only(maxItems=MAX_STOP_STRINGS)]]] = None
    seed: Optional[Int] = None
    presence_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: Optional[Annotated[dict[str, float], schema_only(maxProperties=0)]] = None  # see _no_logit_bias
    user: Optional[str] = None
    metadata: Optional[dict[str, Any]] = None
    # vLLM / SGLang sampling extras
    top_k: Optional[integer(ge=-1)] = None
    min_p: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: Optional[Annotated[float, Field(gt=0.0, json_schema_extra={"maximum": MAX_REPETITION_PENALTY})]] = None
    min_tokens: Optional[integer(ge=0)] = None
    ignore_eos: bool = False
    stop_token_ids: Optional[list[TokenId]] = None
    skip_special_tokens: bool = True
    priority: Optional[Int] = None
    # prefix cache controls: vLLM's tenant salt, OpenAI's routing key and retention
    cache_salt: Optional[CacheSalt] = None
    prompt_cache_key: Optional[PromptCacheKey] = None
    prompt_cache_retention: Optional[PromptCacheRetention] = None
    # structured output, every spelling clients use (at most one per request)
    response_format: Optional[ResponseFormat] = None
    structured_outputs: Optional[StructuredOutputs] = None
    regex: Optional[GrammarText] = None
    ebnf: Optional[GrammarText] = None
    json_schema: Optional[Union[str, dict[str, Any]]] = None
    guided_json: Optional[Union[str, JsonSchema]] = None
    guided_regex: Optional[GrammarText] = None
    guided_choice: Optional[Annotated[list[str], schema_only(minItems=1)]] = None
    guided_grammar: Optional[GrammarText] = None

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, value: Optional[dict[str, float]]) -> Optional[dict[str, float]]:
        if value:
            raise ValueError("logit_bias is not supported by this server")
        return value

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


# Template variables the renderer sets itself (runtime/tokenizer.py apply_chat_template).
TEMPLATE_RESERVED = ("messages", "add_generation_prompt", "bos_token", "eos_token")


def _chat_rules(schema: dict[str, Any]) -> None:
    schema["allOf"] = [
        # _top_logprobs_needs_logprobs
        {"if": {"required": ["top_logprobs"], "properties": {"top_logprobs": {"type": "integer", "minimum": 1}}},
         "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}}},
        # api/openai/tools.py plan_tools: a tool_choice other than none needs tools
        {"if": {"required": ["tool_choice"], "properties": {"tool_choice": {"not": {"enum": [None, "none"]}}}},
         "then": {"required": ["tools"], "properties": {"tools": {"type": "array", "minItems": 1}}}},
    ]


class ChatCompletionRequest(GenerationRequest):
    model_config = ConfigDict(json_schema_extra=_chat_rules)

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[TokenBudget] = None
    logprobs: bool = False
    top_logprobs: Optional[TopLogprobs] = None
    tools: Optional[list[ToolDefinition]] = None
    tool_choice: Optional[ToolChoice] = None
    parallel_tool_calls: Optional[bool] = None
    chat_template_kwargs: Optional[Annotated[dict[str, Any], schema_only(
        propertyNames={"not": {"enum": list(TEMPLATE_RESERVED)}})]] = None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _not_reserved(cls, value: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
        taken = sorted(set(value or {}) & set(TEMPLATE_RESERVED))
        if taken:
            raise ValueError(f"{taken[0]!r} is set by the server, not by chat_template_kwargs")
        return value

    @model_validator(mode="after")
    def _top_logprobs_needs_logprobs(self) -> "ChatCompletionRequest":
        if self.top_logprobs and not self.logprobs:
            raise body_field_error("top_logprobs", "requires logprobs to be true")
        return self

    @property
    def requested_max_tokens(self) -> Optional[int]:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def _is_token_id(value: Any) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, float) and value.is_integer())


# Each prompt must come to at least one token (the engine refuses an empty one).
_PromptText = Annotated[str, schema_only(minLength=1)]
_PromptIds = Annotated[list[TokenId], schema_only(minItems=1)]
PromptInput = Union[_PromptText, Annotated[list[_PromptText], schema_only(minItems=1)], _PromptIds,
                    Annotated[list[_PromptIds], schema_only(minItems=1)]]


def _completion_rules(schema: dict[str, Any]) -> None:
    # api/openai/completions.py: echo cannot be combined with logprobs
    schema["not"] = {"required": ["echo", "logprobs"],
                     "properties": {"echo": {"const": True}, "logprobs": {"type": "integer"}}}


class CompletionRequest(GenerationRequest):
    model_config = ConfigDict(json_schema_extra=_completion_rules)

    prompt: PromptInput
    logprobs: Optional[TopLogprobs] = None
    echo: bool = False
    suffix: Optional[Annotated[str, schema_only(maxLength=0)]] = None    # see _no_suffix
    best_of: Optional[integer(json_schema_extra={"const": 1})] = None       # see _best_of_one

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, value: Any) -> Any:
        # Checked by hand: pydantic's union errors would name every branch it tried.
        if isinstance(value, str):
            return value
        if not isinstance(value, list) or not value:
            raise ValueError("must be a string, a list of strings, or a list of token ids (non-empty)")
        if all(isinstance(v, str) for v in value):
            return value
        if all(_is_token_id(v) for v in value):
            return [_whole_number(v) for v in value]
        if all(isinstance(v, list) and v and all(_is_token_id(t) for t in v) for v in value):
            return [[_whole_number(t) for t in v] for v in value]
        raise ValueError("must be a string, a list of strings, a list of token ids or a list of such lists")

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: Optional[str]) -> Optional[str]:
        if value:
            raise ValueError("suffix (fill-in-the-middle) is not supported by this server")
        return value

    @field_validator("best_of")
    @classmethod
    def _best_of_one(cls, value: Optional[int]) -> Optional[int]:
        if value is not None and value != 1:
            raise ValueError("best_of other than 1 is not supported by this server")
        return value

    @property
    def requested_max_tokens(self) -> Optional[int]:
        return self.max_tokens

    def prompts(self) -> list[Union[str, list[int]]]:
        """The prompt as a list of prompts (each text or token ids)."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(v, int) for v in p):
            return [list(p)]
        return list(p)


def _prompt_or_messages(schema: dict[str, Any]) -> None:
    # _one_input: exactly one of them (null counts as absent)
    def only(given: str, absent: str) -> dict[str, Any]:
        return {"title": f"{given} only", "required": [given],
                "properties": {given: NOT_NULL, absent: {"type": "null"}}}

    schema["oneOf"] = [only("prompt", "messages"), only("messages", "prompt")]


class TokenizeRequest(_Strict):
    model_config = ConfigDict(json_schema_extra=_prompt_or_messages)

    prompt: Optional[str] = None
    messages: Optional[list[ChatMessage]] = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True

    @model_validator(mode="after")
    def _one_input(self) -> "TokenizeRequest":
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt or messages")
        return self


class DetokenizeRequest(_Strict):
    tokens: list[TokenId]
