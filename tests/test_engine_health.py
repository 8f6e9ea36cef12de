"""Honest health: faults injected into a real engine (its model runner's forward raises, stalls, or
the loop thread is killed) and what `/health`, `/health/generate` and requests then report."""
from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from typing import Callable, Iterator

import httpx
import pytest

from radixserve.api.server import build_app
from radixserve.runtime.config import EngineConfig
from radixserve.runtime.engine import Engine
from radixserve.runtime.sampling_params import SamplingParams

from .api_server import serve_app

MODEL = "smol"


class InjectedFault(RuntimeError):
    pass


def fault(kind: str, times: int = 1 << 30, seconds: float = 0.0) -> Callable:
    """A replacement for ModelRunner.forward: `kind` "raise" raises, "stall" sleeps, the first `times`
    calls; later calls (and the stall's end) run the real forward."""
    calls = {"n": 0}

    def install(engine: Engine) -> None:
        real = engine.runner.forward

        def forward(batch):
            calls["n"] += 1
            if calls["n"] <= times:
                if kind == "raise":
                    raise InjectedFault(f"injected fault #{calls['n']}")
                time.sleep(seconds)
            return real(batch)

        engine.runner.forward = forward  # read by the loop thread at its next step
    return install


@contextlib.contextmanager
def server(default_model_files, watchdog_timeout: float = 60.0, **config) -> Iterator[tuple[str, Engine]]:
    engine = Engine(EngineConfig(dtype="float32", kv_cache_tokens=2048, max_running_requests=8, **config),
                    model_files=default_model_files)
    try:
        with serve_app(build_app(engine, served_model_name=MODEL, watchdog_timeout=watchdog_timeout)) as url:
            yield url, engine
        if engine.health().alive:
            engine.check_idle_invariant()
        else:  # the loop has ended: its structures are ours to read
            engine.loop.thread.join(timeout=10)
            engine.kv.check_invariant(engine.scheduler.running)
            assert not engine.scheduler.running and not engine.scheduler.waiting
    finally:
        engine.shutdown()


def chat(url: str, max_tokens: int = 4, **extra) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", timeout=60, json={
        "model": MODEL, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": max_tokens, **extra})


def test_health_is_ok_while_the_engine_serves(default_model_files):
    with server(default_model_files) as (url, _):
        r = httpx.get(url + "/health", timeout=10)
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def test_a_step_that_fails_once_fails_its_request_and_the_engine_keeps_serving(default_model_files):
    with server(default_model_files) as (url, engine):
        fault("raise", times=1)(engine)
        failed = chat(url)
        health = httpx.get(url + "/health", timeout=10)
        after = chat(url)
    assert failed.status_code == 500 and failed.json()["error"]["code"] == "internal_error"
    assert health.status_code == 200
    assert after.status_code == 200 and after.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_steps_that_keep_failing_stop_the_engine_and_health_says_why(default_model_files):
    with server(default_model_files, max_failed_steps=3) as (url, engine):
        fault("raise")(engine)
        statuses = [chat(url).status_code for _ in range(3)]
        engine.loop.thread.join(timeout=10)
        health = httpx.get(url + "/health", timeout=10)
        refused = chat(url)
    assert statuses == [500, 500, 500]
    assert health.status_code == 503 and health.json()["error"]["code"] == "engine_stopped"
    assert "3 consecutive steps failed" in health.json()["error"]["message"]
    assert "InjectedFault" in health.json()["error"]["message"]
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "engine_stopped"


def test_a_failing_step_below_the_limit_does_not_stop_the_engine(default_model_files):
    with server(default_model_files, max_failed_steps=3) as (url, engine):
        fault("raise", times=2)(engine)
        statuses = [chat(url).status_code for _ in range(3)]
        health = httpx.get(url + "/health", timeout=10)
    assert statuses == [500, 500, 200]
    assert health.status_code == 200


def _kill_thread(thread: threading.Thread) -> None:
    """Raise SystemExit inside `thread` at its next bytecode: the thread ends as if killed."""
    done = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(SystemExit))
    assert done == 1


def test_a_killed_loop_thread_ends_its_requests_and_health_turns_503(default_model_files):
    with server(default_model_files) as (url, engine):
        stream = engine.submit("Count to one hundred:", SamplingParams(max_tokens=500, ignore_eos=True))
        first = next(iter(stream))  # it is running
        _kill_thread(engine.loop.thread)
        outputs = [first] + list(stream)
        engine.loop.thread.join(timeout=10)
        health = httpx.get(url + "/health", timeout=10)
        refused = chat(url)
    assert outputs[-1].finish_reason == "error" and "loop thread died" in outputs[-1].error
    assert not engine.loop.thread.is_alive()
    assert health.status_code == 503 and health.json()["error"]["code"] == "engine_stopped"
    assert "SystemExit" in health.json()["error"]["message"]
    assert refused.status_code == 503


def test_a_step_stalled_past_the_watchdog_timeout_turns_health_503_until_it_ends(default_model_files):
    # the watchdog is well above the idle loop's 0.5 s wake-up, so a busy machine cannot trip it
    with server(default_model_files, watchdog_timeout=1.5) as (url, engine):
        fault("stall", times=1, seconds=4.0)(engine)
        stream = engine.submit("Hello", SamplingParams(max_tokens=2))
        time.sleep(2.5)
        during = httpx.get(url + "/health", timeout=10)
        outputs = list(stream)
        time.sleep(0.6)
        after = httpx.get(url + "/health", timeout=10)
    assert during.status_code == 503 and during.json()["error"]["code"] == "engine_stalled"
    assert outputs[-1].finish_reason in ("stop", "length")
    assert after.status_code == 200


def test_health_generate_runs_one_token_through_the_engine(default_model_files):
    with server(default_model_files) as (url, engine):
        before = engine.stats().generation_tokens
        r = httpx.get(url + "/health/generate", timeout=30)
        after = engine.stats().generation_tokens
    assert r.status_code == 200 and r.json()["status"] == "ok" and r.json()["seconds"] > 0
    assert after == before + 1


def test_health_generate_answers_503_within_its_timeout_when_the_engine_is_stuck(default_model_files):
    with server(default_model_files) as (url, engine):
        fault("stall", times=1, seconds=3.0)(engine)
        t0 = time.monotonic()
        r = httpx.get(url + "/health/generate", params={"timeout": 0.5}, timeout=30)
        elapsed = time.monotonic() - t0
    assert r.status_code == 503 and r.json()["error"]["code"] == "engine_stalled"
    assert elapsed < 2.0


@pytest.mark.parametrize("timeout", ["0", "abc"])
def test_health_generate_refuses_a_bad_timeout(default_model_files, timeout):
    with server(default_model_files) as (url, _):
        r = httpx.get(url + "/health/generate", params={"timeout": timeout}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "timeout"


def test_health_generate_answers_503_with_retry_after_when_the_queue_is_full(default_model_files):
    with server(default_model_files, max_waiting_requests=1) as (url, engine):
        capacity = engine.config.max_running_requests + engine.config.max_waiting_requests
        params = SamplingParams(max_tokens=100, ignore_eos=True)
        hogs = [engine.submit([5, 6, 7], params, request_id=f"hog{i}") for i in range(capacity)]
        r = httpx.get(url + "/health/generate", timeout=30)
        for hog in hogs:
            engine.abort(hog.request_id)
        finals = [hog.wait_finished()[-1] for hog in hogs]
    assert r.status_code == 503 and r.json()["error"]["code"] == "overloaded"
    assert int(r.headers["retry-after"]) >= 1
    assert all(f.finished for f in finals)


SLOW_WORK_S = 20.0   # how long the slow work below would block, unless the test releases it first


class SlowWork:
    """Wraps `fn` so that a call it `applies` to blocks until `release`d, setting `started` first."""

    def __init__(self, fn, applies=lambda *args: True):
        self.fn, self.applies = fn, applies
        self.started, self.release = threading.Event(), threading.Event()

    def __call__(self, *args, **kwargs):
        if self.applies(*args):
            self.started.set()
            self.release.wait(SLOW_WORK_S)
        return self.fn(*args, **kwargs)


def health_while_blocked(url: str, slow: SlowWork, request) -> tuple[httpx.Response, httpx.Response]:
    """/health asked while `request` (sent on another thread) is held up in `slow`; then both replies."""
    result: list = []
    thread = threading.Thread(target=lambda: result.append(request()), daemon=True)
    thread.start()
    assert slow.started.wait(SLOW_WORK_S)
    try:
        health = httpx.get(url + "/health", timeout=3)
    finally:
        slow.release.set()
    thread.join(60)
    return health, result[0]


def test_health_answers_while_the_first_constrained_request_builds_the_grammar_backend(default_model_files,
                                                                                        monkeypatch):
    from radixserve.runtime import structured_output

    slow = SlowWork(structured_output.make_grammar_backend)
    monkeypatch.setattr(structured_output, "make_grammar_backend", slow)
    with server(default_model_files) as (url, _):
        health, constrained = health_while_blocked(url, slow, lambda: chat(url, response_format={"type": "json_object"}))
    assert health.status_code == 200
    assert constrained.status_code == 200


def test_health_answers_while_a_prompt_is_tokenised(default_model_files, monkeypatch):
    marker = "Tokenise me slowly"
    tokenizer = default_model_files.tokenizer
    slow = SlowWork(tokenizer.encode, applies=lambda text, *_: marker in text)
    monkeypatch.setattr(tokenizer, "encode", slow)
    with server(default_model_files) as (url, _):
        health, reply = health_while_blocked(url, slow, lambda: httpx.post(url + "/v1/chat/completions", timeout=60, json={
            "model": MODEL, "messages": [{"role": "user", "content": marker}], "max_tokens": 2}))
    assert health.status_code == 200
    assert reply.status_code == 200
