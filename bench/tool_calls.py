"""Parallel tool calls against a real `radixserve serve`: of the turns that carry several calls, the
share whose every call validates against its own tool's parameters.

Requests go through the official client over chat completions with three tools of different
shapes (an enum, a pattern, an integer range), prompts that ask for two or three things at once
after one earlier turn that made two calls, `parallel_tool_calls` left at OpenAI's default
(true), sampled at temperature 1 with a seed per request. Each tool_choice mode in `--modes`
gets `--requests` requests, half of them streamed (the calls then reassembled from
`delta.tool_calls` as a client does). Calls cut off by max_tokens are not complete calls and are
not counted. Never asserts anything; writes bench/results/tool_calls.json.

The default is `required` only: under `auto` the default 135M model answered in text every time
(0 calls in 16 requests at temperature 1, max_tokens 100), so that mode measures nothing on it.

    .venv/bin/python bench/tool_calls.py                          # 50 requests, required
    .venv/bin/python bench/tool_calls.py --modes required,auto    # a model that calls tools by itself
"""
from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import jsonschema
import openai

from local_server import LocalServer  # bench/, beside this script

RESULTS = Path(__file__).with_name("results") / "tool_calls.json"

SCHEMAS: dict[str, dict[str, Any]] = {
    "get_weather": {"type": "object",
                    "properties": {"city": {"type": "string", "maxLength": 30},
                                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                    "required": ["city", "unit"], "additionalProperties": False},
    "get_time": {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 30}},
                 "required": ["timezone"], "additionalProperties": False},
    "search_flights": {"type": "object",
                       "properties": {"origin": {"type": "string", "pattern": "^[A-Z]{3}$"},
                                      "destination": {"type": "string", "pattern": "^[A-Z]{3}$"},
                                      "passengers": {"type": "integer", "minimum": 1, "maximum": 9}},
                       "required": ["origin", "destination", "passengers"], "additionalProperties": False},
}
DESCRIPTIONS = {"get_weather": "Current weather in a city", "get_time": "Current time in a timezone",
                "search_flights": "Flights between two airports (IATA codes)"}
TOOLS = [{"type": "function", "function": {"name": n, "description": DESCRIPTIONS[n], "parameters": s}}
         for n, s in SCHEMAS.items()]
CITIES = [("Paris", "CDG", "Europe/Paris"), ("Tokyo", "HND", "Asia/Tokyo"), ("Oslo", "OSL", "Europe/Oslo"),
          ("Lima", "LIM", "America/Lima"), ("Cairo", "CAI", "Africa/Cairo"), ("Sydney", "SYD", "Australia/Sydney")]


def _call(call_id: str, name: str, args: dict) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


# One earlier turn with two calls in it: without an example the small model rarely calls a tool on
# its own under `auto`, and rarely more than one under `required`.
HISTORY = [
    {"role": "user", "content": "What is the weather in Rome, and what time is it there?"},
    {"role": "assistant", "content": None, "tool_calls": [
        _call("call_0", "get_weather", {"city": "Rome", "unit": "celsius"}),
        _call("call_1", "get_time", {"timezone": "Europe/Rome"})]},
    {"role": "tool", "tool_call_id": "call_0", "content": "Sunny, 21 degrees"},
    {"role": "tool", "tool_call_id": "call_1", "content": "14:05"},
    {"role": "assistant", "content": "It is sunny and 21 degrees in Rome, where it is 14:05."},
]


def prompt(i: int) -> str:
    a, b = CITIES[i % len(CITIES)], CITIES[(i * 5 + 1) % len(CITIES)]
    return [f"What is the weather in {a[0]} and what time is it in {b[0]}?",
            f"Find flights from {a[1]} to {b[1]} for {i % 4 + 1} people, and tell me the weather in {b[0]}.",
            f"Weather in {a[0]} and in {b[0]}, please, and the time in {a[0]}."][i % 3]


@dataclass
class Turn:
    calls: list[tuple[str, str]]       # (name, arguments) of the complete calls
    finish_reason: str
    streamed: bool
    error: str = ""


@dataclass
class ModeReport:
    tool_choice: str
    requests: int
    seconds: float = 0.0
    finish_reasons: dict = field(default_factory=dict)
    errors: list = field(default_factory=list)
    turns_with_calls: int = 0
    parallel_turns: int = 0                    # turns with two calls or more
    parallel_turns_all_valid: int = 0
    share_parallel_turns_all_valid: Optional[float] = None
    calls: int = 0
    calls_valid: int = 0
    calls_per_turn: dict = field(default_factory=dict)
    calls_by_tool: dict = field(default_factory=dict)
    invalid_examples: list = field(default_factory=list)


def validate(name: str, arguments: str) -> Optional[str]:
    """None if the call is valid for its own tool, else why not."""
    if name not in SCHEMAS:
        return f"unknown tool {name!r}"
    try:
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])
    except (json.JSONDecodeError, jsonschema.ValidationError) as e:
        return f"{name}: {str(e).splitlines()[0][:160]}"
    return None


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except json.JSONDecodeError:
        return False


def one_turn(client: openai.OpenAI, model: str, tool_choice: str, i: int, max_tokens: int) -> Turn:
    kw = dict(model=model, messages=HISTORY + [{"role": "user", "content": prompt(i)}], tools=TOOLS,
              tool_choice=tool_choice, max_tokens=max_tokens, temperature=1.0, seed=i)
    streamed = i % 2 == 1
    try:
        if not streamed:
            choice = client.chat.completions.create(**kw).choices[0]
            calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
            return Turn(calls, choice.finish_reason, False)
        parts: dict[int, list[str]] = {}
        names: dict[int, str] = {}
        finish = "none"
        for chunk in client.chat.completions.create(stream=True, **kw):
            for c in chunk.choices:
                for tc in c.delta.tool_calls or []:
                    if tc.function.name:
                        names[tc.index] = tc.function.name
                    parts.setdefault(tc.index, []).append(tc.function.arguments or "")
                finish = c.finish_reason or finish
        calls = [(names[k], "".join(parts[k])) for k in sorted(parts)]
        if finish == "length" and calls and not _is_json(calls[-1][1]):
            calls = calls[:-1]  # cut off mid-arguments: not a complete call
        return Turn(calls, finish, True)
    except Exception as e:  # noqa: BLE001 - counted, not raised: the figure is the point
        return Turn([], "error", streamed, f"{type(e).__name__}: {str(e)[:200]}")


def run_mode(client: openai.OpenAI, model: str, tool_choice: str, requests: int, max_tokens: int,
             concurrency: int) -> ModeReport:
    report = ModeReport(tool_choice, requests)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        turns = list(pool.map(lambda i: one_turn(client, model, tool_choice, i, max_tokens), range(requests)))
    report.seconds = round(time.perf_counter() - t0, 1)
    report.finish_reasons = dict(Counter(t.finish_reason for t in turns))
    report.errors = [t.error for t in turns if t.error][:5]
    per_turn: Counter = Counter()
    by_tool: Counter = Counter()
    for t in turns:
        per_turn[len(t.calls)] += 1
        problems = [p for p in (validate(n, a) for n, a in t.calls) if p]
        report.calls += len(t.calls)
        report.calls_valid += len(t.calls) - len(problems)
        by_tool.update(n for n, _ in t.calls)
        report.invalid_examples += problems[:max(0, 5 - len(report.invalid_examples))]
        if t.calls:
            report.turns_with_calls += 1
        if len(t.calls) >= 2:
            report.parallel_turns += 1
            report.parallel_turns_all_valid += not problems
    report.calls_per_turn = {str(k): v for k, v in sorted(per_turn.items())}
    report.calls_by_tool = dict(by_tool)
    if report.parallel_turns:
        report.share_parallel_turns_all_valid = round(report.parallel_turns_all_valid / report.parallel_turns, 3)
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=50, help="per tool_choice mode")
    ap.add_argument("--modes", default="required")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--url", help="an already running server's base URL (…/v1) instead of starting one")
    ap.add_argument("--json", type=Path, default=RESULTS)
    args = ap.parse_args()

    server = None if args.url else LocalServer()
    url = args.url or server.url + "/v1"
    try:
        client = openai.OpenAI(base_url=url, api_key=os.environ.get("RADIXSERVE_API_KEY", "none"),
                               max_retries=0, timeout=900)
        model = client.models.list().data[0].id
        reports = []
        for mode in args.modes.split(","):
            report = run_mode(client, model, mode, args.requests, args.max_tokens, args.concurrency)
            print(json.dumps(asdict(report), indent=1), flush=True)
            reports.append(asdict(report))
    finally:
        if server is not None:
            server.stop()
    result = {"model": model, "requests_per_mode": args.requests, "max_tokens": args.max_tokens,
              "temperature": 1.0, "parallel_tool_calls": "default (true)", "streamed_share": 0.5,
              "modes": reports}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
