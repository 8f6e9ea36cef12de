"""One Responses turn as the chat machinery's inputs: the conversation (a previous response's, then
`input`) as chat messages, a ChatCompletionRequest carrying the sampling, tool and format fields,
and the prompt token ids.

The prompt of a turn that continues a stored response starts with exactly the token ids the
engine computed for the previous turn (prompt + output), so the radix tree's copy of that KV is
reused; only the text after it is tokenised anew. That holds whenever the rendered conversation
starts with the previous turn's text (the chat template renders the assistant's answer verbatim);
otherwise the whole prompt is tokenised, and the tree still reuses whatever prefix matches.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from pydantic import ValidationError

from radixserve.api.openai.chat_prompt import render_chat_prompt
from radixserve.api.openai.tool_formats import FORMATS, ToolFormat
from radixserve.api.errors import APIError, bad_request
from radixserve.api.openai.protocol import (AssistantToolCall, ChatCompletionRequest, ChatMessage, FunctionCall,
                                     NamedFunction, NamedToolChoice, ResponseFormat, JsonSchemaFormat,
                                     ToolDefinition)
from radixserve.api.responses.store import ResponseStore, StoredResponse
from radixserve.api.responses.protocol import (FunctionCallItem, FunctionCallOutputItem, MessageItem,
                                               NamedFunctionChoice, ResponsesRequest, TextFormatJsonObject,
                                               TextFormatJsonSchema)
from radixserve.runtime.tokenizer import Tokenizer

# Chat field names in errors, as the Responses request names them.
RENAMES = {"response_format": "text.format", "max_tokens": "max_output_tokens", "messages": "input",
           "messages.tool_calls": "input", "prompt": "input"}


@dataclass
class Turn:
    chat: ChatCompletionRequest          # sampling, tools and format, as chat completions take them
    history: list[ChatMessage]           # the conversation before this turn's output, instructions left out
    previous: Optional[StoredResponse]


def build_turn(req: ResponsesRequest, store: ResponseStore) -> Turn:
    previous = store.get(req.previous_response_id, "previous_response_id") if req.previous_response_id else None
    history = (list(previous.messages) if previous else []) + input_messages(req)
    system = [ChatMessage(role="system", content=req.instructions)] if req.instructions is not None else []
    try:
        chat = ChatCompletionRequest(
            model=req.model, messages=system + history, max_tokens=req.max_output_tokens,
            temperature=req.temperature, top_p=req.top_p, seed=req.seed, stop=req.stop,
            tools=[ToolDefinition(function=t.as_chat_function()) for t in req.tools] if req.tools else None,
            tool_choice=_tool_choice(req.tool_choice), parallel_tool_calls=req.parallel_tool_calls,
            response_format=_response_format(req), cache_salt=req.cache_salt,
            prompt_cache_key=req.prompt_cache_key, prompt_cache_retention=req.prompt_cache_retention)
    except ValidationError as e:  # the Responses model already checked these; kept as a 400, never a 500
        raise bad_request(f"input: {e.errors()[0]['msg']}", param="input") from None
    return Turn(chat, history, previous)


def renamed(error: APIError) -> APIError:
    """A chat-path error naming a chat field, renamed to the Responses field."""
    if error.param in RENAMES:
        new = RENAMES[error.param]
        error.message = error.message.replace(error.param, new, 1)
        error.param = new
    return error


def input_messages(req: ResponsesRequest) -> list[ChatMessage]:
    """`input` as chat messages: consecutive function_call items become one assistant message
    with tool_calls (joined to the assistant text right before them), outputs become tool messages."""
    if isinstance(req.input, str):
        return [ChatMessage(role="user", content=req.input)]
    out: list[ChatMessage] = []
    for item in req.input:
        if isinstance(item, MessageItem):
            out.append(ChatMessage(role=item.role, content=item.text))
        elif isinstance(item, FunctionCallItem):
            call = AssistantToolCall(id=item.call_id, function=FunctionCall(name=item.name, arguments=item.arguments))
            last = out[-1] if out else None
            if last is not None and last.role == "assistant":
                last.tool_calls = (last.tool_calls or []) + [call]
            else:
                out.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))
        elif isinstance(item, FunctionCallOutputItem):
            out.append(ChatMessage(role="tool", content=item.text, tool_call_id=item.call_id))
    return out


def output_messages(items: list[dict[str, Any]]) -> list[ChatMessage]:
    """The output items of a finished turn as the assistant message the next turn renders."""
    text = "".join(p["text"] for item in items if item["type"] == "message" for p in item["content"])
    calls = [AssistantToolCall(id=item["call_id"], function=FunctionCall(name=item["name"],
                                                                         arguments=item["arguments"]))
             for item in items if item["type"] == "function_call" and item["status"] == "completed"]
    return [ChatMessage(role="assistant", content=text if text or not calls else None, tool_calls=calls or None)]


def prompt_ids(tokenizer: Tokenizer, messages: list[ChatMessage], template_tools: Optional[list[dict[str, Any]]],
               previous: Optional[StoredResponse], fmt: ToolFormat = FORMATS["hermes"]) -> tuple[str, list[int]]:
    """The rendered prompt and its token ids, starting with the previous turn's own ids when the
    text allows it."""
    text = render_chat_prompt(tokenizer, messages, template_tools, fmt=fmt)
    if previous is not None and text.startswith(previous.text):
        return text, previous.token_ids + tokenizer.encode(text[len(previous.text):], add_special_tokens=False)
    return text, tokenizer.encode(text)


def _tool_choice(choice):
    if isinstance(choice, NamedFunctionChoice):
        return NamedToolChoice(function=NamedFunction(name=choice.name))
    return choice


def _response_format(req: ResponsesRequest) -> Optional[ResponseFormat]:
    fmt = req.text.format if req.text is not None else None
    if isinstance(fmt, TextFormatJsonObject):
        return ResponseFormat(type="json_object")
    if isinstance(fmt, TextFormatJsonSchema):
        return ResponseFormat(type="json_schema", json_schema=JsonSchemaFormat(
            name=fmt.name, description=fmt.description, schema=fmt.schema_, strict=fmt.strict))
    return None
