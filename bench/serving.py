"""Online serving benchmark against any OpenAI-compatible server (radixserve, vLLM, SGLang...).

Streams chat completions and measures what a user sees: time to first token (TTFT), time per
output token after the first (TPOT), inter-token latency between streamed chunks (ITL), end-to-end
latency, request throughput, output tokens/s, and the share of prompt tokens the server reports as
cached (`usage.prompt_tokens_details.cached_tokens`).

Workloads (prompts are generated from --seed, so two servers get the same requests):
  shared-prefix  an agent: a few long system prompts, many users with short questions
  multi-turn     conversations; each turn resends the whole history plus a new question
  json-schema    replies constrained by `response_format: json_schema`
  random         unrelated random prompts of random length (no sharing)

Load: fixed --concurrency (one or more values, each a separate run) or Poisson arrivals at --rate
requests/s. Writes a JSON report and a PNG chart; never asserts anything about time.

    radixserve serve &    # or any other server
    .venv/bin/python bench/serving.py --workload shared-prefix --concurrency 1 8 32 --num-requests 96
    .venv/bin/python bench/serving.py --base-url http://other:8000/v1 --model NAME --rate 4 --duration 60
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import httpx
import jsonschema

WORDS = ("time year people way day man thing woman life child world school state family student group country "
         "problem hand part place case week company system program question work government number night point "
         "home water room mother area money story fact month lot right study book eye job word business issue "
         "side kind head house service friend father power hour game line end member law car city community name "
         "president team minute idea kid body information back parent face others level office door health "
         "person art war history party result change morning reason research girl guy moment air teacher force "
         "education river garden market winter engine signal harbor violin orbit lantern meadow").split()

PERSON_SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "city": {"type": "string", "maxLength": 24}}, "required": ["name", "age", "city"], "additionalProperties": False}
ORDER_SCHEMA = {"type": "object", "properties": {
    "item": {"type": "string", "maxLength": 24}, "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
    "express": {"type": "boolean"}}, "required": ["item", "quantity", "express"], "additionalProperties": False}


# ---- workloads ----------------------------------------------------------------------------------
@dataclass
class Session:
    """Requests that go one after another (one for single-turn workloads)."""
    system: Optional[str]
    turns: list[str]
    extra: dict[str, Any] = field(default_factory=dict)   # e.g. response_format


def _text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def make_sessions(workload: str, count: int, rng: random.Random, args: argparse.Namespace) -> list[Session]:
    if workload == "shared-prefix":
        systems = [f"You are agent {i}. Follow these rules carefully. " + _text(rng, args.prefix_words)
                   for i in range(args.num_prefixes)]
        return [Session(systems[i % len(systems)], [f"Question {i}: tell me about the {_text(rng, 6)}."])
                for i in range(count)]
    if workload == "multi-turn":
        n_conv = max(1, math.ceil(count / args.turns))
        return [Session("You are a helpful assistant.",
                        [f"Turn {t}: what about the {_text(rng, 8)}?" for t in range(args.turns)])
                for _ in range(n_conv)]
    if workload == "json-schema":
        schemas = [("person", PERSON_SCHEMA, "Invent a person"), ("order", ORDER_SCHEMA, "Invent a shop order")]
        out = []
        for i in range(count):
            name, schema, ask = schemas[i % len(schemas)]
            out.append(Session(None, [f"{ask} about the {_text(rng, 4)}. Reply in JSON."],
                               {"response_format": {"type": "json_schema",
                                                    "json_schema": {"name": name, "schema": schema,
                                                                    "strict": True}}}))
        return out
    if workload == "random":
        return [Session(None, [_text(rng, rng.randint(args.random_min_words, args.random_max_words))])
                for _ in range(count)]
    raise ValueError(f"unknown workload {workload!r}")


# ---- one request --------------------------------------------------------------------------------
@dataclass
class RequestResult:
    ok: bool
    start: float
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    error: str = ""
    text: str = ""
    valid: Optional[bool] = None  # json-schema workload: the reply parses and validates

    @property
    def tpot(self) -> Optional[float]:
        if self.completion_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.completion_tokens - 1)


async def stream_chat(client: httpx.AsyncClient, url: str, body: dict) -> RequestResult:
    start = time.perf_counter()
    result = RequestResult(ok=False, start=start)
    last, pieces = None, []
    try:
        async with client.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                result.error = f"HTTP {r.status_code}: {(await r.aread()).decode(errors='replace')[:200]}"
                return result
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    result.error = str(chunk["error"])[:200]
                    return result
                if chunk.get("usage"):
                    u = chunk["usage"]
                    result.prompt_tokens = u.get("prompt_tokens", 0)
                    result.completion_tokens = u.get("completion_tokens", 0)
                    result.cached_tokens = ((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
                for choice in chunk.get("choices", []):
                    text = (choice.get("delta") or {}).get("content") or ""
                    if not text:
                        continue
                    now = time.perf_counter()
                    if last is None:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    last = now
                    pieces.append(text)
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        result.error = f"{type(e).__name__}: {e}"
        return result
    result.e2e = time.perf_counter() - start
    result.text = "".join(pieces)
    result.ok = last is not None
    if not result.ok:
        result.error = "no tokens streamed"
    return result


async def run_session(client: httpx.AsyncClient, args: argparse.Namespace, session: Session,
                      results: list[RequestResult], stop_at: float) -> None:
    messages = [{"role": "system", "content": session.system}] if session.system else []
    for turn in session.turns:
        if time.perf_counter() >= stop_at:
            return
        messages.append({"role": "user", "content": turn})
        body = {"model": args.model, "messages": messages, "max_tokens": args.max_tokens, "stream": True,
                "stream_options": {"include_usage": True}, "temperature": args.temperature, **session.extra}
        if args.ignore_eos:
            body["ignore_eos"] = True
        r = await stream_chat(client, args.base_url.rstrip("/") + "/chat/completions", body)
        schema = ((session.extra.get("response_format") or {}).get("json_schema") or {}).get("schema")
        if schema is not None and r.ok:
            r.valid = reply_validates(r.text, schema)
        results.append(r)
        if not r.ok:
            return
        messages.append({"role": "assistant", "content": r.text})


def reply_validates(text: str, schema: dict) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


# ---- load patterns ------------------------------------------------------------------------------
async def run_load(args: argparse.Namespace, sessions: list[Session], concurrency: Optional[int],
                   rate: Optional[float]) -> tuple[list[RequestResult], float]:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    results: list[RequestResult] = []
    t0 = time.perf_counter()
    stop_at = t0 + args.duration if args.duration else math.inf
    async with httpx.AsyncClient(timeout=args.timeout, headers=headers, limits=limits) as client:
        if concurrency is not None:
            queue: asyncio.Queue = asyncio.Queue()
            for s in sessions:
                queue.put_nowait(s)

            async def worker() -> None:
                while not queue.empty() and time.perf_counter() < stop_at:
                    await run_session(client, args, queue.get_nowait(), results, stop_at)

            await asyncio.gather(*(worker() for _ in range(concurrency)))
        else:
            rng = random.Random(args.seed + 1)
            tasks = []
            for s in sessions:  # Poisson arrivals: exponential gaps between session starts
                if time.perf_counter() >= stop_at:
                    break
                tasks.append(asyncio.create_task(run_session(client, args, s, results, stop_at)))
                await asyncio.sleep(rng.expovariate(rate))
            await asyncio.gather(*tasks)
    return results, time.perf_counter() - t0


# ---- report -------------------------------------------------------------------------------------
def _stats(values: list[float]) -> dict[str, Optional[float]]:
    if not values:
        return {"mean": None, "p50": None, "p99": None}
    xs = sorted(values)

    def pct(p: float) -> float:
        return xs[min(len(xs) - 1, max(0, math.ceil(p / 100 * len(xs)) - 1))]

    return {"mean": statistics.fmean(xs), "p50": pct(50), "p99": pct(99)}


def summarise(results: list[RequestResult], elapsed: float) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.completion_tokens for r in ok)
    prompt_tokens = sum(r.prompt_tokens for r in ok)
    errors = [r.error for r in results if not r.ok]
    return {
        "requests": len(results), "completed": len(ok), "failed": len(errors), "errors": errors[:5],
        "duration_s": elapsed,
        "request_throughput": len(ok) / elapsed if elapsed else 0.0,
        "output_tokens": out_tokens, "output_tokens_per_s": out_tokens / elapsed if elapsed else 0.0,
        "prompt_tokens": prompt_tokens,
        "cached_token_ratio": sum(r.cached_tokens for r in ok) / prompt_tokens if prompt_tokens else 0.0,
        "ttft_s": _stats([r.ttft for r in ok]),
        "tpot_s": _stats([t for r in ok if (t := r.tpot) is not None]),
        "itl_s": _stats([x for r in ok for x in r.itl]),
        "e2e_s": _stats([r.e2e for r in ok]),
        **({"valid_json_share": sum(bool(r.valid) for r in checked) / len(checked)}
           if (checked := [r for r in ok if r.valid is not None]) else {}),
    }


def write_chart(report: dict[str, Any], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = report["runs"]
    labels = [r["load"] for r in runs]
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    panels = [
        ("output tokens/s", [r["output_tokens_per_s"] for r in runs], None),
        ("TTFT (s)", [r["ttft_s"]["p50"] or 0 for r in runs], [r["ttft_s"]["p99"] or 0 for r in runs]),
        ("TPOT (s)", [r["tpot_s"]["p50"] or 0 for r in runs], [r["tpot_s"]["p99"] or 0 for r in runs]),
        ("cached prompt share", [r["cached_token_ratio"] for r in runs], None),
    ]
    x = range(len(runs))
    for ax, (title, main, p99) in zip(axes, panels):
        if p99 is None:
            ax.bar(x, main, color="#4c72b0")
        else:
            ax.bar([i - 0.2 for i in x], main, width=0.4, label="p50", color="#4c72b0")
            ax.bar([i + 0.2 for i in x], p99, width=0.4, label="p99", color="#dd8452")
            ax.legend(fontsize=8)
        ax.set_xticks(list(x), labels, fontsize=8)
        ax.set_title(title, fontsize=10)
    fig.suptitle(f"{report['server']['model']} · {report['config']['workload']} · {report['server']['base_url']}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def served_model(base_url: str, api_key: Optional[str]) -> str:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    r = httpx.get(base_url.rstrip("/") + "/models", headers=headers, timeout=30)
    r.raise_for_status()
    return r.json()["data"][0]["id"]


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    p.add_argument("--model", default=None, help="default: the first model /v1/models lists")
    p.add_argument("--api-key", default=None)
    p.add_argument("--workload", default="shared-prefix",
                   choices=["shared-prefix", "multi-turn", "json-schema", "random"])
    load = p.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=int, nargs="+", help="clients in flight (one run per value)")
    load.add_argument("--rate", type=float, nargs="+", help="Poisson arrivals, requests/s (one run per value)")
    p.add_argument("--num-requests", type=int, default=64, help="requests per run (upper bound with --duration)")
    p.add_argument("--duration", type=float, default=None, help="stop starting requests after this many seconds")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--ignore-eos", action="store_true", help="always generate max_tokens (radixserve, vLLM, SGLang)")
    p.add_argument("--num-prefixes", type=int, default=4, help="shared-prefix: distinct system prompts")
    p.add_argument("--prefix-words", type=int, default=400, help="shared-prefix: words per system prompt")
    p.add_argument("--turns", type=int, default=4, help="multi-turn: turns per conversation")
    p.add_argument("--random-min-words", type=int, default=20)
    p.add_argument("--random-max-words", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0, help="per-request timeout, seconds")
    p.add_argument("--out", default=None, help="JSON report (default bench/results/serving-<workload>.json)")
    p.add_argument("--chart", default=None, help="PNG chart (default: the report's path with .png)")
    args = p.parse_args(argv)
    if not args.concurrency and not args.rate:
        args.concurrency = [8]
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    args.model = args.model or served_model(args.base_url, args.api_key)
    out = Path(args.out or Path(__file__).parent / "results" / f"serving-{args.workload}.json")
    loads = [("concurrency", c) for c in args.concurrency or []] + [("rate", r) for r in args.rate or []]
    runs = []
    for kind, value in loads:
        # the same requests for every load level (and every server)
        sessions = make_sessions(args.workload, args.num_requests, random.Random(args.seed), args)
        results, elapsed = asyncio.run(run_load(args, sessions, value if kind == "concurrency" else None,
                                                value if kind == "rate" else None))
        summary = {"load": f"{kind} {value:g}", kind: value, **summarise(results, elapsed)}
        runs.append(summary)
        print(f"{summary['load']:>16}: {summary['completed']}/{summary['requests']} ok, "
              f"{summary['request_throughput']:.2f} req/s, {summary['output_tokens_per_s']:.1f} out tok/s, "
              f"TTFT p50 {_fmt(summary['ttft_s']['p50'])} p99 {_fmt(summary['ttft_s']['p99'])}, "
              f"TPOT p50 {_fmt(summary['tpot_s']['p50'])}, cached {summary['cached_token_ratio']:.0%}"
              + (f", valid JSON {summary['valid_json_share']:.0%}" if "valid_json_share" in summary else ""),
              flush=True)
    config = {k: v for k, v in vars(args).items() if k not in ("api_key", "out", "chart")}
    report = {"server": {"base_url": args.base_url, "model": args.model},
              "machine": {"platform": platform.platform(), "python": platform.python_version()},
              "config": config, "runs": runs}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    chart = Path(args.chart) if args.chart else out.with_suffix(".png")
    write_chart(report, chart)
    print(f"wrote {out} and {chart}")
    return 0


def _fmt(seconds: Optional[float]) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


if __name__ == "__main__":
    raise SystemExit(main())
