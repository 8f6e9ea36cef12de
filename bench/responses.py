"""The Responses API against chat completions, on `radixserve serve` (default model) in a subprocess:

  ttft    time from sending the request to the first `response.output_text.delta` event of a
          streamed POST /v1/responses, against the first non-empty `delta.content` of a streamed
          POST /v1/chat/completions, same prompt, temperature 0; the two alternate, N each (after
          two warm-up pairs), median / p90 reported. Both read raw SSE with httpx, so client
          parsing weighs the same on both sides.
  resume  a first turn with a ~1,000-token input, then a second turn sent with only
          previous_response_id and a short new input: the second turn's input_tokens and
          cached_tokens (the radix tree still holds turn one's prompt and output), and its time to
          the completed response against the first turn's.

Writes bench/results/responses.json. Reports figures, never asserts.

    .venv/bin/python bench/responses.py [--pairs 20] [--port 0]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import httpx
from local_server import LocalServer  # bench/, beside this script

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "responses.json"
PROMPT = "Write one sentence about the sea."
MAX_TOKENS = 16


def first_delta_seconds(client: httpx.Client, path: str, body: dict, is_first) -> float:
    """Seconds from sending `body` to the first SSE data line for which `is_first(event)` holds;
    the rest of the stream is read to the end so the next request starts on an idle server."""
    t0 = time.perf_counter()
    first = None
    with client.stream("POST", path, json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            if first is None and is_first(json.loads(line[len("data: "):])):
                first = time.perf_counter() - t0
    if first is None:
        raise RuntimeError(f"{path}: no text delta in the stream")
    return first


def responses_text(event: dict) -> bool:
    return event.get("type") == "response.output_text.delta" and bool(event.get("delta"))


def chat_text(chunk: dict) -> bool:
    return any(c.get("delta", {}).get("content") for c in chunk.get("choices", []))


def part_ttft(client: httpx.Client, model: str, pairs: int) -> dict:
    responses_body = {"model": model, "input": PROMPT, "stream": True, "temperature": 0,
                      "max_output_tokens": MAX_TOKENS, "store": False}
    chat_body = {"model": model, "messages": [{"role": "user", "content": PROMPT}], "stream": True,
                 "temperature": 0, "max_tokens": MAX_TOKENS}
    times: dict[str, list[float]] = {"responses": [], "chat": []}
    for i in range(pairs + 2):
        r = first_delta_seconds(client, "/v1/responses", responses_body, responses_text)
        c = first_delta_seconds(client, "/v1/chat/completions", chat_body, chat_text)
        if i >= 2:  # two warm-up pairs
            times["responses"].append(r)
            times["chat"].append(c)

    def summary(xs: list[float]) -> dict:
        xs = sorted(xs)
        return {"median_ms": round(statistics.median(xs) * 1000, 2),
                "p90_ms": round(xs[int(0.9 * (len(xs) - 1))] * 1000, 2), "n": len(xs)}

    return {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "responses_first_output_text_delta": summary(times["responses"]),
            "chat_first_content_delta": summary(times["chat"])}


def long_input(tokens: int, client: httpx.Client) -> str:
    """A text of about `tokens` tokens (counted by the server's tokenizer)."""
    sentences = [f"Note {i}: the lighthouse keeper logged wind from the {d} at {i % 9 + 2} knots."
                 for i, d in zip(range(400), ["north", "south", "east", "west"] * 100)]
    text = ""
    for s in sentences:
        candidate = (text + " " + s).strip()
        count = client.post("/tokenize", json={"prompt": candidate}).json()["count"]
        if count > tokens:
            break
        text = candidate
    return text


def part_resume(client: httpx.Client, model: str, first_tokens: int) -> dict:
    text = long_input(first_tokens, client)
    t0 = time.perf_counter()
    first = client.post("/v1/responses", json={"model": model, "input": "Summarise this log:\n" + text,
                                               "temperature": 0, "max_output_tokens": 32}).json()
    t1 = time.perf_counter()
    second = client.post("/v1/responses", json={"model": model, "previous_response_id": first["id"],
                                                "input": "Which direction was the wind at note 3?",
                                                "temperature": 0, "max_output_tokens": 32}).json()
    t2 = time.perf_counter()
    u1, u2 = first["usage"], second["usage"]
    return {"first_turn": {"input_tokens": u1["input_tokens"], "output_tokens": u1["output_tokens"],
                           "cached_tokens": u1["input_tokens_details"]["cached_tokens"], "seconds": round(t1 - t0, 3)},
            "second_turn": {"input_tokens": u2["input_tokens"], "output_tokens": u2["output_tokens"],
                            "cached_tokens": u2["input_tokens_details"]["cached_tokens"],
                            "new_tokens_prefilled": u2["input_tokens"] - u2["input_tokens_details"]["cached_tokens"],
                            "seconds": round(t2 - t1, 3)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--first-turn-tokens", type=int, default=1000)
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    args = parser.parse_args()
    with LocalServer(port=args.port) as server, httpx.Client(base_url=server.url, timeout=300) as client:
        model = client.get("/v1/models").json()["data"][0]["id"]
        result = {"model": model, "cpu_count": os.cpu_count(),
                  "ttft": part_ttft(client, model, args.pairs),
                  "resume": part_resume(client, model, args.first_turn_tokens)}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
