"""OpenAI request bodies as pydantic models, with the vLLM / SGLang extras their users send.

Unknown fields are refused (400 naming the field) rather than ignored: a constraint or sampling
option this server does not know must never be dropped silently. Ranges that OpenAI documents are
checked here; the rest (e.g. the temperature ceiling, stop token ids) by `SamplingParams.validate`.
"""
from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_N = 128
MAX_TOP_LOGPROBS = 20

JsonSchema = Union[dict[str, Any], bool]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


# ---- messages --------------------------------------------------------------------------------
class FunctionCall(_Strict):
    name: str
    arguments: str = "{}"


class AssistantToolCall(_Strict):
    id: Optional[str] = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    """One message; `content` is normalised to a string (text parts joined) or None."""
    model_config = ConfigDict(extra="ignore")  # e.g. `refusal`, `audio` echoed back by clients

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[str] = None
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


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None


class StructuredOutputs(_Strict):
    """vLLM's `structured_outputs`: exactly one of these may be set."""
    json_: Optional[Union[JsonSchema, str]] = Field(default=None, alias="json")
    regex: Optional[str] = None
    choice: Optional[list[str]] = None
    grammar: Optional[str] = None
    json_object: Optional[bool] = None
    structural_tag: Optional[Union[dict[str, Any], str]] = None


class StreamOptions(_Strict):
    include_usage: bool = False


# ---- requests --------------------------------------------------------------------------------
class GenerationRequest(_Strict):
    """Fields shared by chat and text completions."""
    model: Optional[str] = None
    max_tokens: Optional[int] = Field(default=None, ge=1)
    temperature: Optional[float] = Field(default=None, ge=0.0)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    stop: Optional[Union[str, list[str]]] = None
    seed: Optional[int] = None
    presence_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: Optional[dict[str, float]] = None
    user: Optional[str] = None
    metadata: Optional[dict[str, Any]] = None
    # vLLM / SGLang sampling extras
    top_k: Optional[int] = Field(default=None, ge=-1)
    min_p: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: Optional[float] = Field(default=None, gt=0.0)
    min_tokens: Optional[int] = Field(default=None, ge=0)
    ignore_eos: bool = False
    stop_token_ids: Optional[list[int]] = None
    skip_special_tokens: bool = True
    priority: Optional[int] = None
    # structured output, every spelling clients use (at most one per request)
    response_format: Optional[ResponseFormat] = None
    structured_outputs: Optional[StructuredOutputs] = None
    regex: Optional[str] = None
    ebnf: Optional[str] = None
    json_schema: Optional[Union[str, dict[str, Any]]] = None
    guided_json: Optional[Union[str, JsonSchema]] = None
    guided_regex: Optional[str] = None
    guided_choice: Optional[list[str]] = None
    guided_grammar: Optional[str] = None

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, value: Optional[dict[str, float]]) -> Optional[dict[str, float]]:
        if value:
            raise ValueError("logit_bias is not supported by this server")
        return value

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: Optional[list[ToolDefinition]] = None
    tool_choice: Optional[ToolChoice] = None
    parallel_tool_calls: Optional[bool] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None

    @model_validator(mode="after")
    def _top_logprobs_needs_logprobs(self) -> "ChatCompletionRequest":
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs: requires logprobs to be true")
        return self

    @property
    def requested_max_tokens(self) -> Optional[int]:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


PromptInput = Union[str, list[str], list[int], list[list[int]]]


class CompletionRequest(GenerationRequest):
    prompt: PromptInput
    logprobs: Optional[int] = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False
    suffix: Optional[str] = None
    best_of: Optional[int] = None

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
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return value
        if all(isinstance(v, list) and v and all(isinstance(t, int) and not isinstance(t, bool) for t in v)
               for v in value):
            return value
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


class TokenizeRequest(_Strict):
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
    tokens: list[int]
