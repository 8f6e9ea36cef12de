"""gpt-oss's harmony output: messages on channels, read back into reasoning, content and calls.

After the prompt's `<|start|>assistant`, a completion is one or more messages

    [<|channel|>CHANNEL][ to=RECIPIENT][ <|constrain|>TYPE]<|message|>BODY(<|end|> | <|call|> | <|return|>)

(a recipient may also come before the channel), the later ones each after `<|start|>assistant`.
`analysis` is reasoning, kept out of content (`reasoning_content`, a Responses reasoning item);
`final`, and `commentary` addressed to no one, are content; a message to `functions.NAME` is a
call whose body is its arguments. A reply with no harmony markup at all is plain content.
"""
from __future__ import annotations

import logging
import re
import uuid

from radixserve.api.openai.tools import (ArgumentsDelta, CallDone, CallStarted, ParserEvent, ReasoningDelta,
                                         ToolCall, ToolCallParser, partial_suffix)

log = logging.getLogger("radixserve.api")

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
_RECIPIENT = re.compile(r"to=(\S+?)(?=\s|<\||$)")


class HarmonyParser(ToolCallParser):
    """Incremental, as every parser here. States: header (up to `<|message|>`), body (up to an end
    marker), between (up to the next message's header), plain (no harmony: all content)."""

    def __init__(self, allowed: set[str]):
        super().__init__(allowed)
        self._buffer = ""
        self._state = "header"
        self._kind = "content"          # the open message's: reasoning, content, call or drop

    def feed(self, text: str) -> list[ParserEvent]:
        self._buffer += text
        events: list[ParserEvent] = []
        while True:
            if self._state == "plain":
                events += self._content(self._buffer)
                self._buffer = ""
                return events
            if self._state in ("header", "between"):
                if self._state == "between":
                    start = self._buffer.find(START)
                    if start < 0:
                        return events
                    self._buffer = self._buffer[start + len(START):]
                    self._state = "header"
                head = self._buffer.lstrip()
                if not (head.startswith(("assistant", "to=", CHANNEL)) or CHANNEL.startswith(head)
                        or "assistant".startswith(head) or "to=".startswith(head)):
                    self._state = "plain"      # a reply without harmony markup
                    continue
                end = self._buffer.find(MESSAGE)
                if end < 0:
                    return events
                events += self._header(self._buffer[:end])
                self._buffer = self._buffer[end + len(MESSAGE):]
                self._state = "body"
            else:  # body
                found = [(i, m) for m in ENDS if (i := self._buffer.find(m)) >= 0]
                if not found:
                    keep = max(partial_suffix(self._buffer, m) for m in ENDS)
                    events += self._body(self._buffer[:len(self._buffer) - keep])
                    self._buffer = self._buffer[len(self._buffer) - keep:]
                    return events
                i, marker = min(found)
                events += self._body(self._buffer[:i]) + self._close()
                self._buffer = self._buffer[i + len(marker):]
                self._state = "between"

    def finish(self) -> list[ParserEvent]:
        if self._state == "body" and self._kind == "call":
            self._drop_open_call("cut off before its <|call|>")
        elif self._state in ("body", "plain"):
            events = self._body(self._buffer) if self._state == "body" else self._content(self._buffer)
            self._buffer, self._state = "", "between"
            return events
        self._buffer, self._state = "", "between"
        return []

    def _header(self, header: str) -> list[ParserEvent]:
        """A message's header: what its body is."""
        channel = header.split(CHANNEL, 1)[1].split()[0].split("<|")[0] if CHANNEL in header else "final"
        recipient = _RECIPIENT.search(header)
        if recipient is None:
            self._kind = "reasoning" if channel == "analysis" else "content"
            return []
        name = recipient.group(1).removeprefix("functions.")
        if not recipient.group(1).startswith("functions.") or name not in self.allowed:
            log.warning("dropping a harmony message to %r: not a tool of this request", recipient.group(1))
            self._kind = "drop"
            return []
        self._kind = "call"
        index, call_id = self.started, "call_" + uuid.uuid4().hex[:24]
        self.started += 1
        self._open, self._args_text = (index, call_id, name), []
        return [CallStarted(index, call_id, name)]

    def _body(self, text: str) -> list[ParserEvent]:
        if not text or self._kind == "drop":
            return []
        if self._kind == "reasoning":
            return [ReasoningDelta(text)]
        if self._kind == "call":
            self._args_text.append(text)
            return [ArgumentsDelta(self._open[0], text)]
        return self._content(text)

    def _close(self) -> list[ParserEvent]:
        if self._kind != "call":
            return []
        index, call_id, name = self._open
        call = ToolCall(name, "".join(self._args_text), id=call_id)
        self._open, self._args_text = None, []
        self.calls.append(call)
        return [CallDone(index, call)]

