"""Tenant isolation in the prefix cache: `cache_salt` (vLLM's field) on chat, completions and
Responses. Requests share cached prefixes only with requests of the same salt; no salt is the
shared cache. OpenAI's `prompt_cache_key` names a request's prefix group in the metrics (and keeps
it on one replica: tests/test_prefix_routing.py); `prompt_cache_retention: in_memory` is accepted."""
import uuid

import httpx
import pytest

from radixserve.runtime.scheduler import MAX_CACHE_KEYS, OTHER_CACHE_KEYS, SchedulerStats


def long_prompt(tag: str) -> str:
    """A prompt no other test sends, several pages long."""
    return f"[{tag} {uuid.uuid4().hex}] " + "You are a careful assistant for a shipping company. " * 12


def chat_cached(api, system: str, **extra) -> int:
    r = httpx.post(api.base_url + "/chat/completions", timeout=120, json={
        "model": api.model, "max_tokens": 1, "temperature": 0,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Hi"}], **extra})
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_another_salt_gets_no_cached_tokens_on_an_identical_prompt(api):
    system = long_prompt("salt")
    chat_cached(api, system, cache_salt="tenant-a")
    assert chat_cached(api, system, cache_salt="tenant-b") == 0


def test_the_same_salt_hits(api):
    system = long_prompt("salt")
    chat_cached(api, system, cache_salt="tenant-a")
    assert chat_cached(api, system, cache_salt="tenant-a") >= 64


def test_unsalted_and_salted_requests_never_share(api):
    shared, salted = long_prompt("shared"), long_prompt("salted")
    chat_cached(api, shared)
    assert chat_cached(api, shared, cache_salt="tenant-a") == 0
    chat_cached(api, salted, cache_salt="tenant-a")
    assert chat_cached(api, salted) == 0


def test_completions_take_the_salt(api):
    prompt = long_prompt("completions")

    def cached(salt: str) -> int:
        r = httpx.post(api.base_url + "/completions", timeout=120, json={
            "model": api.model, "prompt": prompt, "max_tokens": 1, "cache_salt": salt})
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    cached("a")
    assert cached("b") == 0 and cached("a") >= 64


def test_responses_take_the_salt(api):
    instructions = long_prompt("responses")

    def cached(salt: str) -> int:
        r = httpx.post(api.base_url + "/responses", timeout=120, json={
            "model": api.model, "instructions": instructions, "input": "Hi", "max_output_tokens": 1,
            "cache_salt": salt})
        assert r.status_code == 200, r.text
        return r.json()["usage"]["input_tokens_details"]["cached_tokens"]

    cached("a")
    assert cached("b") == 0 and cached("a") >= 64


@pytest.mark.parametrize("salt", ["", "x" * 257, 7])
def test_a_bad_salt_is_a_400_naming_cache_salt(api, salt):
    r = httpx.post(api.base_url + "/chat/completions", timeout=60, json={
        "model": api.model, "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}], "cache_salt": salt})
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt", r.text


def test_openai_cache_controls_are_accepted(api):
    assert chat_cached(api, long_prompt("key"), prompt_cache_key="agent-1", prompt_cache_retention="in_memory") == 0


def test_a_retention_this_server_cannot_keep_is_refused(api):
    r = httpx.post(api.base_url + "/chat/completions", timeout=60, json={
        "model": api.model, "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}],
        "prompt_cache_retention": "24h"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_cache_retention", r.text


def test_deleting_one_salts_cache_leaves_the_other_tenants(api):
    system = long_prompt("delete")
    chat_cached(api, system, cache_salt="tenant-a")
    chat_cached(api, system, cache_salt="tenant-b")
    r = httpx.delete(api.base_url + "/cache", params={"cache_salt": "tenant-a"}, timeout=30)
    assert r.status_code == 200 and r.json()["dropped_tokens"] >= 64, r.text
    assert chat_cached(api, system, cache_salt="tenant-a") == 0
    assert chat_cached(api, system, cache_salt="tenant-b") >= 64


def test_deleting_the_cache_drops_every_prefix_and_leaks_no_page(api):
    chat_cached(api, long_prompt("delete-all"))
    api.wait_idle()
    r = httpx.delete(api.base_url + "/cache", timeout=30)
    assert r.status_code == 200 and r.json()["dropped_tokens"] > 0
    assert httpx.get(api.base_url + "/cache", timeout=30).json()["kv_pages"]["cached"] == 0
    api.check_pages()


def test_prompt_cache_key_names_its_prompt_and_hit_tokens_in_metrics(api):
    key = "agent-" + uuid.uuid4().hex[:8]
    system = long_prompt("key-metrics")
    r1 = httpx.post(api.base_url + "/chat/completions", timeout=120, json={
        "model": api.model, "max_tokens": 1, "prompt_cache_key": key,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Hi"}]}).json()
    cached = chat_cached(api, system, prompt_cache_key=key)
    label = f'key="{key}"'
    prompt = api.metric("radixserve_prompt_cache_key_prompt_tokens_total", label)
    hits = api.metric("radixserve_prompt_cache_key_hit_tokens_total", label)
    assert prompt == 2 * r1["usage"]["prompt_tokens"] and hits == cached > 0


def test_prompt_cache_keys_in_metrics_are_bounded():
    stats = SchedulerStats()
    for i in range(MAX_CACHE_KEYS + 5):
        stats.count_cache_key(f"k{i}", 10, 1)
    assert len(stats.by_cache_key) == MAX_CACHE_KEYS + 1
    assert stats.by_cache_key[OTHER_CACHE_KEYS] == [50, 5]
