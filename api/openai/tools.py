"""Tool calling: what `tools` + `tool_choice` + `parallel_tool_calls` ask of the prompt and the
grammar, and the parsers that turn the model's output back into OpenAI `tool_calls`, piece by
piece as it is generated.

- `none` (or no tools): plain text, tools are not shown to the model.
- `required`: the whole output is grammar-constrained JSON: one call object
  `{"name": ..., "arguments": {...}}`, or with `parallel_tool_calls` (OpenAI's default) a non-empty
  array of them; every call's arguments validate against its own tool's parameters. JSON (not a
  structural tag) so that both grammar backends can enforce it.
- a named function: exactly one call object to that function, as OpenAI answers it.
- `auto`: the model answers freely; each Hermes-style `<tool_call>` block is constrained by a
  structural tag (arguments always valid for the tool the block names) and parsed into
  `tool_calls`; without `parallel_tool_calls` the output ends after the first block. A tool-call
  block never reaches the client as content.

The parsers return typed events (`TextDelta`, `CallStarted`, `ArgumentsDelta`, `CallDone`) that
both chat completions and Responses turn into their own stream shapes.
"""
from __future__ import annotations

import json
import logging
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from radixserve.api.errors import bad_request
from radixserve.api.openai.protocol import ToolDefinition
from radixserve.grammar.spec import GrammarSpec

log = logging.getLogger("radixserve.api")

TOOL_CALL_BEGIN = "<tool_call>"
TOOL_CALL_END = "</tool_call>"


@dataclass
class ToolCall:
    name: str
    arguments: str                       # JSON text, as OpenAI returns it
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])

    def to_message(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


# ---- parser events ------------------------------------------------------------------------------
# `index` counts the calls of one choice from 0. The ArgumentsDelta texts of a call, concatenated,
# equal its CallDone's `call.arguments`. A call cut off before its arguments close (max_tokens)
# gets CallStarted and some ArgumentsDelta but no CallDone.

@dataclass(frozen=True)
class TextDelta:
    """Content text (never tool-call markup)."""
    text: str


@dataclass(frozen=True)
class CallStarted:
    """A call's name is known: its id, type and name go out before any arguments."""
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ArgumentsDelta:
    """The next piece of call `index`'s arguments JSON, as generated."""
    index: int
    text: str


@dataclass(frozen=True)
class CallDone:
    """Call `index` is complete; `call.arguments` is the whole arguments JSON."""
    index: int
    call: ToolCall


ParserEvent = Union[TextDelta, CallStarted, ArgumentsDelta, CallDone]


@dataclass
class ToolPlan:
    """What the request's tools mean for this generation."""
    mode: str                                   # none | auto | required
    tools: list[ToolDefinition]                 # tools the model may call (shown to the template)
    build_constraint: Optional[Callable[[], GrammarSpec]] = None  # may raise GrammarError
    parallel: bool = True                       # may one turn carry several calls

    @property
    def template_tools(self) -> Optional[list[dict[str, Any]]]:
        return [t.model_dump(exclude_none=True) for t in self.tools] if self.mode != "none" else None

    def new_parser(self) -> Optional["ToolCallParser"]:
        names = {t.function.name for t in self.tools}
        if self.mode == "auto":
            return HermesToolCallParser(names)
        if self.mode == "required":
            return WholeOutputToolCallParser(names)
        return None


def plan_tools(req: Any) -> ToolPlan:
    """Resolve tools + tool_choice + parallel_tool_calls of a request (anything with those three
    attributes, as ChatCompletionRequest has) into a plan; 400 for an unknown tool."""
    tools = req.tools or []
    choice = req.tool_choice if req.tool_choice is not None else ("auto" if tools else "none")
    parallel = req.parallel_tool_calls is not False      # OpenAI's default is true
    if not tools:
        if choice != "none":
            raise bad_request("tool_choice: requires tools", param="tool_choice")
        return ToolPlan("none", [])
    names = [t.function.name for t in tools]
    if len(set(names)) != len(names):
        raise bad_request("tools: function names must be unique", param="tools")
    if choice == "none":
        return ToolPlan("none", tools, parallel=parallel)
    if choice == "auto":
        return ToolPlan("auto", tools, lambda: _hermes_structural_tag(tools, not parallel), parallel)
    if choice == "required":
        return ToolPlan("required", tools, lambda: GrammarSpec.json_schema(_calls_schema(tools, parallel)),
                        parallel)
    named = [t for t in tools if t.function.name == choice.function.name]
    if not named:
        raise bad_request(f"tool_choice: function {choice.function.name!r} is not among the tools "
                          f"({', '.join(names)})", param="tool_choice")
    # A named function is one call to it, as OpenAI answers it (instructor and langchain's
    # structured output read exactly one call), whatever parallel_tool_calls says.
    return ToolPlan("required", named, lambda: GrammarSpec.json_schema(_calls_schema(named, False)), False)


def _calls_schema(tools: list[ToolDefinition], parallel: bool) -> dict[str, Any]:
    """One tool call as JSON, or a non-empty array of them: in each, the name picks the tool and
    the arguments follow that tool's parameters (an anyOf keyed by the name's const)."""
    options = [{"type": "object",
                "properties": {"name": {"const": t.function.name}, "arguments": t.function.parameters},
                "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
    call = options[0] if len(options) == 1 else {"anyOf": options}
    return {"type": "array", "items": call, "minItems": 1} if parallel else call


def _hermes_structural_tag(tools: list[ToolDefinition], single: bool) -> GrammarSpec:
    # The begin string fixes the name, so the body is exactly that tool's arguments object.
    tags = [{"begin": f'{TOOL_CALL_BEGIN}\n{{"name": {json.dumps(t.function.name)}, "arguments": ',
             "schema": t.function.parameters, "end": f"}}\n{TOOL_CALL_END}"} for t in tools]
    return GrammarSpec.structural_tag({"tags": tags, "triggers": [TOOL_CALL_BEGIN], "at_least_one": False,
                                       "stop_after_first": single})


def parse_call_json(text: str, allowed: set[str]) -> Optional[ToolCall]:
    """`{"name": ..., "arguments": {...}}` as a ToolCall, or None if it is not one."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return None
    return _call_from_object(obj, allowed)


def _call_from_object(obj: Any, allowed: set[str]) -> Optional[ToolCall]:
    if not isinstance(obj, dict) or obj.get("name") not in allowed:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models emit the arguments already as a JSON string
        return ToolCall(obj["name"], args)
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


# A call object's head up to its arguments value, which must be an object: the shape both the
# structural tag and the JSON schema produce (name first), whatever the whitespace.
_CALL_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*(?=\{)', re.S)


class _ValueEnd:
    """Where one JSON object ends, fed piece by piece (braces inside strings do not count)."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = self.escape = self.done = False

    def feed(self, text: str) -> int:
        """How many chars of `text` belong to the value (all of them until it closes)."""
        for i, ch in enumerate(text):
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif ch == "\\":
                    self.escape = True
                elif ch == '"':
                    self.in_string = False
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.done = True
                    return i + 1
        return len(text)


class ToolCallParser:
    """Incremental: `feed` each text delta, then `finish`; both return events in order. Content
    is held back while it may still turn into a tool call, and trailing whitespace is held until
    more content follows, so streamed and whole replies split the same way. A call's arguments
    stream as they are generated once its name is known."""

    def __init__(self, allowed: set[str]):
        self.allowed = allowed
        self.calls: list[ToolCall] = []          # completed calls, in order
        self.started = 0                         # calls with a CallStarted so far
        self._pending_ws = ""
        self._args: Optional[_ValueEnd] = None   # the open call's arguments scanner
        self._open: Optional[tuple[int, str, str]] = None   # (index, id, name) of the open call
        self._args_text: list[str] = []

    def feed(self, text: str) -> list[ParserEvent]:
        raise NotImplementedError

    def finish(self) -> list[ParserEvent]:
        raise NotImplementedError

    def _content(self, text: str) -> list[ParserEvent]:
        if not text:
            return []
        text = self._pending_ws + text
        body = text.rstrip()
        self._pending_ws = text[len(body):]
        return [TextDelta(body)] if body else []

    def _try_head(self, buffer: str) -> Optional[tuple[list[ParserEvent], str]]:
        """If `buffer` (from a call object's start) holds the whole head of a call to an allowed
        tool: CallStarted plus what follows of the arguments, and the text after them."""
        m = _CALL_HEAD.match(buffer)
        if m is None:
            return None
        try:
            name = json.loads(f'"{m.group(1)}"')
        except json.JSONDecodeError:
            return None
        if name not in self.allowed:
            return None
        index = self.started
        self.started += 1
        call_id = "call_" + uuid.uuid4().hex[:24]
        self._open, self._args, self._args_text = (index, call_id, name), _ValueEnd(), []
        events: list[ParserEvent] = [CallStarted(index, call_id, name)]
        more, rest = self._feed_args(buffer[m.end():])
        return events + more, rest

    def _feed_args(self, text: str) -> tuple[list[ParserEvent], str]:
        """Arguments text of the open call; returns its events and any text past the arguments."""
        assert self._args is not None and self._open is not None
        n = self._args.feed(text)
        piece, rest = text[:n], text[n:]
        events: list[ParserEvent] = []
        if piece:
            self._args_text.append(piece)
            events.append(ArgumentsDelta(self._open[0], piece))
        return events, rest

    def _close_call(self) -> list[ParserEvent]:
        """CallDone for the open call, whose arguments have closed."""
        assert self._open is not None
        index, call_id, name = self._open
        call = ToolCall(name, "".join(self._args_text), id=call_id)
        self._open, self._args, self._args_text = None, None, []
        self.calls.append(call)
        return [CallDone(index, call)]

    def _whole_call(self, call: Optional[ToolCall], text: str) -> list[ParserEvent]:
        """A call parsed at once (a shape the head pattern does not read): all three events."""
        if call is None:
            log.warning("dropping an unparsable tool call: %.200r", text)
            return []
        index = self.started
        self.started += 1
        self.calls.append(call)
        return [CallStarted(index, call.id, call.name), ArgumentsDelta(index, call.arguments), CallDone(index, call)]

    def _drop_open_call(self, why: str) -> None:
        if self._open is not None:
            log.info("tool call %d (%s) %s", self._open[0], self._open[2], why)
        self._open, self._args, self._args_text = None, None, []


class HermesToolCallParser(ToolCallParser):
    """Free text with `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks
    (tool_choice auto). States: text, head (after the begin tag), args, tail (up to the end tag)."""

    def __init__(self, allowed: set[str]):
        super().__init__(allowed)
        self._buffer = ""
        self._state = "text"

    def feed(self, text: str) -> list[ParserEvent]:
        self._buffer += text
        events: list[ParserEvent] = []
        while True:
            if self._state == "text":
                start = self._buffer.find(TOOL_CALL_BEGIN)
                if start < 0:
                    keep = _partial_suffix(self._buffer, TOOL_CALL_BEGIN)
                    events += self._content(self._buffer[:len(self._buffer) - keep])
                    self._buffer = self._buffer[len(self._buffer) - keep:]
                    return events
                events += self._content(self._buffer[:start])
                self._buffer = self._buffer[start + len(TOOL_CALL_BEGIN):]
                self._state = "head"
            elif self._state == "head":
                started = self._try_head(self._buffer)
                if started is not None:
                    more, self._buffer = started
                    events += more
                    self._state = "tail" if self._args.done else "args"
                    continue
                end = self._buffer.find(TOOL_CALL_END)
                if end < 0:
                    return events          # the head is not complete yet
                # another shape (not name-then-arguments): read the block as a whole
                block = self._buffer[:end]
                events += self._whole_call(parse_call_json(block.strip(), self.allowed), block)
                self._buffer = self._buffer[end + len(TOOL_CALL_END):]
                self._state = "text"
            elif self._state == "args":
                more, self._buffer = self._feed_args(self._buffer)
                events += more
                if not self._args.done:
                    return events
                self._state = "tail"
            else:  # tail: the call object's closing brace, then the end tag
                end = self._buffer.find(TOOL_CALL_END)
                if end < 0:
                    return events
                events += self._close_call()
                self._buffer = self._buffer[end + len(TOOL_CALL_END):]
                self._state = "text"

    def finish(self) -> list[ParserEvent]:
        # An unclosed block means the reply was cut off (max_tokens): it is not a complete call
        # and, being tool-call text, not content either.
        if self._state != "text":
            self._drop_open_call("cut off before its end tag")
            self._buffer, self._state = "", "text"
            return []
        rest, self._buffer = self._buffer, ""
        return self._content(rest)


class WholeOutputToolCallParser(ToolCallParser):
    """The whole output is one call object, or an array of them (tool_choice required or
    named). States: start, head (a call object's start), args, close (its closing brace), between
    (array: a comma or the closing bracket), end."""

    def __init__(self, allowed: set[str]):
        super().__init__(allowed)
        self._buffer = ""
        self._all: list[str] = []
        self._state = "start"
        self._array = False

    def feed(self, text: str) -> list[ParserEvent]:
        self._all.append(text)
        self._buffer += text
        events: list[ParserEvent] = []
        while True:
            stripped = self._buffer.lstrip()
            if self._state == "start":
                if not stripped:
                    return events
                self._array = stripped[0] == "["
                self._buffer = stripped[1:] if self._array else stripped
                self._state = "head"
            elif self._state == "head":
                started = self._try_head(self._buffer)
                if started is None:
                    return events          # incomplete, or another shape: read at finish
                more, self._buffer = started
                events += more
                self._state = "close" if self._args.done else "args"
            elif self._state == "args":
                more, self._buffer = self._feed_args(self._buffer)
                events += more
                if not self._args.done:
                    return events
                self._state = "close"
            elif self._state == "close":
                if not stripped:
                    return events
                if stripped[0] != "}":
                    return events          # another shape: read at finish
                events += self._close_call()
                self._buffer = stripped[1:]
                self._state = "between" if self._array else "end"
            elif self._state == "between":
                if not stripped:
                    return events
                self._buffer = stripped[1:]
                self._state = "head" if stripped[0] == "," else "end"
            else:
                self._buffer = ""
                return events

    def finish(self) -> list[ParserEvent]:
        if self._state == "end" or self.calls:
            if self._state != "end":
                self._drop_open_call("cut off before its arguments closed")
            return []
        if self.started:              # the first call was cut off: nothing to read again
            self._drop_open_call("cut off before its arguments closed")
            return []
        # Nothing streamed: an unconstrained or unusual shape. Read the whole text once.
        text = "".join(self._all).strip()
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            log.warning("dropping an unparsable tool call: %.200r", text)
            return []
        events: list[ParserEvent] = []
        for item in obj if isinstance(obj, list) else [obj]:
            events += self._whole_call(_call_from_object(item, self.allowed), json.dumps(item)[:200])
        return events


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
