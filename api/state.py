"""What every handler needs: the engine client (absent while the model loads; the in-process
Engine or the Ray replicas' client), the served model name, the metrics, per-model caches and the
stored Responses. Routers reach it with `Depends(server_state)`."""
from __future__ import annotations

import time
from typing import Optional

from starlette.requests import Request

from radixserve.api.errors import APIError, engine_stopped, loading
from radixserve.api.openai.logprobs import TokenTexts
from radixserve.api.openai.tool_formats import FORMATS, special_markers, tool_format
from radixserve.api.responses.store import DEFAULT_RESPONSE_STORE_SIZE, ResponseStore
from radixserve.api.shell.lifecycle import DEFAULT_WATCHDOG_TIMEOUT, Lifecycle
from radixserve.api.shell.metrics import ServerMetrics
from radixserve.runtime.engine_client import EngineClient


class ServerState:
    def __init__(self, engine: Optional[EngineClient], served_model_name: Optional[str], api_key: Optional[str],
                 watchdog_timeout: float = DEFAULT_WATCHDOG_TIMEOUT,
                 response_store_size: int = DEFAULT_RESPONSE_STORE_SIZE, schema_in_prompt: bool = True,
                 show_prefix_text: bool = False, tool_call_format: Optional[str] = None):
        self.engine: Optional[EngineClient] = None
        self._served_model_name = served_model_name
        self.api_key = api_key or None
        self.schema_in_prompt = schema_in_prompt  # chat's response_format schema also stated in the prompt
        self.show_prefix_text = show_prefix_text  # /v1/cache may show cached prompt text
        self.tool_call_format_name = tool_call_format  # None / auto: the chat template's (tool_formats.py)
        self.tool_format = FORMATS["hermes"]
        self.tool_markers_special = False
        self.stop_markup: dict[int, str] = {}   # stop token ids that are the tool format's markup
        self.created = int(time.time())
        self.metrics = ServerMetrics(lambda: self.engine)
        self.token_texts: Optional[TokenTexts] = None
        self.responses = ResponseStore(response_store_size)  # finished Responses kept for previous_response_id
        self.lifecycle = Lifecycle(lambda: self.engine, watchdog_timeout, self.metrics.count_drain)
        if engine is not None:
            self.attach(engine)

    def attach(self, engine: EngineClient) -> None:
        """The model is loaded: start answering."""
        self.token_texts = TokenTexts(engine.tokenizer)
        stop_ids = set(engine.model_config.eos_token_ids) | set(engine.tokenizer.eos_token_ids)
        self.tool_format = tool_format(self.tool_call_format_name, engine.tokenizer.chat_template).for_model(
            engine.tokenizer, stop_ids)
        # the parser needs the markup's special tokens in the text it reads, a stop token's too
        self.tool_markers_special = special_markers(self.tool_format, engine.tokenizer)
        self.stop_markup = {i: m for i, m in engine.tokenizer.markup_ids().items()
                            if m in self.tool_format.stop_markers}
        self.engine = engine

    def stop_markup_text(self, out) -> str:
        """The markup an output ended on as its stop token (a call's <|call|>, which the text
        leaves out as it leaves out every stop token), for the tool-call parser; else ""."""
        if out.finish_reason == "stop" and out.token_ids and out.token_ids[-1] in self.stop_markup:
            return self.stop_markup[out.token_ids[-1]]
        return ""

    @property
    def ready(self) -> bool:
        return self.engine is not None

    @property
    def served_model_name(self) -> Optional[str]:
        if self._served_model_name:
            return self._served_model_name
        return self.engine.model_name if self.engine is not None else None

    def require_engine(self) -> EngineClient:
        if self.engine is None:
            raise loading()
        health = self.engine.health()
        if not health.alive:
            raise engine_stopped(health.fatal_error)
        return self.engine

    def check_model(self, model: Optional[str]) -> str:
        """The served name if `model` names it (or is absent); else 404."""
        served = self.served_model_name
        if model is not None and model != served:
            raise APIError(404, f"The model {model!r} does not exist; this server serves {served!r}",
                           param="model", code="model_not_found", error_type="invalid_request_error")
        return served


def server_state(request: Request) -> ServerState:
    return request.app.state.server
