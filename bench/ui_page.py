"""The web page at `/` in headless Chromium, against `radixserve serve` (default model) in a subprocess:

  load     from navigation to the page being ready (its modules loaded, /v1/models answered, the
           model shown), and the browser's own loadEventEnd, each in a fresh browser context (no
           HTTP cache); N runs, median and spread.
  ttft     the first token on the page (the page's own TTFT: from its fetch call to the first
           token added to the DOM) against the API's TTFT (httpx reading raw SSE from Python: from
           sending to the first non-empty delta.content), same request shape, temperature 0,
           alternating, each trial with its own system prompt so neither side gets a cache hit
           the other does not; median / p90 of each and of page minus API.
  hygiene  console errors and requests to any other origin, over everything the script did.

Also saves screenshots of the chat (text, JSON schema and tool turns) and of the cache view to
bench/results/ui_chat.png and bench/results/ui_cache.png. Writes bench/results/ui_page.json.
Reports figures, never asserts.

    .venv/bin/python bench/ui_page.py [--runs 10] [--pairs 10]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import httpx
from local_server import LocalServer  # bench/, beside this script
from playwright.sync_api import expect, sync_playwright

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from browser import CHROMIUM_ARGS, PageLog, chromium_path  # noqa: E402  (tests/browser.py)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
RESULTS = ROOT / "bench" / "results"
QUESTION = "Write one sentence about the sea."
MAX_TOKENS = 16


def summary(values: list[float]) -> dict:
    values = sorted(values)
    return {"median": round(statistics.median(values), 1), "min": round(values[0], 1), "max": round(values[-1], 1),
            "p90": round(values[int(0.9 * (len(values) - 1))], 1), "n": len(values)}


def open_page(browser, url: str, log: PageLog):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    log.watch(page)
    t0 = time.perf_counter()
    page.goto(url + "/")
    expect(page.locator("#server-status")).to_have_text("ready")
    ready_ms = (time.perf_counter() - t0) * 1000
    load_ms = page.evaluate("performance.getEntriesByType('navigation')[0].loadEventEnd")
    return context, page, ready_ms, load_ms


def api_ttft_ms(url: str, model: str, system: str) -> float:
    body = {"model": model, "stream": True, "max_tokens": MAX_TOKENS, "temperature": 0,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": QUESTION}]}
    first = None
    t0 = time.perf_counter()
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if first is None and line.startswith("data: {"):
                choices = json.loads(line[6:]).get("choices") or [{}]
                if choices[0].get("delta", {}).get("content"):
                    first = (time.perf_counter() - t0) * 1000
    return first


def page_ttft_ms(page, system: str) -> float:
    page.click("#new-chat")   # one message, as the API side sends
    page.fill("#system", system)
    page.fill("#prompt", QUESTION)
    page.click("#send")
    reply = page.locator("#messages .msg.assistant").first
    expect(reply).to_have_attribute("data-state", "done", timeout=120_000)
    return float(reply.get_attribute("data-ttft-ms"))


def screenshots(page) -> None:
    page.click("#new-chat")
    page.fill("#temperature", "0")
    page.fill("#max-tokens", "128")
    page.fill("#system", "You are a helpful assistant.")
    for mode, prompt, choice in (("text", "What is the capital of France? Answer in one sentence.", None),
                                 ("json_schema", "Describe Ada Lovelace.", None),
                                 ("tools", "Weather in Paris?", "required")):
        page.select_option("#mode", mode)
        if choice:
            page.select_option("#tool-choice", choice)
        count = page.locator("#messages .msg.assistant").count()
        page.fill("#prompt", prompt)
        page.click("#send")
        expect(page.locator("#messages .msg.assistant").nth(count)).to_have_attribute("data-state", "done",
                                                                                      timeout=120_000)
    page.fill(".tool-result", "22 degrees and sunny")
    page.select_option("#tool-choice", "none")
    count = page.locator("#messages .msg.assistant").count()
    page.click(".tool-results button")
    expect(page.locator("#messages .msg.assistant").nth(count)).to_have_attribute("data-state", "done",
                                                                                  timeout=120_000)
    page.wait_for_timeout(2500)   # a few more samples on the chart
    page.screenshot(path=RESULTS / "ui_chat.png")
    page.locator("#cache").screenshot(path=RESULTS / "ui_cache.png")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10, help="page loads")
    ap.add_argument("--pairs", type=int, default=10, help="TTFT trials of each side")
    args = ap.parse_args()
    log = PageLog()
    with LocalServer("--kv-cache-tokens", "16384") as server, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        model = httpx.get(server.url + "/v1/models", timeout=30).json()["data"][0]["id"]
        ready, loads = [], []
        for _ in range(args.runs):
            context, _, ready_ms, load_ms = open_page(browser, server.url, log)
            ready.append(ready_ms)
            loads.append(load_ms)
            context.close()
        context, page, _, _ = open_page(browser, server.url, log)
        page.fill("#temperature", "0")
        page.fill("#max-tokens", str(MAX_TOKENS))
        for warm in range(2):
            api_ttft_ms(server.url, model, f"Warm-up {warm}. You are a helpful assistant.")
            page_ttft_ms(page, f"Warm-up page {warm}. You are a helpful assistant.")
        api, shown, gaps = [], [], []
        for i in range(args.pairs):
            a = api_ttft_ms(server.url, model, f"Trial {i} of the API. You are a helpful assistant.")
            s = page_ttft_ms(page, f"Trial {i} of the page. You are a helpful assistant.")
            api.append(a)
            shown.append(s)
            gaps.append(s - a)
        screenshots(page)
        context.close()
        browser.close()
    outside = [u for u in log.requests if not (u.startswith(server.url + "/") or u.startswith("data:"))]
    report = {
        "what": "the page at / in headless Chromium against radixserve serve (default model), one sitting",
        "command": "bench/ui_page.py " + " ".join(sys.argv[1:]),
        "page_ready_ms": summary(ready), "load_event_ms": summary(loads),
        "ttft_api_ms": summary(api), "ttft_page_ms": summary(shown), "page_minus_api_ms": summary(gaps),
        "console_errors": log.errors, "outside_requests": outside,
        "screenshots": ["bench/results/ui_chat.png", "bench/results/ui_cache.png"],
    }
    (RESULTS / "ui_page.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
