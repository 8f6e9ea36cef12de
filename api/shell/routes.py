"""The shell's routes: health (the loop can serve; one token through it), Prometheus metrics,
and (de)tokenisation."""
from __future__ import annotations

import asyncio
import time
import uuid

from fastapi import APIRouter, Depends, Query
from fastapi.responses import JSONResponse
from starlette.responses import Response

from radixserve.api.errors import APIError, bad_request, refusal_error
from radixserve.api.openai.chat_prompt import render_chat_prompt
from radixserve.api.openai.protocol import DetokenizeRequest, TokenizeRequest
from radixserve.api.state import ServerState, server_state
from radixserve.runtime.engine_client import EngineRefusal
from radixserve.runtime.sampling_params import SamplingParams

HEALTH_PROMPT = "ping"
HEALTH_GENERATE_TIMEOUT = 10.0  # seconds

router = APIRouter()


@router.get("/health")
async def health(state: ServerState = Depends(server_state)) -> Response:
    """200 while the engine loop runs and has made progress within the watchdog timeout."""
    problem = state.lifecycle.health_problem()
    return problem.response() if problem else JSONResponse({"status": "ok"})


@router.get("/health/generate")
async def health_generate(timeout: float = Query(default=HEALTH_GENERATE_TIMEOUT, ge=0.1, le=300),
                          state: ServerState = Depends(server_state)) -> Response:
    """One token generated through the engine, within `timeout` seconds."""
    problem = state.lifecycle.health_problem()
    if problem:
        return problem.response()
    engine = state.require_engine()
    rid = "health-" + uuid.uuid4().hex
    t0 = time.monotonic()
    try:
        stream = await engine.start(engine.tokenizer.encode(HEALTH_PROMPT),
                                    SamplingParams(max_tokens=1, temperature=0.0), request_id=rid)
    except EngineRefusal as refusal:   # overloaded: 503 with Retry-After; stopped: 503
        return refusal_error(refusal).response()
    try:
        last = await asyncio.wait_for(_final_output(stream), timeout)
    except asyncio.TimeoutError:
        engine.abort(rid)
        return APIError(503, f"the engine generated no token within {timeout:g} s",
                        code="engine_stalled").response()
    if last.finish_reason not in ("stop", "length"):
        return APIError(503, f"the test generation ended with {last.finish_reason}: {last.error or ''}".strip(),
                        code="engine_failing").response()
    return JSONResponse({"status": "ok", "seconds": round(time.monotonic() - t0, 4)})


async def _final_output(stream):
    last = None
    async for out in stream:
        last = out
    return last


@router.get("/metrics")
async def metrics(state: ServerState = Depends(server_state)) -> Response:
    body, content_type = state.metrics.exposition()
    return Response(body, media_type=content_type)


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, state: ServerState = Depends(server_state)) -> dict:
    engine = state.require_engine()

    def encode() -> list[int]:
        if body.messages is not None:
            text = render_chat_prompt(engine.tokenizer, body.messages, add_generation_prompt=body.add_generation_prompt)
            return engine.tokenizer.encode(text)
        return engine.tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)

    tokens = await asyncio.to_thread(encode)
    return {"tokens": tokens, "count": len(tokens), "max_model_len": engine.model_config.max_context_len}


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, state: ServerState = Depends(server_state)) -> dict:
    engine = state.require_engine()
    vocab = engine.model_config.vocab_size
    bad = next((t for t in body.tokens if not 0 <= t < vocab), None)
    if bad is not None:
        raise bad_request(f"tokens: {bad} is not a token id of this model (vocabulary size {vocab})", param="tokens")
    text = await asyncio.to_thread(engine.tokenizer.decode, body.tokens, skip_special_tokens=False)
    return {"prompt": text}
