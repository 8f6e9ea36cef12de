"""Request fields to `SamplingParams` (the token budget is the engine's admission rule's)."""
from __future__ import annotations

from typing import Optional

from radixserve.api.openai.protocol import GenerationRequest
from radixserve.grammar.spec import GrammarSpec
from radixserve.runtime.sampling_params import SamplingParams


def sampling_params(req: GenerationRequest, max_tokens: int, logprobs: Optional[int],
                    constraint: Optional[GrammarSpec], seed: Optional[int], keep_special: bool = False) -> SamplingParams:
    """One choice's SamplingParams (the caller derives a per-choice seed). `keep_special`: the
    text keeps special tokens whatever the request says (a tool-call parser reads them)."""
    def given(value, default):
        return default if value is None else value

    return SamplingParams(
        max_tokens=max_tokens,
        min_tokens=given(req.min_tokens, 0),
        temperature=given(req.temperature, 1.0),
        top_p=given(req.top_p, 1.0),
        top_k=given(req.top_k, -1),
        min_p=given(req.min_p, 0.0),
        frequency_penalty=given(req.frequency_penalty, 0.0),
        presence_penalty=given(req.presence_penalty, 0.0),
        repetition_penalty=given(req.repetition_penalty, 1.0),
        seed=seed,
        stop=[req.stop] if isinstance(req.stop, str) else list(req.stop or []),
        stop_token_ids=list(req.stop_token_ids or []),
        ignore_eos=req.ignore_eos,
        logprobs=logprobs,
        skip_special_tokens=req.skip_special_tokens and not keep_special,
        constraint=constraint,
        priority=given(req.priority, 0),   # lower first, under --schedule-policy priority
        cache_salt=req.cache_salt,
        prompt_cache_key=req.prompt_cache_key,
        prompt_cache_retention=req.prompt_cache_retention,
    )


def choice_seed(seed: Optional[int], index: int) -> Optional[int]:
    """Distinct, reproducible seeds for the n choices of one seeded request."""
    return None if seed is None else seed + index
