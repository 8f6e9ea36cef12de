"""What streaming costs the server's event loop: the CPU time of the server's main (asyncio) thread
per streamed chat token, read from /proc (schedstat, ns), and the tokens' pace as the client sees
it. The engine thread waits on that thread for the GIL, so its work per token shows in TPOT.

Forms, alternating run by run, each a server of its own: `ours` (api/streaming.py's EventStream)
and `stock` (sse-starlette's own send path, a cancel scope around every send: patched in before
the server starts). One request at a time, --tokens tokens each, EOS ignored, greedy, httpx
streaming client (as bench/serving.py's). Writes JSON; never asserts.

    .venv/bin/python bench/sse_overhead.py [--model FILE] [--runs 3] [--requests 3] [--tokens 400]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

RESULTS = Path(__file__).parent / "results"
# the server as `radixserve serve`, with sse-starlette's send path put back for the `stock` form
LAUNCH = """
import sys
from sse_starlette import EventSourceResponse
from radixserve.api import streaming
if sys.argv[1] == "stock":
    streaming.EventStream._send_with_timeout = EventSourceResponse._send_with_timeout
from radixserve.api.cli import main
sys.exit(main(["serve", *sys.argv[2:]]))
"""


def start(form: str, port: int, model: str | None) -> subprocess.Popen:
    args = ["--port", str(port)] + (["--model", model] if model else [])
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH, form, *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("the server did not start")


def main_thread_ns(pid: int) -> int:
    return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[0])


async def stream(port: int, model: str, tokens: int) -> tuple[int, float]:
    """Streamed content chunks and the mean interval between them (s)."""
    body = {"model": model, "messages": [{"role": "user", "content": "alpha beta " * 40}], "max_tokens": tokens,
            "temperature": 0.0, "stream": True, "ignore_eos": True}
    times = []
    async with httpx.AsyncClient(timeout=600) as client:
        async with client.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    json.loads(line[6:])
                    times.append(time.perf_counter())
    return len(times), (times[-1] - times[1]) / (len(times) - 2)


def run(form: str, port: int, args: argparse.Namespace) -> dict:
    proc = start(form, port, args.model)
    try:
        model = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"][0]["id"]
        asyncio.run(stream(port, model, 8))
        us, itl = [], []
        for _ in range(args.requests):
            before = main_thread_ns(proc.pid)
            n, interval = asyncio.run(stream(port, model, args.tokens))
            us.append((main_thread_ns(proc.pid) - before) / 1e3 / n)
            itl.append(interval * 1e3)
        return {"main_thread_us_per_token": statistics.median(us), "interval_ms": statistics.median(itl)}
    finally:
        proc.terminate()
        proc.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="a GGUF file (default: the embedded model)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--requests", type=int, default=3)
    p.add_argument("--tokens", type=int, default=400)
    p.add_argument("--port", type=int, default=8530)
    p.add_argument("--json", type=Path, default=RESULTS / "sse_overhead.json")
    args = p.parse_args()
    runs: dict[str, list[dict]] = {"ours": [], "stock": []}
    for r in range(args.runs):
        for form in (["ours", "stock"] if r % 2 == 0 else ["stock", "ours"]):
            runs[form].append(run(form, args.port, args))
            print(f"run {r} {form:5}: main thread {runs[form][-1]['main_thread_us_per_token']:.0f} us/token, "
                  f"interval {runs[form][-1]['interval_ms']:.2f} ms", flush=True)
    report = {"model": args.model, "tokens": args.tokens, "runs": runs, "median": {}}
    for form, rs in runs.items():
        report["median"][form] = {k: statistics.median(x[k] for x in rs) for k in rs[0]}
        print(f"{form:5}: main thread {report['median'][form]['main_thread_us_per_token']:.0f} us/token, "
              f"interval {report['median'][form]['interval_ms']:.2f} ms (medians of {args.runs} runs)")
    args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
