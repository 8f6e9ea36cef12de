"""Tool calling: what `tools` + `tool_choice` ask of the prompt and the grammar, and the parsers
that turn the model's output back into OpenAI `tool_calls`.

- `none` (or no tools): plain text, tools are not shown to the model.
- `required` / a named function: the whole output is grammar-constrained to one JSON object
  `{"name": ..., "arguments": {...}}` whose arguments validate against that tool's parameters.
- `auto`: the model answers freely; a Hermes-style `<tool_call>` block is constrained by a
  structural tag (arguments always valid JSON for the chosen tool) and parsed into `tool_calls`.
  A tool-call block never reaches the client as content.
"""
from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from radixserve.api.errors import bad_request
from radixserve.api.protocol import ChatCompletionRequest, ToolDefinition
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


ParserEvent = Union[str, ToolCall]      # content text, or a complete tool call


@dataclass
class ToolPlan:
    """What the request's tools mean for this generation."""
    mode: str                                   # none | auto | required
    tools: list[ToolDefinition]                 # tools the model may call (shown to the template)
    build_constraint: Optional[Callable[[], GrammarSpec]] = None  # may raise GrammarError

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


def plan_tools(req: ChatCompletionRequest) -> ToolPlan:
    """Resolve tools + tool_choice (+ parallel_tool_calls) into a plan; 400 for an unknown tool."""
    tools = req.tools or []
    choice = req.tool_choice if req.tool_choice is not None else ("auto" if tools else "none")
    if not tools:
        if choice != "none":
            raise bad_request("tool_choice: requires tools", param="tool_choice")
        return ToolPlan("none", [])
    names = [t.function.name for t in tools]
    if len(set(names)) != len(names):
        raise bad_request("tools: function names must be unique", param="tools")
    if choice == "none":
        return ToolPlan("none", tools)
    if choice == "auto":
        single = req.parallel_tool_calls is False
        return ToolPlan("auto", tools, lambda: _hermes_structural_tag(tools, single))
    if choice == "required":
        return ToolPlan("required", tools, lambda: GrammarSpec.json_schema(_call_schema(tools)))
    named = [t for t in tools if t.function.name == choice.function.name]
    if not named:
        raise bad_request(f"tool_choice: function {choice.function.name!r} is not among the tools "
                          f"({', '.join(names)})", param="tool_choice")
    return ToolPlan("required", named, lambda: GrammarSpec.json_schema(_call_schema(named)))


def _call_schema(tools: list[ToolDefinition]) -> dict[str, Any]:
    """One tool call as JSON: the name picks the tool, the arguments follow its parameters."""
    options = [{"type": "object",
                "properties": {"name": {"const": t.function.name}, "arguments": t.function.parameters},
                "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
    return options[0] if len(options) == 1 else {"anyOf": options}


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
    if not isinstance(obj, dict) or obj.get("name") not in allowed:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models emit the arguments already as a JSON string
        return ToolCall(obj["name"], args)
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


class ToolCallParser:
    """Incremental: `feed` each text delta, then `finish`; both return content and tool calls in
    order. Content is held back while it may still turn into a tool call, and trailing whitespace
    is held until more content follows, so streamed and whole replies split the same way."""

    def __init__(self, allowed: set[str]):
        self.allowed = allowed
        self.calls: list[ToolCall] = []
        self._pending_ws = ""

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
        return [body] if body else []

    def _call(self, text: str) -> list[ParserEvent]:
        call = parse_call_json(text.strip(), self.allowed)
        if call is None:
            log.warning("dropping an unparsable tool call: %.200r", text)
            return []
        self.calls.append(call)
        return [call]


class HermesToolCallParser(ToolCallParser):
    """Free text with `<tool_call>{json}</tool_call>` blocks (tool_choice auto)."""

    def __init__(self, allowed: set[str]):
        super().__init__(allowed)
        self._buffer = ""
        self._in_call = False

    def feed(self, text: str) -> list[ParserEvent]:
        self._buffer += text
        events: list[ParserEvent] = []
        while True:
            if self._in_call:
                end = self._buffer.find(TOOL_CALL_END)
                if end < 0:
                    return events
                events += self._call(self._buffer[:end])
                self._buffer = self._buffer[end + len(TOOL_CALL_END):]
                self._in_call = False
                continue
            start = self._buffer.find(TOOL_CALL_BEGIN)
            if start >= 0:
                events += self._content(self._buffer[:start])
                self._buffer = self._buffer[start + len(TOOL_CALL_BEGIN):]
                self._in_call = True
                continue
            keep = _partial_suffix(self._buffer, TOOL_CALL_BEGIN)
            events += self._content(self._buffer[:len(self._buffer) - keep])
            self._buffer = self._buffer[len(self._buffer) - keep:]
            return events

    def finish(self) -> list[ParserEvent]:
        # An unclosed block means the reply was cut off (max_tokens): it is not a tool call and,
        # being tool-call text, not content either.
        rest = "" if self._in_call else self._buffer
        self._buffer = ""
        return self._content(rest)


class WholeOutputToolCallParser(ToolCallParser):
    """The whole output is one tool-call object (tool_choice required or named)."""

    def __init__(self, allowed: set[str]):
        super().__init__(allowed)
        self._text: list[str] = []

    def feed(self, text: str) -> list[ParserEvent]:
        self._text.append(text)
        return []

    def finish(self) -> list[ParserEvent]:
        return self._call("".join(self._text))


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
