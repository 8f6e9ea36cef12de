"""The OpenAI Agents SDK in its default configuration, the Responses API (OpenAIProvider ->
OpenAIResponsesModel), against the real server, the way its quick-start runs an agent: a function
tool, a structured `output_type`, and a streamed run. The 135M model cannot be trusted to choose a
tool by itself, so the tool agent sets tool_choice "required" (the SDK resets it to auto after the
call, so the next turn answers in text)."""
from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
from pathlib import Path
from typing import Literal

from agents import Agent, ModelSettings, RunConfig, Runner, function_tool
from agents.items import MessageOutputItem, ToolCallItem, ToolCallOutputItem
from agents.models.openai_provider import OpenAIProvider
from pydantic import BaseModel


class Capital(BaseModel):
    city: Literal["Paris", "Rome", "Berlin"]
    country: Literal["France", "Italy", "Germany"]


def weather_agent(cities: list[str], model: str) -> Agent:
    @function_tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        cities.append(city)
        return f"Sunny, 22 C in {city}"

    return Agent(name="Weather", instructions="You answer weather questions using the tool.", model=model,
                 tools=[get_weather], model_settings=ModelSettings(tool_choice="required", temperature=0,
                                                                   max_tokens=60))


def run(api, main):
    """Run `main(run_config)` with a client made (and closed) inside its own event loop."""
    async def go():
        async with api.async_client() as client:
            # The SDK's default provider: the Responses API unless told otherwise.
            return await main(RunConfig(model_provider=OpenAIProvider(openai_client=client), tracing_disabled=True))

    return asyncio.run(go())


def test_agent_calls_its_function_tool_then_answers(api):
    cities: list[str] = []
    agent = weather_agent(cities, api.model)
    result = run(api, lambda config: Runner.run(agent, "What's the weather in Paris?", run_config=config,
                                                max_turns=4))
    assert cities and all(isinstance(c, str) and c for c in cities)
    kinds = [type(item) for item in result.new_items]
    # one call, or several in parallel (the Responses API allows them by default; on the AVX2 EPYC
    # the model calls get_weather("Paris") twice), each answered by its output, then the answer
    calls = kinds.count(ToolCallItem)
    assert calls >= 1 and kinds[:2 * calls] == [ToolCallItem] * calls + [ToolCallOutputItem] * calls
    assert kinds[-1] is MessageOutputItem
    assert isinstance(result.final_output, str) and result.final_output
    assert all(r.response_id.startswith("resp_") for r in result.raw_responses)  # the Responses path


def test_agent_with_an_output_type_returns_that_type(api):
    agent = Agent(name="Geo", instructions="Answer with the capital.", model=api.model, output_type=Capital,
                  model_settings=ModelSettings(temperature=0, max_tokens=40))
    result = run(api, lambda config: Runner.run(agent, "What is the capital of France?", run_config=config))
    assert isinstance(result.final_output, Capital)


def test_streamed_agent_run_calls_the_tool_and_streams_the_answer(api):
    cities: list[str] = []
    agent = weather_agent(cities, api.model)

    async def main(config):
        streamed = Runner.run_streamed(agent, "What's the weather in Paris?", run_config=config, max_turns=4)
        raw = [event.data.type async for event in streamed.stream_events() if event.type == "raw_response_event"]
        return streamed, raw

    streamed, raw = run(api, main)
    assert cities
    assert "response.function_call_arguments.delta" in raw and "response.output_text.delta" in raw
    assert raw.count("response.completed") == 2  # the call turn and the answer turn
    assert isinstance(streamed.final_output, str) and streamed.final_output


def test_readme_agent_example_runs_against_the_server(api):
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", readme, flags=re.S) if "from agents import" in b]
    code = block.replace("http://127.0.0.1:8000", api.url).replace('"SmolLM2-135M-Instruct"', json.dumps(api.model))
    namespace: dict = {}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(code, "README.md", "exec"), namespace)
    result, first, second = namespace["result"], namespace["first"], namespace["second"]
    assert isinstance(json.loads(result.new_items[0].raw_item.arguments)["city"], str)
    assert isinstance(result.final_output, str) and result.final_output
    page = api.engine.config.page_size
    turn_one = first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens_details.cached_tokens >= (turn_one - 1) // page * page
