"""`radixserve serve --replicas 2` on the embedded model: a real local Ray instance, Ray Serve's
HTTP proxy on loopback, two engine replicas, driven with the official OpenAI client."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from .api_server import free_port

MODEL = "smol"
REPLICA_HEADER = "x-radixserve-replica"
START_TIMEOUT = 240  # seconds: Ray, Serve and two engines on a busy 2-core machine


class Cluster:
    def __init__(self):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="radixserve-ray-", suffix=".log", delete=False)
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "radixserve.api.cli", "serve", "--replicas", "2", "--port", str(self.port),
             "--kv-cache-tokens", "4096", "--max-running-requests", "8", "--served-model-name", MODEL],
            stdout=self.log, stderr=subprocess.STDOUT, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        while "radixserve: ready at" not in self.output():
            assert self.proc.poll() is None, f"radixserve exited:\n{self.output()[-5000:]}"
            assert time.monotonic() - t0 < START_TIMEOUT, f"not ready in time:\n{self.output()[-5000:]}"
            time.sleep(0.2)
        self.start_seconds = time.monotonic() - t0
        self.ray_address = re.search(r"Ray started locally at (\S+);", self.output()).group(1)

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=120)

    def metric(self, sample: str) -> dict[str, float]:
        """Every sample of one metric, by its label text."""
        out = {}
        for line in httpx.get(self.url + "/metrics", timeout=10).text.splitlines():
            if line.startswith(sample):
                labels, value = line[len(sample):].rsplit(" ", 1)
                out[labels] = float(value)
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        os.unlink(self.log.name)


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    print(f"\n2-replica cluster ready in {c.start_seconds:.1f} s")
    try:
        yield c
    finally:
        c.stop()


def long_system_prompt(topic: str, words: int = 700) -> str:
    """~1,000 tokens of instructions that differ from the first token on, per topic."""
    rules = " ".join(f"Rule {i} about {topic}: answer item {i} with care." for i in range(words // 8))
    return f"{topic.upper()} ASSISTANT. {rules}"


def chat(cluster: Cluster, messages: list[dict], **kwargs):
    raw = cluster.client().chat.completions.with_raw_response.create(model=MODEL, messages=messages, **kwargs)
    return raw.headers.get(REPLICA_HEADER), raw.parse()


def test_chat_completion_through_the_openai_client(cluster):
    replica, reply = chat(cluster, [{"role": "user", "content": "Say hello."}], max_tokens=8, temperature=0)
    assert reply.choices[0].finish_reason in ("stop", "length") and reply.choices[0].message.content
    assert reply.usage.completion_tokens >= 1 and replica.startswith("SERVE_REPLICA::")


def test_streamed_chat_arrives_in_chunks_and_ends_with_a_finish_reason(cluster):
    chunks = list(cluster.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count to five."}], max_tokens=12, temperature=0,
        stream=True, extra_body={"ignore_eos": True}))   # the length, not the model's own end, stops it
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(chunks) >= 3 and text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_json_schema_reply_parses_and_validates(cluster):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                                "age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["name", "age"], "additionalProperties": False}
    _, reply = chat(cluster, [{"role": "user", "content": "Invent a person."}], max_tokens=60, temperature=0,
                    response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
    value = json.loads(reply.choices[0].message.content)
    assert set(value) == {"name", "age"} and isinstance(value["age"], int) and 0 <= value["age"] <= 120


def test_a_request_the_replica_refuses_is_a_400_in_openai_format(cluster):
    with pytest.raises(openai.BadRequestError) as e:
        chat(cluster, [{"role": "user", "content": "hi"}], max_tokens=5000)  # beyond the 4,096-token KV pool
    assert e.value.body["param"] == "max_tokens" and "KV cache" in e.value.body["message"]


def test_a_schema_the_grammar_cannot_compile_is_a_400_before_any_token(cluster):
    with pytest.raises(openai.BadRequestError) as e:
        chat(cluster, [{"role": "user", "content": "hi"}], max_tokens=5,
             response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {
                 "type": "object", "properties": {"a": {"type": "string", "pattern": "(unclosed"}}}}})
    assert e.value.body["param"] == "response_format#/properties/a/pattern"   # the keyword, across the replica


def test_requests_sharing_a_long_prefix_land_on_the_same_replica_and_reuse_its_cache(cluster):
    seen = set()
    for topic in ("weather", "chemistry", "sailing"):
        system = {"role": "system", "content": long_system_prompt(topic)}
        first_replica, first = chat(cluster, [system, {"role": "user", "content": "Item 1?"}], max_tokens=2)
        second_replica, second = chat(cluster, [system, {"role": "user", "content": "Item 2?"}], max_tokens=2)
        assert first.usage.prompt_tokens >= 1000
        assert second_replica == first_replica
        assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 32
        seen.add(first_replica)
    decisions = cluster.metric("radixserve_router_requests_total")
    assert any('reason="cached"' in k or 'reason="pending"' in k for k in decisions)
    assert len(seen) == 2  # cold prefixes went to the less loaded replica: both were used


def test_metrics_show_each_replicas_load_and_the_cluster_hit_ratio(cluster):
    chat(cluster, [{"role": "user", "content": "Hi"}], max_tokens=2)
    time.sleep(2.5)  # a report period or two
    assert len(cluster.metric("radixserve_replica_kv_cache_usage_ratio")) == 2
    assert 0.0 < cluster.metric("radixserve_cluster_prefix_hit_ratio")[""] <= 1.0


def test_the_cache_view_sums_the_replicas_pools_and_lists_no_prefixes(cluster):
    chat(cluster, [{"role": "user", "content": "Hello there"}], max_tokens=2)
    time.sleep(2.5)  # a report period or two
    view = httpx.get(cluster.url + "/v1/cache", timeout=30).json()
    pages = view["kv_pages"]
    assert pages["used"] + pages["cached"] + pages["free"] == 2 * 4096 // 16   # two pools of 4096 tokens
    assert pages["cached"] > 0
    assert view["prefixes"] == []   # each replica has its own tree


def test_a_client_that_disconnects_mid_stream_frees_its_replica(cluster):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Write a very long story."}],
            "max_tokens": 3000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", cluster.url + "/v1/chat/completions", json=body, timeout=60) as r:
        replica = r.headers[REPLICA_HEADER]
        running = f'{{replica="{replica}"}}'
        deadline = time.monotonic() + 20
        for _ in r.iter_lines():  # until the replica's report shows the request running
            if cluster.metric("radixserve_replica_requests_running").get(running, 0.0) >= 1.0:
                break
            assert time.monotonic() < deadline, "the replica never reported the request running"
    deadline = time.monotonic() + 20  # the story alone would run for minutes
    while cluster.metric("radixserve_replica_requests_running").get(running, 1.0) != 0.0:
        assert time.monotonic() < deadline, "the replica kept generating for a client that left"
        time.sleep(0.5)


def kill_replica_actor(cluster: Cluster, replica: str, failures: list) -> None:
    """ray.kill on the replica's actor, from a driver attached to the cluster (whose token
    `radixserve serve` left in ~/.ray/auth_token, as Ray does for any local cluster)."""
    code = ("import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR'); "
            "ray.kill(ray.get_actor(sys.argv[2], namespace='serve'), no_restart=True)")
    done = subprocess.run([sys.executable, "-c", code, cluster.ray_address, replica], timeout=60,
                          capture_output=True, text=True, env={**os.environ, "RAY_AUTH_MODE": "token"})
    if done.returncode:
        failures.append(done.stderr[-3000:])


def test_killing_a_replica_mid_stream_ends_that_stream_with_an_error_and_the_other_replica_serves_on(cluster):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Write a very long story."}],
            "max_tokens": 1500, "ignore_eos": True, "stream": True}
    events: list[str] = []
    with httpx.stream("POST", cluster.url + "/v1/chat/completions", json=body, timeout=90) as r:
        replica = r.headers[REPLICA_HEADER]
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("data:"):
                events.append(line[5:].strip())
                if len(events) == 3:
                    break
        failures: list[str] = []
        killer = threading.Thread(target=kill_replica_actor, args=(cluster, replica, failures))
        killer.start()
        for line in lines:
            if line.startswith("data:"):
                events.append(line[5:].strip())
            if failures:
                break
        killer.join()
    assert not failures, failures[0]
    payloads = [json.loads(e) for e in events if e != "[DONE]"]
    assert "error" in payloads[-1], payloads[-3:]
    assert payloads[-1]["error"]["type"] == "server_error"
    assert not any(p.get("choices", [{}])[0].get("finish_reason") for p in payloads[:-1] if "choices" in p)
    for i in range(3):
        survivor, reply = chat(cluster, [{"role": "user", "content": f"Say {i}."}], max_tokens=4)
        assert reply.choices[0].message.content and survivor != replica
