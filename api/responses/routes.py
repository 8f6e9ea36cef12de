"""POST /v1/responses (whole or streamed), GET and DELETE /v1/responses/{id}: the router.

A Responses request is translated into the chat machinery (api/responses/turn.py) and runs through
the same tool plan, constraint path, sampling parameters and Generation as chat completions; only
the reply's shape is its own (api/responses/output.py). A finished response with `store` (the
default) is kept in the server's ResponseStore for `previous_response_id` and GET.
"""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any, AsyncIterator, Callable, Optional

from fastapi import APIRouter, Depends, Path
from fastapi.responses import JSONResponse
from starlette.requests import Request
from starlette.responses import Response

from radixserve.api.errors import APIError, RequestFields, allow_only
from radixserve.api.openai.chat import chat_inputs
from radixserve.api.openai.generation import Generation
from radixserve.api.responses.store import StoredResponse
from radixserve.api.responses.output import Event, OutputBuilder, new_id
from radixserve.api.responses.protocol import ResponsesRequest
from radixserve.api.responses.turn import RENAMES, Turn, build_turn, output_messages, prompt_ids, renamed
from radixserve.api.openai.sampling import sampling_params
from radixserve.api.state import ServerState, server_state
from radixserve.api.streaming import EventStream, event_stream, until_disconnected
from radixserve.api.openai.tools import ParserEvent, TextDelta, ToolCallParser
from radixserve.runtime.request import RequestOutput

router = APIRouter()

# incomplete_details.reason by engine finish reason; "interrupted" is this server's own: the
# request was aborted while the server drained (SIGTERM).
INCOMPLETE_REASONS = {"length": "max_output_tokens", "abort": "interrupted"}


async def create_response(req: ResponsesRequest, http: Request, state: ServerState) -> Response:
    engine = state.require_engine()
    model = state.check_model(req.model)
    rid = new_id("resp")
    http.state.request_id = rid

    def prepare():
        turn = build_turn(req, state.responses)
        inputs = chat_inputs(turn.chat, state)
        return turn, inputs, inputs.fitting(
            lambda messages: prompt_ids(engine.tokenizer, messages, inputs.plan.template_tools, turn.previous,
                                        inputs.plan.format),
            lambda prompt: len(prompt[1]), engine.admission, req.max_output_tokens)

    try:  # schema normalisation, the chat template and the tokenizer, off the event loop
        turn, (plan, constraint, constraint_field, *_), (prompt_text, ids) = await asyncio.to_thread(prepare)
    except APIError as e:
        raise renamed(e) from None
    http.state.fields = RequestFields(RENAMES, RENAMES.get(constraint_field, constraint_field))
    max_tokens = engine.admission.max_tokens(len(ids), req.max_output_tokens)
    gen = Generation(engine, state.metrics, rid)
    await gen.submit(ids, sampling_params(turn.chat, max_tokens, None, constraint, req.seed,
                                          plan.reads_markup and state.tool_markers_special))
    reply = _ResponseReply(req, turn, state, gen, model, rid, plan.new_parser(), prompt_text, ids)
    try:
        if constraint is not None:
            await gen.check_first_outputs(http)  # a grammar the engine refuses is a 400, not a stream
        if req.stream:
            return gen.tag(_event_stream(reply.events(), on_close=gen.abort))
        return gen.tag(JSONResponse(await reply.whole(http)))
    except BaseException:
        gen.abort()
        raise


# Ids are this server's own (resp_<hex>); the pattern keeps path-unsafe text out of the document.
RESPONSE_ID = Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_\-]+$",
                   description="the `id` of a response created with `store` true")


@router.post("/v1/responses")
async def create_responses(body: ResponsesRequest, request: Request, state: ServerState = Depends(server_state)) -> Response:
    return await create_response(body, request, state)


@router.get("/v1/responses/{response_id}")
async def retrieve_response(response_id: str = RESPONSE_ID, state: ServerState = Depends(server_state)) -> dict:
    return state.responses.get(response_id).body


@router.delete("/v1/responses/{response_id}")
async def delete_stored_response(response_id: str = RESPONSE_ID, state: ServerState = Depends(server_state)) -> dict:
    state.responses.delete(response_id)
    return {"id": response_id, "object": "response", "deleted": True}


allow_only(router, "/v1/responses/{response_id}", ["GET", "DELETE"])


# An empty id names no response: a 404, not a redirect to POST /v1/responses.
@router.api_route("/v1/responses/", methods=["GET", "DELETE"], include_in_schema=False)
async def no_response_id(state: ServerState = Depends(server_state)) -> dict:
    return state.responses.get("").body


class _ResponseReply:
    """Turns one Generation's outputs into a response object or its stream of events."""

    def __init__(self, req: ResponsesRequest, turn: Turn, state: ServerState, gen: Generation, model: str,
                 rid: str, parser: Optional[ToolCallParser], prompt_text: str, prompt_ids: list[int]):
        self.req, self.turn, self.state, self.gen, self.model, self.rid = req, turn, state, gen, model, rid
        self.parser = parser
        self.prompt_text, self.prompt_ids = prompt_text, prompt_ids
        self.output_ids: list[int] = []
        self.builder = OutputBuilder()
        self.created = int(time.time())

    # ---- shared ------------------------------------------------------------------------------
    def _consume(self, out: RequestOutput) -> list[Event]:
        self.output_ids += out.token_ids
        if self.parser is None:
            parsed: list[ParserEvent] = [TextDelta(out.text)] if out.text else []
        else:
            parsed = (self.parser.feed(out.text + self.state.stop_markup_text(out))
                      + (self.parser.finish() if out.finished else []))
        return [e for event in parsed for e in self.builder.feed(event)]

    def _finish(self) -> tuple[list[Event], dict[str, Any]]:
        """The closing item events and the final response object (stored if asked)."""
        choice = self.gen.choices[0]
        reason = choice.finish_reason or "abort"
        choice.timer.finish("tool_calls" if reason == "stop" and self.builder.has_calls else reason)
        incomplete = INCOMPLETE_REASONS.get(reason)
        status = "incomplete" if incomplete else "completed"
        events = self.builder.finish(status)
        body = self._body(status, self.builder.items, self._usage(),
                          incomplete_details={"reason": incomplete} if incomplete else None)
        if self.req.store:
            tokenizer = self.gen.engine.tokenizer
            self.state.responses.put(self.rid, StoredResponse(
                body, self.turn.history + output_messages(self.builder.items),
                self.prompt_text + tokenizer.decode(self.output_ids, skip_special_tokens=False),
                self.prompt_ids + self.output_ids))
        return events, body

    def _usage(self) -> dict[str, Any]:
        chat = self.gen.usage()
        return {"input_tokens": chat["prompt_tokens"],
                "input_tokens_details": {"cached_tokens": chat["prompt_tokens_details"]["cached_tokens"]},
                "output_tokens": chat["completion_tokens"], "output_tokens_details": {
                    "reasoning_tokens": 0, "forced_tokens": chat["completion_tokens_details"]["forced_tokens"]},
                "total_tokens": chat["total_tokens"]}

    def _body(self, status: str, output: list[dict[str, Any]], usage: Optional[dict[str, Any]],
              incomplete_details: Optional[dict[str, Any]] = None,
              error: Optional[dict[str, Any]] = None) -> dict[str, Any]:
        req = self.req
        text_format = req.text.format if req.text is not None and req.text.format is not None else None
        tool_choice = req.tool_choice if req.tool_choice is not None else "auto"
        return {
            "id": self.rid, "object": "response", "created_at": self.created, "status": status, "error": error,
            "incomplete_details": incomplete_details, "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens, "model": self.model, "output": output,
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id, "reasoning": {"effort": None, "summary": None},
            "store": req.store, "temperature": 1.0 if req.temperature is None else req.temperature,
            "text": {"format": text_format.model_dump(by_alias=True, exclude_none=True) if text_format
                     else {"type": "text"}},
            "tool_choice": tool_choice if isinstance(tool_choice, str) else tool_choice.model_dump(),
            "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
            "top_p": 1.0 if req.top_p is None else req.top_p, "truncation": "disabled", "usage": usage,
            "user": req.user, "metadata": req.metadata or {},
        }

    # ---- whole reply -------------------------------------------------------------------------
    async def whole(self, http: Request) -> dict[str, Any]:
        async def collect() -> None:
            async for choice, out in self.gen.outputs():
                choice.record(out)
                self._consume(out)

        await until_disconnected(http, collect(), on_disconnect=self.gen.abort)
        self.gen.check_whole()
        return self._finish()[1]

    # ---- streamed reply ----------------------------------------------------------------------
    async def events(self) -> AsyncIterator[Event]:
        started = self._body("in_progress", [], None)
        yield {"type": "response.created", "response": started}
        yield {"type": "response.in_progress", "response": started}
        async for choice, out in self.gen.outputs():
            failure = self.gen.record(choice, out)
            if failure is not None:
                yield {"type": "response.failed",
                       "response": self._body("failed", self.builder.items, None, error={
                           "code": "server_error", "message": failure["error"]["message"]})}
                return
            for event in self._consume(out):
                yield event
            if out.finished:
                closing, body = self._finish()
                for event in closing:
                    yield event
                yield {"type": "response.completed" if body["status"] == "completed" else "response.incomplete",
                       "response": body}


def _event_stream(events: AsyncIterator[Event], on_close: Callable[[], None]) -> EventStream:
    """SSE as OpenAI sends Responses events: `event: <type>` and `data: {json}` with a
    sequence_number counting from 0; no `[DONE]`. `on_close` runs however the response ends and
    aborts whatever still runs."""
    async def sse() -> AsyncIterator[dict[str, str]]:
        try:
            number = 0
            async for event in events:
                event["sequence_number"] = number
                number += 1
                yield {"event": event["type"],
                       "data": json.dumps(event, ensure_ascii=False, separators=(",", ":"))}
        finally:
            await events.aclose()

    return event_stream(sse(), on_close)
