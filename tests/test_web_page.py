"""The page at `/`, in a real headless Chromium, against `radixserve serve` on the embedded model,
with an API key (the page asks for it once, keeps it in session storage and sends it on every call).
Every test also checks that the page logged no console error and fetched nothing from outside."""
from __future__ import annotations

import json
import re
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from playwright.sync_api import expect, sync_playwright

from .api_server import free_port
from .browser import CHROMIUM_ARGS, PageLog, chromium_path

KEY = "page-test-key"
LAST = "#messages .msg.assistant >> nth=-1"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "radixserve.api.cli", "serve", "--port", str(port), "--api-key", KEY,
         "--kv-cache-tokens", "16384", "--log-level", "warning", "--cache-dir", str(tmp_path_factory.mktemp("kv"))],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the server did not become ready"
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "Traceback" not in err, err


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        yield b
        b.close()


class Chat:
    """The page, opened and given the key, with its log."""

    def __init__(self, page, log: PageLog):
        self.page, self.log = page, log

    def settings(self, *, temperature="0", max_tokens="48", mode="text", system=None, api="chat"):
        p = self.page
        p.select_option("#api", api)
        p.fill("#temperature", temperature)
        p.fill("#max-tokens", max_tokens)
        p.select_option("#mode", mode)
        if system is not None:
            p.fill("#system", system)

    def send(self, text: str):
        count = self.page.locator("#messages .msg.assistant").count()
        self.page.fill("#prompt", text)
        self.page.click("#send")
        reply = self.page.locator("#messages .msg.assistant").nth(count)
        expect(reply).to_have_attribute("data-state", "streaming", timeout=10_000)
        return reply

    @staticmethod
    def finished(reply, timeout: float = 120_000):
        expect(reply).to_have_attribute("data-state", "done", timeout=timeout)
        return reply


@pytest.fixture
def chat(browser, server):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    log = PageLog()
    log.watch(page)
    page.goto(server + "/")
    expect(page.locator("#key-dialog")).to_be_visible()
    page.fill("#api-key", KEY)
    page.click("#key-form button")
    expect(page.locator("#server-status")).to_have_text("ready")
    yield Chat(page, log)
    context.close()
    assert log.errors == []
    outside = [u for u in log.requests if not (u.startswith(server + "/") or u.startswith("data:"))]
    assert outside == []


def running(server: str) -> float:
    for line in httpx.get(server + "/metrics", timeout=10).text.splitlines():
        if line.startswith("radixserve_num_requests_running "):
            return float(line.split()[-1])
    raise AssertionError("no running gauge in /metrics")


def test_the_key_is_kept_in_session_storage_and_sent_with_every_call(chat):
    stored = chat.page.evaluate("sessionStorage.getItem('radixserve.apiKey')")
    local = chat.page.evaluate("localStorage.length")
    assert stored == KEY and local == 0
    chat.settings(max_tokens="4")
    chat.finished(chat.send("Hi"))
    assert chat.log.bodies["v1/chat/completions"]


def test_a_streamed_reply_appears_token_by_token(chat):
    chat.page.evaluate("""() => {
        window.lengths = [];
        new MutationObserver(() => {
            const c = document.querySelector('#messages .msg.assistant:last-of-type .content');
            if (c) window.lengths.push(c.textContent.length);
        }).observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true});
    }""")
    chat.settings(max_tokens="32")
    reply = chat.finished(chat.send("Tell me about the sea."))
    lengths = [n for n in chat.page.evaluate("window.lengths") if n]
    text = reply.locator(".content").inner_text()
    assert len(set(lengths)) >= 8, lengths   # many distinct partial texts, not one block at the end
    assert lengths == sorted(lengths) and lengths[-1] == len(text)
    assert "TTFT" in reply.locator(".stats").inner_text() and "tok/s" in reply.locator(".stats").inner_text()


def test_stop_ends_the_stream_and_frees_the_request(chat, server):
    chat.settings(temperature="0.8", max_tokens="2000")
    reply = chat.send("Write a very long story about a dragon who learns to sail.")
    expect(reply).to_have_attribute("data-first-token-at", re.compile(r"^\d"), timeout=60_000)
    chat.page.click("#stop")
    expect(reply).to_have_attribute("data-state", "stopped", timeout=10_000)
    deadline = time.monotonic() + 30
    while running(server) != 0:
        assert time.monotonic() < deadline, "the stopped request still runs"
        time.sleep(0.1)
    expect(chat.page.locator("#running")).to_have_text("0", timeout=10_000)
    assert chat.page.is_enabled("#send") and not chat.page.is_enabled("#stop")


def test_a_second_message_with_the_same_system_prompt_shows_cached_tokens(chat):
    system = "You are Captain Orla, a ship's cook who answers in one short sentence. " * 6
    chat.settings(max_tokens="8", system=system)
    first_cached = int(chat.finished(chat.send("What is for dinner?")).get_attribute("data-cached-tokens"))
    chat.page.click("#new-chat")   # a new conversation: the same system prompt, another question
    second = chat.finished(chat.send("And for breakfast?"))
    second_cached = int(second.get_attribute("data-cached-tokens"))
    assert second_cached > first_cached
    assert f"{second_cached} of" in second.locator(".cached").inner_text()


def test_a_json_schema_reply_is_shown_valid(chat):
    chat.settings(max_tokens="100", mode="json_schema")
    chat.page.select_option("#schema-example", "person")
    reply = chat.finished(chat.send("Describe Ada Lovelace."))
    validity = reply.locator(".validity")
    expect(validity).to_have_attribute("data-valid", "true")
    shown = json.loads(reply.locator("pre.json").inner_text())
    assert set(shown) == {"name", "born"} and 1800 <= shown["born"] <= 1900
    body = chat.log.bodies["v1/chat/completions"][-1]
    assert body["response_format"]["json_schema"]["schema"]["required"] == ["name", "born"]


def test_a_required_tool_call_shows_its_arguments(chat):
    chat.settings(max_tokens="64", mode="tools")
    chat.page.select_option("#tool-choice", "required")
    reply = chat.finished(chat.send("Weather in Paris?"))
    call = reply.locator(".tool-call").first
    assert call.locator(".name").inner_text() in ("get_weather", "get_time")
    assert isinstance(json.loads(call.locator(".args").inner_text()), dict)
    assert reply.get_attribute("data-finish") == "tool_calls"


def test_a_tool_result_continues_the_turn(chat):
    chat.settings(max_tokens="32", mode="tools")
    chat.page.select_option("#tool-choice", "function:get_weather")
    chat.finished(chat.send("Weather in Paris?"))
    chat.page.select_option("#tool-choice", "none")
    chat.page.fill(".tool-result", "22 degrees and sunny")
    chat.page.click(".tool-results button")
    answer = chat.page.locator("#messages .msg.assistant").nth(1)
    chat.finished(answer)
    assert answer.locator(".content").inner_text().strip()
    sent = chat.log.bodies["v1/chat/completions"][-1]["messages"]
    assert [m["role"] for m in sent[-2:]] == ["assistant", "tool"]
    assert sent[-1]["content"] == "22 degrees and sunny" and sent[-1]["tool_call_id"] == sent[-2]["tool_calls"][0]["id"]


def test_the_responses_api_continues_from_the_previous_response(chat):
    chat.settings(max_tokens="8", api="responses")
    chat.finished(chat.send("Name a colour."))
    second = chat.finished(chat.send("Name another one."))
    first_body, second_body = chat.log.bodies["v1/responses"][-2:]
    assert "previous_response_id" not in first_body
    assert second_body["previous_response_id"].startswith("resp")
    assert int(second.get_attribute("data-cached-tokens")) > 0


def test_the_cache_view_shows_the_pool_filling(chat):
    page = chat.page
    expect(page.locator("#kv-chart")).to_have_attribute("data-samples", re.compile(r"^\d"), timeout=10_000)
    before = int(page.inner_text("#kv-cached"))
    chat.settings(max_tokens="4", system="A fresh system prompt about lighthouses and their keepers. " * 8)
    chat.finished(chat.send("Hello"))
    expect(page.locator("#kv-cached")).not_to_have_text(str(before), timeout=10_000)
    assert int(page.inner_text("#kv-cached")) > before
    assert int(page.get_attribute("#kv-chart", "data-samples")) >= 2
    assert page.locator("#prefixes tbody tr").count() > 0
    assert page.inner_text("#hit-ratio").endswith("%")


def test_the_cache_view_shows_the_pages_on_disk(chat):
    page = chat.page
    chat.settings(max_tokens="4", system="Another system prompt, about canals and their locks. " * 8)
    chat.finished(chat.send("Hello"))
    expect(page.locator("#disk")).to_be_visible(timeout=10_000)
    expect(page.locator("#disk-pages")).not_to_have_text(re.compile(r"^(–|0)$"), timeout=10_000)
    assert page.inner_text("#disk-max") == "17.2 GB"   # --cache-dir-size's default, 16 GiB


def test_a_wrong_key_is_refused_and_asked_for_again(browser, server):
    context = browser.new_context()
    page = context.new_page()
    log = PageLog()
    log.watch(page)
    page.goto(server + "/")
    page.fill("#api-key", "not-the-key")
    page.click("#key-form button")
    expect(page.locator("#key-dialog")).to_be_visible()
    expect(page.locator("#notice")).to_have_text("incorrect API key provided")
    assert page.evaluate("sessionStorage.length") == 0   # a refused key is not kept
    context.close()
    # the browser reports the refused call itself, and nothing else
    assert log.errors and all("401" in e for e in log.errors), log.errors
