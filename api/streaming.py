"""Server-sent events: each chunk as one `data: {json}` event, then `data: [DONE]`."""
from __future__ import annotations

import json
from typing import Any, AsyncIterator, Callable

from sse_starlette import EventSourceResponse
from starlette.background import BackgroundTask

# Keep-alive comments for proxies during long prefills; clients ignore them.
PING_SECONDS = 15


def sse_response(chunks: AsyncIterator[dict[str, Any]], on_close: Callable[[], None]) -> EventSourceResponse:
    """Stream `chunks` as SSE. If the client disconnects, sse-starlette cancels the generator;
    `on_close` runs however the response ends (even if the generator never started) and must
    abort whatever is still running."""
    async def events() -> AsyncIterator[dict[str, str]]:
        try:
            async for chunk in chunks:
                yield {"data": json.dumps(chunk, ensure_ascii=False, separators=(",", ":"))}
            yield {"data": "[DONE]"}
        finally:
            await chunks.aclose()

    return EventSourceResponse(events(), sep="\n", ping=PING_SECONDS, background=BackgroundTask(on_close),
                               headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
