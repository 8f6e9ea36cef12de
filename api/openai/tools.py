"""Tool calling: what `tools` + `tool_choice` + `parallel_tool_calls` ask of the prompt and the
grammar, and the parsers that turn the model's output back into OpenAI `tool_calls`, piece by
piece as it is generated.

- `none` (or no tools): plain text, tools are not shown to the model.
- `required`: the whole output is grammar-constrained JSON: one call object
  `{"name": ..., "arguments": {...}}`, or with `parallel_tool_calls` (OpenAI's default) a non-empty
  array of them; every call's arguments validate against its own tool's parameters. JSON (not a
  structural tag) so that both grammar backends can enforce it.
- a named function: exactly one call object to that function, as OpenAI answers it.
- `auto`: the model answers freely; each call in the model's own markup (api/openai/tool_formats.py:
  Hermes `<tool_call>` blocks, Llama 3 JSON, Mistral `[TOOL_CALLS]`, Phi-4-mini `functools`) is
  constrained by a structural tag (arguments always valid for the tool the call names) and parsed
  into `tool_calls`; without `parallel_tool_calls` the output ends after the first call. Tool-call
  markup never reaches the client as content.

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
from radixserve.api.openai.tool_formats import FORMATS, ToolFormat
from radixserve.grammar.spec import GrammarSpec

log = logging.getLogger("radixserve.api")

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
class ReasoningDelta:
    """Reasoning text (gpt-oss's analysis channel): never content."""
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


ParserEvent = Union[TextDelta, ReasoningDelta, CallStarted, ArgumentsDelta, CallDone]


@dataclass
class ToolPlan:
    """What the request's tools mean for this generation."""
    mode: str                                   # none | auto | required
    tools: list[ToolDefinition]                 # tools the model may call (shown to the template)
    build_constraint: Optional[Callable[[], GrammarSpec]] = None  # may raise GrammarError
    parallel: bool = True                       # may one turn carry several calls
    format: ToolFormat = FORMATS["hermes"]      # how the model spells calls (`auto`) and earlier turns

    @property
    def template_tools(self) -> Optional[list[dict[str, Any]]]:
        return [t.model_dump(exclude_none=True) for t in self.tools] if self.mode != "none" else None

    @property
    def reads_markup(self) -> bool:
        """Whether this plan's parser reads the format's markup (the decoded text must keep it)."""
        return self.mode == "auto" or (self.format.channels and self.mode != "required")

    def new_parser(self) -> Optional["ToolCallParser"]:
        names = {t.function.name for t in self.tools}
        if self.format.channels and self.mode != "required":
            from radixserve.api.openai.harmony import HarmonyParser
            return HarmonyParser(names if self.mode == "auto" else set())   # reasoning, tools or not
        if self.mode == "auto":
            return MarkupToolCallParser(names, self.format)
        if self.mode == "required":
            return WholeOutputToolCallParser(names)
        return None


def plan_tools(req: Any, fmt: ToolFormat = FORMATS["hermes"]) -> ToolPlan:
    """Resolve tools + tool_choice + parallel_tool_calls of a request (anything with those three
    attributes, as ChatCompletionRequest has) into a plan for a model that spells calls in `fmt`;
    400 for an unknown tool."""
    tools = req.tools or []
    choice = req.tool_choice if req.tool_choice is not None else ("auto" if tools else "none")
    parallel = req.parallel_tool_calls is not False      # OpenAI's default is true
    if not tools:
        if choice != "none":
            raise bad_request("tool_choice: requires tools", param="tool_choice")
        return ToolPlan("none", [], format=fmt)
    names = [t.function.name for t in tools]
    if len(set(names)) != len(names):
        raise bad_request("tools: function names must be unique", param="tools")
    if choice == "none":
        return ToolPlan("none", tools, parallel=parallel, format=fmt)
    if choice == "auto":
        return ToolPlan("auto", tools, lambda: GrammarSpec.structural_tag(fmt.structural_tag(tools, not parallel)),
                        parallel, fmt)
    if choice == "required":
        return ToolPlan("required", tools, lambda: GrammarSpec.json_schema(_calls_schema(tools, parallel)),
                        parallel, fmt)
    named = [t for t in tools if t.function.name == choice.function.name]
    if not named:
        raise bad_request(f"tool_choice: function {choice.function.name!r} is not among the tools "
                          f"({', '.join(names)})", param="tool_choice")
    # A named function is one call to it, as OpenAI answers it (instructor and langchain's
    # structured output read exactly one call), whatever parallel_tool_calls says.
    return ToolPlan("required", named, lambda: GrammarSpec.json_schema(_calls_schema(named, False)), False, fmt)


def _calls_schema(tools: list[ToolDefinition], parallel: bool) -> dict[str, Any]:
    """One tool call as JSON, or a non-empty array of them: in each, the name picks the tool and
    the arguments follow that tool's parameters (an anyOf keyed by the name's const)."""
    options = [{"type": "object",
                "properties": {"name": {"const": t.function.name}, "arguments": t.function.parameters},
                "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
    call = options[0] if len(options) == 1 else {"anyOf": options}
    return {"type": "array", "items": call, "minItems": 1} if parallel else call


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


def _call_head(args_key: str) -> re.Pattern:
    """A call object's head up to its arguments value, which must be an object: the shape both the
    structural tag and the JSON schema produce (name first), whatever the whitespace."""
    return re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"' + args_key + r'"\s*:\s*(?=\{)', re.S)


_CALL_HEAD = _call_head("arguments")
# where a bare call object (Llama 3) may start
_BARE_CALL = re.compile(r'\{\s*"name"\s*:')
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


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

    def _try_head(self, buffer: str, head: re.Pattern = _CALL_HEAD) -> Optional[tuple[list[ParserEvent], str]]:
        """If `buffer` (from a call object's start) holds the whole head of a call to an allowed
        tool: CallStarted plus what follows of the arguments, and the text after them."""
        m = head.match(buffer)
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


class MarkupToolCallParser(ToolCallParser):
    """Free text with calls in the model's own markup (tool_choice auto; api/openai/tool_formats.py):
    Hermes `<tool_call>` blocks, Llama 3's bare objects joined by ";", Mistral's `[TOOL_CALLS][...]`,
    Phi-4-mini's `functools[...]`. States: text, open (after a block's marker), head (a call
    object's start), args, close (its closing brace), next (another call of the block?), tail (up
    to the block's end marker), skip (a block of no call of ours, dropped)."""

    def __init__(self, allowed: set[str], fmt: ToolFormat = FORMATS["hermes"]):
        super().__init__(allowed)
        self.fmt = fmt
        self._head = _call_head(fmt.args_key)
        # what opens a block: its begin marker, or for bare call objects (Llama 3) the markup that may precede one
        self._markers = [fmt.begin.strip()] if fmt.begin else list(fmt.markers)
        self._end = fmt.end.strip()
        self._buffer = ""
        self._state = "text"
        self._skip: Optional[_ValueEnd] = None

    def feed(self, text: str) -> list[ParserEvent]:
        self._buffer += text
        events: list[ParserEvent] = []
        while True:
            state, rest = self._state, self._buffer.lstrip()
            if state == "text":
                start = self._block_start()
                if start is None:
                    keep = self._held()
                    events += self._content(self._buffer[:len(self._buffer) - keep])
                    self._buffer = self._buffer[len(self._buffer) - keep:]
                    return events
                events += self._content(self._buffer[:start[0]])
                self._buffer = self._buffer[start[1]:]
                self._state = "open"
            elif state == "open":
                if not rest:
                    return events
                if self.fmt.array and rest[0] != "[":
                    self._state = "text"         # a marker with no array after it: dropped
                    continue
                self._buffer = rest[1:] if self.fmt.array else self._buffer
                self._state = "head"
            elif state == "head":
                started = self._try_head(self._buffer, self._head)
                if started is not None:
                    more, self._buffer = started
                    events += more
                    self._state = "close" if self._args.done else "args"
                elif not rest or _could_be_head(rest, self.fmt.args_key):
                    return events                # the head is not complete yet
                elif self._end:
                    # another shape (not name-then-arguments): read the block as a whole
                    end = self._buffer.find(self._end)
                    if end < 0:
                        return events
                    block = self._buffer[:end]
                    events += self._whole_call(parse_call_json(block.strip(), self.allowed), block)
                    self._buffer = self._buffer[end + len(self._end):]
                    self._state = "text"
                elif not self.fmt.begin:         # a bare object that is no call: plain content
                    events += self._content(rest[0])
                    self._buffer, self._state = rest[1:], "text"
                else:
                    self._skip, self._state = _ValueEnd(), "skip"
                    self._skip.depth = 1 if self.fmt.array else 0
            elif state == "args":
                more, self._buffer = self._feed_args(self._buffer)
                events += more
                if not self._args.done:
                    return events
                self._state = "close"
            elif state == "close":
                if not rest:
                    return events
                if rest[0] == "}":
                    events += self._close_call()
                    rest = rest[1:]
                else:
                    self._drop_open_call("not closed where its arguments end")
                self._buffer, self._state = rest, "next"
            elif state == "next":
                if not rest:
                    return events
                more = "," if self.fmt.array else self.fmt.separator
                if more and rest[0] == more:
                    self._buffer, self._state = rest[1:], "head"
                else:
                    if self.fmt.array and rest[0] == "]":
                        self._buffer = rest[1:]
                    self._state = "tail"
            elif state == "skip":
                n = self._skip.feed(self._buffer)
                self._buffer = self._buffer[n:]
                if not self._skip.done:
                    return events
                log.warning("dropping a tool-call block that calls no known tool")
                self._state = "tail"
            else:  # tail: up to the block's end marker, if the format has one
                if self._end:
                    end = self._buffer.find(self._end)
                    if end < 0:
                        return events
                    self._buffer = self._buffer[end + len(self._end):]
                self._state = "text"

    def finish(self) -> list[ParserEvent]:
        # A block cut off inside a call (max_tokens) is not a complete call and, being tool-call
        # text, not content either.
        if self._state not in ("text", "next", "tail"):
            self._drop_open_call("cut off before its arguments closed")
        if self._state != "text":
            self._buffer, self._state = "", "text"
            return []
        rest, self._buffer = self._buffer, ""
        return self._content(rest)

    def _block_start(self) -> Optional[tuple[int, int]]:
        """(where the first block starts, where its content starts) in the buffer; the two are the
        same for a bare call object."""
        found = [(i, i + len(m)) for m in self._markers if (i := self._buffer.find(m)) >= 0]
        if not self.fmt.begin and (bare := _BARE_CALL.search(self._buffer)) is not None:
            found.append((bare.start(), bare.start()))
        return min(found) if found else None

    def _held(self) -> int:
        """How much of the buffer's end may still become a block's start."""
        keep = max((partial_suffix(self._buffer, m) for m in self._markers), default=0)
        brace = self._buffer.rfind("{")
        if not self.fmt.begin and brace >= 0:
            after = self._buffer[brace + 1:].lstrip()
            if '"name"'.startswith(after) or (after.startswith('"name"') and not after[6:].strip()):
                keep = max(keep, len(self._buffer) - brace)
        return keep


def _could_be_head(text: str, args_key: str) -> bool:
    """Whether `text` (from a call object's brace) may still grow into a call's head
    `{"name": "...", "<args_key>": {`, whatever the whitespace. A whole head counts as no: the
    caller's pattern would have taken it had it named a tool of ours."""
    parts = ["{", '"name"', ":", None, ",", f'"{args_key}"', ":", "{"]   # None: the name, any JSON string
    i = 0
    for part in parts:
        while i < len(text) and text[i].isspace():
            i += 1
        if i == len(text):
            return True
        if part is None:
            if text[i] != '"':
                return False
            m = _JSON_STRING.match(text, i)
            if m is None:
                return True              # the name is still being written
            i = m.end()
            continue
        seen = text[i:i + len(part)]
        if not part.startswith(seen):
            return False
        if len(seen) < len(part):
            return True
        i += len(part)
    return False


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


def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
