"""OpenAI error bodies (`{"error": {"message", "type", "param", "code"}}`) for every failure the
server reports, and the exception handlers that produce them. No traceback ever reaches a client.

An engine's refusal (`EngineRefusal`, whichever engine client raised it) becomes HTTP here and
nowhere else: its kind picks the status and code, its field (named as the endpoint's request
names it, `RequestFields`) becomes `param`. A schema refusal's `param` also points at the refused
keyword: the field, then `#` and the JSON pointer of the keyword inside the schema, e.g.
`response_format#/properties/tags/uniqueItems`."""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from radixserve.runtime.engine_client import EngineRefusal, RefusalKind

log = logging.getLogger("radixserve.api")

# OpenAI's error types by status.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               405: "invalid_request_error", 413: "invalid_request_error", 422: "invalid_request_error",
               429: "rate_limit_error", 500: "server_error", 503: "server_error"}

RETRY_AFTER_SECONDS = 1


class APIError(Exception):
    """An error the client gets as an OpenAI error body with this status."""

    def __init__(self, status: int, message: str, param: Optional[str] = None, code: Optional[str] = None,
                 error_type: Optional[str] = None, headers: Optional[dict[str, str]] = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.error_type = error_type or ERROR_TYPES.get(status, "server_error")
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.error_type, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(message: str, error_type: str, param: Optional[str] = None, code: Optional[str] = None) -> dict:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def bad_request(message: str, param: Optional[str] = None, code: Optional[str] = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def overloaded(message: str = "server overloaded: too many requests waiting; retry later") -> APIError:
    return APIError(503, message, code="overloaded", headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


def loading() -> APIError:
    return APIError(503, "the model is still loading; retry shortly", code="model_loading",
                    headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


def engine_stopped(reason: Optional[str]) -> APIError:
    return APIError(503, f"the engine has stopped and cannot serve: {reason or 'shut down'}",
                    code="engine_stopped")


def internal_error(request_id: str) -> APIError:
    return APIError(500, f"internal server error (request {request_id}); see the server log", code="internal_error")


@dataclass(frozen=True)
class RequestFields:
    """How one endpoint's request names the engine's fields, for the refusals it may get."""
    renames: Mapping[str, str] = field(default_factory=dict)   # engine field -> request field
    constraint: Optional[str] = None                            # the field that set the constraint

    def name(self, engine_field: Optional[str]) -> Optional[str]:
        if engine_field == "constraint" and self.constraint:
            return self.constraint
        return self.renames.get(engine_field, engine_field) if engine_field else None


def refusal_error(refusal: EngineRefusal, fields: RequestFields = RequestFields()) -> APIError:
    """The one mapping of engine refusals to HTTP."""
    kind = refusal.kind
    if kind is RefusalKind.OVERLOADED:
        return overloaded(refusal.message)
    if kind is RefusalKind.STOPPED:
        return engine_stopped(refusal.message)
    param = fields.name(refusal.field)
    if kind is RefusalKind.CONTEXT_LENGTH:
        return bad_request(refusal.message, param=param, code="context_length_exceeded")
    message = f"{param}: {refusal.message}" if param else refusal.message
    if kind is RefusalKind.GRAMMAR:
        if param and refusal.pointer:
            param = f"{param}#{refusal.pointer}"
        return bad_request(message, param=param, code="invalid_grammar")
    return bad_request(message, param=param)


def field_path(loc: Sequence[Any]) -> Optional[str]:
    """A pydantic error location as the request field it names: ('body', 'messages', 0, 'role')
    -> 'messages[0].role'. Union-branch and validator labels pydantic adds are dropped."""
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif item in ("body", "query", "path") and not parts:
            continue
        elif isinstance(item, str) and ("[" in item or "-" in item or item in _TYPE_LABELS):
            continue  # e.g. 'list[str]', 'function-after[...]', 'str': the branch, not the field
        else:
            parts.append(("." if parts else "") + item)
    return "".join(parts) or None


_TYPE_LABELS = {"str", "int", "float", "bool", "dict", "list", "none", "json-or-python"}


def _validation_error(exc: RequestValidationError) -> APIError:
    errors = exc.errors()
    first = errors[0] if errors else {"msg": "invalid request", "loc": ()}
    if first.get("type") == "json_invalid":
        detail = first.get("ctx", {}).get("error", "")
        return bad_request(f"malformed JSON body{': ' + str(detail) if detail else ''}", code="invalid_json")
    param = field_path(first.get("loc", ()))
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if param is None and first.get("type") == "body_field":  # a whole-body check names its field
        return bad_request(msg, param=first["ctx"]["field"])
    if first.get("type") == "missing":
        msg = "required field is missing"
    elif first.get("type") == "extra_forbidden":
        msg = "unrecognized request argument (not supported by this server)"
    elif first.get("type") == "model_attributes_type" and param is None:
        msg = "the request body must be a JSON object"
    return bad_request(f"{param}: {msg}" if param else msg, param=param)


# nginx's "client closed request": nobody reads it, it only shows in the access log.
CLIENT_CLOSED_REQUEST = 499


class ClientDisconnected(Exception):
    """The client went away; nothing is sent."""


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(EngineRefusal)
    async def _refused(request: Request, exc: EngineRefusal) -> JSONResponse:
        # a handler that submits to the engine names its request's fields first (request.state.fields)
        return refusal_error(exc, getattr(request.state, "fields", RequestFields())).response()

    @app.exception_handler(ClientDisconnected)
    async def _gone(_: Request, __: ClientDisconnected) -> Response:
        return Response(status_code=CLIENT_CLOSED_REQUEST)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_error(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        if exc.status_code == 404:
            message = "not found: no such endpoint"
        return APIError(exc.status_code, message, headers=dict(exc.headers or {})).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        request_id = getattr(request.state, "request_id", "-")
        log.exception("request %s failed: %s", request_id, exc)
        return internal_error(request_id).response()


HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "TRACE")


def allow_only(router, path: str, allowed: Sequence[str]) -> None:
    """Answer every other method on `path` with a 405 naming all of `allowed`: where several routes
    share a path, Starlette's own 405 would name only the first one's method."""
    allow = ", ".join(sorted(allowed))

    async def other_method() -> Response:
        raise APIError(405, "Method Not Allowed", headers={"Allow": allow})

    router.add_api_route(path, other_method, methods=[m for m in HTTP_METHODS if m not in allowed],
                         include_in_schema=False)
