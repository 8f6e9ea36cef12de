"""What every handler needs: the engine (absent while the model loads), the served model name,
the metrics, per-model caches and the stored Responses."""
from __future__ import annotations

import time
from typing import Optional

from radixserve.api.errors import APIError, loading
from radixserve.api.lifecycle import DEFAULT_WATCHDOG_TIMEOUT, Lifecycle, engine_stopped
from radixserve.api.logprobs import TokenTexts
from radixserve.api.metrics import ServerMetrics
from radixserve.api.response_store import DEFAULT_RESPONSE_STORE_SIZE, ResponseStore
from radixserve.runtime.engine import Engine


class ServerState:
    def __init__(self, engine: Optional[Engine], served_model_name: Optional[str], api_key: Optional[str],
                 watchdog_timeout: float = DEFAULT_WATCHDOG_TIMEOUT,
                 response_store_size: int = DEFAULT_RESPONSE_STORE_SIZE, schema_in_prompt: bool = True):
        self.engine: Optional[Engine] = None
        self._served_model_name = served_model_name
        self.api_key = api_key or None
        self.schema_in_prompt = schema_in_prompt  # chat's response_format schema also stated in the prompt
        self.created = int(time.time())
        self.metrics = ServerMetrics(lambda: self.engine)
        self.token_texts: Optional[TokenTexts] = None
        self.responses = ResponseStore(response_store_size)  # finished Responses kept for previous_response_id
        self.lifecycle = Lifecycle(lambda: self.engine, watchdog_timeout, self.metrics.count_drain)
        if engine is not None:
            self.attach(engine)

    def attach(self, engine: Engine) -> None:
        """The model is loaded: start answering."""
        self.token_texts = TokenTexts(engine.tokenizer)
        self.engine = engine

    @property
    def ready(self) -> bool:
        return self.engine is not None

    @property
    def served_model_name(self) -> Optional[str]:
        if self._served_model_name:
            return self._served_model_name
        return self.engine.model_name if self.engine is not None else None

    def require_engine(self) -> Engine:
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
