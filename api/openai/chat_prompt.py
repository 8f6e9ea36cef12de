"""Chat messages (and tools) to prompt text through the model's chat template.

Templates that know tools (they mention `tools`) get them as the template variable and assistant
`tool_calls` with parsed arguments, as Hugging Face templates expect. Templates that do not (the
default SmolLM2 one) get the tool-call format's text instead (api/openai/tool_formats.py; Hermes
unless `--tool-call-format` says otherwise): the tool signatures in the system message, earlier
calls as that format writes them, the same markup the `auto` tool-call parser reads back.
"""
from __future__ import annotations

import json
from typing import Any, Optional

from radixserve.api.errors import bad_request
from radixserve.api.openai.protocol import ChatMessage
from radixserve.api.openai.tool_formats import FORMATS, ToolFormat
from radixserve.runtime.tokenizer import Tokenizer, TokenizerError

# Why state the schema as well as enforce it: a model only constrained, never told the shape, fills
# free strings with whatever it drifts into. bench/json_schemas.py's parse() part, 150 seeded calls at
# temperature 1 (Measurement(value: float, unit: str), max_tokens 120): 137 finished without it, 149
# with it in the system message.
SCHEMA_PROMPT = "Answer with JSON that matches this JSON Schema: {schema}"


def states_schema(messages: list[ChatMessage], schema: Any) -> bool:
    """Whether some message already holds `schema` as JSON (as instructor's JSON mode and many
    clients put it in the user message), in any spacing: stating it again only costs context."""
    decoder = json.JSONDecoder()
    for m in messages:
        text, i = m.content or "", 0
        while (i := text.find("{", i)) >= 0:
            try:
                value, end = decoder.raw_decode(text, i)
            except ValueError:
                i += 1
                continue
            if _holds(value, schema):
                return True
            i = end   # its inner braces were looked at by _holds
    return False


def _holds(value: Any, schema: Any) -> bool:
    if value == schema:
        return True
    if isinstance(value, dict):
        return any(_holds(v, schema) for v in value.values())
    if isinstance(value, list):
        return any(_holds(v, schema) for v in value)
    return False


def with_schema_instruction(messages: list[ChatMessage], schema: Any) -> list[ChatMessage]:
    """`messages` with the response schema stated at the end of the system message (one is added
    when there is none), where the tool signatures go too; the conversation after it is untouched,
    so its prefix stays shared with requests that send the same system prompt."""
    note = SCHEMA_PROMPT.format(schema=json.dumps(schema, ensure_ascii=False, separators=(",", ":")))
    if messages and messages[0].role in ("system", "developer"):
        first = messages[0]
        content = f"{first.content}\n\n{note}" if first.content else note
        return [first.model_copy(update={"content": content}), *messages[1:]]
    return [ChatMessage(role="system", content=note), *messages]


def render_chat_prompt(tokenizer: Tokenizer, messages: list[ChatMessage],
                       tools: Optional[list[dict[str, Any]]] = None,
                       template_kwargs: Optional[dict[str, Any]] = None,
                       add_generation_prompt: bool = True, fmt: ToolFormat = FORMATS["hermes"]) -> str:
    """The prompt text for `messages` (tools and calls in `fmt` where the template does not render
    them); 400 if the template refuses them."""
    template = tokenizer.chat_template or ""
    native_tools = "tools" in template
    if native_tools:
        rendered = [_native_message(m) for m in messages]
        extra = {"tools": tools} if tools else {}
    else:
        rendered = _prompted_messages(messages, tools, fmt)
        extra = {}
    extra.update(template_kwargs or {})
    try:
        return tokenizer.apply_chat_template(rendered, add_generation_prompt=add_generation_prompt, **extra)
    except TokenizerError as e:
        raise bad_request(f"messages: {e}", param="messages") from None


def _role(m: ChatMessage) -> str:
    return "system" if m.role == "developer" else m.role


def _arguments(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise bad_request(f"{where}: arguments must be a JSON string", param=where) from None


def _native_message(m: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": _role(m), "content": m.content or ""}
    if m.name:
        out["name"] = m.name
    if m.tool_call_id:
        out["tool_call_id"] = m.tool_call_id
    if m.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.function.name,
                                           "arguments": _arguments(c.function.arguments, "messages.tool_calls")}}
                             for c in m.tool_calls]
    return out


def _prompted_messages(messages: list[ChatMessage], tools: Optional[list[dict[str, Any]]],
                       fmt: ToolFormat) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        content = m.content or ""
        if m.tool_calls:
            calls = fmt.render_calls([(c.function.name, _arguments(c.function.arguments, "messages.tool_calls"))
                                      for c in m.tool_calls])
            content = f"{content}\n{calls}" if content else calls
        elif m.role == "tool":
            content = fmt.result_message(content)
        out.append({"role": _role(m), "content": content})
    if tools:
        listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        prompt = fmt.instruction.format(tools=listing)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{prompt}"}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out
