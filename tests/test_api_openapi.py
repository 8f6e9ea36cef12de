"""The OpenAPI document (/openapi.json) is the server's contract: every operation lists the errors
it can return with OpenAI's error body, the media types it answers with, and request schemas that
call invalid exactly what the server refuses."""
from __future__ import annotations

import httpx
import jsonschema
import pytest
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from radixserve.api.shell.openapi import ERROR_SCHEMA
from radixserve.api.openai.protocol import MODEL_LIMIT
from radixserve.api.server import build_app
from .api_server import serve_app

ERROR_REF = {"$ref": f"#/components/schemas/{ERROR_SCHEMA}"}
GENERATION = ["/v1/chat/completions", "/v1/completions"]


@pytest.fixture(scope="module")
def document(api_server) -> dict:
    r = httpx.get(api_server.url + "/openapi.json", timeout=30)
    assert r.status_code == 200
    return r.json()


def operations(doc: dict):
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            yield path, method, op


def validator(doc: dict, schema_name: str) -> jsonschema.Draft202012Validator:
    registry = Registry().with_resource("urn:openapi", Resource.from_contents(doc, default_specification=DRAFT202012))
    return jsonschema.Draft202012Validator({"$ref": f"urn:openapi#/components/schemas/{schema_name}"},
                                           registry=registry)


def request_schema(doc: dict, path: str) -> str:
    ref = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    return ref.rsplit("/", 1)[-1]


def test_openapi_json_is_served_as_an_openapi_3_1_document(api, document):
    assert document["openapi"].startswith("3.1")
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics", "/tokenize",
            "/detokenize"} <= set(document["paths"])


def test_docs_page_points_at_the_document_and_says_its_ui_needs_the_network(api):
    r = httpx.get(api.url + "/docs", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "/openapi.json" in r.text and "needs the network" in r.text


def test_every_operation_lists_500_and_503_with_the_error_body(document):
    for path, method, op in operations(document):
        for status in ("500", "503"):
            assert op["responses"][status]["content"]["application/json"]["schema"] == ERROR_REF, (path, status)


def test_503_documents_retry_after(document):
    for path, method, op in operations(document):
        assert op["responses"]["503"]["headers"]["Retry-After"]["schema"]["type"] == "integer", path


def test_operations_that_read_input_list_400(document):
    for path, method, op in operations(document):
        reads_input = "requestBody" in op or op.get("parameters")
        assert ("400" in op["responses"]) == bool(reads_input), path
        if reads_input:
            assert op["responses"]["400"]["content"]["application/json"]["schema"] == ERROR_REF


def test_v1_operations_list_401_and_others_do_not(document):
    for path, method, op in operations(document):
        assert ("401" in op["responses"]) == path.startswith("/v1/"), path


def test_operations_that_name_a_model_list_404(document):
    for path in GENERATION:
        assert document["paths"][path]["post"]["responses"]["404"]["content"]["application/json"]["schema"] == ERROR_REF
    assert "404" not in document["paths"]["/tokenize"]["post"]["responses"]


def test_validation_errors_are_not_documented_as_422(document):
    assert all("422" not in op["responses"] for _, _, op in operations(document))
    assert "HTTPValidationError" not in document["components"]["schemas"]


def test_metrics_documents_prometheus_text(api, document):
    content = document["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(content) == ["text/plain"]
    assert httpx.get(api.url + "/metrics", timeout=30).headers["content-type"].startswith("text/plain")


def test_streaming_operations_document_an_event_stream(document):
    for path in GENERATION:
        content = document["paths"][path]["post"]["responses"]["200"]["content"]
        assert {"application/json", "text/event-stream"} <= set(content), path


def test_error_schema_matches_the_body_the_server_sends(api, document):
    r = httpx.post(api.base_url + "/chat/completions", json={"messages": []}, timeout=30)
    assert r.status_code == 400
    validator(document, ERROR_SCHEMA).validate(r.json())


# What the issue observed: the document called these valid, and the server refuses them.
REFUSED = [
    ("/v1/completions", {"prompt": ""}),
    ("/v1/chat/completions", {"messages": [{"role": "tool"}]}),
    ("/tokenize", {}),
    # a template variable the renderer sets itself: was a 500 (TypeError in the template call)
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "chat_template_kwargs": {"add_generation_prompt": False}}),
]
ACCEPTED = [
    ("/v1/completions", {"prompt": "x", "max_tokens": 1}),
    ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "20 C"}], "max_tokens": 1}),
    ("/tokenize", {"prompt": "x"}),
]


@pytest.mark.parametrize("path,body", REFUSED)
def test_what_the_server_refuses_the_document_calls_invalid(api, document, path, body):
    assert httpx.post(api.url + path, json=body, timeout=60).status_code == 400
    assert not validator(document, request_schema(document, path)).is_valid(body)


@pytest.mark.parametrize("path,body", ACCEPTED)
def test_what_the_server_accepts_the_document_calls_valid(api, document, path, body):
    assert httpx.post(api.url + path, json=body, timeout=60).status_code == 200
    assert validator(document, request_schema(document, path)).is_valid(body)


def test_model_limits_are_stated_once_the_model_is_loaded(api, document):
    tokens = document["components"]["schemas"]["DetokenizeRequest"]["properties"]["tokens"]["items"]
    assert tokens["maximum"] == api.engine.model_config.vocab_size - 1
    max_tokens = document["components"]["schemas"]["CompletionRequest"]["properties"]["max_tokens"]["anyOf"][0]
    assert max_tokens["maximum"] < api.engine.model_config.max_context_len
    assert MODEL_LIMIT not in str(document)


def test_while_loading_the_document_states_no_model_limits():
    doc = build_app(None).openapi()
    tokens = doc["components"]["schemas"]["DetokenizeRequest"]["properties"]["tokens"]["items"]
    assert "maximum" not in tokens and MODEL_LIMIT not in str(doc)


def test_a_route_added_later_is_documented_with_its_errors():
    app = build_app(None)

    @app.get("/v1/extra")
    async def extra() -> dict:
        return {}

    responses = app.openapi()["paths"]["/v1/extra"]["get"]["responses"]
    assert {"200", "401", "500", "503"} <= set(responses)


def test_with_an_api_key_v1_operations_require_bearer_and_the_document_stays_open(api):
    with serve_app(build_app(api.engine, served_model_name=api.model, api_key="s3cret")) as url:
        r = httpx.get(url + "/openapi.json", timeout=30)
        assert r.status_code == 200
        doc = r.json()
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert doc["paths"]["/v1/models"]["get"]["security"] == [{"bearer": []}]
    assert "security" not in doc["paths"]["/health"]["get"]
