"""Request fields to `SamplingParams`, and the token budget a prompt leaves in the context."""
from __future__ import annotations

from dataclasses import fields
from typing import Optional

from radixserve.api.errors import bad_request
from radixserve.api.protocol import GenerationRequest
from radixserve.grammar.spec import GrammarSpec
from radixserve.runtime.engine import Engine
from radixserve.runtime.sampling_params import SamplingParams

_SAMPLING_FIELDS = {f.name for f in fields(SamplingParams)}


def resolve_max_tokens(engine: Engine, requested: Optional[int], prompt_len: int, default: Optional[int],
                       prompt_field: str) -> int:
    """The request's max_tokens, checked against the context window; without one, `default` or
    else whatever the context (and the KV pool) leaves after the prompt."""
    context = engine.model_config.max_context_len
    room = min(context, engine.kv_capacity_tokens) - prompt_len
    if requested is None:
        if room < 1:
            raise bad_request(f"This model's maximum context length is {context} tokens, but the "
                              f"{prompt_field} has {prompt_len} tokens, leaving no room for a completion.",
                              param=prompt_field, code="context_length_exceeded")
        return min(default, room) if default is not None else room
    if prompt_len + requested > context:
        raise bad_request(f"This model's maximum context length is {context} tokens. However, you requested "
                          f"{prompt_len + requested} tokens ({prompt_len} in the {prompt_field}, {requested} in "
                          f"the completion). Please reduce the length of the {prompt_field} or of max_tokens.",
                          param=prompt_field, code="context_length_exceeded")
    return requested


def sampling_params(req: GenerationRequest, max_tokens: int, logprobs: Optional[int],
                    constraint: Optional[GrammarSpec], seed: Optional[int]) -> SamplingParams:
    """One choice's SamplingParams (the caller derives a per-choice seed)."""
    def given(value, default):
        return default if value is None else value

    values = dict(
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
        skip_special_tokens=req.skip_special_tokens,
        constraint=constraint,
    )
    # `priority` (lower first) matters under --schedule-policy priority; checked for, so that this
    # module also runs against an engine without the field.
    if req.priority is not None and "priority" in _SAMPLING_FIELDS:
        values["priority"] = req.priority
    return SamplingParams(**values)


def choice_seed(seed: Optional[int], index: int) -> Optional[int]:
    """Distinct, reproducible seeds for the n choices of one seeded request."""
    return None if seed is None else seed + index
