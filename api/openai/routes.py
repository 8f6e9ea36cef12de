"""OpenAI's chat completions, completions and model list."""
from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from radixserve.api.openai import bodies
from radixserve.api.openai.chat import create_chat_completion
from radixserve.api.openai.completions import create_completion
from radixserve.api.openai.protocol import ChatCompletionRequest, CompletionRequest
from radixserve.api.state import ServerState, server_state

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request,
                           state: ServerState = Depends(server_state)) -> Response:
    return await create_chat_completion(body, request, state)


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request,
                      state: ServerState = Depends(server_state)) -> Response:
    return await create_completion(body, request, state)


@router.get("/v1/models")
async def models(state: ServerState = Depends(server_state)) -> dict:
    engine = state.require_engine()
    card = bodies.model_card(state.served_model_name, state.created, engine.model_config.max_context_len)
    return {"object": "list", "data": [card]}
