"""The FastAPI app: OpenAI-compatible endpoints plus health, metrics and (de)tokenisation.

`build_app` may be given no engine yet: `/health` and every model endpoint answer 503 until
`attach_engine` is called, so uvicorn can listen while the model loads.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from typing import Optional

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse
from starlette.responses import Response

from radixserve.api import responses
from radixserve.api.auth import BearerAuthMiddleware
from radixserve.api.chat import create_chat_completion
from radixserve.api.chat_prompt import render_chat_prompt
from radixserve.api.completions import create_completion
from radixserve.api.errors import APIError, bad_request, install_error_handlers
from radixserve.api.generation import ClientDisconnected
from radixserve.api.lifecycle import DEFAULT_WATCHDOG_TIMEOUT, DrainGate
from radixserve.api.openapi import install_openapi
from radixserve.api.protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from radixserve.api.response_store import DEFAULT_RESPONSE_STORE_SIZE
from radixserve.api.responses_api import (OTHER_METHODS, RESPONSE_ID, create_response, delete_response,
                                          get_response)
from radixserve.api.responses_protocol import ResponsesRequest
from radixserve.api.state import ServerState
from radixserve.runtime.engine import Engine, EngineStoppedError
from radixserve.runtime.sampling_params import SamplingParams

# nginx's "client closed request": nobody reads it, it only shows in the access log.
CLIENT_CLOSED_REQUEST = 499

HEALTH_PROMPT = "ping"
HEALTH_GENERATE_TIMEOUT = 10.0  # seconds


def build_app(engine: Optional[Engine] = None, served_model_name: Optional[str] = None,
              api_key: Optional[str] = None, watchdog_timeout: float = DEFAULT_WATCHDOG_TIMEOUT,
              response_store_size: int = DEFAULT_RESPONSE_STORE_SIZE, schema_in_prompt: bool = True) -> FastAPI:
    state = ServerState(engine, served_model_name, api_key, watchdog_timeout, response_store_size, schema_in_prompt)
    app = FastAPI(title="radixserve", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = state
    install_error_handlers(app)
    if state.api_key:
        app.add_middleware(BearerAuthMiddleware, api_key=state.api_key)
    app.add_middleware(DrainGate, lifecycle=state.lifecycle)  # outermost: a draining server refuses first

    @app.exception_handler(ClientDisconnected)
    async def _gone(_: Request, __: ClientDisconnected) -> Response:
        return Response(status_code=CLIENT_CLOSED_REQUEST)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await create_chat_completion(body, request, state)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await create_completion(body, request, state)

    @app.post("/v1/responses")
    async def create_responses(body: ResponsesRequest, request: Request) -> Response:
        return await create_response(body, request, state)

    @app.get("/v1/responses/{response_id}")
    async def retrieve_response(response_id: str = RESPONSE_ID) -> dict:
        return get_response(response_id, state)

    @app.delete("/v1/responses/{response_id}")
    async def delete_stored_response(response_id: str = RESPONSE_ID) -> dict:
        return delete_response(response_id, state)

    # Two routes share that path, so Starlette's 405 would name only the first one's method.
    @app.api_route("/v1/responses/{response_id}", methods=OTHER_METHODS, include_in_schema=False)
    async def stored_response_other_method() -> Response:
        raise APIError(405, "Method Not Allowed", headers={"Allow": "DELETE, GET"})

    # An empty id names no response: a 404, not a redirect to POST /v1/responses.
    @app.api_route("/v1/responses/", methods=["GET", "DELETE"], include_in_schema=False)
    async def no_response_id() -> dict:
        return get_response("", state)

    @app.get("/v1/models")
    async def models() -> dict:
        engine = state.require_engine()
        card = responses.model_card(state.served_model_name, state.created, engine.model_config.max_context_len)
        return {"object": "list", "data": [card]}

    @app.get("/health")
    async def health() -> Response:
        """200 while the engine loop runs and has made progress within the watchdog timeout."""
        problem = state.lifecycle.health_problem()
        return problem.response() if problem else JSONResponse({"status": "ok"})

    @app.get("/health/generate")
    async def health_generate(timeout: float = Query(default=HEALTH_GENERATE_TIMEOUT, ge=0.1, le=300)) -> Response:
        """One token generated through the engine, within `timeout` seconds."""
        problem = state.lifecycle.health_problem()
        if problem:
            return problem.response()
        engine = state.require_engine()
        rid = "health-" + uuid.uuid4().hex
        t0 = time.monotonic()
        try:
            stream = await engine.start(HEALTH_PROMPT, SamplingParams(max_tokens=1, temperature=0.0), request_id=rid)
        except EngineStoppedError:
            return state.lifecycle.health_problem().response()
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

    @app.get("/metrics")
    async def metrics() -> Response:
        body, content_type = state.metrics.exposition()
        return Response(body, media_type=content_type)

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict:
        engine = state.require_engine()
        if body.messages is not None:
            text = render_chat_prompt(engine.tokenizer, body.messages,
                                      add_generation_prompt=body.add_generation_prompt)
            tokens = engine.tokenizer.encode(text)
        else:
            tokens = engine.tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)
        return {"tokens": tokens, "count": len(tokens), "max_model_len": engine.model_config.max_context_len}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict:
        engine = state.require_engine()
        vocab = engine.model_config.vocab_size
        bad = next((t for t in body.tokens if not 0 <= t < vocab), None)
        if bad is not None:
            raise bad_request(f"tokens: {bad} is not a token id of this model (vocabulary size {vocab})",
                              param="tokens")
        return {"prompt": engine.tokenizer.decode(body.tokens, skip_special_tokens=False)}

    install_openapi(app)
    return app


async def _final_output(stream):
    last = None
    async for out in stream:
        last = out
    return last


def attach_engine(app: FastAPI, engine: Engine) -> None:
    """The model has loaded: the app starts answering."""
    app.state.server.attach(engine)
