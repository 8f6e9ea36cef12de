"""Agent frameworks over chat completions, each driven the way its quick-start does, against the
real server on the embedded model: pydantic-ai, langchain-openai, instructor and the OpenAI Agents
SDK (its chat-completions model). The 135M model cannot be trusted to pick a tool on its own, so
every call here is forced: tool_choice required or a named tool, or a structured output the
framework itself asks for as a forced tool call or a JSON schema. Replies are greedy and short.

Every test runs twice: with the server's default tool-call format (Hermes) and with Llama 3's JSON
format, whose instruction and earlier-call rendering the prompts then carry."""
from __future__ import annotations

import asyncio
from typing import Literal

import instructor
import pytest
from pydantic import BaseModel, Field

MAX_TOKENS = 64


@pytest.fixture(autouse=True, params=["hermes", "llama3_json"])
def tool_call_format(request, api):
    """The shared server answering as if started with --tool-call-format <param>."""
    from radixserve.api.openai.tool_formats import FORMATS

    before, api.state.tool_format = api.state.tool_format, FORMATS[request.param]
    yield request.param
    api.state.tool_format = before


class CityWeather(BaseModel):
    """The weather in one city."""
    city: str = Field(max_length=20)
    unit: Literal["celsius", "fahrenheit"]


def get_weather(city: str) -> str:
    """Current weather in a city."""
    return f"It is sunny in {city}."


QUESTION = "What is the weather like in Paris today?"


def assert_weather(value) -> None:
    assert isinstance(value, CityWeather)
    assert value.city and value.unit in ("celsius", "fahrenheit")


# ---- pydantic-ai ---------------------------------------------------------------------------------
def pydantic_ai_model(api):
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    return OpenAIChatModel(api.model, provider=OpenAIProvider(base_url=api.base_url, api_key="unused"))


# One output call: with parallel calls allowed the greedy model repeats final_result two or three
# times, which pydantic-ai handles (it keeps the first) but which triples the reply.
PYDANTIC_AI_SETTINGS = {"max_tokens": MAX_TOKENS, "temperature": 0, "parallel_tool_calls": False}


def test_pydantic_ai_agent_returns_its_structured_output_type(api):
    # A structured output_type is an output tool that pydantic-ai forces with tool_choice required.
    from pydantic_ai import Agent
    agent = Agent(pydantic_ai_model(api), output_type=CityWeather, retries=0, model_settings=PYDANTIC_AI_SETTINGS)
    result = agent.run_sync(QUESTION)
    assert_weather(result.output)


def test_pydantic_ai_streams_its_structured_output_from_streamed_tool_call_deltas(api):
    from pydantic_ai import Agent
    agent = Agent(pydantic_ai_model(api), output_type=CityWeather, retries=0, model_settings=PYDANTIC_AI_SETTINGS)

    async def run() -> tuple[list, CityWeather]:
        async with agent.run_stream(QUESTION) as stream:
            partials = [p async for p in stream.stream_output(debounce_by=None)]
            return partials, await stream.get_output()

    partials, output = asyncio.run(run())
    assert_weather(output)
    assert len(partials) > 1  # the arguments arrived in pieces, not as one fragment at the end


# ---- langchain-openai ----------------------------------------------------------------------------
def chat_openai(api):
    from langchain_openai import ChatOpenAI
    return ChatOpenAI(model=api.model, base_url=api.base_url, api_key="unused", temperature=0,
                      max_tokens=MAX_TOKENS, max_retries=0)


def test_langchain_bind_tools_returns_a_tool_call_with_parsed_args(api):
    llm = chat_openai(api).bind_tools([get_weather], tool_choice="required")
    message = llm.invoke(QUESTION)
    assert message.tool_calls and {c["name"] for c in message.tool_calls} == {"get_weather"}
    assert all(isinstance(c["args"]["city"], str) and c["id"] for c in message.tool_calls)


def test_langchain_assembles_the_same_tool_call_from_the_stream(api):
    llm = chat_openai(api).bind_tools([get_weather], tool_choice="required", parallel_tool_calls=False)
    whole = llm.invoke(QUESTION).tool_calls
    chunks = list(llm.stream(QUESTION))
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged += chunk
    assert len([c for c in chunks if c.tool_call_chunks]) > 3
    assert [(c["name"], c["args"]) for c in merged.tool_calls] == [(c["name"], c["args"]) for c in whole]


def test_langchain_with_structured_output_function_calling(api):
    structured = chat_openai(api).with_structured_output(CityWeather, method="function_calling")
    assert_weather(structured.invoke(QUESTION))


# ---- instructor ----------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", [instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA])
def test_instructor_returns_the_response_model(api, mode):
    client = instructor.from_openai(api.client(), mode=mode)
    weather = client.chat.completions.create(
        model=api.model, response_model=CityWeather, max_retries=0, max_tokens=MAX_TOKENS, temperature=0,
        messages=[{"role": "user", "content": QUESTION}])
    assert_weather(weather)


# ---- OpenAI Agents SDK, chat-completions path -----------------------------------------------------
def agents_model(api):
    from agents import OpenAIChatCompletionsModel, set_tracing_disabled
    set_tracing_disabled(True)  # no trace export: nothing leaves the machine
    return OpenAIChatCompletionsModel(model=api.model, openai_client=api.async_client())


def test_agents_sdk_runs_a_function_tool_over_chat_completions(api):
    from agents import Agent, ModelSettings, Runner, function_tool
    ran: list[str] = []

    @function_tool
    def weather(city: str) -> str:
        """Current weather in a city."""
        ran.append(city)
        return f"It is sunny in {city}."

    # required on the first turn; the SDK resets tool_choice after a tool ran (reset_tool_choice),
    # and stop_on_first_tool ends the run with the tool's result instead of a free-text turn.
    agent = Agent(name="Assistant", instructions="You answer questions about the weather.", tools=[weather],
                  model=agents_model(api), tool_use_behavior="stop_on_first_tool",
                  model_settings=ModelSettings(tool_choice="required", max_tokens=MAX_TOKENS, temperature=0))
    result = Runner.run_sync(agent, QUESTION, max_turns=2)
    assert ran and result.final_output == f"It is sunny in {ran[0]}."


def test_agents_sdk_returns_a_structured_output_type_over_chat_completions(api):
    from agents import Agent, ModelSettings, Runner
    agent = Agent(name="Assistant", instructions="You answer questions about the weather.",
                  output_type=CityWeather, model=agents_model(api),
                  model_settings=ModelSettings(max_tokens=MAX_TOKENS, temperature=0))
    result = Runner.run_sync(agent, QUESTION, max_turns=1)
    assert_weather(result.final_output)
