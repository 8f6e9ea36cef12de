"""`radixserve` command line: `generate` and `serve`, with the engine flags they share."""
from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import fields

from radixserve.api.serve import add_serve_args, cmd_serve
from radixserve.runtime.config import GRAMMAR_BACKENDS, SCHEDULE_POLICIES, EngineConfig, parse_size


def add_engine_args(p: argparse.ArgumentParser) -> None:
    d = EngineConfig()
    p.add_argument("--model", default=None, help="GGUF file or Hugging Face directory (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--device", default=d.device, choices=["auto", "cpu", "cuda"])
    p.add_argument("--mmap", action="store_true",
                   help="CPU: decode from the GGUF file's memory map (shared by processes) instead of moving its "
                        "weights to huge pages once serving")
    p.add_argument("--dtype", default=d.dtype, choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--page-size", type=int, default=d.page_size, help="tokens per KV page")
    p.add_argument("--kv-cache-tokens", type=int, default=None, help="KV pool size in tokens")
    p.add_argument("--mem-fraction", type=float, default=d.mem_fraction, help="KV pool as a share of free memory")
    p.add_argument("--max-running-requests", type=int, default=d.max_running_requests)
    p.add_argument("--max-batched-tokens", type=int, default=d.max_batched_tokens)
    p.add_argument("--chunked-prefill-size", type=int, default=d.chunked_prefill_size)
    p.add_argument("--max-waiting-requests", type=int, default=d.max_waiting_requests)
    p.add_argument("--schedule-policy", default=d.schedule_policy, choices=SCHEDULE_POLICIES,
                   help="waiting-queue order: lpm = longest cached prefix first")
    p.add_argument("--max-queue-wait-boost", type=float, default=d.max_queue_wait_boost,
                   help="seconds after which a waiting request jumps ahead of newer ones under lpm / dfs-weight")
    p.add_argument("--disable-radix-cache", action="store_true")
    p.add_argument("--swa-full-tokens-ratio", type=float, default=d.swa_full_tokens_ratio,
                   help="sliding-window layers' KV pool as a share of the KV pool (models with such layers)")
    p.add_argument("--disable-hybrid-swa-memory", action="store_true",
                   help="sliding-window layers keep every position's K/V, as global layers do")
    p.add_argument("--cache-dir", default=None,
                   help="keep the prefix cache's evicted pages in this directory; they survive restarts")
    p.add_argument("--cache-dir-size", type=parse_size, default=d.cache_dir_size,
                   help="bound of --cache-dir, least recently used pages go first (e.g. 16G, 512M)")
    p.add_argument("--attention-backend", default=d.attention_backend, choices=["auto", "triton", "cpu", "torch"],
                   help="auto = triton on CUDA, torch on CPU")
    p.add_argument("--disable-cuda-graph", action="store_true", help="run CUDA decode steps eagerly")
    p.add_argument("--grammar-backend", default=d.grammar_backend, choices=list(GRAMMAR_BACKENDS),
                   help="structured-output backend")
    p.add_argument("--grammar-compile-timeout", type=float, default=d.grammar_compile_timeout,
                   help="seconds a grammar may take to compile")
    p.add_argument("--grammar-any-whitespace", action="store_true",
                   help="let constrained JSON hold any whitespace between tokens (default: compact)")
    p.add_argument("--no-jump-forward", dest="jump_forward", action="store_false",
                   help="decode text a grammar forces one token a step, as any other (default: appended at once)")
    p.add_argument("--max-failed-steps", type=int, default=d.max_failed_steps,
                   help="consecutive failed engine steps after which the engine stops (the server exits non-zero)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--log-level", default=d.log_level, choices=["debug", "info", "warning", "error"])


def engine_config(args: argparse.Namespace) -> EngineConfig:
    names = {f.name for f in fields(EngineConfig)}
    return EngineConfig(**{k: v for k, v in vars(args).items() if k in names})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixserve", description="LLM serving runtime with a radix prefix cache")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate a reply to one prompt and stream it to stdout")
    g.add_argument("prompt")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.add_argument("--system", default=None, help="system message (with --chat)")
    g.add_argument("--max-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=-1)
    g.add_argument("--sampling-seed", type=int, default=None, help="seed of this request's sampling")
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    add_engine_args(g)
    s = sub.add_parser("serve", help="run the OpenAI-compatible HTTP server")
    add_serve_args(s)
    add_engine_args(s)
    return parser


def cmd_generate(args: argparse.Namespace) -> int:
    from radixserve.runtime.engine import Engine
    from radixserve.runtime.sampling_params import SamplingParams

    t0 = time.monotonic()
    engine = Engine(engine_config(args))
    log = logging.getLogger("radixserve")
    log.info("model %s on %s (%s), KV cache %d tokens, loaded in %.1f s", engine.model_name, engine.device,
             str(engine.dtype).replace("torch.", ""), engine.kv_capacity_tokens, time.monotonic() - t0)
    try:
        prompt = args.prompt
        if args.chat:
            messages = [{"role": "system", "content": args.system}] if args.system else []
            prompt = engine.tokenizer.apply_chat_template(messages + [{"role": "user", "content": prompt}])
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                                top_k=args.top_k, seed=args.sampling_seed, stop=args.stop)
        stream = engine.submit(prompt, params)
        t1 = time.monotonic()
        last = None
        for out in stream:
            sys.stdout.write(out.text)
            sys.stdout.flush()
            last = out
        sys.stdout.write("\n")
        elapsed = time.monotonic() - t1
        if last.error:
            raise RuntimeError(last.error)
        log.info("%d tokens in %.2f s (%.1f tok/s), finish reason %s", last.completion_tokens, elapsed,
                 last.completion_tokens / max(elapsed, 1e-9), last.finish_reason)
    finally:
        engine.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    from radixserve.runtime.engine_client import EngineRefusal
    from radixserve.runtime.models.loader import ModelLoadError

    try:
        if args.command == "generate":
            return cmd_generate(args)
        if args.command == "serve":
            return cmd_serve(args, engine_config)
    except (ModelLoadError, ValueError, EngineRefusal) as e:
        print(f"radixserve: error: {e}", file=sys.stderr)
        return 1 if isinstance(e, ModelLoadError) else 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
