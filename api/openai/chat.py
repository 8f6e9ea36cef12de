"""POST /v1/chat/completions: messages (+ tools) through the chat template, n choices, streamed
or whole, with structured output and tool calls."""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any, AsyncIterator, Callable, NamedTuple, Optional, TypeVar

from starlette.requests import Request
from starlette.responses import Response

from radixserve.api.openai import bodies
from radixserve.api.openai.chat_prompt import render_chat_prompt, states_schema, with_schema_instruction
from radixserve.api.openai.constraints import request_constraint
from radixserve.api.errors import RequestFields
from radixserve.api.openai.generation import Choice, Generation
from radixserve.api.openai.logprobs import chat_logprobs
from radixserve.api.openai.protocol import ChatCompletionRequest, ChatMessage
from radixserve.api.openai.sampling import choice_seed, sampling_params
from radixserve.api.state import ServerState
from radixserve.api.streaming import until_disconnected
from radixserve.api.openai.tools import (ArgumentsDelta, CallDone, CallStarted, ParserEvent, ReasoningDelta, TextDelta,
                                         ToolCallParser, ToolPlan, plan_tools)
from radixserve.grammar.spec import GrammarSpec
from radixserve.runtime.admission import Admission

log = logging.getLogger("radixserve.api")
R = TypeVar("R")

# Engine fields as the chat request names them.
_RENAMES = {"prompt": "messages", "logprobs": "top_logprobs"}


async def create_chat_completion(req: ChatCompletionRequest, http: Request, state: ServerState) -> Response:
    engine = state.require_engine()
    model = state.check_model(req.model)
    rid = "chatcmpl-" + uuid.uuid4().hex
    http.state.request_id = rid

    def prepare() -> tuple[ChatInputs, list[int]]:
        inputs = chat_inputs(req, state)
        return inputs, inputs.fitting(
            lambda messages: engine.tokenizer.encode(render_chat_prompt(
                engine.tokenizer, messages, inputs.plan.template_tools, req.chat_template_kwargs,
                fmt=inputs.plan.format)),
            len, engine.admission, req.requested_max_tokens)

    # schema normalisation, the chat template and the tokenizer take milliseconds on a long
    # request: off the event loop, which keeps serving every other request meanwhile
    (plan, constraint, constraint_field, *_), prompt_ids = await asyncio.to_thread(prepare)
    renames = {**_RENAMES, **({"max_tokens": "max_completion_tokens"} if req.max_completion_tokens else {})}
    http.state.fields = RequestFields(renames, constraint_field)
    max_tokens = engine.admission.max_tokens(len(prompt_ids), req.requested_max_tokens)
    top_k = req.top_logprobs or 0
    keep_markup = plan.reads_markup and state.tool_markers_special
    gen = Generation(engine, state.metrics, rid)
    for i in range(req.n):
        await gen.submit(prompt_ids, sampling_params(req, max_tokens, top_k if req.logprobs else None, constraint,
                                                     choice_seed(req.seed, i), keep_markup))
    parsers = {c.index: plan.new_parser() for c in gen.choices}
    reply = _ChatReply(req, state, gen, model, rid, parsers)
    return await gen.respond(http, reply, req.stream, constraint is not None)


class ChatInputs(NamedTuple):
    plan: ToolPlan
    constraint: Optional[GrammarSpec]
    constraint_field: Optional[str]     # the request field that set the constraint, for its errors
    messages: list[ChatMessage]         # to render
    client_messages: list[ChatMessage]  # as the client sent them: `messages` is this plus the schema note

    def fitting(self, render: Callable[[list[ChatMessage]], R], length: Callable[[R], int], admission: Admission,
                requested: Optional[int]) -> R:
        """The prompt rendered with the schema note if prompt and completion still fit, else without
        it: text the server adds never makes a request fail."""
        prompt = render(self.messages)
        if self.messages is self.client_messages or admission.fits(length(prompt), requested):
            return prompt
        log.debug("response schema left out of the prompt: %d tokens with it, %s asked for", length(prompt), requested)
        return render(self.client_messages)


def chat_inputs(req: ChatCompletionRequest, state: ServerState) -> ChatInputs:
    """What a chat-shaped request (chat completions, or a translated Responses turn) asks of the
    engine besides sampling: its tool plan, its constraint and the field that set it, and the
    messages to render (with the response schema stated in them unless --no-schema-in-prompt, a message
    already holds it, or it would not fit: see `ChatInputs.fitting`)."""
    plan = plan_tools(req, state.tool_format)
    tool_field = "tool_choice" if req.tool_choice is not None else "tools"
    tool_constraint = (tool_field, plan.build_constraint) if plan.build_constraint else None
    constraint, constraint_field = request_constraint(req, tool_constraint)
    messages = req.messages
    schema = _response_schema(req)
    if schema is not None and state.schema_in_prompt and not states_schema(req.messages, schema):
        messages = with_schema_instruction(messages, schema)
    return ChatInputs(plan, constraint, constraint_field, messages, req.messages)


def _response_schema(req: ChatCompletionRequest) -> Any:
    """The schema of OpenAI's `response_format: json_schema` (what `parse()` sends), or None."""
    rf = req.response_format
    if rf is None or rf.type != "json_schema" or rf.json_schema is None:
        return None
    return rf.json_schema.schema_


class _ChatReply:
    """Turns one Generation's outputs into a chat.completion or its chunks."""

    def __init__(self, req: ChatCompletionRequest, state: ServerState, gen: Generation, model: str, rid: str,
                 parsers: dict[int, Optional[ToolCallParser]]):
        self.req, self.state, self.gen, self.model, self.rid = req, state, gen, model, rid
        self.created = int(time.time())
        self.parsers = parsers
        self.top_k = req.top_logprobs or 0

    def _finish_reason(self, choice: Choice) -> str:
        parser = self.parsers[choice.index]
        if choice.finish_reason == "stop" and parser is not None and parser.calls:
            return "tool_calls"
        return choice.finish_reason


    # ---- whole reply ---------------------------------------------------------------------
    async def whole(self, http: Request) -> dict[str, Any]:
        events: dict[int, list] = {c.index: [] for c in self.gen.choices}

        async def collect() -> None:
            async for choice, out in self.gen.outputs():
                choice.record(out)
                parser = self.parsers[choice.index]
                if parser is not None:
                    events[choice.index] += parser.feed(out.text + self.state.stop_markup_text(out))
                    if out.finished:
                        events[choice.index] += parser.finish()

        await until_disconnected(http, collect(), on_disconnect=self.gen.abort)
        self.gen.check_whole()
        choices = []
        for c in self.gen.choices:
            reason = self._finish_reason(c)
            c.timer.finish(reason)
            reasoning = None
            if self.parsers[c.index] is None:
                content, calls = "".join(c.text), []
            else:
                content = "".join(e.text for e in events[c.index] if isinstance(e, TextDelta))
                reasoning = "".join(e.text for e in events[c.index] if isinstance(e, ReasoningDelta))
                calls = [e.call.to_message() for e in events[c.index] if isinstance(e, CallDone)]
                content = content or (None if calls else "")
            logprobs = chat_logprobs(c.logprobs, self.state.token_texts, self.top_k) if self.req.logprobs else None
            choices.append(bodies.chat_choice(c.index, content, calls, reason, logprobs, reasoning))
        return bodies.chat_completion(self.rid, self.created, self.model, choices, self.gen.usage())

    # ---- streamed reply ------------------------------------------------------------------
    def _chunk(self, index: int, delta: dict, finish_reason: Optional[str] = None,
               logprobs: Optional[dict] = None) -> dict[str, Any]:
        return bodies.chat_chunk(self.rid, self.created, self.model, index, delta, finish_reason, logprobs,
                                    with_usage_field=self.req.include_usage)

    def _delta(self, event: ParserEvent) -> Optional[dict[str, Any]]:
        """A parser event as a chat delta, OpenAI's way: a call's id, type and name in its first
        delta with empty arguments, then the arguments piece by piece under the same index."""
        if isinstance(event, TextDelta):
            return {"content": event.text}
        if isinstance(event, ReasoningDelta):
            return {"reasoning_content": event.text}
        if isinstance(event, CallStarted):
            return {"tool_calls": [{"index": event.index, "id": event.id, "type": "function",
                                    "function": {"name": event.name, "arguments": ""}}]}
        if isinstance(event, ArgumentsDelta):
            return {"tool_calls": [{"index": event.index, "function": {"arguments": event.text}}]}
        return None  # CallDone: everything about the call has been sent

    async def chunks(self) -> AsyncIterator[dict[str, Any]]:
        for c in self.gen.choices:
            yield self._chunk(c.index, {"role": "assistant", "content": ""})
        async for choice, out in self.gen.outputs():
            failure = self.gen.record(choice, out)
            if failure is not None:
                yield failure
                return
            logprobs = (chat_logprobs(out.logprobs, self.state.token_texts, self.top_k)
                        if self.req.logprobs and out.logprobs else None)
            parser = self.parsers[choice.index]
            if parser is None:
                events: list[ParserEvent] = [TextDelta(out.text)] if out.text else []
            else:
                events = (parser.feed(out.text + self.state.stop_markup_text(out))
                          + (parser.finish() if out.finished else []))
            for event in events:
                delta = self._delta(event)
                if delta is not None:
                    yield self._chunk(choice.index, delta, logprobs=logprobs)
                    logprobs = None  # sent once, with the first chunk of this output
            if out.finished:
                reason = self._finish_reason(choice)
                choice.timer.finish(reason)
                yield self._chunk(choice.index, {}, finish_reason=reason, logprobs=logprobs)
            elif logprobs is not None:  # tokens whose text is held back (partial UTF-8, a stop string...)
                yield self._chunk(choice.index, {}, logprobs=logprobs)
        if self.req.include_usage:
            yield bodies.usage_chunk(self.rid, self.created, self.model, "chat.completion.chunk",
                                        self.gen.usage())
