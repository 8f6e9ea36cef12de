"""POST /v1/completions: one or more prompts (text or token ids) × n choices, streamed or whole."""
from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, AsyncIterator, Union

from starlette.requests import Request
from starlette.responses import Response

from radixserve.api.openai import bodies
from radixserve.api.openai.constraints import request_constraint
from radixserve.api.errors import RequestFields, bad_request
from radixserve.api.openai.generation import Choice, Generation
from radixserve.api.openai.logprobs import completion_logprobs
from radixserve.api.openai.protocol import CompletionRequest
from radixserve.api.openai.sampling import choice_seed, sampling_params
from radixserve.api.state import ServerState
from radixserve.api.streaming import until_disconnected

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions


async def create_completion(req: CompletionRequest, http: Request, state: ServerState) -> Response:
    engine = state.require_engine()
    model = state.check_model(req.model)
    rid = "cmpl-" + uuid.uuid4().hex
    http.state.request_id = rid
    if req.echo and req.logprobs is not None:
        raise bad_request("echo: prompt logprobs are not supported, so echo cannot be combined with logprobs",
                          param="echo")

    def prepare() -> tuple[tuple, list[tuple[list[int], str]]]:
        constraint = request_constraint(req)
        return constraint, [(engine.tokenizer.encode(p) if isinstance(p, str) else list(p),
                             _prompt_text(engine, p) if req.echo else "") for p in req.prompts()]

    # schema normalisation and the tokenizer, off the event loop
    (constraint, constraint_field), prompts = await asyncio.to_thread(prepare)
    http.state.fields = RequestFields(constraint=constraint_field)
    budgets = [engine.admission.max_tokens(len(ids), req.max_tokens, DEFAULT_MAX_TOKENS) for ids, _ in prompts]

    gen = Generation(engine, state.metrics, rid)
    groups: list[list[Choice]] = []
    echoes: dict[int, str] = {}
    for (ids, echo), max_tokens in zip(prompts, budgets):
        group = []
        for i in range(req.n):  # a refused submit aborts the choices queued before it
            c = await gen.submit(ids, sampling_params(req, max_tokens, req.logprobs, constraint,
                                                      choice_seed(req.seed, i)))
            echoes[c.index] = echo
            group.append(c)
        groups.append(group)
    reply = _CompletionReply(req, state, gen, model, rid, groups, echoes)
    return await gen.respond(http, reply, req.stream, constraint is not None)


def _prompt_text(engine, prompt: Union[str, list[int]]) -> str:
    if isinstance(prompt, str):
        return prompt
    try:
        return engine.tokenizer.decode(prompt, skip_special_tokens=False)
    except Exception:  # out-of-vocabulary ids: the engine names the problem when it validates
        return ""


class _CompletionReply:
    def __init__(self, req: CompletionRequest, state: ServerState, gen: Generation, model: str, rid: str,
                 groups: list[list[Choice]], echoes: dict[int, str]):
        self.req, self.state, self.gen, self.model, self.rid = req, state, gen, model, rid
        self.groups, self.echoes = groups, echoes
        self.created = int(time.time())

    def _logprobs(self, choice_logprobs, offset: int = 0):
        if self.req.logprobs is None:
            return None
        return completion_logprobs(choice_logprobs, self.state.token_texts, self.req.logprobs, offset)

    async def whole(self, http: Request) -> dict[str, Any]:
        async def collect() -> None:
            async for choice, out in self.gen.outputs():
                choice.record(out)

        await until_disconnected(http, collect(), on_disconnect=self.gen.abort)
        self.gen.check_whole()
        choices = []
        for c in self.gen.choices:
            c.timer.finish(c.finish_reason)
            text = self.echoes[c.index] + "".join(c.text)
            choices.append(bodies.completion_choice(c.index, text, c.finish_reason, self._logprobs(c.logprobs)))
        return bodies.completion(self.rid, self.created, self.model, choices, self.gen.usage(self.groups))

    async def chunks(self) -> AsyncIterator[dict[str, Any]]:
        include_usage = self.req.include_usage
        offsets = {c.index: 0 for c in self.gen.choices}
        for c in self.gen.choices:
            if self.echoes[c.index]:
                yield bodies.completion_chunk(self.rid, self.created, self.model, c.index, self.echoes[c.index],
                                                 with_usage_field=include_usage)
        async for choice, out in self.gen.outputs():
            failure = self.gen.record(choice, out)
            if failure is not None:
                yield failure
                return
            logprobs = self._logprobs(out.logprobs, offsets[choice.index]) if out.logprobs else None
            if logprobs:
                offsets[choice.index] += sum(len(t) for t in logprobs["tokens"])
            if out.finished:
                choice.timer.finish(out.finish_reason)
            if out.text or logprobs or out.finished:
                yield bodies.completion_chunk(self.rid, self.created, self.model, choice.index, out.text,
                                                 out.finish_reason, logprobs, with_usage_field=include_usage)
        if include_usage:
            yield bodies.usage_chunk(self.rid, self.created, self.model, "text_completion",
                                        self.gen.usage(self.groups))
