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
from radixserve.api.openai.tools import ArgumentsDelta, CallDone, ReasoningDelta, TextDelta, ToolPlan
from radixserve.api.responses.output import OutputBuilder
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
    "harmony": ('<|channel|>analysis<|message|>They want weather and time.<|end|><|start|>assistant<|channel|>commentary'
                '<|message|>Let me check.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather '
                '<|constrain|>json<|message|>{"city": "Pa}ris", "unit": "celsius"}<|call|><|start|>assistant to=functions.'
                'get_time<|channel|>commentary json<|message|>{"timezone": "CET"}<|call|>'),
}
# what each family's chat template writes (fragments of the real templates' markup)
TEMPLATES = {
    "hermes": "{%- if tools %}<tools>{{ tool | tojson }}</tools> ... <tool_call>{%- endif %}",
    "llama3_json": "<|start_header_id|>ipython<|end_header_id|> {%- if tools is not none %}{{ t | tojson }}{%- endif %}",
    "mistral": "{%- if tools %}[AVAILABLE_TOOLS]{{ tools|tojson }}[/AVAILABLE_TOOLS]{%- endif %}[TOOL_CALLS]",
    "phi4_mini": "{% if message['tools'] %}<|tool|>{{ message['tools'] }}<|/tool|>{% endif %}",
    "harmony": "<|start|>assistant<|channel|>analysis<|message|>{{ m.thinking }}<|end|>",
}


def events_of(fmt: str, pieces: list[str]) -> list:
    plan = ToolPlan("auto", [ToolDefinition.model_validate(t) for t in TOOLS], format=FORMATS[fmt])
    parser = plan.new_parser()
    return [e for p in pieces for e in parser.feed(p)] + parser.finish()


def parse(fmt: str, pieces: list[str]) -> tuple[str, list[tuple[str, dict]]]:
    events = events_of(fmt, pieces)
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
    [tag] = [t for t in f.structural_tag(tools, single=True)["tags"] if "get_time" in t["begin"]]
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



# ---- harmony (gpt-oss) -------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=40))
def test_harmony_analysis_is_reasoning_never_content(cuts):
    text = ('<|channel|>analysis<|message|>The user greets; answer <politely>.<|end|><|start|>assistant'
            '<|channel|>final<|message|>Hello there!<|return|>')
    events = events_of("harmony", chunked(text, cuts))
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == "The user greets; answer <politely>."
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Hello there!"


def test_harmony_call_arguments_stream_as_generated():
    text = REPLIES["harmony"]
    events = events_of("harmony", list(text))
    for done in [e for e in events if isinstance(e, CallDone)]:
        pieces = [e.text for e in events if isinstance(e, ArgumentsDelta) and e.index == done.index]
        assert len(pieces) > 1 and "".join(pieces) == done.call.arguments


def test_a_reply_without_harmony_markup_is_plain_content():
    assert parse("harmony", list("Just text, <b>no</b> channels.")) == ("Just text, <b>no</b> channels.", [])


def test_a_harmony_message_to_an_unknown_recipient_is_dropped():
    text = '<|channel|>commentary to=browser.search <|constrain|>json<|message|>{"q": "x"}<|call|>'
    assert events_of("harmony", [text]) == []


def test_a_cut_off_harmony_call_is_not_a_call():
    text = '<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{"timez'
    assert parse("harmony", [text]) == ("", [])


HARMONY_REPLY = r"<\|channel\|>analysis<\|message\|>[a-z ]{3,30}<\|end\|><\|start\|>assistant<\|channel\|>final<\|message\|>[A-Z][a-z ]{3,30}"


def test_harmony_reasoning_reaches_chat_as_reasoning_content_whole_and_streamed(api):
    api.state.tool_format, before = FORMATS["harmony"], api.state.tool_format
    try:
        kw = dict(model=api.model, messages=ASK, max_tokens=80, temperature=0, extra_body={"guided_regex": HARMONY_REPLY})
        api.client().chat.completions.create(**{**kw, "max_tokens": 1})   # both on a warm cache (README)
        whole = api.client().chat.completions.create(**kw).choices[0].message
        chunks = [c for c in api.client().chat.completions.create(stream=True, **kw) if c.choices]
    finally:
        api.state.tool_format = before
    reasoning = whole.model_extra["reasoning_content"]
    assert reasoning and "<|" not in reasoning and whole.content and "<|" not in whole.content
    streamed = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks)
    assert streamed == reasoning
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.content


def test_harmony_reasoning_becomes_a_responses_reasoning_item_before_the_calls():
    builder = OutputBuilder()
    stream = [e for event in events_of("harmony", list(REPLIES["harmony"])) for e in builder.feed(event)]
    stream += builder.finish("completed")
    assert [item["type"] for item in builder.items] == ["reasoning", "message", "function_call", "function_call"]
    assert builder.items[0]["content"] == [{"type": "reasoning_text", "text": "They want weather and time."}]
    deltas = "".join(e["delta"] for e in stream if e["type"] == "response.reasoning_text.delta")
    assert deltas == "They want weather and time." and builder.output_text == "Let me check."


# ---- markup that is the tokenizer's own special tokens (Mistral's, gpt-oss's) -------------------
def test_every_formats_markers_are_known_markup_tokens():
    from radixserve.runtime.tokenizer import TOOL_MARKUP_TOKENS
    assert all(set(fmt.markers) <= set(TOOL_MARKUP_TOKENS) for fmt in FORMATS.values())


@pytest.fixture(scope="module")
def special_markup_tokenizer(default_tokenizer):
    """The default tokenizer with every tool markup token added as a special token, the call end
    <|call|> among its stop tokens, as gpt-oss's generation config has it."""
    from tokenizers import Tokenizer as HFTokenizer
    from radixserve.runtime.tokenizer import TOOL_MARKUP_TOKENS, Tokenizer
    tok = HFTokenizer.from_str(default_tokenizer.tok.to_str())
    tok.add_special_tokens(list(TOOL_MARKUP_TOKENS))
    return Tokenizer(tok, None, default_tokenizer.bos_token_id, tok.token_to_id("<|call|>"), False)


def _matcher(tokenizer, structural_tag: dict):
    from radixserve.grammar import GrammarSpec, make_grammar_backend
    backend = make_grammar_backend("xgrammar", tokenizer.vocab_info())
    return backend, backend.matcher(backend.compile(GrammarSpec.structural_tag(structural_tag)))


def _allowed(backend, matcher, token: int) -> bool:
    bitmask = backend.allocate_bitmask(1)
    backend.fill_bitmask([matcher], bitmask, [0])
    return bool((int(bitmask[0, token // 32]) >> (token % 32)) & 1)


def test_an_auto_call_may_begin_with_the_models_own_special_marker(special_markup_tokenizer):
    tok = special_markup_tokenizer
    backend, matcher = _matcher(tok, FORMATS["mistral"].for_model(tok, tok.eos_token_ids).structural_tag(
        [ToolDefinition.model_validate(t) for t in TOOLS], single=False))
    marker = tok.tok.token_to_id("[TOOL_CALLS]")
    assert _allowed(backend, matcher, marker) and matcher.accept_token(marker)
    for t in tok.encode('[{"name": "get_time", "arguments": {"timezone":"CET"}}]', add_special_tokens=False):
        assert matcher.accept_token(t)
    assert all(_allowed(backend, matcher, s) for s in tok.eos_token_ids)


def test_a_harmony_call_ends_on_the_call_marker_that_is_the_models_stop_token(special_markup_tokenizer):
    tok = special_markup_tokenizer
    fmt = FORMATS["harmony"].for_model(tok, tok.eos_token_ids)
    assert fmt.stop_markers == {"<|call|>"}
    tools = [ToolDefinition.model_validate(t) for t in TOOLS]
    backend, matcher = _matcher(tok, fmt.structural_tag(tools, single=False))
    text = fmt.header("get_time") + '{"timezone":"CET"}'   # the grammar's JSON is compact
    ids = tok.encode("<|start|>assistant" + text, add_special_tokens=False)
    assert tok.tok.token_to_id("<|channel|>") in ids and tok.tok.token_to_id("<|message|>") in ids   # one token each
    for t in ids:
        assert matcher.accept_token(t)
    call = tok.tok.token_to_id("<|call|>")
    assert _allowed(backend, matcher, call) and matcher.accept_token(call) and matcher.is_terminated()


def test_markup_that_is_not_special_in_a_tokenizer_keeps_its_tag_end(default_tokenizer):
    fmt = FORMATS["harmony"].for_model(default_tokenizer, default_tokenizer.eos_token_ids)
    assert not fmt.stop_markers
    tools = [ToolDefinition.model_validate(t) for t in TOOLS]
    assert {tag["end"] for tag in fmt.structural_tag(tools, False)["tags"]} == {"<|call|>"}


def test_a_harmony_call_that_ends_on_its_stop_token_is_read_as_a_call(special_markup_tokenizer, default_model_files):
    from types import SimpleNamespace
    from radixserve.api.state import ServerState
    from radixserve.runtime.request import RequestOutput
    tok = special_markup_tokenizer
    state = ServerState(None, "tiny", None, tool_call_format="harmony")
    state.attach(SimpleNamespace(tokenizer=tok, model_config=default_model_files.config))   # what attach reads
    parser = ToolPlan("auto", [ToolDefinition.model_validate(t) for t in TOOLS], format=state.tool_format).new_parser()
    reply = "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>" + '{"timezone":"CET"}'
    last = RequestOutput("r", reply, [1, 2, tok.tok.token_to_id("<|call|>")], finish_reason="stop")
    events = parser.feed(last.text + state.stop_markup_text(last)) + parser.finish()
    assert [e.call.name for e in events if isinstance(e, CallDone)] == ["get_time"]
    assert not [e for e in events if isinstance(e, TextDelta) and e.text.strip()]
