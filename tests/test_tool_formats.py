"""Tool-call formats (api/openai/tool_formats.py): each family's markup is detected from its chat
template, parsed the same however the stream splits it, never leaks into content, and written back
into the next turn exactly as `auto`'s grammar spells it."""
from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.api.openai.protocol import ToolDefinition
from radixserve.api.openai.tool_formats import FORMATS, LLAMA_PYTHON_TAG, detect_tool_format, tool_format
from radixserve.api.openai.tools import CallDone, MarkupToolCallParser, TextDelta
from .test_api_tools import ASK, SCHEMAS, TOOLS

CALLS = [("get_weather", {"city": "Pa}ris", "unit": "celsius"}), ("get_time", {"timezone": "CET"})]
# model-style replies: some text, then two calls in each family's markup
REPLIES = {
    "hermes": ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa}ris", "unit": "celsius"}}'
               '\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"timezone": "CET"}}\n</tool_call>'),
    "llama3_json": ('Let me check. ' + LLAMA_PYTHON_TAG + '{"name": "get_weather", "parameters": {"city": "Pa}ris", '
                    '"unit": "celsius"}}; {"name": "get_time", "parameters": {"timezone": "CET"}}'),
    "mistral": ('Let me check.[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Pa}ris", "unit": "celsius"}},'
                ' {"name": "get_time", "arguments": {"timezone": "CET"}}]'),
    "phi4_mini": ('Let me check. functools[{"name": "get_weather", "arguments": {"city": "Pa}ris", "unit": "celsius"}}, '
                  '{"name": "get_time", "arguments": {"timezone": "CET"}}]'),
}
# what each family's chat template writes (fragments of the real templates' markup)
TEMPLATES = {
    "hermes": "{%- if tools %}<tools>{{ tool | tojson }}</tools> ... <tool_call>{%- endif %}",
    "llama3_json": "<|start_header_id|>ipython<|end_header_id|> {%- if tools is not none %}{{ t | tojson }}{%- endif %}",
    "mistral": "{%- if tools %}[AVAILABLE_TOOLS]{{ tools|tojson }}[/AVAILABLE_TOOLS]{%- endif %}[TOOL_CALLS]",
    "phi4_mini": "{% if message['tools'] %}<|tool|>{{ message['tools'] }}<|/tool|>{% endif %}",
}


def parse(fmt: str, pieces: list[str]) -> tuple[str, list[tuple[str, dict]]]:
    parser = MarkupToolCallParser(set(SCHEMAS), FORMATS[fmt])
    events = [e for p in pieces for e in parser.feed(p)] + parser.finish()
    content = "".join(e.text for e in events if isinstance(e, TextDelta))
    return content, [(e.call.name, json.loads(e.call.arguments)) for e in events if isinstance(e, CallDone)]


def chunked(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)])]


@pytest.mark.parametrize("fmt", sorted(REPLIES))
@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=40))
def test_each_format_parses_the_same_however_the_stream_splits_it(fmt, cuts):
    assert parse(fmt, chunked(REPLIES[fmt], cuts)) == ("Let me check.", CALLS)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_calls_written_back_parse_to_themselves_with_no_content(fmt):
    assert parse(fmt, [FORMATS[fmt].render_calls(CALLS)]) == ("", CALLS)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_the_grammar_spells_a_call_as_the_next_turn_renders_it(fmt):
    """begin + arguments + end of `auto`'s structural tag is the call as written back, so a resumed
    conversation's prompt starts with the generated text."""
    f = FORMATS[fmt]
    tools = [ToolDefinition.model_validate(t) for t in TOOLS]
    [tag] = [t for t in f.structural_tag(tools, single=True)["tags"] if t["begin"].find('"get_time"') >= 0]
    args = {"timezone": "CET"}
    assert tag["begin"] + json.dumps(args) + tag["end"] == f.render_calls([("get_time", args)])
    assert tag["begin"].startswith(f.trigger)


@pytest.mark.parametrize("fmt", sorted(TEMPLATES))
def test_the_format_is_read_from_the_chat_template(fmt):
    assert detect_tool_format(TEMPLATES[fmt]).name == fmt


def test_a_template_without_tool_markup_gets_hermes_and_the_flag_overrides_it():
    assert detect_tool_format("{{ messages }}").name == "hermes"
    assert tool_format("mistral", TEMPLATES["hermes"]).name == "mistral"
    with pytest.raises(ValueError, match="unknown tool-call format"):
        tool_format("xml", None)


def test_bare_json_that_is_no_call_stays_content_under_llama3():
    text = 'The config is {"name": 3} and {"mode": "fast"}.'
    assert parse("llama3_json", list(text)) == (text, [])


@pytest.mark.parametrize("fmt", ["mistral", "phi4_mini"])
def test_a_block_calling_no_known_tool_is_dropped_not_shown(fmt):
    text = FORMATS[fmt].render_calls([("launch", {"when": "now"})]) + " Done."
    assert parse(fmt, list(text)) == (" Done.", [])


# ---- through the server -----------------------------------------------------------------------
@pytest.fixture(params=["llama3_json", "mistral", "phi4_mini"])
def served_format(request, api):
    """The shared server answering as if started with --tool-call-format <param>."""
    before = api.state.tool_format
    api.state.tool_format = FORMATS[request.param]
    yield FORMATS[request.param]
    api.state.tool_format = before


def test_required_calls_are_valid_and_no_markup_reaches_content_in_every_format(api, served_format):
    r = api.client().chat.completions.create(model=api.model, messages=ASK, tools=TOOLS, tool_choice="required",
                                             max_tokens=80, temperature=0)
    message = r.choices[0].message
    assert message.tool_calls and not message.content
    for call in message.tool_calls:
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_auto_streams_the_same_events_as_the_whole_reply_in_every_format(api, served_format):
    kw = dict(model=api.model, messages=ASK, tools=TOOLS, tool_choice="auto", max_tokens=80, temperature=0)
    whole = api.client().chat.completions.create(**kw).choices[0]
    chunks = [c for c in api.client().chat.completions.create(stream=True, **kw) if c.choices]
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    names = [tc.function.name for c in chunks for tc in c.choices[0].delta.tool_calls or [] if tc.function.name]
    assert content == (whole.message.content or "")
    assert names == [c.function.name for c in whole.message.tool_calls or []]
    assert served_format.trigger not in content

