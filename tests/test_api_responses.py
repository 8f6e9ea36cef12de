"""The Responses API (POST /v1/responses, GET/DELETE /v1/responses/{id}) against the real server
through the official client: the same generation as chat completions, output items, the streamed
event sequence, structured output and tools through the chat path, and conversations by id that
resume from the radix cache. The builder and store tests at the end need no server."""
from __future__ import annotations

import json
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel

from radixserve.api.cli import main as cli_main
from radixserve.api.openai.protocol import ChatMessage
from radixserve.api.responses.store import ResponseStore, StoredResponse
from radixserve.api.responses.output import OutputBuilder
from radixserve.api.responses.turn import prompt_ids
from radixserve.api.server import build_app
from radixserve.api.openai.tools import ArgumentsDelta, CallDone, CallStarted, TextDelta, ToolCall

from .api_server import serve_app

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
           "required": ["city"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 20}},
        "required": ["timezone"], "additionalProperties": False}
TOOLS = [{"type": "function", "name": "get_weather", "description": "Current weather in a city", "parameters": WEATHER},
         {"type": "function", "name": "get_time", "description": "Current time in a timezone", "parameters": TIME}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = "What's the weather in Paris?"
# greedy: "The capital of France is Paris." (8 tokens) on every dtype; the bare question puts "The" and
# "L" 0.08 logits apart in float32, which bf16 hosts (AMX) flip into a long French answer
SHORT = "What is the capital of France? Answer in one sentence."
WEATHER_OUTPUT = "The temperature in Paris is 22 degrees."


def create(api, **kw):
    # stop and seed are this server's extras (as in chat); the client sends them in the body as is
    extra = {k: kw.pop(k) for k in ("stop", "seed") if k in kw}
    return api.client().responses.create(model=api.model, extra_body=extra or None,
                                         **{"temperature": 0, "max_output_tokens": 24, **kw})


def chat_text(api, messages, **kw) -> str:
    r = api.client().chat.completions.create(model=api.model, messages=messages,
                                             **{"temperature": 0, "max_tokens": 24, **kw})
    return r.choices[0].message.content


def post(api, body: dict) -> httpx.Response:
    return httpx.post(api.base_url + "/responses", json={"model": api.model, **body}, timeout=60)


def sse_events(api, body: dict) -> list[tuple[str, dict]]:
    """(event name, data) of a streamed response, read off the wire."""
    events, name = [], None
    with httpx.stream("POST", api.base_url + "/responses", json={"model": api.model, "stream": True, **body},
                      timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                events.append((name, json.loads(line[len("data: "):])))
    return events


# ---- the same generation as chat ------------------------------------------------------------
def test_string_input_gives_a_completed_message_with_usage(api):
    r = create(api, input=SHORT)
    assert r.object == "response" and r.id.startswith("resp_") and r.status == "completed"
    assert r.incomplete_details is None and r.model == api.model
    [item] = r.output
    assert item.type == "message" and item.role == "assistant" and item.status == "completed"
    assert [p.type for p in item.content] == ["output_text"]
    assert r.output_text == item.content[0].text == chat_text(api, [{"role": "user", "content": SHORT}])
    assert r.usage.output_tokens > 0 and r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.input_tokens_details.cached_tokens >= 0 and r.usage.output_tokens_details.reasoning_tokens == 0


@pytest.mark.parametrize("responses_kw, messages, chat_kw", [
    (dict(instructions="Answer in French.", input="Say hello.", max_output_tokens=8),
     [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Say hello."}],
     dict(max_tokens=8)),
    (dict(input=[{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
                 {"role": "user", "content": "Name a fruit."},
                 {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                  "content": [{"type": "output_text", "text": "Apple.", "annotations": [], "logprobs": []}]},
                 {"role": "user", "content": "Another one?"}]),
     [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a fruit."},
      {"role": "assistant", "content": "Apple."}, {"role": "user", "content": "Another one?"}], {}),
    (dict(input="Write a sentence about the sea.", stop=[","], seed=7, temperature=0.8, top_p=0.9,
          max_output_tokens=12),
     [{"role": "user", "content": "Write a sentence about the sea."}],
     dict(stop=[","], seed=7, temperature=0.8, top_p=0.9, max_tokens=12)),
], ids=["instructions", "message-items", "sampling"])
def test_a_request_generates_what_the_equivalent_chat_request_does(api, responses_kw, messages, chat_kw):
    # both with the prompt cached: a cold prefill and a warm one may round a near-tie apart
    chat_text(api, messages, **chat_kw)
    assert create(api, **responses_kw).output_text == chat_text(api, messages, **chat_kw)


def test_a_reply_cut_by_max_output_tokens_is_incomplete(api):
    r = create(api, input="Tell me a long story about dragons.", max_output_tokens=5)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 5 and r.output[0].status == "incomplete" and r.output_text


# ---- streaming ------------------------------------------------------------------------------
def test_stream_sends_the_documented_event_sequence_numbered_from_zero(api):
    events = sse_events(api, {"input": SHORT, "temperature": 0, "max_output_tokens": 24})
    names = [name for name, _ in events]
    assert names == [data["type"] for _, data in events]
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    deltas = names.count("response.output_text.delta")
    assert deltas >= 2
    assert names == (["response.created", "response.in_progress", "response.output_item.added",
                      "response.content_part.added"] + ["response.output_text.delta"] * deltas +
                     ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                      "response.completed"])
    data = dict(events)
    assert data["response.created"]["response"]["status"] == "in_progress"
    text = "".join(d["delta"] for n, d in events if n == "response.output_text.delta")
    assert text == data["response.output_text.done"]["text"] == data["response.content_part.done"]["part"]["text"]
    final = data["response.completed"]["response"]
    assert final["status"] == "completed" and final["output"] == [data["response.output_item.done"]["item"]]
    assert final["output"][0]["content"][0]["text"] == text == create(api, input=SHORT).output_text
    assert final["usage"]["output_tokens"] > 0


def test_stream_cut_by_max_output_tokens_ends_with_response_incomplete(api):
    events = sse_events(api, {"input": "Tell me a long story.", "max_output_tokens": 3})
    name, data = events[-1]
    assert name == "response.incomplete"
    assert data["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_official_stream_helper_accepts_the_stream(api):
    with api.client().responses.stream(model=api.model, input=SHORT, temperature=0, max_output_tokens=24) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.status == "completed" and final.output_text == "".join(deltas) != ""


def test_a_client_leaving_mid_stream_frees_the_request(api):
    with httpx.stream("POST", api.base_url + "/responses", timeout=60,
                      json={"model": api.model, "input": "Tell me a long story.", "stream": True,
                            "max_output_tokens": 200}) as r:
        for line in r.iter_lines():
            if "response.output_text.delta" in line:
                break
    api.wait_idle()  # and the fixture checks every KV page is free or in the tree


# ---- structured output ----------------------------------------------------------------------
class Capital(BaseModel):
    city: Literal["Paris", "Rome", "Berlin"]
    country: Literal["France", "Italy", "Germany"]


def test_json_schema_format_is_enforced_and_parses_with_the_official_client(api):
    r = api.client().responses.parse(model=api.model, input=SHORT, text_format=Capital, temperature=0,
                                     max_output_tokens=40)
    assert r.status == "completed"
    assert isinstance(r.output_parsed, Capital)
    jsonschema.validate(json.loads(r.output_text), Capital.model_json_schema())
    # the same prompt as chat's parse(): the schema stated in the system message too
    chat = api.client().chat.completions.parse(model=api.model, messages=[{"role": "user", "content": SHORT}],
                                               response_format=Capital, temperature=0, max_tokens=40)
    assert r.usage.input_tokens == chat.usage.prompt_tokens and r.output_text == chat.choices[0].message.content


def test_json_object_format_gives_a_json_object(api):
    r = create(api, input='Give the capital of France as a JSON object with one key, "answer".',
               text={"format": {"type": "json_object"}},
               max_output_tokens=40)
    assert r.status == "completed" and isinstance(json.loads(r.output_text), dict)


def test_a_schema_that_cannot_be_enforced_is_refused_as_in_chat(api):
    schema = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    r = post(api, {"input": "numbers", "text": {"format": {"type": "json_schema", "name": "n", "schema": schema}}})
    chat = httpx.post(api.base_url + "/chat/completions", timeout=60, json={
        "model": api.model, "messages": [{"role": "user", "content": "numbers"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}})
    assert r.status_code == chat.status_code == 400
    error, chat_error = r.json()["error"], chat.json()["error"]
    assert error["param"] == "text.format#/uniqueItems" and error["code"] == chat_error["code"]
    assert chat_error["param"] == "response_format#/uniqueItems"
    assert error["message"] == chat_error["message"].replace("response_format", "text.format")
    assert "uniqueItems" in error["message"]


# ---- tools ----------------------------------------------------------------------------------
def assert_valid_call(item) -> None:
    assert item.type == "function_call" and item.status == "completed"
    assert item.call_id.startswith("call_") and item.id.startswith("fc_")
    jsonschema.validate(json.loads(item.arguments), SCHEMAS[item.name])


def test_required_tool_choice_returns_function_call_items(api):
    r = create(api, input=ASK, tools=TOOLS, tool_choice="required", max_output_tokens=60)
    assert r.status == "completed" and r.output
    for item in r.output:
        assert_valid_call(item)


def test_named_tool_choice_without_parallel_calls_returns_one_call_of_that_tool(api):
    r = create(api, input=ASK, tools=TOOLS, tool_choice={"type": "function", "name": "get_time"},
               parallel_tool_calls=False, max_output_tokens=60)
    [item] = r.output
    assert item.name == "get_time"
    assert_valid_call(item)


def test_tool_choice_none_answers_in_text(api):
    r = create(api, input=SHORT, tools=TOOLS, tool_choice="none")
    assert [item.type for item in r.output] == ["message"] and r.output_text


def test_streamed_call_arguments_arrive_as_deltas_after_the_item_is_added(api):
    events = sse_events(api, {"input": ASK, "tools": TOOLS, "tool_choice": "required", "temperature": 0,
                              "parallel_tool_calls": False, "max_output_tokens": 60})
    names = [n for n, _ in events]
    added = next(d for n, d in events if n == "response.output_item.added")["item"]
    assert added["type"] == "function_call" and added["name"] == "get_weather" and added["call_id"]
    first_delta = names.index("response.function_call_arguments.delta")
    assert names.index("response.output_item.added") < first_delta
    deltas = [d["delta"] for n, d in events if n == "response.function_call_arguments.delta"]
    done = next(d for n, d in events if n == "response.function_call_arguments.done")
    final = events[-1][1]["response"]
    assert names[-1] == "response.completed"
    assert "".join(deltas) == done["arguments"] == final["output"][0]["arguments"]
    assert done["item_id"] == added["id"] == final["output"][0]["id"]
    jsonschema.validate(json.loads(done["arguments"]), WEATHER)


def test_a_tool_loop_sends_calls_and_outputs_back_as_input_items(api):
    call = create(api, input=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                  max_output_tokens=60).output[0]
    r = create(api, tools=TOOLS, max_output_tokens=40, input=[
        {"role": "user", "content": ASK}, call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": WEATHER_OUTPUT}])
    assert r.status == "completed" and [item.type for item in r.output] == ["message"]
    assert "22" in r.output_text


# ---- conversations by id --------------------------------------------------------------------
def test_previous_response_id_continues_the_conversation_from_the_cache(api):
    client = api.client()
    long_story = "Here is a story. " + " ".join(f"Sentence {i} is about a red fox." for i in range(30))
    first = create(api, input=long_story, instructions="Summarise briefly.", max_output_tokens=16)
    second = create(api, input="Thanks!", instructions="Summarise briefly.", previous_response_id=first.id,
                    max_output_tokens=8)
    page = api.engine.config.page_size
    turn_one = first.usage.input_tokens + first.usage.output_tokens
    # Everything of turn one whose KV was computed (its last token never went through the model),
    # whole pages of it, is reused: the new prompt starts with exactly turn one's token ids.
    assert second.usage.input_tokens_details.cached_tokens >= (turn_one - 1) // page * page
    assert second.previous_response_id == first.id
    # The conversation is turn one's input and output plus the new input, as chat renders it.
    messages = [{"role": "system", "content": "Summarise briefly."}, {"role": "user", "content": long_story},
                {"role": "assistant", "content": first.output_text}, {"role": "user", "content": "Thanks!"}]
    tokens = httpx.post(api.url + "/tokenize", json={"messages": messages}, timeout=30).json()
    assert second.usage.input_tokens == tokens["count"]
    assert client.responses.retrieve(second.id).output_text == second.output_text


def test_a_turn_after_a_tool_call_resumes_with_the_function_call_output(api):
    call_turn = create(api, input=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                       max_output_tokens=60)
    call = call_turn.output[0]
    r = create(api, tools=TOOLS, previous_response_id=call_turn.id, max_output_tokens=40,
               input=[{"type": "function_call_output", "call_id": call.call_id, "output": WEATHER_OUTPUT}])
    assert r.status == "completed" and "22" in r.output_text
    assert r.usage.input_tokens_details.cached_tokens >= call_turn.usage.input_tokens // api.engine.config.page_size \
        * api.engine.config.page_size


def test_get_returns_the_stored_response_and_delete_removes_it(api):
    client = api.client()
    r = create(api, input=SHORT)
    assert client.responses.retrieve(r.id).model_dump() == r.model_dump()
    deleted = httpx.delete(f"{api.base_url}/responses/{r.id}", timeout=30)
    assert deleted.status_code == 200 and deleted.json() == {"id": r.id, "object": "response", "deleted": True}
    assert_not_found(httpx.get(f"{api.base_url}/responses/{r.id}", timeout=30), None)
    assert_not_found(httpx.delete(f"{api.base_url}/responses/{r.id}", timeout=30), None)


def test_store_false_keeps_nothing(api):
    r = create(api, input=SHORT, store=False, max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        api.client().responses.retrieve(r.id)
    assert_not_found(post(api, {"input": "hi", "previous_response_id": r.id}), "previous_response_id")


def assert_not_found(r: httpx.Response, param) -> None:
    assert r.status_code == 404
    assert r.json() == {"error": {"message": r.json()["error"]["message"], "type": "invalid_request_error",
                                  "param": param, "code": "response_not_found"}}


def test_the_store_evicts_the_least_recently_used_response(api):
    with serve_app(build_app(api.engine, served_model_name=api.model, response_store_size=2)) as url:
        def turn(**kw) -> str:
            r = httpx.post(url + "/v1/responses", timeout=60,
                           json={"model": api.model, "input": "hi", "max_output_tokens": 1, **kw})
            assert r.status_code == 200, r.text
            return r.json()["id"]

        a, b = turn(), turn()
        assert httpx.get(f"{url}/v1/responses/{a}", timeout=30).status_code == 200  # a is now the most recent
        c = turn()
        assert_not_found(httpx.get(f"{url}/v1/responses/{b}", timeout=30), None)
        assert_not_found(httpx.post(url + "/v1/responses", timeout=30, json={
            "input": "hi", "previous_response_id": b}), "previous_response_id")
        for kept in (a, c):
            assert httpx.get(f"{url}/v1/responses/{kept}", timeout=30).status_code == 200


def test_serve_takes_a_response_store_size_and_refuses_a_negative_one(capsys):
    assert cli_main(["serve", "--response-store-size", "-1"]) == 2
    assert "response-store-size" in capsys.readouterr().err


# ---- refusals -------------------------------------------------------------------------------
@pytest.mark.parametrize("body, param", [
    ({"input": []}, "input"),
    ({}, "input"),
    ({"input": "hi", "bogus": 1}, "bogus"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0].type"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{nope"}]}, "input"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "hi", "tool_choice": "required"}, "tool_choice"),
    ({"input": "hi", "tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"input": "hi", "include": ["message.output_text.logprobs"]}, "include"),
    ({"input": "hi", "truncation": "auto"}, "truncation"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"input": "hi", "max_output_tokens": 10 ** 9}, "input"),  # as chat names messages: the prompt is too long
    ({"input": "hi", "tools": TOOLS, "tool_choice": "required", "text": {"format": {"type": "json_object"}}},
     "tool_choice"),
])
def test_invalid_requests_get_a_400_naming_the_field(api, body, param):
    r = post(api, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error


@pytest.mark.parametrize("method", ["PUT", "PATCH", "OPTIONS"])
def test_other_methods_on_a_stored_response_get_405_naming_both_it_serves(api, method):
    r = httpx.request(method, f"{api.base_url}/responses/resp_1", timeout=30)
    assert r.status_code == 405 and r.headers["allow"] == "DELETE, GET"
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_a_response_id_that_cannot_be_one_is_a_400_and_an_empty_one_a_404(api):
    r = httpx.get(f"{api.base_url}/responses/a.b", timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_id"
    assert_not_found(httpx.get(f"{api.base_url}/responses/", timeout=30, follow_redirects=False), None)


# ---- output items from parser events (no server) --------------------------------------------
def test_builder_orders_text_then_parallel_calls_and_closes_each_item():
    builder = OutputBuilder()
    events = []
    for e in [TextDelta("Checking."), CallStarted(0, "call_a", "get_weather"), ArgumentsDelta(0, '{"city":'),
              ArgumentsDelta(0, '"Rome"}'), CallDone(0, ToolCall("get_weather", '{"city":"Rome"}', "call_a")),
              CallStarted(1, "call_b", "get_time"), ArgumentsDelta(1, '{"timezone":"CET"}'),
              CallDone(1, ToolCall("get_time", '{"timezone":"CET"}', "call_b"))]:
        events += builder.feed(e)
    events += builder.finish("completed")
    assert [(i["type"], i["status"]) for i in builder.items] == [
        ("message", "completed"), ("function_call", "completed"), ("function_call", "completed")]
    assert [i.get("call_id") for i in builder.items[1:]] == ["call_a", "call_b"]
    assert builder.items[1]["arguments"] == '{"city":"Rome"}' and builder.output_text == "Checking."
    assert [(e["type"], e["output_index"]) for e in events] == [
        ("response.output_item.added", 0), ("response.content_part.added", 0), ("response.output_text.delta", 0),
        ("response.output_text.done", 0), ("response.content_part.done", 0), ("response.output_item.done", 0),
        ("response.output_item.added", 1), ("response.function_call_arguments.delta", 1),
        ("response.function_call_arguments.delta", 1), ("response.function_call_arguments.done", 1),
        ("response.output_item.done", 1),
        ("response.output_item.added", 2), ("response.function_call_arguments.delta", 2),
        ("response.function_call_arguments.done", 2), ("response.output_item.done", 2)]


def test_builder_closes_a_call_cut_off_mid_arguments_as_incomplete():
    builder = OutputBuilder()
    for e in [CallStarted(0, "call_a", "get_weather"), ArgumentsDelta(0, '{"ci')]:
        builder.feed(e)
    events = builder.finish("incomplete")
    assert builder.items == [{"id": builder.items[0]["id"], "type": "function_call", "status": "incomplete",
                              "call_id": "call_a", "name": "get_weather", "arguments": '{"ci'}]
    assert [e["type"] for e in events] == ["response.function_call_arguments.done", "response.output_item.done"]


def test_builder_gives_an_empty_reply_one_empty_message():
    builder = OutputBuilder()
    builder.finish("completed")
    assert [(i["type"], i["content"][0]["text"]) for i in builder.items] == [("message", "")]


# ---- the prompt of a continued turn (no server) ---------------------------------------------
def test_a_continued_prompt_starts_with_the_previous_turns_exact_token_ids(default_tokenizer):
    tok = default_tokenizer
    first = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    # The model spelled "Hello" one character per token, not as the tokenizer would.
    spelled = [tok.encode(ch, add_special_tokens=False)[0] for ch in "Hello"]
    end = tok.encode("<|im_end|>", add_special_tokens=False)
    previous = StoredResponse({}, [ChatMessage(role="user", content="Hi"), ChatMessage(role="assistant", content="Hello")],
                              first + "Hello<|im_end|>", tok.encode(first) + spelled + end)
    text, ids = prompt_ids(tok, previous.messages + [ChatMessage(role="user", content="Bye")], None, previous)
    assert ids[:len(previous.token_ids)] == previous.token_ids
    assert tok.decode(ids, skip_special_tokens=False) == tok.decode(tok.encode(text), skip_special_tokens=False)
    assert tok.encode(text)[:len(previous.token_ids)] != previous.token_ids  # plain encoding would miss the cache


def test_a_continued_prompt_that_no_longer_matches_is_tokenised_whole(default_tokenizer):
    tok = default_tokenizer
    previous = StoredResponse({}, [], "something else entirely", [1, 2, 3])
    text, ids = prompt_ids(tok, [ChatMessage(role="user", content="Bye")], None, previous)
    assert ids == tok.encode(text)


def test_the_store_is_bounded_and_least_recently_used_goes_first():
    store = ResponseStore(2)
    item = StoredResponse({}, [], "", [])
    store.put("a", item)
    store.put("b", item)
    store.get("a")
    store.put("c", item)
    assert len(store) == 2 and store.get("a") is item and store.get("c") is item
    with pytest.raises(Exception, match="not found"):
        store.get("b")
    ResponseStore(0).put("a", item)
    assert len(ResponseStore(0)) == 0
