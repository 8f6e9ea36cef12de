"""The FastAPI app: OpenAI-compatible endpoints plus health, metrics and (de)tokenisation.

`build_app` may be given no engine yet: `/health` and every model endpoint answer 503 until
`attach_engine` is called, so uvicorn can listen while the model loads.
"""
from __future__ import annotations

from typing import Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.responses import Response

from radixserve.api import responses
from radixserve.api.auth import BearerAuthMiddleware
from radixserve.api.chat import create_chat_completion
from radixserve.api.chat_prompt import render_chat_prompt
from radixserve.api.completions import create_completion
from radixserve.api.errors import bad_request, install_error_handlers, loading
from radixserve.api.generation import ClientDisconnected
from radixserve.api.protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from radixserve.api.state import ServerState
from radixserve.runtime.engine import Engine

# nginx's "client closed request": nobody reads it, it only shows in the access log.
CLIENT_CLOSED_REQUEST = 499


def build_app(engine: Optional[Engine] = None, served_model_name: Optional[str] = None,
              api_key: Optional[str] = None) -> FastAPI:
    state = ServerState(engine, served_model_name, api_key)
    app = FastAPI(title="radixserve", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = state
    install_error_handlers(app)
    if state.api_key:
        app.add_middleware(BearerAuthMiddleware, api_key=state.api_key)

    @app.exception_handler(ClientDisconnected)
    async def _gone(_: Request, __: ClientDisconnected) -> Response:
        return Response(status_code=CLIENT_CLOSED_REQUEST)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await create_chat_completion(body, request, state)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await create_completion(body, request, state)

    @app.get("/v1/models")
    async def models() -> dict:
        engine = state.require_engine()
        card = responses.model_card(state.served_model_name, state.created, engine.model_config.max_context_len)
        return {"object": "list", "data": [card]}

    @app.get("/health")
    async def health() -> Response:
        if not state.ready:
            return loading().response()
        return JSONResponse({"status": "ok"})

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

    return app


def attach_engine(app: FastAPI, engine: Engine) -> None:
    """The model has loaded: the app starts answering."""
    app.state.server.attach(engine)
