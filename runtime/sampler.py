"""Batched sampling: penalties, min_tokens, temperature, top-k / top-p / min-p, seeds, logprobs."""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from radixserve.kernels.sampling import argmax_rows
from radixserve.runtime.request import Request, TokenLogprob


class Sampler:
    def __init__(self, vocab_size: int, eos_token_ids: Sequence[int], seed: int = 0):
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self.generator = torch.Generator().manual_seed(seed)  # for unseeded requests

    def sample(self, logits: torch.Tensor, reqs: Sequence[Request]) -> tuple[list[int], list[Optional[TokenLogprob]]]:
        """logits: [len(reqs), vocab] float32 (modified in place). Returns a token and optional logprob per row."""
        logits = logits[:, : self.vocab_size]
        params = [r.params for r in reqs]
        want_logprobs = [i for i, p in enumerate(params) if p.logprobs is not None]
        raw_logprobs = torch.log_softmax(logits[want_logprobs], dim=-1) if want_logprobs else None

        for i, r in enumerate(reqs):
            p = r.params
            if p.needs_penalties:
                self._apply_penalties(logits[i], r)
            if len(r.output_ids) < p.min_tokens and r.matcher is None:  # a grammar decides where it ends
                banned = p.stop_token_ids + ([] if p.ignore_eos else self.eos_token_ids)
                if banned:
                    logits[i, banned] = float("-inf")

        greedy = [i for i, p in enumerate(params) if p.greedy]
        if len(greedy) == len(params):
            tokens = argmax_rows(logits).tolist()
        else:
            tokens = [0] * len(params)
            if greedy:
                for i, t in zip(greedy, argmax_rows(logits[greedy]).tolist()):
                    tokens[i] = t
            rows = [i for i, p in enumerate(params) if not p.greedy]
            for i, t in zip(rows, self._sample_rows(logits[rows], [reqs[i] for i in rows])):
                tokens[i] = t

        out_logprobs: list[Optional[TokenLogprob]] = [None] * len(reqs)
        for j, i in enumerate(want_logprobs):
            lp = raw_logprobs[j]
            k = params[i].logprobs
            top = []
            if k:
                vals, ids = lp.topk(k)
                top = list(zip(ids.tolist(), vals.tolist()))
            out_logprobs[i] = TokenLogprob(tokens[i], lp[tokens[i]].item(), top)
        return tokens, out_logprobs

    @staticmethod
    def _apply_penalties(row: torch.Tensor, r: Request) -> None:
        p = r.params
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(r.token_ids)), dtype=torch.long)
            vals = row[seen]
            row[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        if r.output_ids and (p.frequency_penalty or p.presence_penalty):
            counts = torch.bincount(torch.tensor(r.output_ids, dtype=torch.long), minlength=row.shape[0])
            counts = counts[: row.shape[0]].to(row.dtype)
            row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)

    def _sample_rows(self, logits: torch.Tensor, reqs: Sequence[Request]) -> list[int]:
        params = [r.params for r in reqs]
        temps = torch.tensor([p.temperature for p in params], dtype=logits.dtype).unsqueeze(1)
        logits = logits / temps
        top_ks = [p.top_k for p in params]
        if any(k > 0 for k in top_ks):
            k_max = max(k for k in top_ks if k > 0)
            kth = logits.topk(min(k_max, logits.shape[1]), dim=-1).values
            for i, k in enumerate(top_ks):
                if k > 0:
                    logits[i][logits[i] < kth[i, min(k, kth.shape[1]) - 1]] = float("-inf")
        probs = torch.softmax(logits, dim=-1)
        top_ps = torch.tensor([p.top_p for p in params], dtype=probs.dtype)
        if bool((top_ps < 1.0).any()):
            sorted_p, order = probs.sort(dim=-1, descending=True)
            # keep the smallest set whose mass reaches top_p (the first token always stays)
            drop = (sorted_p.cumsum(dim=-1) - sorted_p) >= top_ps.unsqueeze(1)
            sorted_p[drop] = 0.0
            probs = torch.zeros_like(probs).scatter_(1, order, sorted_p)
        min_ps = torch.tensor([p.min_p for p in params], dtype=probs.dtype)
        if bool((min_ps > 0).any()):
            floor = probs.amax(dim=-1, keepdim=True) * min_ps.unsqueeze(1)
            probs = torch.where(probs < floor, torch.zeros_like(probs), probs)
        # Gumbel-style: argmax(p / Exp(1)) samples from p; a seeded request draws only from its own
        # generator, so its tokens do not depend on what else is in the batch.
        noise = torch.empty_like(probs)
        unseeded = [i for i, r in enumerate(reqs) if r.generator is None]
        if unseeded:
            noise[unseeded] = torch.empty(len(unseeded), probs.shape[1]).exponential_(generator=self.generator)
        for i, r in enumerate(reqs):
            if r.generator is not None:
                noise[i].exponential_(generator=r.generator)
        return argmax_rows(probs / noise).tolist()
