"""POST /v1/completions: one or more prompts (text or token ids) × n choices, streamed or whole."""
from __future__ import annotations

import time
import uuid
from typing import Any, AsyncIterator, Union

from starlette.requests import Request
from starlette.responses import Response

from radixserve.api import responses
from radixserve.api.constraints import request_constraint
from radixserve.api.errors import bad_request
from radixserve.api.generation import Choice, Generation, until_disconnected
from radixserve.api.logprobs import completion_logprobs
from radixserve.api.protocol import CompletionRequest
from radixserve.api.sampling import choice_seed, resolve_max_tokens, sampling_params
from radixserve.api.state import ServerState

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions


async def create_completion(req: CompletionRequest, http: Request, state: ServerState) -> Response:
    engine = state.require_engine()
    model = state.check_model(req.model)
    rid = "cmpl-" + uuid.uuid4().hex
    http.state.request_id = rid
    if req.echo and req.logprobs is not None:
        raise bad_request("echo: prompt logprobs are not supported, so echo cannot be combined with logprobs",
                          param="echo")
    constraint, constraint_field = request_constraint(req)
    prompts: list[tuple[list[int], str]] = []
    for p in req.prompts():
        ids = engine.tokenizer.encode(p) if isinstance(p, str) else list(p)
        prompts.append((ids, _prompt_text(engine, p) if req.echo else ""))
    budgets = [resolve_max_tokens(engine, req.max_tokens, len(ids), DEFAULT_MAX_TOKENS, "prompt")
               for ids, _ in prompts]

    gen = Generation(engine, state.metrics, rid, {}, constraint_field)
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
            choices.append(responses.completion_choice(c.index, text, c.finish_reason, self._logprobs(c.logprobs)))
        return responses.completion(self.rid, self.created, self.model, choices, self.gen.usage(self.groups))

    async def chunks(self) -> AsyncIterator[dict[str, Any]]:
        include_usage = self.req.include_usage
        offsets = {c.index: 0 for c in self.gen.choices}
        for c in self.gen.choices:
            if self.echoes[c.index]:
                yield responses.completion_chunk(self.rid, self.created, self.model, c.index, self.echoes[c.index],
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
                yield responses.completion_chunk(self.rid, self.created, self.model, choice.index, out.text,
                                                 out.finish_reason, logprobs, with_usage_field=include_usage)
        if include_usage:
            yield responses.usage_chunk(self.rid, self.created, self.model, "text_completion",
                                        self.gen.usage(self.groups))
