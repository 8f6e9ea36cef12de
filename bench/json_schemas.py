"""Real-world JSON schemas end to end (issue 21's four targets), on the default model:

  compile    every schema of tests/schemas/corpus.json through the normalisation pass and xgrammar:
             how many are accepted (of those whose prompt fits the context), the pass's time
             (median, worst) and the whole compile's (normalisation + grammar + xgrammar).
  generate   one request per accepted schema (the schema in the prompt, as clients send it) at the
             default temperature 1.0: finish reasons, and every finished output validated against
             its original schema with jsonschema under the schema's own draft.
  context    `radixserve serve` in a subprocess, every corpus schema's request sized to fill the context on
             its own (with the schema in the user message, and without): refusals for context length
             (the server's schema note must never cause one) and prompt_tokens as the request alone.
  parse      `radixserve serve` in a subprocess and the official client's
             `chat.completions.parse(response_format=<Pydantic model with a float>)`, N calls with
             max_tokens 120 at the default temperature: how many parse, how many raise
             LengthFinishReasonError.

Writes bench/results/json_schemas.json. Reports figures, never asserts.

    .venv/bin/python bench/json_schemas.py [--parts compile,generate,parse,context] [--max-tokens 256] [--calls 50]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from radixserve.grammar import GrammarError, GrammarSpec, make_grammar_backend  # noqa: E402
from radixserve.grammar.json_schema import normalise_json_schema, validator_class  # noqa: E402
from radixserve.grammar.schema_support import XGRAMMAR_SUPPORT  # noqa: E402
from local_server import LocalServer  # noqa: E402  (bench/, beside this script)

ROOT = Path(__file__).resolve().parents[1]
CORPUS = json.loads((ROOT / "tests" / "schemas" / "corpus.json").read_text())
RESULTS = ROOT / "bench" / "results" / "json_schemas.json"


def prompt_messages(entry: dict) -> list[dict]:
    schema_text = json.dumps(entry["schema"], separators=(",", ":"))
    return [{"role": "system", "content": "Reply with one JSON document that follows this JSON schema:\n" + schema_text},
            {"role": "user", "content": f"Write a realistic example of a {entry['name'].split('/')[-1]}."}]


def ms(seconds: list[float]) -> dict:
    return {"median_ms": round(statistics.median(seconds) * 1000, 2), "worst_ms": round(max(seconds) * 1000, 2)}


def part_compile(tokenizer, vocab_size: int, context: int) -> tuple[dict, list[dict]]:
    backend = make_grammar_backend("xgrammar", tokenizer.vocab_info(vocab_size))
    normalise_s, compile_s, accepted, refused, too_long = [], [], [], [], []
    for entry in CORPUS:
        prompt = tokenizer.apply_chat_template(prompt_messages(entry))
        if len(tokenizer.encode(prompt, add_special_tokens=False)) >= context:
            too_long.append(entry["name"])
            continue
        t0 = time.perf_counter()
        try:
            normalise_json_schema(entry["schema"], XGRAMMAR_SUPPORT)
        except GrammarError:
            pass
        normalise_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        try:
            backend.compile(GrammarSpec.json_schema(entry["schema"]))
        except GrammarError as e:
            refused.append({"name": entry["name"], "keyword": getattr(e, "keyword", None), "message": str(e)})
            continue
        compile_s.append(time.perf_counter() - t0)
        accepted.append(entry)
    fitting = len(CORPUS) - len(too_long)
    report = {"schemas": len(CORPUS), "exceed_context": too_long, "fitting": fitting, "accepted": len(accepted),
              "accepted_share": round(len(accepted) / fitting, 4), "refused": refused,
              "normalisation": ms(normalise_s), "compile_total": ms(compile_s)}
    return report, accepted


def part_generate(engine, accepted: list[dict], max_tokens: int) -> dict:
    from radixserve.runtime.sampling_params import SamplingParams

    prompts = [engine.tokenizer.apply_chat_template(prompt_messages(e)) for e in accepted]
    params = [SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=i,
                             constraint=GrammarSpec.json_schema(e["schema"])) for i, e in enumerate(accepted)]
    t0 = time.perf_counter()
    results = engine.generate(prompts, params)
    elapsed = time.perf_counter() - t0
    reasons = Counter(r.finish_reason for r in results)
    invalid = []
    for entry, result in zip(accepted, results):
        if result.finish_reason != "stop":
            continue
        schema = entry["schema"]
        try:
            ok = validator_class(schema)(schema).is_valid(json.loads(result.text))
        except json.JSONDecodeError:
            ok = False
        if not ok:
            invalid.append({"name": entry["name"], "text": result.text[:400]})
    return {"requests": len(accepted), "max_tokens": max_tokens, "temperature": 1.0,
            "jump_forward": engine.config.jump_forward,
            "forced_tokens": sum(r.forced_tokens for r in results),
            "completion_tokens": sum(len(r.token_ids) for r in results),
            "finish_reasons": dict(reasons), "finished_invalid": len(invalid), "invalid": invalid,
            "seconds": round(elapsed, 1)}


FILLER = ("Meeting notes, item {i}: the team reviewed the quarterly figures, the supplier contracts and the "
          "open tickets, and agreed on the next steps for the release. ")


def part_context(stride: int, max_tokens: int = 8) -> dict:
    """The schema note never costs a request its context: each fitting schema's request is sized to
    fill the context on its own (a long shared document, then the ask), so the server's note would
    push it over. Two askings: the schema inside the user message (instructor's JSON mode), and a
    plain ask. Counts refusals for context length and whether `prompt_tokens` is the request alone.
    Every `stride`-th schema: each request prefills its ask after an 8k-token prefix (~30 s here)."""
    import openai

    from radixserve.runtime.models.loader import load_model_files

    files = load_model_files(None)
    tokenizer, context = files.tokenizer, files.config.max_context_len
    document = "".join(FILLER.format(i=i) for i in range(context // 20))
    doc_ids = tokenizer.encode(document, add_special_tokens=False)

    def messages(n: int, ask: str) -> list[dict]:
        return [{"role": "user", "content": tokenizer.decode(doc_ids[:n]) + "\n\n" + ask}]

    def alone(msgs: list[dict]) -> int:
        return len(tokenizer.encode(tokenizer.apply_chat_template(msgs), add_special_tokens=False))

    target = context - max_tokens - 2   # the request alone fits, with 2 tokens to spare
    report: dict = {"context": context, "max_tokens": max_tokens, "schemas": f"every {stride}th of the corpus"}
    with LocalServer() as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=900)
        model = client.models.list().data[0].id
        for asking in ("schema_in_user_message", "plain_ask"):
            counts: Counter = Counter()
            t0 = time.perf_counter()
            for entry in CORPUS[::stride]:
                schema_text = json.dumps(entry["schema"], separators=(",", ":"))
                ask = (f"Reply with one JSON document that follows this JSON schema:\n{schema_text}"
                       if asking == "schema_in_user_message" else "Reply with the meeting's record as JSON.")
                n = target - alone(messages(0, ask))
                for _ in range(4):   # re-encoding the document's cut may merge a token or two
                    n += target - alone(messages(n, ask))
                msgs = messages(n, ask)
                if n < 0 or alone(msgs) > target:
                    counts["does_not_fit_alone"] += 1
                    continue
                try:
                    reply = client.chat.completions.create(
                        model=model, messages=msgs, max_tokens=max_tokens, temperature=0,
                        response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": entry["schema"]}})
                except openai.BadRequestError as e:
                    body = e.body if isinstance(e.body, dict) else {}
                    message = str(body.get("message", e))
                    counts["refused_context" if "context" in message or "tokens" in message else "refused_schema"] += 1
                    continue
                counts["served"] += 1
                counts["prompt_tokens_as_alone" if reply.usage.prompt_tokens == alone(msgs) else "prompt_tokens_other"] += 1
            report[asking] = {**dict(counts), "seconds": round(time.perf_counter() - t0, 1)}
            print(asking, report[asking], flush=True)
    return report


def _pydantic_cases():
    """(name, Pydantic model, prompt of call i): a float first, as the issue's runaway numbers; and
    a free-text string before the float, where the small model may ramble inside the string."""
    from pydantic import BaseModel

    class Measurement(BaseModel):
        value: float
        unit: str

    class Reading(BaseModel):
        sensor: str
        value: float

    return [("Measurement(value: float, unit: str)", Measurement,
             lambda i: f"Measure the temperature of cup number {i} of tea and report it."),
            ("Reading(sensor: str, value: float)", Reading,
             lambda i: f"Sensor T-{i} reads a temperature. Report the reading.")]


def part_parse(calls: int, max_tokens: int, concurrency: int) -> dict:
    import openai

    with LocalServer() as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=600)
        model = client.models.list().data[0].id
        report = {}
        for name, response_format, prompt in _pydantic_cases():
            cut: list[str] = []

            def one(i: int) -> str:
                try:
                    reply = client.chat.completions.parse(model=model, max_tokens=max_tokens, response_format=response_format,
                                                          messages=[{"role": "user", "content": prompt(i)}])
                    return "parsed" if reply.choices[0].message.parsed is not None else "refusal"
                except openai.LengthFinishReasonError as e:
                    cut.append(e.completion.choices[0].message.content[:200])
                    return "length"
                except Exception as e:  # noqa: BLE001 - counted, not raised: the figure is the point
                    return f"error: {type(e).__name__}"

            t0 = time.perf_counter()
            with ThreadPoolExecutor(concurrency) as pool:
                outcomes = Counter(pool.map(one, range(calls)))
            report[name] = {"calls": calls, "max_tokens": max_tokens, "temperature": "default (not sent)",
                            "outcomes": dict(outcomes), "parsed": outcomes["parsed"],
                            "length_errors": outcomes["length"], "cut_outputs": cut,
                            "seconds": round(time.perf_counter() - t0, 1)}
            print(name, json.dumps(report[name], indent=1), flush=True)
        return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="compile,generate,parse")
    ap.add_argument("--max-tokens", type=int, default=256, help="of the generate part")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--context-stride", type=int, default=6, help="the context part takes every N-th schema")
    ap.add_argument("--concurrency", type=int, default=10)
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    report: dict = {"corpus": "tests/schemas/corpus.json"}
    if parts & {"compile", "generate"}:
        from radixserve.runtime.config import EngineConfig
        from radixserve.runtime.engine import Engine

        engine = Engine(EngineConfig())
        try:
            report["compile"], accepted = part_compile(engine.tokenizer, engine.model_config.vocab_size,
                                                       engine.model_config.max_context_len)
            print(json.dumps({k: v for k, v in report["compile"].items() if k != "refused"}, indent=1), flush=True)
            if "generate" in parts:
                report["generate"] = part_generate(engine, accepted, args.max_tokens)
                print(json.dumps(report["generate"], indent=1)[:2000], flush=True)
        finally:
            engine.shutdown()
    if "parse" in parts:
        report["parse"] = part_parse(args.calls, 120, args.concurrency)
    if "context" in parts:
        report["context"] = part_context(args.context_stride)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    RESULTS.write_text(json.dumps({**previous, **report}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
