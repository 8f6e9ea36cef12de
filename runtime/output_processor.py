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
        """A sampled token, then the tokens its grammar forces after it (jump-forward): one output.
        Forced tokens count as output (`max_tokens` included) and, where logprobs are asked for,
        carry logprob 0 with themselves as the only candidate: the grammar left no other."""
        if req.first_token_time is None:
            req.first_token_time = time.monotonic()
        if req.matcher is not None and not req.matcher.accept_token(token):
            self.finish(req, "error", error=f"internal error: the grammar rejected token {token}")
            return
        tokens: list[int] = []
        logprobs: list[TokenLogprob] = []
        reason = self._append(req, token, logprob, tokens, logprobs)
        if reason is None:
            p = req.params
            limit = min(p.max_tokens - len(req.output_ids), self.max_context_len - req.num_tokens)
            for forced in self.structured.force(req, limit):
                req.forced_tokens += 1
                certain = None if p.logprobs is None else TokenLogprob(forced, 0.0, [(forced, 0.0)][:p.logprobs])
                reason = self._append(req, forced, certain, tokens, logprobs)
                if reason is not None:
                    break
        if reason is not None:
            self.finish(req, reason, tokens, logprobs)
            return
        req.stream.put(RequestOutput(req.request_id, req.detok.pop_delta(), tokens, logprobs,
                                     prompt_tokens=len(req.prompt_ids), completion_tokens=len(req.output_ids),
                                     cached_tokens=req.cached_tokens, forced_tokens=req.forced_tokens))

    def _append(self, req: Request, token: int, logprob: Optional[TokenLogprob], tokens: list[int],
                logprobs: list[TokenLogprob]) -> Optional[str]:
        """Add one token the grammar (if any) has accepted; the finish reason it causes, or None."""
        p = req.params
        req.append_token(token)
        self.generation_tokens += 1
        tokens.append(token)
        if logprob is not None:
            logprobs.append(logprob)
            req.logprobs.append(logprob)
        if req.matcher is not None and req.matcher.is_terminated():
            return "stop"   # only a stop token ends a grammar: no text to add
        n_out = len(req.output_ids)
        hit_stop_id = token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_token_ids)
        if hit_stop_id and n_out >= p.min_tokens:
            return "stop"
        req.detok.add_token(token)
        if req.detok.stopped and n_out >= p.min_tokens:
            return "stop"
        if n_out >= p.max_tokens or req.num_tokens >= self.max_context_len:
            return "length"
        return None

    def finish(self, req: Request, reason: str, tokens: Sequence[int] = (), logprobs: Sequence[TokenLogprob] = (),
               error: Optional[str] = None, refusal: Optional[EngineRefusal] = None, cache: bool = True) -> None:
        """End `req` with `reason`, its last `tokens` in the final output; an "error" carries `error`
        (internal) or `refusal` (the request's own fault, e.g. a grammar that does not compile)."""
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
                req.request_id, text, list(tokens), list(logprobs), finish_reason=reason,
                error=error or (str(refusal) if refusal else None), refusal=refusal,
                prompt_tokens=len(req.prompt_ids), completion_tokens=len(req.output_ids),
                cached_tokens=req.cached_tokens, forced_tokens=req.forced_tokens,
                time_to_first_token=(req.first_token_time - req.arrival_time) if req.first_token_time else None))
