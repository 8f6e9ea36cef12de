"""SIGTERM on a real `radixserve serve` with requests in flight: it stops admitting, lets what fits in
--shutdown-timeout finish, ends the rest with finish_reason "abort" and [DONE], and exits 0. If its
engine stops serving, it exits non-zero instead, so that a supervisor restarts it."""
from __future__ import annotations

import json
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

import httpx
import pytest

from .serve_process import Server

SHUTDOWN_TIMEOUT = 12.0  # room for the short stream below when other tests load both cores
LONG = 2000  # tokens: far more than fit in the timeout on any machine this runs on
@dataclass
class Stream:
    """One raw SSE chat stream read on a thread: every `data:` payload, in order."""
    max_tokens: int
    events: list[str] = field(default_factory=list)
    started: threading.Event = field(default_factory=threading.Event)
    error: Optional[BaseException] = None

    def run(self, url: str) -> None:
        body = {"model": "smol", "messages": [{"role": "user", "content": "Write a long story."}],
                "max_tokens": self.max_tokens, "ignore_eos": True, "stream": True}
        try:
            with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(line[6:])
                        if '"content":"' in line and not line.endswith('"content":""}'):
                            self.started.set()
        except BaseException as e:  # noqa: BLE001 (reported by the test)
            self.error = e
        finally:
            self.started.set()

    @property
    def chunks(self) -> list[dict]:
        return [json.loads(e) for e in self.events if e != "[DONE]"]

    @property
    def finish_reason(self) -> Optional[str]:
        reasons = [c["choices"][0]["finish_reason"] for c in self.chunks if c.get("choices")]
        return reasons[-1] if reasons else None

    @property
    def text(self) -> str:
        return "".join(c["choices"][0]["delta"].get("content") or "" for c in self.chunks if c.get("choices"))


@dataclass
class Drain:
    """What clients saw around one SIGTERM."""
    long_streams: list[Stream]
    short_stream: Stream
    whole: dict                 # a non-streamed request cut by the timeout
    refused: httpx.Response     # a new request during the drain
    health: httpx.Response      # /health during the drain
    drained_metric: float       # radixserve_drain_requests_total{outcome="drained"} mid-drain
    exit_status: int
    log: str
    seconds_to_exit: float


def _metric(url: str, sample: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    return 0.0


@pytest.fixture(scope="module")
def drain() -> Drain:
    server = Server("--shutdown-timeout", str(SHUTDOWN_TIMEOUT))
    try:
        long_streams = [Stream(LONG) for _ in range(2)]
        whole: dict = {}

        def post_whole() -> None:
            r = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
                "model": "smol", "messages": [{"role": "user", "content": "Tell me everything."}],
                "max_tokens": LONG, "ignore_eos": True})
            whole.update(status=r.status_code, body=r.json())

        threads = [threading.Thread(target=s.run, args=(server.url,)) for s in long_streams]
        threads.append(threading.Thread(target=post_whole))
        for t in threads:
            t.start()
        for s in long_streams:
            assert s.started.wait(60) and s.error is None
        # long enough to be running when the signal lands (8 tokens could finish first on a fast
        # step), short enough to finish inside the timeout
        short = Stream(16)
        threads.append(threading.Thread(target=short.run, args=(server.url,)))
        threads[-1].start()
        assert short.started.wait(60) and short.error is None
        server.proc.send_signal(signal.SIGTERM)
        t_signal = time.monotonic()
        time.sleep(0.3)  # the signal reaches the event loop
        refused = httpx.post(server.url + "/v1/chat/completions", timeout=30, json={
            "model": "smol", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        health = httpx.get(server.url + "/health", timeout=30)
        threads[-1].join(timeout=SHUTDOWN_TIMEOUT)
        drained_metric = _metric(server.url, 'radixserve_drain_requests_total{outcome="drained"}')
        for t in threads:
            t.join(timeout=60)
        status, log = server.wait(timeout=60)
        return Drain(long_streams, short, whole, refused, health, drained_metric, status, log,
                     time.monotonic() - t_signal)
    finally:
        server.kill()


def test_streams_cut_by_the_shutdown_timeout_end_with_finish_reason_abort_then_done(drain):
    for s in drain.long_streams:
        assert s.error is None
        assert s.events[-1] == "[DONE]"
        assert s.finish_reason == "abort"
        assert s.text  # what was generated before the cut was delivered


def test_a_stream_that_fits_in_the_shutdown_timeout_completes_normally(drain):
    assert drain.short_stream.events[-1] == "[DONE]"
    assert drain.short_stream.finish_reason == "length"
    assert drain.short_stream.chunks[-2]["choices"][0]["delta"] or drain.short_stream.text


def test_a_whole_request_cut_by_the_timeout_gets_its_text_so_far_with_finish_reason_abort(drain):
    assert drain.whole["status"] == 200
    choice = drain.whole["body"]["choices"][0]
    assert choice["finish_reason"] == "abort"
    assert choice["message"]["content"]
    assert drain.whole["body"]["usage"]["completion_tokens"] > 0


def test_new_requests_during_the_drain_get_503_with_retry_after(drain):
    assert drain.refused.status_code == 503
    assert drain.refused.json()["error"]["code"] == "shutting_down"
    assert int(drain.refused.headers["retry-after"]) > 0


def test_health_turns_503_as_the_drain_begins(drain):
    assert drain.health.status_code == 503
    assert drain.health.json()["error"]["code"] == "shutting_down"


def test_metrics_count_drained_and_aborted_requests(drain):
    assert drain.drained_metric == 1  # the short stream
    assert "drained: 1 finished, 3 aborted" in drain.log


def test_the_server_exits_0_soon_after_the_timeout(drain):
    assert drain.exit_status == 0, drain.log
    assert SHUTDOWN_TIMEOUT <= drain.seconds_to_exit < SHUTDOWN_TIMEOUT + 15
    assert "Traceback" not in drain.log


def test_a_second_signal_stops_at_once():
    server = Server("--shutdown-timeout", "120")
    try:
        stream = Stream(LONG)
        thread = threading.Thread(target=stream.run, args=(server.url,))
        thread.start()
        assert stream.started.wait(60)
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert server.proc.poll() is None  # draining: the stream may still finish
        t0 = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        status, log = server.wait(timeout=30)
        thread.join(timeout=30)
    finally:
        server.kill()
    assert time.monotonic() - t0 < 10
    assert status == 0, log


@pytest.mark.parametrize("fault", ["raise", "kill-thread"])
def test_the_process_exits_nonzero_when_its_engine_stops_serving(fault):
    server = Server("--max-failed-steps", "2", fault=fault)
    try:
        statuses = []
        for _ in range(3):
            try:
                statuses.append(httpx.post(server.url + "/v1/chat/completions", timeout=30, json={
                    "model": "smol", "messages": [{"role": "user", "content": "Hi"}],
                    "max_tokens": 2}).status_code)
            except httpx.TransportError:
                break  # it has exited
        status, log = server.wait(timeout=30)
    finally:
        server.kill()
    assert status == 1, log
    assert statuses and set(statuses) <= {500, 503}
    assert "exiting so that a supervisor restarts the server" in log
