"""Jump-forward decoding against `--no-jump-forward`, side by side in one sitting (issue 35's figure).

Two `radixserve serve` processes on the default model, one with jump-forward (the default) and one
without. Each round sends the same 16 chat requests (4 schemas with long snake_case keys, greedy,
streamed) at concurrency 4 through the official client, first to one server, then to the other, the
order alternating between rounds. Reported per side, as the median over rounds with the range:
the round's wall time, output tokens/s, forward passes per request (completion tokens less the
forced ones: a sampled token costs one pass, a forced run rides in the next), and time to first
token (the median per round; and pooled over every request of every round, median and p90, the
steadier figure where a round's 16 requests are few). Every output is validated against its schema.

Writes bench/results/jump_forward.json (or --out). Reports figures, never asserts.

    .venv/bin/python bench/jump_forward.py [--rounds 5] [--requests 16] [--concurrency 4] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
from openai import OpenAI

from compare import machine  # bench/, beside this script
from local_server import LocalServer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
RESULTS = Path(__file__).resolve().parent / "results" / "jump_forward.json"


def _obj(props: dict) -> dict:
    return {"type": "object", "additionalProperties": False, "required": list(props), "properties": props}


SCHEMAS = {
    "order": _obj({
        "customer_full_name": {"type": "string", "maxLength": 24},
        "customer_shipping_address": {"type": "string", "maxLength": 32},
        "preferred_delivery_window": {"enum": ["morning_before_noon", "afternoon_after_lunch", "evening_after_six"]},
        "order_total_amount_in_cents": {"type": "integer", "minimum": 0, "maximum": 1000000},
        "is_gift_wrapping_requested": {"type": "boolean"},
        "requires_signature_on_delivery": {"type": "boolean"}}),
    "incident": _obj({
        "incident_severity_level": {"enum": ["sev1_critical_outage", "sev2_partial_degradation", "sev3_minor_issue"]},
        "affected_service_identifier": {"type": "string", "maxLength": 24},
        "customer_facing_impact_detected": {"type": "boolean"},
        "estimated_minutes_until_resolution": {"type": "integer", "minimum": 0, "maximum": 10000},
        "responsible_on_call_engineer": {"type": "string", "maxLength": 24}}),
    "profile": _obj({
        "account_holder_display_name": {"type": "string", "maxLength": 24},
        "account_created_year": {"type": "integer", "minimum": 1990, "maximum": 2030},
        "notification_preferences": _obj({
            "email_notifications_enabled": {"type": "boolean"},
            "sms_notifications_enabled": {"type": "boolean"},
            "weekly_digest_subscription_active": {"type": "boolean"}}),
        "preferred_interface_language": {"enum": ["english_united_states", "english_united_kingdom",
                                                  "german_germany", "french_france"]}}),
    "listing": _obj({
        "product_listing_title": {"type": "string", "maxLength": 32},
        "product_category_path": {"type": "array", "items": {"enum": ["home_and_kitchen", "outdoor_equipment",
                                                                     "consumer_electronics"]},
                                  "minItems": 1, "maxItems": 2},
        "listing_price_in_cents": {"type": "integer", "minimum": 0, "maximum": 100000},
        "currently_available_for_shipping": {"type": "boolean"},
        "warehouse_location_code": {"type": "string", "maxLength": 12}}),
}


def workload(n: int) -> list[tuple[str, dict, list[dict]]]:
    names = list(SCHEMAS)
    out = []
    for i in range(n):
        name = names[i % len(names)]
        messages = [{"role": "user", "content": f"Write record number {i} of kind {name} as JSON."}]
        out.append((name, SCHEMAS[name], messages))
    return out


def one(client: OpenAI, model: str, item, max_tokens: int) -> dict:
    name, schema, messages = item
    t0 = time.perf_counter()
    first, text, usage, reason = None, [], None, None
    stream = client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=max_tokens, stream=True,
        stream_options={"include_usage": True},
        response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}})
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                first = first or time.perf_counter()
                text.append(choice.delta.content)
            reason = choice.finish_reason or reason
    body = "".join(text)
    valid = reason == "stop"
    if valid:
        try:
            jsonschema.validate(json.loads(body), schema)
        except (ValueError, jsonschema.ValidationError):
            valid = False
    details = (usage.completion_tokens_details.model_extra or {}) if usage.completion_tokens_details else {}
    return {"ttft": (first or time.perf_counter()) - t0, "tokens": usage.completion_tokens,
            "forced": details.get("forced_tokens", 0), "valid": valid, "finish": reason}


def run_round(url: str, items, concurrency: int, max_tokens: int) -> dict:
    client = OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda it: one(client, model, it, max_tokens), items))
    wall = time.perf_counter() - t0
    tokens = sum(r["tokens"] for r in results)
    return {"wall_s": wall, "output_tok_per_s": tokens / wall, "output_tokens": tokens,
            "passes_per_request": statistics.mean(r["tokens"] - r["forced"] for r in results),
            "forced_per_request": statistics.mean(r["forced"] for r in results),
            "tokens_per_request": tokens / len(results),
            "ttft_median_s": statistics.median(r["ttft"] for r in results),
            "ttfts_s": [round(r["ttft"], 4) for r in results],
            "invalid": sum(not r["valid"] for r in results),
            "finish": sorted({r["finish"] for r in results})}


def summary(rounds: list[dict]) -> dict:
    out = {}
    for key in ("wall_s", "output_tok_per_s", "passes_per_request", "forced_per_request", "tokens_per_request",
                "ttft_median_s"):
        values = [r[key] for r in rounds]
        out[key] = {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
                    "max": round(max(values), 4)}
    pooled = sorted(t for r in rounds for t in r["ttfts_s"])
    out["ttft_pooled_s"] = {"median": round(statistics.median(pooled), 4),
                            "p90": round(pooled[int(0.9 * (len(pooled) - 1))], 4), "requests": len(pooled)}
    out["invalid"] = sum(r["invalid"] for r in rounds)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    items = workload(args.requests)
    sides = {"jump_forward": [], "no_jump_forward": []}
    with LocalServer() as on, LocalServer("--no-jump-forward") as off:
        servers = {"jump_forward": on, "no_jump_forward": off}
        for side, server in servers.items():   # warm: grammars compiled, prompts cached
            run_round(server.url, items[:len(SCHEMAS)], args.concurrency, args.max_tokens)
        for r in range(args.rounds):
            order = list(servers) if r % 2 == 0 else list(servers)[::-1]
            for side in order:
                result = run_round(servers[side].url, items, args.concurrency, args.max_tokens)
                sides[side].append(result)
                print(f"round {r} {side}: {result['wall_s']:.2f} s, {result['output_tok_per_s']:.1f} tok/s, "
                      f"{result['passes_per_request']:.1f} passes/request, ttft {result['ttft_median_s']:.3f} s, "
                      f"invalid {result['invalid']}", flush=True)
    on_s, off_s = summary(sides["jump_forward"]), summary(sides["no_jump_forward"])
    walls = [b["wall_s"] / a["wall_s"] for a, b in zip(sides["jump_forward"], sides["no_jump_forward"])]
    report = {
        "command": "bench/jump_forward.py " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
                                                       if k != "out"),
        "model": "default (SmolLM2-135M-Instruct Q4_1; embeddings and LM head Q8_0)", "machine": machine(),
        "workload": f"{args.requests} chat requests over {len(SCHEMAS)} schemas with long keys, greedy, streamed, "
                    f"concurrency {args.concurrency}",
        "jump_forward": on_s, "no_jump_forward": off_s,
        "speedup_wall": {"median": round(statistics.median(walls), 3), "min": round(min(walls), 3),
                         "max": round(max(walls), 3)},
        # the paired figure above pairs each round's two runs; a slow spell over one of them moves
        # it, where it moves this one less
        "speedup_of_median_walls": round(off_s["wall_s"]["median"] / on_s["wall_s"]["median"], 3),
        "passes_saved_per_request": round(off_s["passes_per_request"]["median"]
                                          - on_s["passes_per_request"]["median"], 1),
        "ttft_ratio": round(on_s["ttft_median_s"]["median"] / off_s["ttft_median_s"]["median"], 3),
        "ttft_pooled_ratio": round(on_s["ttft_pooled_s"]["median"] / off_s["ttft_pooled_s"]["median"], 3),
        "rounds": sides,
    }
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "rounds"}, indent=1))


if __name__ == "__main__":
    main()
