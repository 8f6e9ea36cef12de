"""Load with faults against a real `radixserve serve`: streaming clients arriving over a few minutes,
some disconnecting at a random point, some sending malformed bodies, and one SIGTERM at the end.

Reports what clients saw (completed, aborted by the shutdown, refused as malformed, errored), KV
pages still held by requests once the load has passed (must be 0), the server's RSS before and after
the load, end-to-end latency p50 / p99 of completed streams, and the exit status after SIGTERM.
Never asserts anything; writes bench/results/lifecycle_load.json.

    .venv/bin/python bench/lifecycle_load.py                         # 500 clients over 300 s
    .venv/bin/python bench/lifecycle_load.py --clients 60 --duration 30   # a quick look
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import httpx
from local_server import LocalServer  # bench/, beside this script

RESULTS = Path(__file__).with_name("results") / "lifecycle_load.json"
MALFORMED = [  # bodies a careless client sends: each must be a 4xx, never a 5xx or a hang
    b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true',  # truncated JSON
    b'{"messages": []}',
    b'{"messages": [{"role": "wizard", "content": "hi"}]}',
    b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}',
    b'{"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}',
    b'{"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_schema", '
    b'"json_schema": {"name": "x", "schema": {"type": "object", "uniqueItems": true, "properties": '
    b'{"a": {"type": "array", "uniqueItems": true}}}}}}',
    b'[1, 2, 3]',
    b'\xff\xfe not even utf-8',
]
TOPICS = "the sea,a lighthouse,winter,a violin,the harbor,a garden,an orbit,a market,a river,a lantern".split(",")


@dataclass
class Outcome:
    kind: str                      # completed | aborted | disconnected | refused | errored
    latency: Optional[float] = None
    detail: str = ""


@dataclass
class Report:
    clients: int
    duration_s: float
    counts: dict = field(default_factory=dict)
    errors: list = field(default_factory=list)
    kv_pages_used_after_load: float = -1
    kv_pages_leaked: float = -1
    rss_mib_before: float = 0
    rss_mib_after: float = 0
    latency_p50_s: Optional[float] = None
    latency_p99_s: Optional[float] = None
    exit_status: Optional[int] = None
    seconds_to_exit_after_sigterm: Optional[float] = None
    invariant_broken_in_log: bool = False


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def metric(client: httpx.AsyncClient, url: str, sample: str) -> float:
    text = (await client.get(url + "/metrics")).text
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    return float("nan")


async def one_client(client: httpx.AsyncClient, url: str, rng: random.Random, disconnect: bool,
                     malformed: bool) -> Outcome:
    t0 = time.monotonic()
    if malformed:
        r = await client.post(url + "/v1/chat/completions", content=rng.choice(MALFORMED),
                              headers={"content-type": "application/json"})
        return Outcome("refused" if 400 <= r.status_code < 500 else "errored", detail=f"malformed -> {r.status_code}")
    body = {"messages": [{"role": "user", "content": f"Write a short poem about {rng.choice(TOPICS)}."}],
            "max_tokens": rng.randint(16, 160), "temperature": 0.8, "stream": True}
    cut_after = rng.randint(1, 40) if disconnect else None
    events: list[str] = []
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                return Outcome("errored", detail=f"status {r.status_code}: {(await r.aread())[:200]!r}")
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(line[6:])
                if cut_after is not None and len(events) >= cut_after:
                    return Outcome("disconnected")  # leaving the block closes the connection mid-stream
    except httpx.HTTPError as e:
        return Outcome("errored", detail=f"{type(e).__name__}: {e}")
    if not events or events[-1] != "[DONE]":
        return Outcome("errored", detail="stream ended without [DONE]")
    last = json.loads(events[-2])
    if "error" in last:
        return Outcome("errored", detail=str(last["error"]))
    reason = last["choices"][0]["finish_reason"]
    if reason == "abort":
        return Outcome("aborted", time.monotonic() - t0)
    if reason in ("stop", "length"):
        return Outcome("completed", time.monotonic() - t0)
    return Outcome("errored", detail=f"finish_reason {reason}")


async def load(url: str, proc: subprocess.Popen, clients: int, duration: float, rng: random.Random,
               args: argparse.Namespace, sigterm_at_end: bool) -> tuple[list[Outcome], Optional[float]]:
    """`clients` arrivals (Poisson) over `duration` seconds; with `sigterm_at_end`, the server gets
    SIGTERM right after the last arrival. Returns the outcomes and, then, the seconds to its exit."""
    limits = httpx.Limits(max_connections=clients + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600, connect=30), limits=limits) as client:
        tasks = []
        for _ in range(clients):
            disconnect, malformed = rng.random() < args.disconnect_share, rng.random() < args.malformed_share
            tasks.append(asyncio.create_task(one_client(client, url, random.Random(rng.random()),
                                                        disconnect, malformed)))
            await asyncio.sleep(rng.expovariate(clients / duration))
        if not sigterm_at_end:
            return list(await asyncio.gather(*tasks)), None
        proc.send_signal(signal.SIGTERM)  # the last arrivals are still streaming: the drain takes them
        t_signal = time.monotonic()
        outcomes = list(await asyncio.gather(*tasks))
    try:
        await asyncio.to_thread(proc.wait, args.shutdown_timeout + 30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return outcomes, None
    return outcomes, round(time.monotonic() - t_signal, 2)


async def pages_after_load(url: str, proc: subprocess.Popen, report: Report) -> None:
    """Once every request has ended (before the signal), no page may be held by a request."""
    async with httpx.AsyncClient(timeout=30) as client:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            running = await metric(client, url, "radixserve_num_requests_running")
            waiting = await metric(client, url, "radixserve_num_requests_waiting")
            if running == 0 and waiting == 0:
                break
            await asyncio.sleep(0.2)
        report.kv_pages_used_after_load = await metric(client, url, 'radixserve_kv_pages{state="used"}')
        report.rss_mib_after = rss_mib(proc.pid)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=500)
    ap.add_argument("--duration", type=float, default=300.0, help="seconds over which clients arrive")
    ap.add_argument("--disconnect-share", type=float, default=0.20)
    ap.add_argument("--malformed-share", type=float, default=0.05)
    ap.add_argument("--shutdown-timeout", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=RESULTS)
    args = ap.parse_args()

    server = LocalServer("--shutdown-timeout", str(args.shutdown_timeout))
    url, proc = server.url, server.proc

    report = Report(args.clients, args.duration)
    report.rss_mib_before = rss_mib(proc.pid)
    rng = random.Random(args.seed)
    # Pages are checked at a quiet moment before the signal: 90% of the clients, the check, then the
    # rest with the SIGTERM right after the last arrival.
    head = int(args.clients * 0.9)
    outcomes, _ = asyncio.run(load(url, proc, head, args.duration * 0.9, rng, args, sigterm_at_end=False))
    asyncio.run(pages_after_load(url, proc, report))
    tail, report.seconds_to_exit_after_sigterm = asyncio.run(
        load(url, proc, args.clients - head, args.duration * 0.1, rng, args, sigterm_at_end=True))
    outcomes += tail
    report.exit_status = proc.returncode
    report.invariant_broken_in_log = "INVARIANT BROKEN" in server.log()
    report.kv_pages_leaked = report.kv_pages_used_after_load
    for o in outcomes:
        report.counts[o.kind] = report.counts.get(o.kind, 0) + 1
        if o.kind == "errored":
            report.errors.append(o.detail)
    latencies = sorted(o.latency for o in outcomes if o.kind == "completed")
    if latencies:
        report.latency_p50_s = round(statistics.median(latencies), 3)
        report.latency_p99_s = round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 3)
    report.rss_mib_before, report.rss_mib_after = round(report.rss_mib_before, 1), round(report.rss_mib_after, 1)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(asdict(report), indent=2) + "\n")
    print(json.dumps(asdict(report), indent=2))


if __name__ == "__main__":
    main()
