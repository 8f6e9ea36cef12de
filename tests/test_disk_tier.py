"""The prefix cache's disk tier (`--cache-dir`) on the real default model: a prompt's KV survives a
restart and an eviction and comes back as cached tokens with the same greedy text; what is corrupt,
another model's or another tenant's is never read; `DELETE /v1/cache` and `prompt_cache_retention`
reach the disk; a SIGKILLed server keeps its cache."""
from __future__ import annotations

import dataclasses
import gc
import shutil
import signal
import threading
import time
import uuid

import httpx
import pytest
import torch

from radixserve.radix.prefix_hash import page_hashes
from radixserve.runtime.config import EngineConfig
from radixserve.runtime.engine import CompletionResult, Engine
from radixserve.runtime.engine_client import EngineRefusal
from radixserve.runtime.sampling_params import SamplingParams

from .conftest import assert_all_pages_free
from .serve_process import Server

GREEDY = SamplingParams(max_tokens=4, temperature=0.0)


def prompt(tag: str, repeat: int = 12) -> str:
    """~10 tokens a repeat, never sent before."""
    return f"[{tag} {uuid.uuid4().hex}] " + "You are a careful assistant for a shipping company. " * repeat + "Why?"


def served_then_stopped(files, cache_dir, requests: list[tuple[str, SamplingParams]]) -> list[CompletionResult]:
    """Requests on an engine that then shuts down, as a restart would; its pages are checked first,
    and no thread of its disk tier may outlive it."""
    before = set(threading.enumerate())
    engine = Engine(EngineConfig(dtype="float32", kv_cache_tokens=8192, cache_dir=str(cache_dir)), model_files=files)
    try:
        results = [engine.generate(text, params)[0] for text, params in requests]
        assert_all_pages_free(engine)
    finally:
        engine.shutdown()
        del engine
        gc.collect()   # its ~1 GB of weights and KV pool (see conftest's make_engine)
    assert not [t for t in set(threading.enumerate()) - before if "cache-dir" in t.name and t.is_alive()]
    return results


TEXT, SALTED = prompt("restart"), prompt("salted")
SALT_A = dataclasses.replace(GREEDY, cache_salt="tenant-a")


@pytest.fixture(scope="module")
def written(default_model_files, tmp_path_factory):
    """A cache dir left by a stopped engine that served TEXT, and SALTED under tenant-a's salt."""
    directory = tmp_path_factory.mktemp("written")
    results = served_then_stopped(default_model_files, directory, [(TEXT, GREEDY), (SALTED, SALT_A)])
    return directory, results[0]


@pytest.fixture
def restarted(written, tmp_path):
    """A copy of `written` (tests may damage it) and the cold result of TEXT."""
    shutil.copytree(written[0], tmp_path, dirs_exist_ok=True)
    return tmp_path, written[1]


def page_files(engine) -> list:
    engine.kv.disk.store.flush()
    return sorted(engine.kv.disk.store.dir.glob("*.kv"))


def test_a_restarted_engine_reads_the_prompt_back_with_the_same_text(make_engine, restarted):
    directory, cold = restarted
    again = make_engine(cache_dir=str(directory))
    warm = again.generate(TEXT, GREEDY)[0]
    assert warm.text == cold.text
    assert warm.cached_tokens >= 0.9 * warm.prompt_tokens
    assert again.stats().prefix_cache_disk_hit_tokens == warm.cached_tokens
    assert again.kv.disk.read_ahead_bytes == 0


def test_an_evicted_prefix_is_read_back_not_recomputed(make_engine, tmp_path):
    engine = make_engine(cache_dir=str(tmp_path), kv_cache_tokens=320)
    first = prompt("evicted")
    cold = engine.generate(first, GREEDY)[0]
    for i in range(3):   # each ~150 tokens: the pool of 320 holds two
        engine.generate(prompt(f"filler {i}"), GREEDY)
    assert engine.kv.evicted_tokens > 0
    warm = engine.generate(first, GREEDY)[0]
    assert warm.text == cold.text
    assert warm.cached_tokens >= 0.9 * warm.prompt_tokens
    assert engine.stats().prefix_cache_disk_hit_tokens == warm.cached_tokens


def test_a_corrupt_page_is_dropped_and_its_tokens_recomputed(make_engine, default_model_files, restarted):
    directory, cold = restarted
    # files are named by chained page hash: flip a payload byte in the prompt's page 4
    name = f"{page_hashes(default_model_files.tokenizer.encode(TEXT), 16)[4]:016x}"
    victim = next(directory.glob(f"*/{name}-*.kv"))
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    again = make_engine(cache_dir=str(directory))
    warm = again.generate(TEXT, GREEDY)[0]
    assert warm.text == cold.text
    assert warm.cached_tokens == 4 * 16   # the pages before it, none after
    assert again.stats().cache_dir.corrupt_dropped == 1
    assert not victim.exists() or victim.read_bytes() != data   # gone, or rewritten from the recomputed page


def test_another_models_pages_are_never_read(make_engine, default_model_files, restarted):
    directory, _ = restarted
    weights = dict(default_model_files.weights)
    name = next(k for k, w in weights.items() if isinstance(w, torch.Tensor) and "norm" in k)
    weights[name] = weights[name] * 1.01
    other = make_engine(dataclasses.replace(default_model_files, weights=weights), cache_dir=str(directory))
    result = other.generate(TEXT, GREEDY)[0]
    assert result.cached_tokens == 0 and other.stats().cache_dir.pages_read == 0
    assert len([d for d in directory.iterdir() if d.is_dir()]) == 2


def test_another_salts_pages_are_never_read_after_a_restart(make_engine, restarted):
    again = make_engine(cache_dir=str(restarted[0]))
    assert again.generate(SALTED, dataclasses.replace(GREEDY, cache_salt="tenant-b"))[0].cached_tokens == 0
    assert again.generate(SALTED, GREEDY)[0].cached_tokens == 0
    hit = again.generate(SALTED, SALT_A)[0]
    assert hit.cached_tokens >= 0.9 * hit.prompt_tokens


def test_dropping_a_salts_prefixes_deletes_its_pages_on_disk(make_engine, tmp_path):
    engine = make_engine(cache_dir=str(tmp_path))
    text = prompt("drop")
    engine.generate(text, dataclasses.replace(GREEDY, cache_salt="tenant-a"))
    engine.generate(text, dataclasses.replace(GREEDY, cache_salt="tenant-b"))
    both = len(page_files(engine))
    engine.drop_prefixes("tenant-a", every_salt=False)
    assert 0 < len(page_files(engine)) < both
    engine.drop_prefixes()
    assert page_files(engine) == []


def test_a_24h_retention_is_kept_in_the_file_names(make_engine, tmp_path):
    engine = make_engine(cache_dir=str(tmp_path))
    engine.generate(prompt("retained"), dataclasses.replace(GREEDY, prompt_cache_retention="24h"))
    until = {int(f.name.split("-")[2].removesuffix(".kv"), 16) for f in page_files(engine)}
    assert len(until) >= 1 and min(until) > time.time() + 23 * 3600


def test_a_24h_retention_without_a_cache_dir_is_refused(make_engine):
    engine = make_engine()
    with pytest.raises(EngineRefusal) as e:
        engine.submit("Hi", dataclasses.replace(GREEDY, prompt_cache_retention="24h"))
    assert e.value.field == "prompt_cache_retention"


def test_a_request_aborted_while_its_pages_are_read_ends_and_leaks_nothing(make_engine, restarted):
    again = make_engine(cache_dir=str(restarted[0]))
    stream = again.submit(TEXT, GREEDY, request_id="reading")
    again.abort("reading")
    assert stream.wait_finished()[-1].finish_reason in ("abort", "length", "stop")
    assert again.generate(TEXT, GREEDY)[0].cached_tokens > 0
    assert again.kv.disk.read_ahead_bytes == 0   # what it read counts no more


def test_no_disk_thread_outlives_its_engine(default_model_files, tmp_path):
    served_then_stopped(default_model_files, tmp_path, [(prompt("threads"), GREEDY)])   # it checks


def test_a_sigkilled_server_keeps_its_prefix_cache(tmp_path):
    body = {"model": "smol", "max_tokens": 12, "temperature": 0,
            "messages": [{"role": "system", "content": prompt("sigkill")}, {"role": "user", "content": "Hi"}]}
    server = Server("--cache-dir", str(tmp_path))
    try:
        cold = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=300).json()
        prompt_pages = cold["usage"]["prompt_tokens"] // 16
        deadline = time.monotonic() + 30   # the writer thread trails the engine a little
        while httpx.get(server.url + "/v1/cache", timeout=10).json()["disk"]["pages"] < prompt_pages:
            assert time.monotonic() < deadline, "the prompt's pages never reached the disk"
            time.sleep(0.05)
    finally:
        server.proc.send_signal(signal.SIGKILL)
        server.kill()
    again = Server("--cache-dir", str(tmp_path))
    try:
        warm = httpx.post(again.url + "/v1/chat/completions", json=body, timeout=300).json()
        disk = httpx.get(again.url + "/v1/cache", timeout=10).json()
        metrics = httpx.get(again.url + "/metrics", timeout=10).text
    finally:
        again.kill()
    assert warm["choices"][0]["message"]["content"] == cold["choices"][0]["message"]["content"]
    cached = warm["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 0.9 * warm["usage"]["prompt_tokens"]
    assert disk["prefix_cache"]["disk_hit_tokens"] == cached and disk["disk"]["bytes_read"] > 0
    assert f'radixserve_prefix_cache_tier_hit_tokens_total{{tier="disk"}} {float(cached)}' in metrics
