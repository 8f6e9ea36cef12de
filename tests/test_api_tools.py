"""Tool calling: required and named choices are grammar-constrained calls, auto parses Hermes
blocks into tool_calls and never leaks them as content. The server tests need the grammar path in
the engine; the parser tests at the end do not."""
from __future__ import annotations

import json

import jsonschema
import pytest

from radixserve.api.openai.tools import (ArgumentsDelta, CallDone, CallStarted, MarkupToolCallParser, TextDelta,
                                  WholeOutputToolCallParser)

WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "maxLength": 20},
                          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 20}},
        "required": ["timezone"], "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "Current time in a timezone",
                                      "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]
ASK_SEVERAL = [{"role": "user", "content": "What is the weather like in Paris, in London and in Tokyo today?"}]


def assert_valid_calls(calls) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_named_tool_choice_calls_that_tool(api):
    r = api.client().chat.completions.create(
        model=api.model, messages=ASK, tools=TOOLS, max_tokens=60, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_time"}})
    calls = r.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_time"]  # one call, parallel_tool_calls or not
    assert_valid_calls(calls)


def streamed_calls(deltas) -> dict[int, dict]:
    """The streamed tool-call deltas folded per index, checking OpenAI's shape on the way: the
    first delta of a call has its id, type and name and empty arguments; later ones only
    arguments."""
    calls: dict[int, dict] = {}
    for d in deltas:
        for tc in d.delta.tool_calls or []:
            if tc.index not in calls:
                assert tc.id and tc.type == "function" and tc.function.name and tc.function.arguments == ""
                calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": "", "pieces": 0}
            else:
                assert tc.id is None and not tc.function.name
                calls[tc.index]["arguments"] += tc.function.arguments
                calls[tc.index]["pieces"] += 1
    return calls


@pytest.mark.parametrize("parallel", [False, True])
def test_required_tool_choice_gives_one_call_or_with_parallel_calls_several_each_valid_streamed_alike(api, parallel):
    # Greedy, the model calls get_weather several times for three cities when it may: each call's
    # arguments are constrained by its own tool's schema (the array's items are keyed by the name).
    # Streamed, every call arrives in OpenAI's delta shape, its arguments token by token.
    kw = dict(model=api.model, messages=ASK_SEVERAL, tools=TOOLS, tool_choice="required", max_tokens=120, temperature=0,
              parallel_tool_calls=parallel)
    client = api.client()
    choice = client.chat.completions.create(**kw).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    whole = choice.message.tool_calls
    assert (len(whole) >= 2) if parallel else (len(whole) == 1)
    assert len({c.id for c in whole}) == len(whole)
    assert_valid_calls(whole)
    deltas = [c.choices[0] for c in client.chat.completions.create(stream=True, **kw) if c.choices]
    calls = streamed_calls(deltas)
    assert sorted(calls) == list(range(len(whole)))
    for i, call in enumerate(whole):
        assert (calls[i]["name"], calls[i]["arguments"]) == (call.function.name, call.function.arguments)
        assert calls[i]["pieces"] > 3  # token by token, not one fragment at the end
    assert not "".join(d.delta.content or "" for d in deltas)
    assert deltas[-1].finish_reason == "tool_calls"


def past_call(call_id: str, city: str) -> dict:
    return {"id": call_id, "type": "function", "function": {
        "name": "get_weather", "arguments": json.dumps({"city": city, "unit": "celsius"})}}


# Earlier turns that called the tool: with them the small model calls it again on its own.
HISTORY = [
    {"role": "user", "content": "What is the weather in Rome?"},
    {"role": "assistant", "content": None, "tool_calls": [past_call("call_1", "Rome")]},
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [past_call("call_2", "Paris")]},
    {"role": "user", "content": "What is the weather in Oslo?"},
]


def test_auto_tool_choice_parses_the_call_block_into_tool_calls(api):
    kw = dict(model=api.model, messages=HISTORY, tools=TOOLS, tool_choice="auto", max_tokens=60, temperature=0)
    client = api.client()
    choice = client.chat.completions.create(**kw).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert not choice.message.content  # the block is not content
    assert_valid_calls(choice.message.tool_calls)
    deltas = [c.choices[0] for c in client.chat.completions.create(stream=True, **kw) if c.choices]
    assert "<tool_call>" not in "".join(d.delta.content or "" for d in deltas)
    streamed = streamed_calls(deltas)
    assert [(c["name"], c["arguments"]) for c in streamed.values()] == [
        (c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    assert all(c["pieces"] > 3 for c in streamed.values())
    assert deltas[-1].finish_reason == "tool_calls"


def test_auto_tool_choice_may_answer_in_plain_text(api):
    r = api.client().chat.completions.create(model=api.model, messages=ASK, tools=TOOLS, tool_choice="auto",
                                             max_tokens=12, temperature=0)
    message = r.choices[0].message
    assert message.tool_calls is None and message.content and "<tool_call>" not in message.content


def test_tool_choice_none_is_plain_text(api):
    r = api.client().chat.completions.create(model=api.model, messages=ASK, tools=TOOLS, tool_choice="none",
                                             max_tokens=8, temperature=0)
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content


# ---- the parsers on their own -------------------------------------------------------------------
REPLY = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa}ris", "unit": "celsius"}}\n'
         '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"timezone": "CET"}}\n</tool_call>\n')
ARRAY = '[{"name":"get_weather","arguments":{"city":"P\\"{a","unit":"celsius"}},{"name":"get_time","arguments":{"timezone":"CET"}}]'


def feed_all(parser, pieces) -> list:
    events = []
    for piece in pieces:
        events += parser.feed(piece)
    return events + parser.finish()


def run_parser(parser, pieces):
    events = feed_all(parser, pieces)
    content = "".join(e.text for e in events if isinstance(e, TextDelta))
    calls = [(e.call.name, json.loads(e.call.arguments)) for e in events if isinstance(e, CallDone)]
    return content, calls


def splits(text: str):
    yield [text]
    for size in (1, 2, 3, 5, 7, 11):
        yield [text[i:i + size] for i in range(0, len(text), size)]


def test_hermes_parser_gives_the_same_result_however_the_text_is_split():
    expected = ("Let me check.", [("get_weather", {"city": "Pa}ris", "unit": "celsius"}),
                                  ("get_time", {"timezone": "CET"})])
    for pieces in splits(REPLY):
        assert run_parser(MarkupToolCallParser(set(SCHEMAS)), pieces) == expected


@pytest.mark.parametrize("make,text", [(MarkupToolCallParser, REPLY), (WholeOutputToolCallParser, ARRAY)])
def test_parsers_stream_each_calls_arguments_after_its_start_and_before_its_end(make, text):
    for pieces in splits(text):
        events = [e for e in feed_all(make(set(SCHEMAS)), pieces) if not isinstance(e, TextDelta)]
        done = [e for e in events if isinstance(e, CallDone)]
        assert [e.index for e in done] == [0, 1]
        for d in done:
            own = [e for e in events if getattr(e, "index", None) == d.index]
            assert own[0] == CallStarted(d.index, d.call.id, d.call.name) and own[-1] is d
            deltas = [e.text for e in own[1:-1]]
            assert all(isinstance(e, ArgumentsDelta) for e in own[1:-1])
            assert "".join(deltas) == d.call.arguments
            # fed a character at a time, the arguments come out a character at a time
            assert len(deltas) == (len(d.call.arguments) if len(pieces[0]) == 1 else len(deltas))
        # calls come one after another, never interleaved
        assert [getattr(e, "index") for e in events] == sorted(getattr(e, "index") for e in events)


def test_hermes_parser_passes_plain_text_and_lookalike_tags_through():
    text = "Use <tool> and <tool_ca maybe, 3 < 4."
    assert run_parser(MarkupToolCallParser(set(SCHEMAS)), list(text)) == (text, [])


def test_hermes_parser_reads_a_block_of_another_shape_whole():
    text = '<tool_call>{"arguments": {"timezone": "UTC"}, "name": "get_time"}</tool_call>'
    for pieces in splits(text):
        assert run_parser(MarkupToolCallParser(set(SCHEMAS)), pieces) == ("", [("get_time", {"timezone": "UTC"})])


def test_hermes_parser_drops_a_cut_off_call():
    for cut in ('Sure.<tool_call>\n{"name": "get_weather", "argu',
                'Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa'):
        events = feed_all(MarkupToolCallParser(set(SCHEMAS)), [cut])
        assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Sure."
        assert not [e for e in events if isinstance(e, CallDone)]


def test_hermes_parser_never_starts_a_call_to_an_unknown_tool():
    text = '<tool_call>\n{"name": "launch", "arguments": {}}\n</tool_call>'
    assert feed_all(MarkupToolCallParser(set(SCHEMAS)), [text]) == []


@pytest.mark.parametrize("text,calls", [
    ('{"name": "get_time", "arguments": {"timezone": "UTC"}}', [("get_time", {"timezone": "UTC"})]),
    ('{"name":"get_time","arguments":{"timezone":"UTC"}}', [("get_time", {"timezone": "UTC"})]),
    ('{"name": "get_time", "parameters": {"timezone": "UTC"}}', [("get_time", {"timezone": "UTC"})]),
    (ARRAY, [("get_weather", {"city": 'P"{a', "unit": "celsius"}), ("get_time", {"timezone": "CET"})]),
    ('[ {"name": "get_time", "arguments": {"timezone": "UTC"}} ,\n {"name": "get_time", "arguments": {"timezone": "CET"}} ]',
     [("get_time", {"timezone": "UTC"}), ("get_time", {"timezone": "CET"})]),
    ('{"name": "launch", "arguments": {}}', []),
    ('{"name": "get_time", "argu', []),
    ('[{"name":"get_time","arguments":{"timezone":"UTC"}},{"name":"get_time","arguments":{"time', [("get_time", {"timezone": "UTC"})]),
])
def test_whole_output_parser_reads_one_call_object_or_an_array_of_them(text, calls):
    for pieces in splits(text):
        assert run_parser(WholeOutputToolCallParser(set(SCHEMAS)), pieces) == ("", calls)


# ---- what each plan's grammar lets through (the xgrammar backend over the default vocabulary) -----
@pytest.fixture(scope="module")
def xgrammar(default_model_files, default_tokenizer):
    from radixserve.grammar import make_grammar_backend
    return make_grammar_backend("xgrammar", default_tokenizer.vocab_info(default_model_files.config.vocab_size))


def accepts(backend, tokenizer, spec, text: str, then_stop: bool = True) -> bool:
    """Whether the grammar takes `text` token by token (and then a stop token)."""
    matcher = backend.matcher(backend.compile(spec))
    if not all(matcher.accept_token(t) for t in tokenizer.encode(text, add_special_tokens=False)):
        return False
    return not then_stop or matcher.accept_token(backend.vocab.stop_token_ids[-1])


def constraint(tool_choice, parallel):
    from radixserve.api.openai.protocol import ChatCompletionRequest
    from radixserve.api.openai.tools import plan_tools
    req = ChatCompletionRequest.model_validate({"messages": ASK, "tools": TOOLS, "tool_choice": tool_choice,
                                                "parallel_tool_calls": parallel})
    return plan_tools(req).build_constraint()


def block(name: str, args: dict) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(args, separators=(",", ":"))}}}\n</tool_call>'


TWO_CALLS = [("get_weather", {"city": "Paris", "unit": "celsius"}), ("get_time", {"timezone": "CET"})]


@pytest.mark.parametrize("parallel", [True, False])
def test_auto_grammar_allows_a_second_call_block_only_with_parallel_tool_calls(xgrammar, default_tokenizer,
                                                                              parallel):
    spec = constraint("auto", parallel)
    first = "Let me check. " + block(*TWO_CALLS[0])
    assert accepts(xgrammar, default_tokenizer, spec, first)
    assert accepts(xgrammar, default_tokenizer, spec, first + "\n" + block(*TWO_CALLS[1])) == parallel


@pytest.mark.parametrize("parallel", [True, False])
def test_required_grammar_takes_an_array_of_calls_only_with_parallel_tool_calls(xgrammar, default_tokenizer,
                                                                               parallel):
    spec = constraint("required", parallel)
    calls = [{"name": n, "arguments": a} for n, a in TWO_CALLS]
    compact = dict(separators=(",", ":"))
    assert accepts(xgrammar, default_tokenizer, spec, json.dumps(calls, **compact)) == parallel
    assert accepts(xgrammar, default_tokenizer, spec, json.dumps(calls[0], **compact)) == (not parallel)
    # each call's arguments follow its own tool's schema, not another tool's
    swapped = [{"name": "get_time", "arguments": TWO_CALLS[0][1]}]
    assert not accepts(xgrammar, default_tokenizer, spec, json.dumps(swapped if parallel else swapped[0], **compact),
                       then_stop=False)
    assert not accepts(xgrammar, default_tokenizer, spec, "[]" if parallel else "{}", then_stop=False)


def test_named_grammar_is_one_call_even_with_parallel_tool_calls(xgrammar, default_tokenizer):
    spec = constraint({"type": "function", "function": {"name": "get_time"}}, True)
    call = {"name": "get_time", "arguments": {"timezone": "CET"}}
    assert accepts(xgrammar, default_tokenizer, spec, json.dumps(call, separators=(",", ":")))
    assert not accepts(xgrammar, default_tokenizer, spec, json.dumps([call], separators=(",", ":")), then_stop=False)
