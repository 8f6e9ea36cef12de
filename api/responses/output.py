"""A generation's text and tool-call events (api/openai/tools.py) as Responses output items, and the
stream events that build them, in OpenAI's documented order:

    response.output_item.added, response.content_part.added, response.output_text.delta ...,
    response.output_text.done, response.content_part.done, response.output_item.done
    (a function_call item: output_item.added, function_call_arguments.delta ...,
    function_call_arguments.done, output_item.done; a reasoning item: output_item.added,
    reasoning_text.delta ..., reasoning_text.done, output_item.done)

Whole and streamed replies run the same builder, so they cannot disagree; a whole reply simply
drops the events. Sequence numbers are the emitter's business (api/responses/routes.py).
"""
from __future__ import annotations

import uuid
from typing import Any, Optional

from radixserve.api.openai.tools import ArgumentsDelta, CallDone, CallStarted, ParserEvent, ReasoningDelta, TextDelta

Event = dict[str, Any]


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class OutputBuilder:
    """Output items in the order the model produced them: a message item per run of text, a
    reasoning item per run of reasoning, a function_call item per call."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self._message: Optional[dict[str, Any]] = None     # the message item still open
        self._text: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}          # parser call index -> its open item
        self._reasoning: Optional[dict[str, Any]] = None   # the reasoning item still open

    # ---- events in ----------------------------------------------------------------------------
    def feed(self, event: ParserEvent) -> list[Event]:
        if isinstance(event, TextDelta):
            return self._text_delta(event.text) if event.text else []
        if isinstance(event, ReasoningDelta):
            return self._reasoning_delta(event.text) if event.text else []
        if isinstance(event, CallStarted):
            return self._call_started(event)
        if isinstance(event, ArgumentsDelta):
            return self._arguments(event)
        if isinstance(event, CallDone):
            return self._call_done(event)
        raise TypeError(f"unknown parser event {event!r}")

    def finish(self, status: str) -> list[Event]:
        """Close what is open (`status` is the response's: completed or incomplete). A reply with
        no output at all still gets an empty message, as OpenAI's does."""
        events = self._close_reasoning(status) + self._close_message(status)
        for index in list(self._calls):  # cut off before the arguments closed
            events += self._close_call(index, status)
        if not self.items:
            events += self._open_message() + self._close_message(status)
        return events

    # ---- results ------------------------------------------------------------------------------
    @property
    def output_text(self) -> str:
        return "".join(part["text"] for item in self.items if item["type"] == "message"
                       for part in item["content"])

    @property
    def has_calls(self) -> bool:
        return any(item["type"] == "function_call" for item in self.items)

    # ---- message items ------------------------------------------------------------------------
    def _open_message(self) -> list[Event]:
        self._message = {"id": new_id("msg"), "type": "message", "status": "in_progress", "role": "assistant",
                         "content": []}
        self._text = []
        self.items.append(self._message)
        where = self._where(self._message)
        return [{"type": "response.output_item.added", "output_index": where["output_index"],
                 "item": _copy(self._message)},
                {"type": "response.content_part.added", **where, "content_index": 0, "part": _text_part("")}]

    def _text_delta(self, text: str) -> list[Event]:
        events = self._close_reasoning("completed")
        events += [] if self._message is not None else self._open_message()
        self._text.append(text)
        return events + [{"type": "response.output_text.delta", **self._where(self._message), "content_index": 0,
                          "delta": text, "logprobs": []}]

    def _close_message(self, status: str) -> list[Event]:
        if self._message is None:
            return []
        message, text = self._message, "".join(self._text)
        self._message = None
        message["content"] = [_text_part(text)]
        message["status"] = status
        where = self._where(message)
        return [{"type": "response.output_text.done", **where, "content_index": 0, "text": text, "logprobs": []},
                {"type": "response.content_part.done", **where, "content_index": 0, "part": _text_part(text)},
                {"type": "response.output_item.done", "output_index": where["output_index"], "item": _copy(message)}]

    # ---- reasoning items ------------------------------------------------------------------------
    def _reasoning_delta(self, text: str) -> list[Event]:
        events = self._close_message("completed")
        if self._reasoning is None:
            self._reasoning = {"id": new_id("rs"), "type": "reasoning", "status": "in_progress", "summary": [],
                               "content": [{"type": "reasoning_text", "text": ""}]}
            self.items.append(self._reasoning)
            events.append({"type": "response.output_item.added", "output_index": len(self.items) - 1,
                           "item": _copy(self._reasoning)})
        self._reasoning["content"][0]["text"] += text
        return events + [{"type": "response.reasoning_text.delta", **self._where(self._reasoning), "content_index": 0,
                          "delta": text}]

    def _close_reasoning(self, status: str) -> list[Event]:
        if self._reasoning is None:
            return []
        item, self._reasoning = self._reasoning, None
        item["status"] = status
        where = self._where(item)
        return [{"type": "response.reasoning_text.done", **where, "content_index": 0,
                 "text": item["content"][0]["text"]},
                {"type": "response.output_item.done", "output_index": where["output_index"], "item": _copy(item)}]

    # ---- function_call items ------------------------------------------------------------------
    def _call_started(self, event: CallStarted) -> list[Event]:
        # text or reasoning before a call is finished
        events = self._close_reasoning("completed") + self._close_message("completed")
        item = {"id": new_id("fc"), "type": "function_call", "status": "in_progress", "call_id": event.id,
                "name": event.name, "arguments": ""}
        self._calls[event.index] = item
        self.items.append(item)
        return events + [{"type": "response.output_item.added", "output_index": len(self.items) - 1,
                          "item": _copy(item)}]

    def _arguments(self, event: ArgumentsDelta) -> list[Event]:
        item = self._calls[event.index]
        item["arguments"] += event.text
        return [{"type": "response.function_call_arguments.delta", **self._where(item), "delta": event.text}]

    def _call_done(self, event: CallDone) -> list[Event]:
        item = self._calls[event.index]
        item["arguments"] = event.call.arguments  # the parser's whole text; equal to the deltas joined
        return self._close_call(event.index, "completed")

    def _close_call(self, index: int, status: str) -> list[Event]:
        item = self._calls.pop(index)
        item["status"] = status
        where = self._where(item)
        return [{"type": "response.function_call_arguments.done", **where, "name": item["name"],
                 "arguments": item["arguments"]},
                {"type": "response.output_item.done", "output_index": where["output_index"], "item": _copy(item)}]

    def _where(self, item: dict[str, Any]) -> dict[str, Any]:
        return {"item_id": item["id"], "output_index": next(i for i, x in enumerate(self.items) if x is item)}


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    """A snapshot: the item keeps changing after the event that carries it is queued."""
    return {k: ([dict(p) for p in v] if isinstance(v, list) else v) for k, v in item.items()}
