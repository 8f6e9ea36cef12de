"""Batched sampling: penalties, min_tokens, temperature, top-k / top-p / min-p, seeds, logprobs.

Everything up to the final host conversion is whole-batch tensor work on the logits' device
(`Sampler.sample_tensors`); per-row parameters reach the device as one packed int64 and one packed
float tensor per step, built from Python lists.

Noise is counter-based: the Exp(1) noise of a row at token t is a pure function of (key, t), where
a seeded request's key is hash(seed, tokens output so far) and an unseeded row's key is
hash(engine seed, call counter, row). The same integer math runs on every device, so a seeded
request's noise, and with it its tokens, depend on its own logits only: not on the rest of the
batch, its row, or the device (up to float rounding of its probabilities).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from radixserve.kernels.sampling import argmax_rows, sort_desc, topk_values
from radixserve.runtime.platform import Platform
from radixserve.runtime.request import Request, TokenLogprob

_M64 = (1 << 64) - 1
_SEEDED_TAG = 0x243F6A8885A308D3      # keeps seeded keys and the engine's unseeded keys apart
_UNSEEDED_TAG = 0x13198A2E03707344


def _mix64(x: int) -> int:
    """splitmix64's finalizer, on Python ints (per-row keys are computed on the host)."""
    x &= _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _int32(x: int) -> int:
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x >= 1 << 31 else x


def seeded_key(seed: int, step: int) -> int:
    """The noise key (a signed 32-bit value) of a seeded request's `step`-th token."""
    return _int32(_mix64(_mix64(seed ^ _SEEDED_TAG) + step) >> 32)


# Per-element mixing is 32-bit: AVX2 has no 64-bit vector multiply, and int64 hashing ran 2.5x
# slower than int32 here. torch integer multiplies wrap and `>>` is arithmetic, so shifted values
# are masked to act as logical shifts.
_C1, _C2, _C3 = _int32(0x85EBCA6B), _int32(0xC2B2AE35), _int32(0x7FEB352D)


def token_table(width: int) -> torch.Tensor:
    """int32 [width]: murmur3's fmix32 of each token id (spreads ids before they meet a key)."""
    h = torch.arange(width, dtype=torch.int64) * 0x9E3779B9 & 0xFFFFFFFF
    h ^= h >> 16
    h = h * 0x85EBCA6B & 0xFFFFFFFF
    h ^= h >> 13
    h = h * 0xC2B2AE35 & 0xFFFFFFFF
    h ^= h >> 16
    return torch.where(h >= 1 << 31, h - (1 << 32), h).to(torch.int32)


def log_uniform(keys: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """float32 [rows, width]: log(u), u uniform in (0, 1), a pure function of (keys[row], token).

    Three multiply rounds, not murmur's two: with two, keys a bit or two apart gave visibly
    correlated rows (2-D chi-square in the thousands); with three they look independent. u is
    the top 23 bits of the hash as an odd multiple of 2^-24: never 0 or 1, so -log(u) is a finite
    positive Exp(1) draw."""
    z = table.unsqueeze(0) ^ keys.unsqueeze(1)
    shifted = torch.empty_like(z)  # one scratch for both xorshifts: fresh multi-MB tensors fault in pages

    def xorshift(s: int) -> None:
        torch.bitwise_right_shift(z, s, out=shifted)
        z.bitwise_xor_(shifted.bitwise_and_((1 << (32 - s)) - 1))

    z.mul_(_C1)
    xorshift(16)
    z.mul_(_C2)
    xorshift(15)
    z.mul_(_C3)
    # the top 23 bits as the mantissa of a float in [1, 2), then moved to (0, 1) exactly
    z.bitwise_right_shift_(9).bitwise_and_(0x7FFFFF).bitwise_or_(0x3F800000)
    return z.view(torch.float32).sub_(1.0 - 2.0 ** -24).log_()


class _Pack:
    """Python values gathered over a step and sent to the device as one tensor; `add` returns the
    slice a segment will occupy."""

    def __init__(self) -> None:
        self.values: list = []

    def add(self, values: Sequence) -> slice:
        start = len(self.values)
        self.values.extend(values)
        return slice(start, len(self.values))

    def upload(self, dtype: torch.dtype, device: torch.device, platform: Optional[Platform]) -> torch.Tensor:
        if not self.values:
            return torch.empty(0, dtype=dtype, device=device)
        if platform is None:
            return torch.tensor(self.values, dtype=dtype, device=device)
        return platform.upload(self.values, dtype)


@dataclass
class SampledTensors:
    """What `sample_tensors` leaves on the device; `sample` reads it back."""
    tokens: torch.Tensor                         # int64 [rows]
    logprob_rows: list[int]                      # rows that asked for logprobs
    top_counts: list[int]                        # alternatives each of those rows asked for
    token_logprobs: Optional[torch.Tensor] = None  # [len(logprob_rows)]: the sampled token's
    top_logprobs: Optional[torch.Tensor] = None    # [len(logprob_rows), max(top_counts)], best first
    top_ids: Optional[torch.Tensor] = None


# Plans: what a step needs, as slices of the packed int (I) and float (F) tensors. A subset's `at`
# lists its positions among the rows it filters, or is None when it covers them all (no gather).
@dataclass
class _PenaltyPlan:
    rows: slice                     # (row, token) pairs: every token a penalty touches
    toks: slice
    params: slice                   # per batch row: repetition, frequency, presence
    out_rows: Optional[slice]       # outputs of rows with frequency / presence penalties,
    out_toks: Optional[slice]       # sorted within each row


@dataclass
class _TopK:
    at: Optional[slice]
    k_max: int
    kth: slice                      # per filtered row: k - 1


@dataclass
class _TopP:
    at: Optional[slice]
    p: slice
    after_top_k: bool               # some of its rows have top-k too


@dataclass
class _DrawPlan:
    rows: int
    keys: slice                     # per sampled row: its noise key
    temps: slice
    unit_temperature: bool          # every row at temperature 1: no division
    top_k: Optional[_TopK] = None
    top_p: Optional[_TopP] = None
    min_p: Optional[slice] = None


@dataclass
class _Step:
    logits: torch.Tensor            # [rows, vocab], penalised and banned
    greedy: list[int]
    sampled: list[int]
    want: list[int]                 # rows that asked for logprobs
    greedy_at: Optional[slice]      # None unless the batch mixes greedy and sampled rows
    sampled_at: Optional[slice]
    want_at: Optional[slice]        # None when every row or no row wants logprobs
    draw: Optional[_DrawPlan] = None
    I: Optional[torch.Tensor] = None
    F: Optional[torch.Tensor] = None
    raw_logprobs: Optional[torch.Tensor] = None


def read_back(out: SampledTensors) -> tuple[list[int], list[float], list[list[int]], list[list[float]]]:
    """Tokens, their logprobs and the top ids and logprobs in one device-to-host copy (each a wait
    for the device): packed as float64, which holds token ids and float32 logprobs exactly."""
    rows, k = len(out.logprob_rows), out.top_ids.shape[1] if out.top_ids is not None else 0
    parts = [out.tokens, out.token_logprobs] + ([out.top_ids.flatten(), out.top_logprobs.flatten()] if k else [])
    flat = torch.cat([p.to(torch.float64) for p in parts]).tolist()
    n = len(out.tokens)
    tokens, values = [int(t) for t in flat[:n]], flat[n:n + rows]
    ids = flat[n + rows:n + rows + rows * k]
    tops = flat[n + rows + rows * k:]
    return (tokens, values, [[int(t) for t in ids[j * k:(j + 1) * k]] for j in range(rows)],
            [tops[j * k:(j + 1) * k] for j in range(rows)])


class Sampler:
    def __init__(self, vocab_size: int, eos_token_ids: Sequence[int], seed: int = 0,
                 platform: Optional[Platform] = None):
        """`platform`: the engine's, whose uploads may overlap the forward (pinned memory on CUDA);
        without one, per-step values are plain tensors on the logits' device."""
        self.vocab_size = vocab_size
        self.platform = platform
        self.eos_token_ids = list(eos_token_ids)
        self.seed = seed
        self.calls = 0                           # advances unseeded rows' keys every step
        self._tables: dict[tuple[torch.device, int], torch.Tensor] = {}

    def sample(self, logits: torch.Tensor, reqs: Sequence[Request]) -> tuple[list[int], list[Optional[TokenLogprob]]]:
        """logits: [len(reqs), >= vocab] (modified in place). Returns a token and optional logprob per row."""
        out = self.sample_tensors(logits, reqs)
        logprobs: list[Optional[TokenLogprob]] = [None] * len(reqs)
        if not out.logprob_rows:
            return out.tokens.tolist(), logprobs
        tokens, values, ids, tops = read_back(out)
        for j, (i, k) in enumerate(zip(out.logprob_rows, out.top_counts)):
            top = list(zip(ids[j][:k], tops[j][:k])) if k else []
            logprobs[i] = TokenLogprob(tokens[i], values[j], top)
        return tokens, logprobs

    def sample_tensors(self, logits: torch.Tensor, reqs: Sequence[Request]) -> SampledTensors:
        """`sample` without the read-back: every tensor on logits' device, nothing waits for it."""
        step = self._prepare(logits, reqs)
        logits, I = step.logits, step.I
        if not step.sampled:
            tokens = argmax_rows(logits)
        elif not step.greedy:
            tokens = self._noisy_argmax(self._probs(logits, step), step)
        else:
            g, s = I[step.greedy_at], I[step.sampled_at]
            tokens = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
            tokens.index_copy_(0, g, argmax_rows(logits.index_select(0, g)))
            tokens.index_copy_(0, s, self._noisy_argmax(self._probs(logits.index_select(0, s), step), step))

        out = SampledTensors(tokens, step.want, [reqs[i].params.logprobs for i in step.want])
        if step.want:
            picked = tokens if step.want_at is None else tokens.index_select(0, I[step.want_at])
            out.token_logprobs = step.raw_logprobs.gather(1, picked.unsqueeze(1)).squeeze(1)
            k = max(out.top_counts)
            if k:
                out.top_logprobs, out.top_ids = step.raw_logprobs.topk(min(k, logits.shape[1]), dim=-1)
        return out

    def probabilities(self, logits: torch.Tensor, reqs: Sequence[Request]) -> torch.Tensor:
        """[rows, vocab]: the distribution `sample` draws each row from (after penalties, bans,
        temperature and filters; a greedy row is one-hot at its argmax). For tests and debugging."""
        step = self._prepare(logits, reqs)
        logits = step.logits
        out = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
        if step.greedy:
            g = torch.tensor(step.greedy, device=logits.device)
            out[g, argmax_rows(logits.index_select(0, g))] = 1.0
        if step.sampled:
            probs = self._probs(logits.index_select(0, torch.tensor(step.sampled, device=logits.device)), step)
            out[step.sampled] = (probs / probs.sum(-1, keepdim=True)).float()
        return out

    def _prepare(self, logits: torch.Tensor, reqs: Sequence[Request]) -> _Step:
        """Plan the step, upload its parameters, take logprobs, apply penalties and bans."""
        logits = logits[:, : self.vocab_size]
        device, (rows, width) = logits.device, logits.shape
        self.calls += 1
        # one pass over the requests: at batch 32 the per-request Python is most of a greedy step
        greedy, sampled, want, penalised, banned = [], [], [], [], []
        for i, r in enumerate(reqs):
            p = r.params
            (greedy if p.greedy else sampled).append(i)
            if p.logprobs is not None:
                want.append(i)
            if p.repetition_penalty != 1.0 or p.frequency_penalty or p.presence_penalty:
                penalised.append(i)
            if p.min_tokens > len(r.output_ids) and r.matcher is None:  # a grammar decides where it ends
                banned.append(i)
        ints, floats = _Pack(), _Pack()
        mixed = bool(greedy) and bool(sampled)
        step = _Step(logits, greedy, sampled, want,
                     greedy_at=ints.add(greedy) if mixed else None,
                     sampled_at=ints.add(sampled) if mixed else None,
                     want_at=ints.add(want) if 0 < len(want) < rows else None)
        penalties = self._plan_penalties(reqs, penalised, ints, floats) if penalised else None
        bans = self._plan_bans(reqs, banned, ints) if banned else None
        if sampled:
            step.draw = self._plan_draw(reqs, sampled, width, ints, floats)
        if not ints.values and not want:
            return step  # nothing to upload or apply: a plain greedy batch
        step.I = I = ints.upload(torch.int64, device, self.platform)
        step.F = F = floats.upload(logits.dtype, device, self.platform)

        # logprobs are of the model's distribution: before penalties, bans and filters
        if want:
            step.raw_logprobs = torch.log_softmax(
                logits if step.want_at is None else logits.index_select(0, I[step.want_at]), dim=-1)
        if penalties is not None:
            self._apply_penalties(logits, I, F, penalties)
        if bans is not None:
            logits[I[bans[0]], I[bans[1]]] = float("-inf")
        return step

    # ---- penalties and bans: (row, token) pairs of the whole batch, by gather / scatter --------
    @staticmethod
    def _plan_penalties(reqs: Sequence[Request], penalised: list[int], ints: _Pack,
                        floats: _Pack) -> Optional[_PenaltyPlan]:
        pair_rows: list[int] = []
        pair_toks: list[int] = []
        out_rows: list[int] = []
        out_toks: list[int] = []
        per_row = [1.0, 0.0, 0.0] * len(reqs)
        for i in penalised:
            r, p = reqs[i], reqs[i].params
            per_row[3 * i: 3 * i + 3] = p.repetition_penalty, p.frequency_penalty, p.presence_penalty
            # repetition covers the prompt too; frequency and presence count the output only
            toks = r.token_ids if p.repetition_penalty != 1.0 else r.output_ids
            pair_rows += [i] * len(toks)
            pair_toks += toks
            if p.frequency_penalty or p.presence_penalty:
                out_rows += [i] * len(r.output_ids)
                out_toks += sorted(r.output_ids)
        if not pair_rows:
            return None
        return _PenaltyPlan(ints.add(pair_rows), ints.add(pair_toks), floats.add(per_row),
                            ints.add(out_rows) if out_rows else None, ints.add(out_toks) if out_rows else None)

    @staticmethod
    def _apply_penalties(logits: torch.Tensor, I: torch.Tensor, F: torch.Tensor, plan: _PenaltyPlan) -> None:
        width = logits.shape[1]
        pr, pt = I[plan.rows], I[plan.toks]
        per_row = F[plan.params].view(-1, 3)
        # a valid penalty as small as 5e-324 is 0 in float32: -inf * 0 (a masked token) would be
        # NaN and poison the row, and x / tiny overflows; clamp both ends to finite values
        finfo = torch.finfo(logits.dtype)
        rp = per_row[:, 0].index_select(0, pr).clamp_min(finfo.tiny)
        vals = logits[pr, pt]
        new = torch.where(vals > 0, (vals / rp).clamp_max(finfo.max), vals * rp)
        if plan.out_rows is not None:
            # each pair's count among the outputs: searchsorted into the (row-major sorted) output keys
            out_keys = I[plan.out_rows] * width + I[plan.out_toks]
            keys = pr * width + pt
            counts = (torch.searchsorted(out_keys, keys, right=True) - torch.searchsorted(out_keys, keys)).to(new.dtype)
            fp, pp = per_row[:, 1].index_select(0, pr), per_row[:, 2].index_select(0, pr)
            new = new - (fp * counts + pp * (counts > 0).to(new.dtype))
        # a token seen twice is listed twice: both writes carry the same value
        logits[pr, pt] = new

    def _plan_bans(self, reqs: Sequence[Request], banned: list[int], ints: _Pack) -> Optional[tuple[slice, slice]]:
        ban_rows: list[int] = []
        ban_toks: list[int] = []
        for i in banned:
            p = reqs[i].params
            toks = p.stop_token_ids + ([] if p.ignore_eos else self.eos_token_ids)
            ban_rows += [i] * len(toks)
            ban_toks += toks
        return (ints.add(ban_rows), ints.add(ban_toks)) if ban_rows else None

    # ---- sampled rows: temperature, top-k, top-p, min-p, noise ---------------------------------
    def _plan_draw(self, reqs: Sequence[Request], sampled: list[int], width: int,
                   ints: _Pack, floats: _Pack) -> _DrawPlan:
        params = [reqs[i].params for i in sampled]
        base = _mix64(_mix64(self.seed ^ _UNSEEDED_TAG) + self.calls)
        keys = [seeded_key(p.seed, len(reqs[i].output_ids)) if p.seed is not None else _int32(_mix64(base + i) >> 32)
                for i, p in zip(sampled, params)]
        temps = [p.temperature for p in params]
        plan = _DrawPlan(len(sampled), ints.add(keys), floats.add(temps), all(t == 1.0 for t in temps))

        def subset(at: list[int]) -> Optional[slice]:
            return ints.add(at) if len(at) < len(sampled) else None

        top_k = [j for j, p in enumerate(params) if 0 < p.top_k < width]
        if top_k:
            ks = [params[j].top_k for j in top_k]
            plan.top_k = _TopK(subset(top_k), max(ks), ints.add([k - 1 for k in ks]))
        top_p = [j for j, p in enumerate(params) if p.top_p < 1.0]
        if top_p:
            plan.top_p = _TopP(subset(top_p), floats.add([params[j].top_p for j in top_p]),
                               any(0 < params[j].top_k < width for j in top_p))
        if any(p.min_p > 0 for p in params):
            plan.min_p = floats.add([p.min_p for p in params])
        return plan

    def _table(self, device: torch.device, width: int) -> torch.Tensor:
        table = self._tables.get((device, width))
        if table is None:
            table = self._tables[(device, width)] = token_table(width).to(device)
        return table

    def _probs(self, x: torch.Tensor, step: _Step) -> torch.Tensor:
        """Unnormalised probabilities of the sampled rows (x holds them, in plan order, and may be
        written); filtered tokens get 0.

        top-k, top-p and min-p each give a floor per row, and one pass zeroes what is below the
        highest: a vocabulary-wide mask costs more here than a softmax. Ties with a floor stay."""
        plan, I, F = step.draw, step.I, step.F
        if not plan.unit_temperature:
            x.div_(F[plan.temps].unsqueeze(1))
        probs = torch.softmax(x, dim=-1)
        floor = None

        def per_row(values: torch.Tensor, at: Optional[torch.Tensor]) -> torch.Tensor:
            if at is None:
                return values
            return torch.zeros(plan.rows, dtype=values.dtype, device=values.device).index_copy_(0, at, values)

        if plan.top_k is not None:
            at = None if plan.top_k.at is None else I[plan.top_k.at]
            top = topk_values(probs if at is None else probs.index_select(0, at), plan.top_k.k_max)
            floor = per_row(top.gather(1, I[plan.top_k.kth].unsqueeze(1)).squeeze(1), at)
        if plan.top_p is not None:
            at = None if plan.top_p.at is None else I[plan.top_p.at]
            desc = sort_desc(probs if at is None else probs.index_select(0, at))
            if plan.top_p.after_top_k:  # top-p measures the mass of what top-k left
                desc = torch.where(desc < (floor if at is None else floor.index_select(0, at)).unsqueeze(1), 0.0, desc)
            # the smallest set whose mass reaches top_p (the first token always stays); its last
            # value is the floor
            reach = F[plan.top_p.p] * desc.sum(-1)
            # clamped: a top_p that rounds to 0 in float32 still keeps the first token
            keep = ((desc.cumsum(dim=-1) - desc) < reach.unsqueeze(1)).sum(-1, keepdim=True).clamp_min(1)
            floor_p = per_row(desc.gather(1, keep - 1).squeeze(1), at)
            floor = floor_p if floor is None else torch.maximum(floor, floor_p)
        if plan.min_p is not None:
            floor_m = probs.amax(dim=-1) * F[plan.min_p]
            floor = floor_m if floor is None else torch.maximum(floor, floor_m)
        if floor is not None:
            probs = torch.where(probs < floor.unsqueeze(1), 0.0, probs)
        return probs

    def _noisy_argmax(self, probs: torch.Tensor, step: _Step) -> torch.Tensor:
        """argmax(p / E) for E ~ Exp(1) samples from p; with log(u) = -E that is argmax(log(u) / p),
        where tokens with p = 0 score -inf."""
        keys = step.I[step.draw.keys].to(torch.int32)
        return argmax_rows(log_uniform(keys, self._table(probs.device, probs.shape[1])).div_(probs))
