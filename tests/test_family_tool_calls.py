"""Tool calls end to end on a tiny random model of each family, served with a chat template in that
family's style: the server reads the tool-call format from the template, the template renders the
tools and the earlier calls itself, and `tool_choice: required` gives valid calls with no markup in
content. (The templates are small ones written here in each family's markup, not the real ones.)"""
from __future__ import annotations

import json

import jsonschema
import pytest

from radixserve.api.server import build_app
from radixserve.runtime.config import EngineConfig
from radixserve.runtime.engine import Engine
from radixserve.runtime.models.loader import load_model_files
from .api_server import APIServer, serve_app
from .test_api_tools import SCHEMAS, TOOLS
from .tiny_models import build_tiny_model

_TURNS = ("{% for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}"
          "{{ CALL_OPEN }}{{ {'name': c.function.name, ARGS: c.function.arguments} | tojson }}{{ CALL_CLOSE }}"
          "{% endfor %}{% else %}{{ ROLE_OPEN }}{{ m.role }}{{ ROLE_MID }}{{ m.content }}{{ ROLE_CLOSE }}{% endif %}"
          "{% endfor %}{% if add_generation_prompt %}{{ ROLE_OPEN }}assistant{{ ROLE_MID }}{% endif %}")


def template(tools_block: str, **marks: str) -> str:
    """A chat template: `tools_block` renders `tools`, then each turn with these marks."""
    body = _TURNS
    for name, value in marks.items():
        body = body.replace("{{ " + name + " }}", value).replace(name, json.dumps(value))
    return "{% if tools %}" + tools_block + "{% endif %}" + body


# (architecture, its template, the format the server should read from it)
FAMILIES = {
    "llama3_json": ("llama", template(
        "<|start_header_id|>system<|end_header_id|>Call a function with its name and parameters as JSON:"
        "{% for t in tools %}{{ t | tojson }}{% endfor %}<|eot_id|>",
        CALL_OPEN="<|start_header_id|>assistant<|end_header_id|>", CALL_CLOSE="<|eot_id|>", ARGS="parameters",
        ROLE_OPEN="<|start_header_id|>", ROLE_MID="<|end_header_id|>", ROLE_CLOSE="<|eot_id|>")),
    "mistral": ("mixtral", template(
        "[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]",
        CALL_OPEN="[TOOL_CALLS][", CALL_CLOSE="]</s>", ARGS="arguments",
        ROLE_OPEN="[INST]", ROLE_MID=": ", ROLE_CLOSE="[/INST]")),
    "phi4_mini": ("phi4_mini", template(
        "<|system|><|tool|>{{ tools | tojson }}<|/tool|><|end|>",
        CALL_OPEN="<|assistant|>functools[", CALL_CLOSE="]<|end|>", ARGS="arguments",
        ROLE_OPEN="<|", ROLE_MID="|>", ROLE_CLOSE="<|end|>")),
    "harmony": ("gpt_oss", template(
        "<|start|>developer<|message|># Tools{% for t in tools %}{{ t | tojson }}{% endfor %}<|end|>",
        CALL_OPEN="<|start|>assistant<|channel|>commentary<|message|>", CALL_CLOSE="<|call|>", ARGS="arguments",
        ROLE_OPEN="<|start|>", ROLE_MID="<|message|>", ROLE_CLOSE="<|end|>")),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_server(request, tmp_path_factory, default_tokenizer):
    arch, chat_template = FAMILIES[request.param]
    directory = tmp_path_factory.mktemp(request.param)
    build_tiny_model(arch, directory, default_tokenizer)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": chat_template}))
    model_config = json.loads((directory / "config.json").read_text())   # room for the tools' JSON
    (directory / "config.json").write_text(json.dumps({**model_config, "max_position_embeddings": 2048}))
    engine = Engine(EngineConfig(kv_cache_tokens=2048, max_running_requests=4),
                    model_files=load_model_files(str(directory)))
    try:
        app = build_app(engine, served_model_name="tiny")
        with serve_app(app) as url:
            yield request.param, APIServer(url, engine, app.state.server, model="tiny")
    finally:
        engine.shutdown()


ASK = [{"role": "user", "content": "Weather and time in Paris?"}]


def test_the_format_is_read_from_the_family_template(family_server):
    name, api = family_server
    assert api.state.tool_format.name == name


def test_required_calls_are_valid_with_no_markup_in_content(family_server):
    _, api = family_server
    r = api.client().chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required",
                                             max_tokens=60, temperature=0)
    message = r.choices[0].message
    assert message.tool_calls and not message.content
    for call in message.tool_calls:
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_the_family_template_renders_an_earlier_turns_calls_and_results(family_server):
    _, api = family_server
    first = api.client().chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, max_tokens=60,
                                                 temperature=0, tool_choice={"type": "function",
                                                                            "function": {"name": "get_time"}})
    call = first.choices[0].message.tool_calls[0]
    follow = ASK + [first.choices[0].message.model_dump(exclude_none=True),
                    {"role": "tool", "tool_call_id": call.id, "content": '{"time": "12:00"}'}]
    r = api.client().chat.completions.create(model="tiny", messages=follow, tools=TOOLS, max_tokens=4, temperature=0)
    assert r.usage.prompt_tokens > first.usage.prompt_tokens
    assert r.choices[0].finish_reason in ("length", "stop", "tool_calls")
