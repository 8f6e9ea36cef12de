"""OpenAI response bodies and stream chunks, built as plain dicts (exactly the fields OpenAI sends)."""
from __future__ import annotations

from typing import Any, Optional


def chat_completion(rid: str, created: int, model: str, choices: list[dict], usage: dict) -> dict[str, Any]:
    return {"id": rid, "object": "chat.completion", "created": created, "model": model,
            "system_fingerprint": None, "choices": choices, "usage": usage}


def chat_choice(index: int, content: Optional[str], tool_calls: list[dict], finish_reason: str,
                logprobs: Optional[dict], reasoning: Optional[str] = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    if reasoning:   # vLLM's field for a reasoning model's thinking, never part of content
        message["reasoning_content"] = reasoning
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}


def chat_chunk(rid: str, created: int, model: str, index: int, delta: dict, finish_reason: Optional[str] = None,
               logprobs: Optional[dict] = None, with_usage_field: bool = False) -> dict[str, Any]:
    chunk = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
             "system_fingerprint": None,
             "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}]}
    if with_usage_field:
        chunk["usage"] = None
    return chunk


def usage_chunk(rid: str, created: int, model: str, obj: str, usage: dict) -> dict[str, Any]:
    """The last chunk with stream_options.include_usage: no choices, the request's usage."""
    return {"id": rid, "object": obj, "created": created, "model": model, "system_fingerprint": None,
            "choices": [], "usage": usage}


def completion(rid: str, created: int, model: str, choices: list[dict], usage: dict) -> dict[str, Any]:
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "system_fingerprint": None, "choices": choices, "usage": usage}


def completion_choice(index: int, text: str, finish_reason: Optional[str], logprobs: Optional[dict]) -> dict:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


def completion_chunk(rid: str, created: int, model: str, index: int, text: str, finish_reason: Optional[str] = None,
                     logprobs: Optional[dict] = None, with_usage_field: bool = False) -> dict[str, Any]:
    chunk = {"id": rid, "object": "text_completion", "created": created, "model": model,
             "system_fingerprint": None, "choices": [completion_choice(index, text, finish_reason, logprobs)]}
    if with_usage_field:
        chunk["usage"] = None
    return chunk


def model_card(model_id: str, created: int, max_model_len: int) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": created, "owned_by": "radixserve",
            "max_model_len": max_model_len}
