"""Bearer-token check on `/v1/*`, before the body is read (so a bad key is a 401, not a 400)."""
from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from radixserve.api.errors import APIError


class BearerAuthMiddleware:
    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                message = ("missing API key: send it as 'Authorization: Bearer <key>'" if not given
                           else "incorrect API key provided")
                await APIError(401, message, code="invalid_api_key",
                               headers={"WWW-Authenticate": "Bearer"}).response()(scope, receive, send)
                return
        await self.app(scope, receive, send)
