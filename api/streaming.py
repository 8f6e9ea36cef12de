"""How a reply reaches the client: server-sent events (each chunk as one `data: {json}` event,
then `data: [DONE]`), and work that stops when the client goes away."""
from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Callable

from sse_starlette import EventSourceResponse
from starlette.background import BackgroundTask
from starlette.requests import Request

from radixserve.api.errors import ClientDisconnected

# Keep-alive comments for proxies during long prefills; clients ignore them.
PING_SECONDS = 15


class EventStream(EventSourceResponse):
    """sse-starlette's response, less the cancel scope it opens around each send when no send
    timeout is set (this server sets none). That scope's async-backend lookup was about a third of
    the event loop's CPU per streamed token, which the engine thread waits on for the GIL: without
    it 458 -> 373 us a token, the default model's tokens 7.42 -> 7.18 ms apart
    (bench/sse_overhead.py, a Zen 4 EPYC)."""

    async def _send_with_timeout(self, send, message) -> None:
        if self.send_timeout is not None:
            await super()._send_with_timeout(send, message)
            return
        try:
            await send(message)
        except BaseException:
            self._send_interrupted = True
            raise


def event_stream(events: AsyncIterator[dict[str, str]], on_close: Callable[[], None]) -> EventStream:
    """`events` (sse-starlette's fields: `data`, `event`) as SSE, with keep-alive pings. If the
    client disconnects, sse-starlette cancels the generator; `on_close` runs however the response
    ends (even if the generator never started) and must abort whatever is still running."""
    return EventStream(events, sep="\n", ping=PING_SECONDS, background=BackgroundTask(on_close),
                       headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def sse_response(chunks: AsyncIterator[dict[str, Any]], on_close: Callable[[], None]) -> EventStream:
    """Stream `chunks` as `data: {json}` events, then `data: [DONE]` (see `event_stream`)."""
    async def events() -> AsyncIterator[dict[str, str]]:
        try:
            async for chunk in chunks:
                yield {"data": json.dumps(chunk, ensure_ascii=False, separators=(",", ":"))}
            yield {"data": "[DONE]"}
        finally:
            await chunks.aclose()

    return event_stream(events(), on_close)


async def until_disconnected(http: Request, work, on_disconnect: Callable[[], None]) -> None:
    """Run `work` (awaitable) unless the client disconnects first; then call `on_disconnect` and
    raise ClientDisconnected."""
    work_task = asyncio.ensure_future(work)
    watch = asyncio.create_task(_wait_for_disconnect(http))
    try:
        done, _ = await asyncio.wait({work_task, watch}, return_when=asyncio.FIRST_COMPLETED)
        if work_task in done:
            work_task.result()
            return
        on_disconnect()
        raise ClientDisconnected()
    finally:
        watch.cancel()
        if not work_task.done():
            work_task.cancel()


async def _wait_for_disconnect(http: Request) -> None:
    while True:
        message = await http.receive()
        if message["type"] == "http.disconnect":
            return
