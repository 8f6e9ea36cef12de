"""A serving process's lifecycle: health that says whether the engine can still serve, and the
drain on SIGTERM (stop admitting, let in-flight requests finish, abort the rest, exit).

`DrainGate` is the ASGI middleware that counts in-flight requests and refuses new ones while
draining; `Lifecycle` owns that state and the drain itself. `serve.py` wires the signals to it.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Callable, Optional

from starlette.types import ASGIApp, Receive, Scope, Send

from radixserve.api.errors import APIError, RETRY_AFTER_SECONDS, engine_stopped, loading
from radixserve.runtime.engine_client import EngineClient

log = logging.getLogger("radixserve")

DEFAULT_WATCHDOG_TIMEOUT = 60.0   # seconds without a finished step or idle wait before /health fails
DEFAULT_SHUTDOWN_TIMEOUT = 30.0   # seconds in-flight requests may finish after SIGTERM
# After the abort, streams still send their final chunk and [DONE]: a short grace for that.
ABORT_FLUSH_SECONDS = 5.0
_POLL_SECONDS = 0.05

# Paths a draining server still answers: an orchestrator reads health and metrics until the end.
_ALWAYS_OPEN = ("/health", "/metrics")


def shutting_down() -> APIError:
    return APIError(503, "the server is shutting down; retry on another replica", code="shutting_down",
                    headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


@dataclass(frozen=True)
class DrainResult:
    in_flight: int   # HTTP requests in flight when the drain began
    drained: int     # of those, finished before the timeout
    aborted: int     # still running at the timeout, ended with finish_reason "abort"


class Lifecycle:
    def __init__(self, get_engine: Callable[[], Optional[EngineClient]], watchdog_timeout: float = DEFAULT_WATCHDOG_TIMEOUT,
                 count: Callable[[str, int], None] = lambda outcome, n: None):
        self._get_engine = get_engine
        self.watchdog_timeout = watchdog_timeout
        self._count = count  # (outcome "drained" | "aborted", requests): for /metrics, as they happen
        self.draining = False
        self.in_flight = 0
        self._finished_while_draining = 0
        self._past_timeout = False

    # ---- health ---------------------------------------------------------------------------
    def health_problem(self) -> Optional[APIError]:
        """Why this server cannot serve right now (a 503), or None when it can."""
        engine = self._get_engine()
        if engine is None:
            return loading()
        if self.draining:
            return shutting_down()
        h = engine.health()
        if not h.alive:
            return engine_stopped(h.fatal_error)
        if h.seconds_since_progress > self.watchdog_timeout:
            return APIError(503, f"the engine loop has made no progress for {h.seconds_since_progress:.0f} s "
                                 f"(watchdog timeout {self.watchdog_timeout:g} s)", code="engine_stalled")
        return None

    # ---- drain ----------------------------------------------------------------------------
    def admit(self) -> Optional[APIError]:
        """Refusal of a new request, or None when it may run (then `finished` must follow)."""
        if self.draining:
            return shutting_down()
        self.in_flight += 1
        return None

    def finished(self) -> None:
        self.in_flight -= 1
        if self.draining and not self._past_timeout:
            self._finished_while_draining += 1
            self._count("drained", 1)

    async def drain(self, timeout: float) -> DrainResult:
        """Stop admitting; wait up to `timeout` seconds for in-flight requests; abort the rest and
        wait (briefly) until they have sent their final chunk. Runs on the server's event loop."""
        self.draining = True
        at_start = self.in_flight
        log.info("draining: %d request(s) in flight, up to %g s to finish", at_start, timeout)
        await self._until_idle(timeout)
        self._past_timeout = True
        aborted = self.in_flight
        engine = self._get_engine()
        if aborted:
            log.warning("drain timeout: aborting %d request(s) still running", aborted)
            self._count("aborted", aborted)
            if engine is not None:
                engine.abort_all()
            await self._until_idle(ABORT_FLUSH_SECONDS)
        result = DrainResult(at_start, self._finished_while_draining, aborted)
        log.info("drained: %d finished, %d aborted", result.drained, result.aborted)
        return result

    async def _until_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(_POLL_SECONDS)


class DrainGate:
    """Counts requests in flight (a stream until its last byte) and refuses new ones while draining."""

    def __init__(self, app: ASGIApp, lifecycle: Lifecycle):
        self.app = app
        self.lifecycle = lifecycle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(_ALWAYS_OPEN):
            await self.app(scope, receive, send)
            return
        refusal = self.lifecycle.admit()
        if refusal is not None:
            await refusal.response()(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.lifecycle.finished()
