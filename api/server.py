"""The FastAPI app: the shell (health, metrics, tokenize, the cache view), OpenAI's chat/completions
and the Responses API, each its own router, behind one error mapping, auth and the drain gate; and
the web page at `/` (api/ui/) unless `ui` is off.

`build_app` may be given no engine yet: `/health` and every model endpoint answer 503 until
`attach_engine` is called, so uvicorn can listen while the model loads. The engine is any
`EngineClient`: the in-process Engine, or the Ray replicas' client (api/cluster/).
"""
from __future__ import annotations

from typing import Optional

from fastapi import FastAPI

from radixserve.api.errors import install_error_handlers
from radixserve.api.openai.routes import router as openai_router
from radixserve.api.responses.routes import router as responses_router
from radixserve.api.responses.store import DEFAULT_RESPONSE_STORE_SIZE
from radixserve.api.shell.cache import router as cache_router
from radixserve.api.shell.auth import BearerAuthMiddleware
from radixserve.api.shell.lifecycle import DEFAULT_WATCHDOG_TIMEOUT, DrainGate
from radixserve.api.shell.openapi import install_openapi
from radixserve.api.shell.routes import router as shell_router
from radixserve.api.state import ServerState
from radixserve.api.openai.tool_formats import tool_format
from radixserve.api.ui import install_ui
from radixserve.runtime.engine_client import EngineClient


def build_app(engine: Optional[EngineClient] = None, served_model_name: Optional[str] = None,
              api_key: Optional[str] = None, watchdog_timeout: float = DEFAULT_WATCHDOG_TIMEOUT,
              response_store_size: int = DEFAULT_RESPONSE_STORE_SIZE, schema_in_prompt: bool = True,
              ui: bool = True, ui_show_prefix_text: bool = False, tool_call_format: Optional[str] = None) -> FastAPI:
    tool_format(tool_call_format, None)   # an unknown name fails before anything listens
    state = ServerState(engine, served_model_name, api_key, watchdog_timeout, response_store_size, schema_in_prompt,
                        ui_show_prefix_text, tool_call_format)
    app = FastAPI(title="radixserve", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = state
    install_error_handlers(app)
    if state.api_key:
        app.add_middleware(BearerAuthMiddleware, api_key=state.api_key)
    app.add_middleware(DrainGate, lifecycle=state.lifecycle)  # outermost: a draining server refuses first
    for router in (openai_router, responses_router, shell_router, cache_router):
        app.include_router(router)
    if ui:
        install_ui(app)
    install_openapi(app)
    return app


def attach_engine(app: FastAPI, engine: EngineClient) -> None:
    """The model has loaded: the app starts answering."""
    app.state.server.attach(engine)
