"""How each model family spells tool calls: a registry of formats, chosen from the chat template
(or `--tool-call-format`).

A format knows four things, all derived from one spelling of a call, so what the grammar lets the
model write, what the parser reads back and what the next turn renders agree:
- the instruction and call rendering for templates that cannot render tools themselves;
- the structural tag that constrains `auto` calls (arguments always valid for the named tool);
- where calls start and how several are joined, for the streaming parser (api/openai/tools.py);
- how calls of an earlier turn are written back into the prompt.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Optional


@dataclass(frozen=True)
class ToolFormat:
    name: str
    args_key: str                   # "arguments", or Llama 3's "parameters"
    begin: str                      # what opens a block of calls ("" : a bare call object)
    end: str                        # what closes it after the last call ("" : nothing)
    array: bool                     # the block holds a JSON array of calls
    separator: str                  # between calls of one block, when not an array (Llama 3: ";")
    instruction: str                # for templates that do not render tools; {tools}: one JSON per line
    markers: tuple[str, ...] = ()   # the markup's own tokens: decoded for the parser where they are special
    block_per_call: bool = False    # each call in a block of its own (Hermes), not all in one
    result_wrap: tuple[str, str] = ("", "")   # around a tool's result, for templates without tool support
    channels: bool = False          # harmony: every reply is channelled messages (reasoning apart), tools or not
    # markers this model writes as a stop token (gpt-oss's <|call|>): a grammar cannot ask for a stop
    # token as text, so a call's tag ends before it and generation stops on it (`for_model`)
    stop_markers: frozenset[str] = frozenset()

    def for_model(self, tokenizer, stop_ids) -> "ToolFormat":
        """This format for a model whose stop tokens are `stop_ids`."""
        stops = set(stop_ids)
        ids = {tokenizer.tok.token_to_id(m): m for m in self.markers}
        return replace(self, stop_markers=frozenset(m for i, m in ids.items() if i is not None and i in stops))

    def tag_end(self, end: str) -> str:
        for m in self.stop_markers:
            if end.endswith(m):
                return end[:-len(m)]
        return end

    def call_object(self, name: str, arguments: Any) -> str:
        return json.dumps({"name": name, self.args_key: arguments}, ensure_ascii=False)

    def render_calls(self, calls: list[tuple[str, Any]]) -> str:
        """An earlier turn's calls, as this format writes them (and as `auto`'s grammar spells them)."""
        objects = [self.call_object(name, args) for name, args in calls]
        if self.block_per_call:
            return "\n".join(f"{self.begin}{o}{self.end}" for o in objects)
        body = f"[{', '.join(objects)}]" if self.array else f"{self.separator} ".join(objects)
        return f"{self.begin}{body}{self.end}"

    def structural_tag(self, tools: list, single: bool) -> dict[str, Any]:
        """xgrammar's structural tag for `auto`: each tag begins with the call up to its arguments
        (the name fixed), whose body is that tool's parameters schema."""
        open_, close = ("[", "]") if self.array else ("", "")
        tags = [{"begin": f'{self.begin}{open_}{{"name": {json.dumps(t.function.name)}, "{self.args_key}": ',
                 "schema": t.function.parameters, "end": self.tag_end(f"}}{close}{self.end}")} for t in tools]
        return {"tags": tags, "triggers": [self.trigger], "at_least_one": False, "stop_after_first": single}

    @property
    def trigger(self) -> str:
        return self.begin.strip() or '{"name": '

    def result_message(self, content: str) -> str:
        """A tool's result, as the message content a template without tool support gets."""
        return f"{self.result_wrap[0]}{content}{self.result_wrap[1]}"


def _instruction(spelling: str) -> str:
    return ("You are a function calling AI model. You may call one or more of these functions to assist with "
            "the user query. Don't make assumptions about what values to plug into functions. "
            "Here are the available tools:\n{tools}\n" f"To call functions, answer with {spelling}")


class HarmonyFormat(ToolFormat):
    """gpt-oss: each call is a message on the commentary channel addressed to `functions.NAME`,
    its body the arguments, ended by <|call|>; reasoning goes on the analysis channel
    (api/openai/harmony.py reads both)."""

    @staticmethod
    def header(name: str) -> str:
        return f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>"

    def render_calls(self, calls: list[tuple[str, Any]]) -> str:
        return "<|start|>assistant".join(f"{self.header(name)}{json.dumps(args, ensure_ascii=False)}<|call|>"
                                         for name, args in calls)

    def structural_tag(self, tools: list, single: bool) -> dict[str, Any]:
        tags = [{"begin": self.header(t.function.name), "schema": t.function.parameters,
                 "end": self.tag_end("<|call|>")} for t in tools]
        return {"tags": tags, "triggers": [self.trigger], "at_least_one": False, "stop_after_first": single}

    @property
    def trigger(self) -> str:
        return "<|channel|>commentary to="


FORMATS = {
    "hermes": ToolFormat(
        "hermes", "arguments", "<tool_call>\n", "\n</tool_call>", False, "",
        "You are a function calling AI model. You are provided with function signatures within <tools></tools> "
        "XML tags. You may call one or more functions to assist with the user query. Don't make assumptions "
        "about what values to plug into functions. Here are the available tools: <tools>\n{tools}\n</tools>\n"
        "For each function call return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags as follows:\n<tool_call>\n"
        '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>', ("<tool_call>", "</tool_call>"),
        block_per_call=True, result_wrap=("<tool_response>\n", "\n</tool_response>")),
    # Llama 3.x: a bare JSON object per call (3.1's <|python_tag|> before it is read too), ";" between
    "llama3_json": ToolFormat(
        "llama3_json", "parameters", "", "", False, ";",
        _instruction('a JSON object {{"name": <function-name>, "parameters": <args-json-object>}} per call, '
                     'separated by ";", and nothing else.'), ("<|python_tag|>",)),
    "mistral": ToolFormat(
        "mistral", "arguments", "[TOOL_CALLS]", "", True, "",
        _instruction('[TOOL_CALLS] followed by a JSON array of '
                     '{{"name": <function-name>, "arguments": <args-json-object>}} objects.'), ("[TOOL_CALLS]",)),
    # Phi-4-mini: functools[...]
    "phi4_mini": ToolFormat(
        "phi4_mini", "arguments", "functools", "", True, "",
        _instruction('functools followed by a JSON array of '
                     '{{"name": <function-name>, "arguments": <args-json-object>}} objects.')),
    "harmony": HarmonyFormat(
        "harmony", "arguments", "", "", False, "",
        _instruction('<|channel|>commentary to=functions.<function-name> <|constrain|>json<|message|>'
                     '<args-json-object><|call|> per call. Think on <|channel|>analysis<|message|>...<|end|> '
                     'first if you need to, and answer on <|channel|>final<|message|>.'),
        ("<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>", "<|call|>", "<|return|>"),
        channels=True),
}
# a marker some templates put before a Llama 3 call; read as the call's start, never as content
LLAMA_PYTHON_TAG = "<|python_tag|>"



def detect_tool_format(chat_template: Optional[str]) -> ToolFormat:
    """The format a model was trained on, from the markup its chat template writes; Hermes (what
    Qwen and most fine-tunes use, and what we prompt templates without tools with) otherwise."""
    t = chat_template or ""
    if "<|channel|>" in t:
        return FORMATS["harmony"]
    if "[TOOL_CALLS]" in t or "[AVAILABLE_TOOLS]" in t:
        return FORMATS["mistral"]
    if "<tool_call>" in t:
        return FORMATS["hermes"]
    if LLAMA_PYTHON_TAG in t or ("<|start_header_id|>" in t and "tools" in t):
        return FORMATS["llama3_json"]
    if "functools" in t or "<|tool|>" in t:
        return FORMATS["phi4_mini"]
    return FORMATS["hermes"]


def tool_format(name: Optional[str], chat_template: Optional[str]) -> ToolFormat:
    """`--tool-call-format` (auto: from the template)."""
    if name in (None, "auto"):
        return detect_tool_format(chat_template)
    if name not in FORMATS:
        raise ValueError(f"unknown tool-call format {name!r} (known: auto, {', '.join(FORMATS)})")
    return FORMATS[name]


def special_markers(fmt: ToolFormat, tokenizer) -> bool:
    """Whether some of `fmt`'s markup is special tokens of `tokenizer` (Mistral's [TOOL_CALLS],
    harmony's channels): text decoded with special tokens skipped would lose it."""
    ids = [tokenizer.tok.token_to_id(m) for m in fmt.markers]
    return any(i is not None and i in tokenizer.special_ids for i in ids)
