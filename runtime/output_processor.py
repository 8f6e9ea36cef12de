"""What a sampled token does to its request, and how a request ends: the grammar accepts the
token, the stop rules and limits are checked, its text is detokenised and pushed to the stream;
an ended request gives back its KV (its prefix stays in the tree) and gets its final output."""
from __future__ import annotations

import time
from typing import Optional, Sequence

from radixserve.runtime.engine_client import EngineRefusal
from radixserve.runtime.request import Request, RequestOutput, RequestStatus, TokenLogprob
from radixserve.runtime.scheduler import Scheduler
from radixserve.runtime.structured_output import StructuredOutput


class OutputProcessor:
    def __init__(self, scheduler: Scheduler, structured: StructuredOutput, live, eos_token_ids: Sequence[int],
                 max_context_len: int):
        self.scheduler = scheduler
        self.structured = structured
        self.live = live                      # the engine's LiveRequests: an ended request leaves it
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_context_len = max_context_len
        self.generation_tokens = 0

    def commit(self, req: Request, token: int, logprob: Optional[TokenLogprob]) -> None:
        p = req.params
        req.append_token(token)
        if req.first_token_time is None:
            req.first_token_time = time.monotonic()
        self.generation_tokens += 1
        if logprob is not None:
            req.logprobs.append(logprob)
        if req.matcher is not None:
            if not req.matcher.accept_token(token):
                self.finish(req, "error", error=f"internal error: the grammar rejected token {token}")
                return
            if req.matcher.is_terminated():  # only a stop token ends a grammar: no text to add
                self.finish(req, "stop", token=token, logprob=logprob)
                return
        n_out = len(req.output_ids)
        reason = None
        hit_stop_id = token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_token_ids)
        if hit_stop_id and n_out >= p.min_tokens:
            reason = "stop"
        else:
            req.detok.add_token(token)
            if req.detok.stopped and n_out >= p.min_tokens:
                reason = "stop"
        if reason is None and (n_out >= p.max_tokens or req.num_tokens >= self.max_context_len):
            reason = "length"
        if reason is not None:
            self.finish(req, reason, token=token, logprob=logprob)
            return
        req.stream.put(RequestOutput(req.request_id, req.detok.pop_delta(), [token], [logprob] if logprob else [],
                                     prompt_tokens=len(req.prompt_ids), completion_tokens=n_out,
                                     cached_tokens=req.cached_tokens))

    def finish(self, req: Request, reason: str, token: Optional[int] = None, logprob=None,
               error: Optional[str] = None, refusal: Optional[EngineRefusal] = None, cache: bool = True) -> None:
        """End `req` with `reason`; an "error" carries `error` (internal) or `refusal` (the
        request's own fault, e.g. a grammar that does not compile)."""
        req.finish_reason = reason
        req.status = RequestStatus.ABORTED if reason in ("abort", "error") else RequestStatus.FINISHED
        text = ""
        try:
            self.structured.release(req)
            self.scheduler.remove(req, cache=cache)
            if reason != "error":
                text = req.detok.pop_delta(final=True)
        finally:  # whatever failed above, the stream gets its final output
            self.live.remove(req.request_id)
            req.stream.put(RequestOutput(
                req.request_id, text, [token] if token is not None else [], [logprob] if logprob else [],
                finish_reason=reason, error=error or (str(refusal) if refusal else None), refusal=refusal,
                prompt_tokens=len(req.prompt_ids), completion_tokens=len(req.output_ids),
                cached_tokens=req.cached_tokens,
                time_to_first_token=(req.first_token_time - req.arrival_time) if req.first_token_time else None))
