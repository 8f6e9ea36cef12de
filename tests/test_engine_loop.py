"""The engine loop's contract with other threads: a caller waiting on the loop is answered or told
it has stopped, whenever the loop ends; a consumer that went away cannot fail a step; failures
outside a step count like failed steps, so a bug that recurs stops the engine instead of spinning."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from radixserve.runtime.config import EngineConfig
from radixserve.runtime.engine import Engine
from radixserve.runtime.engine_client import EngineRefusal, RefusalKind
from radixserve.runtime.engine_loop import Stop
from radixserve.runtime.request import OutputStream, RequestOutput
from radixserve.runtime.sampling_params import SamplingParams

WAIT_S = 10.0


class _LoopEndsFirst:
    """The loop's inbox, but the loop has ended by the time a caller's message goes in: the race
    between a caller's liveness check and its put, forced."""

    def __init__(self, loop):
        self.loop, self.real = loop, loop.inbox

    def put(self, message) -> None:
        self.loop._stop.set()
        self.real.put(Stop())
        self.loop.thread.join(WAIT_S)
        self.real.put(message)

    def __getattr__(self, name):
        return getattr(self.real, name)


def _in_thread(fn) -> tuple[threading.Thread, list]:
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(fn())
        except BaseException as e:
            outcome.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


@pytest.fixture
def engine(default_model_files):
    """An engine whose loop a test may end: its pages are checked directly afterwards."""
    engine = Engine(EngineConfig(dtype="float32", kv_cache_tokens=2048, max_failed_steps=3),
                    model_files=default_model_files)
    yield engine
    engine.shutdown()
    engine.kv.check_invariant(engine.scheduler.running)
    assert not engine.scheduler.running and not engine.scheduler.waiting


@pytest.mark.parametrize("call", ["flush_cache", "check_idle_invariant", "prefix_summary"])
def test_a_caller_is_told_the_engine_stopped_when_the_loop_ends_before_reading_its_message(engine, call):
    engine.generate([5, 6, 7], SamplingParams(max_tokens=2, temperature=0.0))
    engine.loop.inbox = _LoopEndsFirst(engine.loop)
    method = getattr(engine, call)
    thread, outcome = _in_thread(lambda: method(8) if call == "prefix_summary" else method())
    thread.join(WAIT_S)
    assert not thread.is_alive(), f"{call} still waits on a loop that has ended"
    assert isinstance(outcome[0], EngineRefusal) and outcome[0].kind is RefusalKind.STOPPED


def test_a_consumer_whose_event_loop_has_closed_does_not_fail_its_request(engine):
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    gone = engine.submit([5, 6, 7, 8], params)
    consumer, reading = asyncio.new_event_loop(), gone.__aiter__()
    consumer.run_until_complete(reading.__anext__())   # it read one output, then its loop closed
    consumer.close()
    other = engine.submit([9, 10, 11], params)
    assert list(other)[-1].finish_reason == "length"
    assert gone.wait_finished()[-1].finish_reason == "length"   # it ran to its end, unread
    assert engine.health().failed_steps == 0


def test_put_skips_a_waiter_whose_event_loop_has_closed():
    stream = OutputStream("r")
    consumer = asyncio.new_event_loop()
    iterator = stream.__aiter__()
    waiting = consumer.create_task(iterator.__anext__())
    consumer.run_until_complete(asyncio.sleep(0))   # it waits for an output, registered with the stream
    waiting.cancel()
    consumer.close()
    stream.put(RequestOutput("r", "text"))
    stream.put(RequestOutput("r", finish_reason="stop"))
    assert [o.text for o in stream.wait_finished()] == ["text", ""]


def test_a_failure_outside_a_step_that_recurs_stops_the_engine(engine, monkeypatch):
    calls = {"n": 0}

    def broken_schedule():   # a bug that does not go away with the requests it failed
        calls["n"] += 1
        raise RuntimeError("scheduler bug")

    monkeypatch.setattr(engine.scheduler, "schedule", broken_schedule)
    stream = engine.submit([5, 6, 7], SamplingParams(max_tokens=4))
    assert stream.wait_finished()[-1].finish_reason == "error"
    engine.loop.thread.join(WAIT_S)
    health = engine.health()
    assert not health.alive and "scheduler bug" in health.fatal_error
    assert calls["n"] == 3   # it gave up at the limit instead of spinning
    with pytest.raises(EngineRefusal) as refused:
        engine.submit([5, 6, 7], SamplingParams(max_tokens=4))
    assert refused.value.kind is RefusalKind.STOPPED and "scheduler bug" in refused.value.message


def test_one_failure_outside_a_step_is_forgiven_once_the_loop_runs_again(make_engine, monkeypatch):
    engine = make_engine(max_failed_steps=2)
    real = engine.scheduler.schedule
    calls = {"n": 0}

    def fails_once():
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("transient")
        return real()

    monkeypatch.setattr(engine.scheduler, "schedule", fails_once)
    first = engine.submit([5, 6, 7], SamplingParams(max_tokens=2))
    assert first.wait_finished()[-1].finish_reason == "error"
    second = engine.generate([5, 6, 7], SamplingParams(max_tokens=2, temperature=0.0))[0]
    assert second.finish_reason == "length" and engine.health().alive
