"""`/openapi.json` and `/docs`: the document FastAPI derives from the routes and the protocol
models, completed with what it cannot see: the OpenAI error body of every failure an operation can
return, the event stream of `stream: true`, Prometheus text on `/metrics`, and the loaded model's
own limits (vocabulary size, context window).

Errors are attached by rule, not by a list of routes, so a route added later is documented too:
every operation can answer 500 and 503 (loading, overloaded, draining: with Retry-After); one that
reads a body or parameters, 400; one under /v1/, 401 (needed only when the server has an API key); one whose
body names a `model` or a `previous_response_id`, or whose path names a stored response, 404.
"""
from __future__ import annotations

import copy
from importlib import metadata
from typing import Any, Callable, Optional

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse

from radixserve.api.openai.protocol import MODEL_LIMIT

ERROR_SCHEMA = "ErrorResponse"
_ERROR_REF = {"$ref": f"#/components/schemas/{ERROR_SCHEMA}"}

ERROR_RESPONSE_SCHEMA: dict[str, Any] = {
    "title": ERROR_SCHEMA,
    "description": "OpenAI's error body; no traceback ever reaches a client.",
    "type": "object",
    "required": ["error"],
    "additionalProperties": False,
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type", "param", "code"],
        "additionalProperties": False,
        "properties": {
            "message": {"type": "string"},
            "type": {"type": "string", "description": "e.g. invalid_request_error, authentication_error, "
                                                      "server_error"},
            "param": {"type": ["string", "null"], "description": "the request field at fault, e.g. "
                                                                 "`messages[0].role`"},
            "code": {"type": ["string", "null"], "description": "e.g. context_length_exceeded, invalid_grammar, "
                                                                "model_not_found, model_loading, overloaded"},
        },
    }},
}

# Sent when waiting helps (model_loading, overloaded, shutting_down), not when the engine has stopped
# or stalled: then a health check fails and retrying this server will not help.
# OpenAPI 3.1 has the schema of an event stream describe one event.
_STREAM_EVENT = {
    "title": "ServerSentEvent",
    "description": "With `stream: true`: one event per chunk, `data: {chunk as JSON}`, then `data: [DONE]`; "
                   "an error after the stream began comes as one `data: {error body}` event.",
    "type": "object",
    "required": ["data"],
    "properties": {"data": {"anyOf": [{"const": "[DONE]"},
                                      {"type": "string", "contentMediaType": "application/json"}]}},
}

# POST /v1/responses streams OpenAI's Responses events instead: named, numbered, no [DONE].
_RESPONSES_EVENT = {
    "title": "ResponseStreamEvent",
    "description": "With `stream: true`: `event: <type>` and `data: {event as JSON}` per event, each with its "
                   "`type` and a `sequence_number` counting from 0: response.created, response.in_progress, then "
                   "per output item response.output_item.added, response.content_part.added, "
                   "response.output_text.delta..., response.output_text.done, response.content_part.done (a "
                   "function_call item: response.function_call_arguments.delta..., "
                   "response.function_call_arguments.done), response.output_item.done; last "
                   "response.completed, response.incomplete (cut at max_output_tokens) or response.failed.",
    "type": "object",
    "required": ["event", "data"],
    "properties": {"event": {"type": "string"},
                   "data": {"type": "string", "contentMediaType": "application/json"}},
}

_RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before retrying, when the condition is "
                                               "transient", "required": False,
                                "schema": {"type": "integer", "minimum": 0}}}
_WWW_AUTHENTICATE = {"WWW-Authenticate": {"description": "`Bearer`", "required": True,
                                          "schema": {"type": "string"}}}

_BAD_REQUEST = (
    "The request is refused, and `param` names the field: the body is not a JSON object, a field is "
    "missing, unknown, of the wrong type or out of range (all stated in the request schema), or it asks "
    "for what no schema can state: a prompt that with max_tokens exceeds the context window "
    "(`context_length_exceeded`), a grammar, regex or JSON schema the grammar backend cannot compile or "
    "enforce (`invalid_grammar`), two structured-output spellings in one request (`conflicting_constraints`), "
    "token ids outside the vocabulary, tools with the same name, a tool_choice naming no tool, tool-call "
    "arguments that are not JSON, messages the chat template refuses, min_tokens above max_tokens.")


def _error(description: str, headers: Optional[dict] = None) -> dict[str, Any]:
    response: dict[str, Any] = {"description": description,
                                "content": {"application/json": {"schema": dict(_ERROR_REF)}}}
    if headers:
        response["headers"] = copy.deepcopy(headers)
    return response


def install_openapi(app: FastAPI, title: str = "radixserve") -> None:
    """Serve the document at /openapi.json and Swagger UI at /docs, and make `app.openapi()`
    return the completed document."""
    app.openapi = _document_builder(app, title)  # type: ignore[method-assign]

    async def openapi_json(_: Request) -> JSONResponse:
        return JSONResponse(app.openapi())

    async def docs(_: Request) -> HTMLResponse:
        page = get_swagger_ui_html(openapi_url="/openapi.json", title=f"{title} API").body.decode()
        note = ("<p>This page loads Swagger UI from a CDN, so it needs the network; "
                "the document itself is served offline at <a href=\"/openapi.json\">/openapi.json</a>.</p>")
        return HTMLResponse(page.replace("<body>", "<body>\n" + note, 1))

    app.add_route("/openapi.json", openapi_json, methods=["GET"], include_in_schema=False)
    app.add_route("/docs", docs, methods=["GET"], include_in_schema=False)


def _document_builder(app: FastAPI, title: str) -> Callable[[], dict[str, Any]]:
    cache: dict[tuple, dict[str, Any]] = {}

    def openapi() -> dict[str, Any]:
        # Rebuilt when the model arrives (its limits enter the document) or a route is added.
        state = getattr(app.state, "server", None)
        engine = getattr(state, "engine", None)
        key = (id(engine), len(app.routes), bool(getattr(state, "api_key", None)))
        if key not in cache:
            cache.clear()
            cache[key] = build_document(app, title, _model_limits(engine),
                                        api_key=bool(getattr(state, "api_key", None)))
        return cache[key]

    return openapi


def _model_limits(engine) -> dict[str, Any]:
    """The engine's own admission rule, as schema maxima (and the retentions it keeps, as an enum)."""
    if engine is None:
        return {}
    admission = engine.admission
    return {"vocab_size": admission.vocab_size - 1, "max_new_tokens": admission.max_new_tokens,
            "retentions": list(admission.retentions)}


def _version() -> str:
    try:
        return metadata.version("radixserve")
    except metadata.PackageNotFoundError:
        return "0"


def build_document(app: FastAPI, title: str, limits: dict[str, Any], api_key: bool = False) -> dict[str, Any]:
    """The OpenAPI document of `app`; `limits` fills in the `maximum` of model-dependent fields."""
    # Deep-copied: the generated document shares dicts with the protocol models' schema constants.
    doc = copy.deepcopy(get_openapi(title=title, version=_version(), routes=app.routes,
                                    description="An OpenAI-compatible LLM server."))
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    # Validation errors are answered as 400 with the error body, never as FastAPI's 422.
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    schemas[ERROR_SCHEMA] = copy.deepcopy(ERROR_RESPONSE_SCHEMA)
    if api_key:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    for path, operations in doc.get("paths", {}).items():
        for operation in operations.values():
            _complete_operation(path, operation, schemas, api_key)
    _fill_model_limits(doc, limits)
    return doc


def _body_schema(operation: dict[str, Any], schemas: dict[str, Any]) -> Optional[dict[str, Any]]:
    body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
    if body and "$ref" in body:
        return schemas.get(body["$ref"].rsplit("/", 1)[-1])
    return body


def _complete_operation(path: str, operation: dict[str, Any], schemas: dict[str, Any], api_key: bool) -> None:
    responses = operation.setdefault("responses", {})
    responses.pop("422", None)
    body = _body_schema(operation, schemas)
    fields = (body or {}).get("properties", {})
    ok = responses.setdefault("200", {"description": "Successful Response"})
    if path == "/metrics":
        ok["content"] = {"text/plain": {"schema": {"type": "string"},
                                        "description": "Prometheus text exposition format"}}
    if "stream" in fields:
        event = _RESPONSES_EVENT if path == "/v1/responses" else _STREAM_EVENT
        ok.setdefault("content", {})["text/event-stream"] = {"schema": copy.deepcopy(event)}
    if body is not None or operation.get("parameters"):
        responses["400"] = _error(_BAD_REQUEST)
    if path.startswith("/v1/"):
        responses["401"] = _error("No or a wrong API key, when the server has one (`--api-key`): send "
                                  "`Authorization: Bearer KEY`.", _WWW_AUTHENTICATE)
        if api_key:
            operation["security"] = [{"bearer": []}]
    not_found = []
    if "model" in fields:
        not_found.append("The `model` named is not the one this server serves (`model_not_found`).")
    if "previous_response_id" in fields or any(p.get("in") == "path" for p in operation.get("parameters", [])):
        not_found.append("No stored response has the id given (`response_not_found`): it was stored with "
                         "`store: false`, deleted, or evicted from the bounded store.")
    if not_found:
        responses["404"] = _error(" ".join(not_found))
    responses["500"] = _error("An internal error; the message names the request id to find in the server log.")
    responses["503"] = _error("Not serving now: the model is still loading (`model_loading`), too many requests "
                              "are waiting (`overloaded`), the server is draining (`shutting_down`) - these "
                              "with Retry-After - or the engine has stopped or stalled.", _RETRY_AFTER)


def _fill_model_limits(node: Any, limits: dict[str, Any]) -> None:
    """Each MODEL_LIMIT marker becomes a `maximum`, or for a list the `enum` (or goes, while no model
    is loaded)."""
    if isinstance(node, dict):
        limit = node.pop(MODEL_LIMIT, None)
        if limit is not None and limit in limits:
            node["enum" if isinstance(limits[limit], list) else "maximum"] = limits[limit]
        for value in node.values():
            _fill_model_limits(value, limits)
    elif isinstance(node, list):
        for value in node:
            _fill_model_limits(value, limits)
