"""Every failure is an OpenAI error body with the right status: 400 bad input, 401 auth, 404
unknown model, 503 loading or overloaded; never a traceback."""
from __future__ import annotations

import json

import httpx
import pytest

from radixserve.api.server import attach_engine, build_app
from .api_server import serve_app

USER = [{"role": "user", "content": "Hi"}]


def post(api, path: str, body, **kw) -> httpx.Response:
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(api.base_url + path, content=content, headers={"content-type": "application/json"},
                      timeout=60, **kw)


def assert_error(r: httpx.Response, status: int, param=None, *needles: str) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert "Traceback" not in r.text
    if param is not None:
        assert error["param"] == param, error
    for needle in needles:
        assert needle in error["message"], error
    return error


@pytest.mark.parametrize("body,param", [
    ({"model": "m"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content"),
    ({"messages": USER, "max_tokens": 0}, "max_tokens"),
    ({"messages": USER, "max_completion_tokens": 0}, "max_completion_tokens"),
    ({"messages": USER, "temperature": -0.5}, "temperature"),
    ({"messages": USER, "top_p": 0}, "top_p"),
    ({"messages": USER, "top_p": 1.5}, "top_p"),
    ({"messages": USER, "n": 0}, "n"),
    ({"messages": USER, "presence_penalty": 3}, "presence_penalty"),
    ({"messages": USER, "top_logprobs": 3}, "top_logprobs"),
    ({"messages": USER, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"messages": USER, "min_tokens": 5, "max_tokens": 2}, "min_tokens"),
    ({"messages": USER, "temperature": 500}, "temperature"),
    ({"messages": USER, "stop_token_ids": [10 ** 9]}, "stop_token_ids"),
    ({"messages": USER, "functions": [{"name": "f"}]}, "functions"),
    ({"messages": USER, "logit_bias": {"50": 10}}, "logit_bias"),
    ({"messages": USER, "tool_choice": "required"}, "tool_choice"),
])
def test_invalid_chat_fields_are_400_naming_the_field(api, body, param):
    assert_error(post(api, "/chat/completions", body), 400, param)


@pytest.mark.parametrize("body,param", [
    ({"prompt": []}, "prompt"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "logprobs": 50}, "logprobs"),
    ({"prompt": "x", "echo": True, "logprobs": 1}, "echo"),
    ({"prompt": [1, 2, 10 ** 9]}, "prompt"),
    ({"prompt": "x", "suffix": "y"}, "suffix"),
])
def test_invalid_completion_fields_are_400_naming_the_field(api, body, param):
    assert_error(post(api, "/completions", body), 400, param)


def test_malformed_json_is_400(api):
    error = assert_error(post(api, "/chat/completions", b'{"messages": [}'), 400, None, "malformed JSON")
    assert error["type"] == "invalid_request_error"
    assert_error(post(api, "/chat/completions", b"[1, 2]"), 400)


def test_prompt_beyond_the_context_window_names_both_lengths(api):
    context = api.engine.model_config.max_context_len
    r = post(api, "/chat/completions", {"messages": USER, "max_tokens": context})
    error = assert_error(r, 400, "messages", "context length", str(context), f"{context} in the completion")
    assert error["code"] == "context_length_exceeded"
    long_prompt = "hello " * (context + 10)
    assert_error(post(api, "/completions", {"prompt": long_prompt}), 400, "prompt", "context length")


def test_two_constraints_in_one_request_are_400(api):
    r = post(api, "/chat/completions", {"messages": USER, "guided_regex": "a+",
                                         "response_format": {"type": "json_object"}})
    assert_error(r, 400, None, "only one structured-output constraint")
    r = post(api, "/chat/completions", {"messages": USER, "structured_outputs": {"regex": "a", "choice": ["a"]}})
    assert_error(r, 400, "structured_outputs")
    r = post(api, "/chat/completions", {"messages": USER, "regex": "a+", "tool_choice": "required", "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]})
    assert_error(r, 400, None, "only one structured-output constraint")


def test_unparsable_schema_text_is_400(api):
    r = post(api, "/chat/completions", {"messages": USER, "guided_json": "{not json"})
    assert_error(r, 400, "guided_json", "not valid JSON")
    r = post(api, "/chat/completions", {"messages": USER, "response_format": {"type": "json_schema"}})
    assert_error(r, 400, "response_format.json_schema")


def test_unknown_tool_in_tool_choice_is_400(api):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    r = post(api, "/chat/completions", {"messages": USER, "tools": tools,
                                         "tool_choice": {"type": "function", "function": {"name": "launch"}}})
    assert_error(r, 400, "tool_choice", "launch")


def test_unknown_model_is_404(api):
    error = assert_error(post(api, "/chat/completions", {"model": "gpt-9", "messages": USER}), 404, "model", "gpt-9")
    assert error["code"] == "model_not_found"


def test_unknown_route_is_404_error_body(api):
    assert_error(httpx.get(api.base_url + "/engines"), 404)


def test_full_queue_is_503_with_retry_after(api):
    cfg = api.engine.config
    capacity = cfg.max_running_requests + cfg.max_waiting_requests
    hog = {"model": api.model, "messages": USER, "n": capacity, "max_tokens": 200, "ignore_eos": True,
           "stream": True}
    with httpx.stream("POST", api.base_url + "/chat/completions", json=hog, timeout=60) as stream:
        assert stream.status_code == 200
        next(stream.iter_lines())  # the engine now holds `capacity` requests
        r = post(api, "/chat/completions", {"messages": USER, "max_tokens": 1})
        error = assert_error(r, 503)
        assert error["code"] == "overloaded" and int(r.headers["retry-after"]) >= 1
    api.wait_idle()  # closing the stream aborted all of them


def test_no_engine_yet_means_503_loading_then_ready(api):
    app = build_app(None, served_model_name=api.model)
    with serve_app(app) as url:
        assert_error(httpx.get(url + "/health"), 503)
        assert_error(httpx.post(url + "/v1/chat/completions", json={"messages": USER}), 503)
        assert_error(httpx.get(url + "/v1/models"), 503)
        attach_engine(app, api.engine)
        assert httpx.get(url + "/health").status_code == 200
        assert httpx.get(url + "/v1/models").json()["data"][0]["id"] == api.model


def test_api_key_guards_v1_only(api):
    with serve_app(build_app(api.engine, served_model_name=api.model, api_key="s3cret")) as url:
        body = {"messages": USER, "max_tokens": 1}
        missing = httpx.post(url + "/v1/chat/completions", json=body)
        assert_error(missing, 401, None, "API key")
        wrong = httpx.post(url + "/v1/chat/completions", json=body, headers={"Authorization": "Bearer nope"})
        assert_error(wrong, 401)
        assert_error(httpx.get(url + "/v1/models", headers={"Authorization": "Bearer nope"}), 401)
        ok = httpx.post(url + "/v1/chat/completions", json=body, headers={"Authorization": "Bearer s3cret"},
                        timeout=60)
        assert ok.status_code == 200
        assert httpx.get(url + "/health").status_code == 200
        assert httpx.get(url + "/metrics").status_code == 200


def test_without_api_key_no_authorization_is_needed(api):
    r = post(api, "/chat/completions", {"messages": USER, "max_tokens": 1})
    assert r.status_code == 200


def test_openai_client_raises_its_typed_errors(api):
    import openai

    client = api.client()
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=api.model, messages=USER, max_tokens=0)
    assert e.value.param == "max_tokens"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=USER)

