"""The web page at `/`: a streaming chat playground (structured output, tools, the Responses API)
beside a live view of the prefix cache. Plain HTML, CSS and ES modules in `static/`, no build step
and nothing fetched from outside the server (the Content-Security-Policy says so to the browser).
The page talks to the server only through its public API, as any client would; it embeds nothing
secret, so serving it needs no API key (the page asks for one when `/v1/*` answers 401)."""
from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse
from starlette.staticfiles import StaticFiles

STATIC = Path(__file__).parent / "static"

# Everything from this origin, nothing from anywhere else; no inline script, no eval.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}


class _Assets(StaticFiles):
    """The page's files, with the same headers as the page (revalidated, so an upgrade shows at once)."""

    def file_response(self, *args, **kwargs):
        response = super().file_response(*args, **kwargs)
        response.headers.update(HEADERS)
        return response


def install_ui(app: FastAPI) -> None:
    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html", headers=HEADERS)

    @app.get("/ui/config.json", include_in_schema=False)
    async def config(request: Request) -> JSONResponse:
        # whether to ask for the key before the first call (a 401 would already say so, as an error)
        return JSONResponse({"api_key_required": request.app.state.server.api_key is not None}, headers=HEADERS)

    app.mount("/ui", _Assets(directory=STATIC), name="ui")
