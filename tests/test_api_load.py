"""Many clients at once, clients that go away, and the metrics that show both."""
from __future__ import annotations

import asyncio
import time

import httpx

USER = [{"role": "user", "content": "Tell me a long story about a dragon."}]


def wait_for_metric(api, name: str, value: float, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while api.metric(name) != value:
        assert time.monotonic() < deadline, f"{name} is {api.metric(name)}, expected {value}"
        time.sleep(0.05)


def test_32_concurrent_streams_all_finish(api):
    async def one(client, i: int) -> tuple[str, str]:
        stream = await client.chat.completions.create(
            model=api.model, messages=[{"role": "user", "content": f"Count to {i + 3}."}], max_tokens=6,
            temperature=0, stream=True)
        text, reason = [], None
        async for chunk in stream:
            if chunk.choices:
                text.append(chunk.choices[0].delta.content or "")
                reason = chunk.choices[0].finish_reason or reason
        return "".join(text), reason

    async def run_all():
        async with api.async_client() as client:
            return await asyncio.gather(*(one(client, i) for i in range(32)))

    results = asyncio.run(run_all())
    assert len(results) == 32
    assert all(text and reason in ("stop", "length") for text, reason in results)


def test_closing_streams_aborts_their_requests(api):
    aborted_before = api.metric("radixserve_requests_total", 'finish_reason="abort"')
    client = api.client()
    streams = [client.chat.completions.create(model=api.model, messages=USER, max_tokens=500, temperature=0,
                                              stream=True, extra_body={"ignore_eos": True}) for _ in range(4)]
    for s in streams:
        next(iter(s))  # the request is running
    assert api.metric("radixserve_num_requests_running") + api.metric("radixserve_num_requests_waiting") >= 1
    for s in streams:
        s.close()
    wait_for_metric(api, "radixserve_num_requests_running", 0)
    wait_for_metric(api, "radixserve_num_requests_waiting", 0)
    assert api.metric("radixserve_requests_total", 'finish_reason="abort"') == aborted_before + 4


def test_client_timeout_on_a_whole_reply_aborts_it(api):
    body = {"model": api.model, "messages": USER, "max_tokens": 2000, "temperature": 0, "ignore_eos": True}
    try:
        httpx.post(api.base_url + "/chat/completions", json=body, timeout=0.5)
        raise AssertionError("2000 tokens should take longer than half a second")
    except httpx.ReadTimeout:
        pass
    wait_for_metric(api, "radixserve_num_requests_running", 0)
    wait_for_metric(api, "radixserve_num_requests_waiting", 0)


def test_metrics_expose_engine_and_request_series(api):
    api.client().chat.completions.create(model=api.model, messages=USER, max_tokens=3, temperature=0)
    text = httpx.get(api.url + "/metrics").text
    for name in ("radixserve_num_requests_running", "radixserve_num_requests_waiting",
                 "radixserve_kv_cache_usage_ratio", "radixserve_prefix_cache_queried_tokens_total",
                 "radixserve_prefix_cache_hit_tokens_total", "radixserve_prompt_tokens_total",
                 "radixserve_generation_tokens_total", "radixserve_preemptions_total",
                 'radixserve_requests_total{finish_reason="length"}',
                 "radixserve_time_to_first_token_seconds_bucket", "radixserve_time_per_output_token_seconds_bucket",
                 "radixserve_e2e_request_latency_seconds_bucket"):
        assert name in text, name
    assert api.metric("radixserve_generation_tokens_total") >= 3
    assert api.metric("radixserve_time_to_first_token_seconds_count") >= 1
