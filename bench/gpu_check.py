"""GPU check: one command on a CUDA machine with torch, triton and transformers installed.

    python bench/gpu_check.py                          # CUDA, every section; < 8 minutes on one H100/H200
    python bench/gpu_check.py --sections engine        # only the engine end to end
    python bench/gpu_check.py --device cpu             # the engine section CPU-vs-CPU: a self-test
    python bench/gpu_check.py --sections engine --model .gpu/model --random-weights
                                                       # the default model's shape, random weights
                                                       # (bench/gpu_run.sh on a machine without it)
    python bench/gpu_check.py --cpu-smoke --sections kernels,roofline,throughput
                                                       # tiny shapes, Triton interpreter: code paths only

Prints a table per section and a summary of every check, writes a JSON report (--json; default
bench/results/gpu_check.json on CUDA, on the CPU only when given; rewritten after every check, so
a run killed by a time limit keeps what it finished), exits 1 if any check failed.
Sections (--sections names in brackets):
1. [kernels] each Triton kernel against its torch reference on realistic shapes (relative L2 error);
2. [roofline] decode attention time against the memory roofline: K/V bytes read / the bandwidth of
   a large device-to-device copy, at batch 1/32/128 and context 1k/8k;
3. [throughput] decode throughput of a random-weight Llama-3-8B-shaped model (bf16) at batch
   1/16/64/256 with CUDA graphs on and off (model forward + greedy argmax + host sync per step, as
   the engine does; no scheduler), and transformers' generate on the same shapes as the baseline;
4. [throughput] prefill tokens/s at 2k-token prompts, with and without a 1.5k-token cached prefix;
5. [engine] the real Engine on the default model (SmolLM2-135M; --model another, --random-weights
   for a skeleton without weights) on the device, a CPU engine beside it as the reference: fp32
   greedy batch == CPU; top-20 logprobs == CPU within 1e-3 along equal prefixes; seeded sampling (top-p/k, min-p, penalties,
   logprobs) repeats alone and in a batch, and against the CPU; JSON-schema outputs validate and
   greedy == CPU; a prefix-cache hit == CPU; chunked prefill == unchunked == CPU; CUDA graphs ==
   eager; the OpenAI server (uvicorn on loopback, the official client): chat, streamed chat,
   json_schema response_format; figures: engine decode tok/s at batch 1/32 and prefill tok/s.

Sections 1-3 import only torch, triton, transformers and the model/kernel modules; the engine
section also needs the package's own dependencies (grammar backends, fastapi, uvicorn, openai).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Optional

SMOKE = "--cpu-smoke" in sys.argv
if SMOKE:  # triton reads it when kernels are decorated, i.e. at import
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from radixserve.runtime.models.config import ModelConfig  # noqa: E402

# Sections 1-3 drive internals that other work refactors; if these imports break, the sections that
# need them report the error as a failed check and the rest (the engine: public API only) still run.
try:
    from radixserve.kernels import triton_attention as ta
    from radixserve.kernels.paged_attention import (attention_bias, decode_attention, decode_kv_rows,
                                                    extend_attention, write_kv)
    KERNELS_IMPORT_ERROR = None
except ImportError as e:  # pragma: no cover - only while internals move
    KERNELS_IMPORT_ERROR = f"{type(e).__name__}: {e}"
try:
    from radixserve.runtime.attention_triton import TritonAttentionBackend
    from radixserve.runtime.cuda_graph import DecodeGraphRunner
    from radixserve.runtime.forward_batch import BatchLayout, ForwardBatch
    from radixserve.runtime.kv_cache import KVCache
    from radixserve.runtime.models.llama import LlamaForCausalLM
    from radixserve.runtime.models.random_init import random_weights
    from radixserve.runtime.platform import get_platform
    MODEL_IMPORT_ERROR = None
except ImportError as e:  # pragma: no cover - only while internals move
    MODEL_IMPORT_ERROR = f"{type(e).__name__}: {e}"

# full run vs smoke run: every size the script uses
FULL = dict(
    model=ModelConfig(model_type="llama", hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
                      head_dim=128, intermediate_size=14336, vocab_size=128256, rope_theta=500000.0,
                      max_context_len=8192),
    dtype=torch.bfloat16, page=16, kernel_batch=32, kernel_max_len=4096,
    extend_segments=[(0, 512), (1024, 512), (1536, 256), (0, 1), (37, 300)],
    roofline_batches=[1, 32, 128], roofline_contexts=[1024, 8192],
    decode_batches=[1, 16, 64, 256], decode_context=512, decode_steps=32,
    prefill_requests=4, prefill_len=2048, prefill_cached=1536, iters=20)
SMOKE_SIZES = dict(
    model=ModelConfig(model_type="llama", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                      intermediate_size=128, vocab_size=512, max_context_len=256),
    dtype=torch.float32, page=16, kernel_batch=3, kernel_max_len=40,
    extend_segments=[(0, 9), (16, 5), (0, 1)],
    roofline_batches=[1, 3], roofline_contexts=[16, 40],
    decode_batches=[1, 3], decode_context=8, decode_steps=2,
    prefill_requests=2, prefill_len=32, prefill_cached=24, iters=1)


def timed(fn, iters: int, device: torch.device) -> float:
    """Seconds per call (after one warm-up call)."""
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end) / 1e3 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.float(), want.float()
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


class Paged:
    """A random single-layer KV cache and a page table for requests of the given lengths."""

    def __init__(self, lens: list[int], page: int, kv_heads: int, dim: int, dtype, device, seed: int = 0):
        gen = torch.Generator(device=device).manual_seed(seed)
        self.page, self.lens = page, lens
        n_pages = [-(-n // page) for n in lens]
        total = sum(n_pages)
        self.k = torch.randn(total + 1, page, kv_heads, dim, generator=gen, device=device, dtype=dtype)
        self.v = torch.randn(total + 1, page, kv_heads, dim, generator=gen, device=device, dtype=dtype)
        self.k[total], self.v[total] = 0, 0
        self.pad_page = total
        perm = torch.randperm(total, generator=gen, device=device)
        self.table = torch.zeros(len(lens), max(n_pages), dtype=torch.long, device=device)
        used = 0
        for r, n in enumerate(n_pages):
            self.table[r, :n] = perm[used:used + n]
            used += n
        self.rows = torch.arange(len(lens), device=device)
        self.lens_t = torch.tensor(lens, device=device)

    def slots(self, row: int, length: int) -> torch.Tensor:
        pos = torch.arange(length, device=self.table.device)
        return self.table[row, pos // self.page] * self.page + pos % self.page


# ---- 1. kernels against references -------------------------------------------------------------
def check_kernels(s: dict, device) -> list[dict]:
    cfg, dtype, rows = s["model"], s["dtype"], []
    heads, kvh, dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    scale = dim ** -0.5
    gen = torch.Generator().manual_seed(1)
    for page in (1, 16):
        lens = [1, page, page + 1] + torch.randint(2, s["kernel_max_len"], (s["kernel_batch"] - 3,),
                                                   generator=gen).tolist()
        pc = Paged(lens, page, kvh, dim, dtype, device)
        q = torch.randn(len(lens), heads, dim, device=device, dtype=dtype)
        n = pc.table.shape[1]
        pages = pc.table.masked_fill(~(torch.arange(n, device=device) * page < pc.lens_t[:, None]), pc.pad_page)
        attend = (torch.arange(n * page, device=device) < pc.lens_t[:, None])[:, None, None, :]
        want = decode_attention(q.float(), pc.k.float(), pc.v.float(), decode_kv_rows(pages, page, kvh),
                                attention_bias(attend), scale)
        splits = ta.num_decode_splits(len(lens), kvh, max(lens))
        got = ta.decode_attention_triton(q, pc.k, pc.v, pc.table, pc.rows, pc.lens_t, scale, splits)
        rows.append(dict(kernel="decode_attention", page_size=page, shape=f"B={len(lens)} max_len={max(lens)} "
                         f"splits={splits}", rel_err=rel_err(got, want)))
        # a sliding window (Gemma 3's local layers) and attention sinks (gpt-oss)
        window, sinks = max(2, s["kernel_max_len"] // 3), torch.randn(heads, device=device) * 2
        positions = torch.arange(n * page, device=device)
        seen = (positions < pc.lens_t[:, None]) & (positions >= pc.lens_t[:, None] - window)
        want = decode_attention(q.float(), pc.k.float(), pc.v.float(), decode_kv_rows(pages, page, kvh),
                                attention_bias(seen[:, None, None, :]), scale, sinks=sinks)
        got = ta.decode_attention_triton(q, pc.k, pc.v, pc.table, pc.rows, pc.lens_t, scale, splits,
                                         window=window, sinks=sinks)
        rows.append(dict(kernel="decode_attention window+sinks", page_size=page,
                         shape=f"B={len(lens)} window={window} splits={splits}", rel_err=rel_err(got, want)))
    segs = s["extend_segments"]
    pc = Paged([p + n for p, n in segs], 16, kvh, dim, dtype, device)
    total = sum(n for _, n in segs)
    q = torch.randn(total, heads, dim, device=device, dtype=dtype)
    sinks = torch.randn(heads, device=device) * 2
    for window, sink in ((None, None), (max(2, s["kernel_max_len"] // 3), sinks)):
        want, meta, start = torch.empty(total, heads, dim, device=device), [], 0
        for r, (pre, n) in enumerate(segs):
            slots = pc.slots(r, pre + n)
            kf, vf = pc.k.view(-1, kvh, dim)[slots[pre:]].float(), pc.v.view(-1, kvh, dim)[slots[pre:]].float()
            want[start:start + n] = extend_attention(q[start:start + n].float(), kf, vf, pc.k.float(), pc.v.float(),
                                                     slots if pre else None, pre, scale, window, sink)
            meta.append((start, n, pre, r))
            start += n
        meta_t = torch.tensor(meta, dtype=torch.long, device=device).t().contiguous()
        got = ta.extend_attention_triton(q, pc.k, pc.v, pc.table, meta_t, max(n for _, n in segs), scale,
                                         torch.empty_like(q), window=window, sinks=sink)
        rows.append(dict(kernel="extend_attention" + (" window+sinks" if window else ""), page_size=16,
                         shape=f"segments(prefix,new)={segs}" + (f" window={window}" if window else ""),
                         rel_err=rel_err(got, want)))
    k = torch.randn(total, kvh, dim, device=device, dtype=dtype)
    v = torch.randn(total, kvh, dim, device=device, dtype=dtype)
    slots = torch.cat([pc.slots(r, p + n)[p:] for r, (p, n) in enumerate(segs)])
    kr, vr = pc.k.clone(), pc.v.clone()
    write_kv(kr, vr, slots, k, v)
    ta.write_kv_triton(pc.k, pc.v, slots, k, v)
    rows.append(dict(kernel="write_kv", page_size=16, shape=f"T={total}",
                     rel_err=max(rel_err(pc.k, kr), rel_err(pc.v, vr))))
    rows.append(check_moe(s, device))
    return rows


def check_moe(s: dict, device) -> dict:
    """The CUDA MoE layer (two grouped matmuls, no host sync) against the per-expert loop on the
    same experts, and both timed: a Mixtral-like layer scaled to the run's model."""
    from radixserve.kernels.triton_moe import GroupedExperts
    from radixserve.runtime.models.layer_ops import TorchLayerOps
    from radixserve.runtime.models.linear import Linear
    from radixserve.runtime.models.moe import SparseMoE

    cfg, dtype = s["model"], s["dtype"]
    hidden, inter, n_experts, top_k, tokens = cfg.hidden_size, cfg.intermediate_size // 4, 8, 2, s["kernel_batch"]
    gen = torch.Generator(device=device).manual_seed(3)
    rand = lambda *shape: (torch.randn(*shape, generator=gen, device=device) * shape[-1] ** -0.5).to(dtype)  # noqa: E731
    experts = [(Linear(rand(2 * inter, hidden)), Linear(rand(hidden, inter))) for _ in range(n_experts)]
    silu_mul = TorchLayerOps().silu_mul
    loop = SparseMoE(torch.randn(n_experts, hidden, generator=gen, device=device), experts, top_k, True, silu_mul)
    grouped = SparseMoE(loop.router, experts, top_k, True, silu_mul, grouped=GroupedExperts.of(experts))
    h = rand(tokens, hidden)
    iters = max(1, s["iters"] // 2)
    return dict(kernel="moe grouped matmul", page_size="-", shape=f"T={tokens} E={n_experts} k={top_k} "
                f"H={hidden} I={inter}", rel_err=rel_err(grouped(h), loop(h)),
                us=timed(lambda: grouped(h), iters, device) * 1e6, loop_us=timed(lambda: loop(h), iters, device) * 1e6)


def check_staging(device) -> dict:
    """The pinned staging buffer (the grammar bitmask, the graphs' inputs) is refilled right after
    an asynchronous upload: the refill must wait for the copy, or the device reads the new values."""
    platform = get_platform(device)
    staging = platform.staging(torch.ones(64 << 20, dtype=torch.int32))   # 256 MB: a copy that takes a while
    busy = torch.randn(2048, 2048, device=device)
    for _ in range(50):   # queue work first, so that the copy waits behind it
        busy = torch.tanh(busy @ busy)
    uploaded = staging.upload()
    staging.writable().fill_(2)
    torch.cuda.synchronize(device)
    wrong = int((uploaded != 1).sum())
    return dict(section="kernels", check="pinned staging: a refill waits for the copy", ok=wrong == 0,
                wrong_values=wrong)


# ---- 2. decode attention vs the memory roofline ------------------------------------------------
def copy_bandwidth(device, nbytes: int) -> float:
    """Bytes moved (read + written) per second by one large device-to-device copy."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    t = timed(lambda: dst.copy_(src), 10, device)
    return 2 * nbytes / t


def check_roofline(s: dict, device) -> list[dict]:
    cfg, dtype = s["model"], s["dtype"]
    bw = copy_bandwidth(device, (2 << 30) if device.type == "cuda" else (64 << 20))
    rows = []
    for ctx in s["roofline_contexts"]:
        for b in s["roofline_batches"]:
            pc = Paged([ctx] * b, s["page"], cfg.num_kv_heads, cfg.head_dim, dtype, device)
            q = torch.randn(b, cfg.num_heads, cfg.head_dim, device=device, dtype=dtype)
            out = torch.empty_like(q)
            splits = ta.num_decode_splits(b, cfg.num_kv_heads, ctx, _num_sms(device))
            t = timed(lambda: ta.decode_attention_triton(q, pc.k, pc.v, pc.table, pc.rows, pc.lens_t,
                                                         cfg.head_dim ** -0.5, splits, out=out), s["iters"], device)
            kv_bytes = 2 * b * ctx * cfg.num_kv_heads * cfg.head_dim * pc.k.element_size()
            rows.append(dict(batch=b, context=ctx, splits=splits, us=t * 1e6, roofline_us=kv_bytes / bw * 1e6,
                             share_of_roofline=kv_bytes / bw / t, copy_gbps=bw / 1e9))
            del pc
    return rows


def _num_sms(device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


# ---- 3. decode throughput ----------------------------------------------------------------------
def run_layout(model, attn, layout, device):
    """One forward of a layout, as ModelRunner runs it: the backend builds its own metadata."""
    return model.forward(ForwardBatch.of(layout, attn.prepare(layout), get_platform(device)), attn)


def our_decode(model, attn, kv: KVCache, table, batch: int, ctx: int, steps: int, graphs) -> float:
    """Tokens/s over `steps` greedy decode steps of `batch` requests that start at `ctx` tokens."""
    ids, lens = [1] * batch, [ctx + 1] * batch
    host_table = table.tolist()  # slots are computed on the host, as the engine does

    def step():
        nonlocal ids
        layout = BatchLayout(kv.k.shape[2])
        for r, n in enumerate(lens):
            layout.add_decode(ids[r], n - 1, r, host_table[r])
        logits = graphs.run(layout) if graphs is not None else None
        if logits is None:
            logits = run_layout(model, attn, layout, table.device)
        ids = logits.argmax(-1).tolist()  # the host sync every engine step has
        for r in range(batch):
            lens[r] += 1
    step()  # warm-up
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return batch * steps / (time.perf_counter() - t0)


def hf_decode(hf, batch: int, ctx: int, steps: int, device) -> float:
    """transformers generate: (time for steps + 1 tokens - time for 1 token) isolates decoding."""
    prompt = torch.randint(0, hf.config.vocab_size, (batch, ctx), device=device)

    def gen(n):
        t0 = time.perf_counter()
        hf.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0
    gen(2)  # warm-up
    return batch * steps / max(1e-9, gen(steps + 1) - gen(1))


def check_decode_throughput(s: dict, device) -> tuple[list[dict], object, object, object, object]:
    cfg, dtype, p = s["model"], s["dtype"], s["page"]
    max_b, ctx, steps = max(s["decode_batches"]), s["decode_context"], s["decode_steps"]
    model = LlamaForCausalLM(cfg, random_weights(cfg, dtype, device), dtype, get_platform(device))
    per_req = -(-(ctx + steps + 4) // p)
    pages = max(max_b * per_req, s["prefill_requests"] * -(-s["prefill_len"] // p))
    kv = KVCache(cfg.num_layers, pages, p, cfg.num_kv_heads, cfg.head_dim, dtype, device)
    table = torch.arange(max_b * per_req, device=device).view(max_b, per_req)
    attn = TritonAttentionBackend(kv, table, cfg.num_heads, get_platform(device))
    graphs = DecodeGraphRunner(model, attn, attn.graphs, max_b, cfg.max_context_len, kv.pad_page * p,
                               get_platform(device), capture=device.type == "cuda")
    rows = []
    for b in s["decode_batches"]:
        eager = our_decode(model, attn, kv, table, b, ctx, steps, None)
        graphed = our_decode(model, attn, kv, table, b, ctx, steps, graphs)
        rows.append(dict(batch=b, context=ctx, eager_tok_s=eager, cuda_graph_tok_s=graphed))
    return rows, model, attn, kv, graphs


def hf_llama_config(c: ModelConfig):
    """transformers' LlamaConfig of a Llama-shaped ModelConfig."""
    import transformers as tf

    return tf.LlamaConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                          num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads, head_dim=c.head_dim,
                          num_key_value_heads=c.num_kv_heads, max_position_embeddings=c.max_context_len,
                          rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta,
                          tie_word_embeddings=c.tie_word_embeddings)


def add_hf_baseline(rows: list[dict], s: dict, device) -> None:
    import transformers as tf

    cfg, dtype = s["model"], s["dtype"]
    hf_cfg = hf_llama_config(cfg)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # works whether this transformers spells it dtype or torch_dtype
    try:
        with torch.device(device):  # random init on the device: seconds, not minutes, for 8B parameters
            hf = tf.LlamaForCausalLM(hf_cfg).eval()
    finally:
        torch.set_default_dtype(default)
    for row in rows:
        row["transformers_tok_s"] = hf_decode(hf, row["batch"], s["decode_context"], s["decode_steps"], device)
    del hf


# ---- 4. prefill --------------------------------------------------------------------------------
def check_prefill(s: dict, model, kv: KVCache, device) -> list[dict]:
    p, n_req, length = kv.k.shape[2], s["prefill_requests"], s["prefill_len"]
    per_req = -(-length // p)
    table = torch.arange(n_req * per_req, device=device).view(n_req, per_req)
    attn = TritonAttentionBackend(kv, table, model.cfg.num_heads, get_platform(device))   # over this table of prefills
    host_table, rows = table.tolist(), []
    for cached in (0, s["prefill_cached"]):
        new = length - cached
        layout = BatchLayout(p)
        for r in range(n_req):
            tokens = [(r * 7 + i) % model.cfg.vocab_size for i in range(length)]
            layout.add_extend(tokens, cached, new, r, host_table[r], samples=True)
        t = len(layout.ids)
        sec = timed(lambda: run_layout(model, attn, layout, device), max(1, s["iters"] // 4), device)
        rows.append(dict(requests=n_req, prompt_len=length, cached_prefix=cached, new_tokens_per_s=t / sec,
                         prompt_tokens_per_s=n_req * length / sec, ms=sec * 1e3))
    return rows


# ---- 5. the engine end to end (section "engine") -------------------------------------------------
# The real engine on the default model (SmolLM2-135M) on the device under test, beside a CPU engine
# as the reference. With --device cpu the device under test is the CPU too (a differently shaped
# engine: page size 16 and the radix cache against page size 1 without it), so that this very code
# runs, and is tested, on a machine without a GPU.
ENGINE_BUDGETS = {
    "full": dict(prompts=8, json_prompts=2, greedy_tokens=32, sampled_tokens=24, json_tokens=48, server_tokens=24,
                 long_system_repeats=6, chunk=64, kv_tokens=32768, max_running=64, decode_batches=[1, 64],
                 decode_tokens=64, prefill_requests=8, prefill_len=1024, repeats=2,
                 throughput_dtypes=["float32", "bfloat16"]),
    # the CPU self-test: every check once, on as little work as shows it runs
    "small": dict(prompts=2, json_prompts=1, greedy_tokens=4, sampled_tokens=4, json_tokens=40, server_tokens=4,
                  long_system_repeats=2, chunk=64, kv_tokens=4096, max_running=4, decode_batches=[2],
                  decode_tokens=4, prefill_requests=2, prefill_len=80, repeats=1,
                  throughput_dtypes=["float32"]),
}
SYSTEM = ("You are a careful assistant for a railway company. Answer briefly, name real stations and "
          "never guess timetables. ")
QUESTIONS = ["How do I get from Lyon to Turin by train?", "Which night trains leave Vienna?",
             "Is a seat reservation needed from Milan to Zurich?", "What is the fastest way to Porto?",
             "Can I bring a bicycle on a train in Norway?", "Where do trains to Krakow leave Berlin from?",
             "Suggest a scenic route through the Alps.", "How early should I arrive at Paris Gare de Lyon?"]
# A schema every greedy or sampled answer can complete within json_tokens (bounded string, enum,
# bounded integer, boolean; the grammar allows no free whitespace).
TRIP_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["city", "days", "name", "rail"],
               "properties": {"city": {"type": "string", "enum": ["Lyon", "Turin", "Vienna", "Porto"]},
                              "days": {"type": "integer", "minimum": 1, "maximum": 14},
                              "name": {"type": "string", "maxLength": 12},
                              "rail": {"type": "boolean"}}}
JSON_QUESTION = "Plan a short rail trip. Reply with JSON: city, days, traveller name, rail (true/false)."
# A greedy token flips between two fp32 implementations only where its top two candidates are
# (nearly) tied: see compare_greedy.
NEAR_TIE_NATS = 0.02
# fp32 on the device against fp32 on the CPU: summation order moves a logprob by ~1e-5; TF32 or a
# wrong kernel by far more than this
TOP_LOGPROBS, LOGPROB_TOLERANCE = 20, 1e-3


class EngineRig:
    """The engines the checks share, built on first use: `dev(**overrides)` on the device under test,
    `ref()` the CPU reference. Also the prompts and every check's record."""

    def __init__(self, device: str, budget: dict, files):
        self.device, self.b, self.files = device, budget, files
        self.tok = files.tokenizer
        self.engines: dict[str, object] = {}
        self.replays: dict[str, object] = {}  # per engine: [decode steps its graph runner served] or None
        self.checks: list[dict] = []
        self.figures: dict = {}
        self.prompts = [self.chat(SYSTEM, q) for q in (QUESTIONS * 4)[:budget["prompts"]]]
        self._greedy: dict[str, list] = {}
        self.server_reply = (None, None, None)  # the unstreamed chat reply: text, finish_reason, tokens

    def chat(self, system: str, question: str) -> list[int]:
        return self.tok.encode(self.tok.apply_chat_template([{"role": "system", "content": system},
                                                             {"role": "user", "content": question}]))

    def config(self, device: str, **overrides):
        from radixserve import EngineConfig

        cfg = dict(device=device, dtype="float32", kv_cache_tokens=self.b["kv_tokens"],
                   max_running_requests=self.b["max_running"], max_waiting_requests=64)
        cfg.update(overrides)
        return EngineConfig(**cfg)

    def engine(self, name: str, device: str, **overrides):
        from radixserve import Engine

        if name not in self.engines:
            t0 = time.perf_counter()
            self.engines[name] = Engine(self.config(device, **overrides), model_files=self.files)
            self.figures.setdefault("engine_build_s", {})[name] = round(time.perf_counter() - t0, 2)
            self.replays[name] = count_replays(self.engines[name])
        return self.engines[name]

    def dev(self, variant: str = "dev", **overrides):
        return self.engine(variant, self.device, **overrides)

    def ref(self):
        # page size 1 and no radix cache: on a CPU self-test, what makes it differ from `dev`
        return self.engine("ref", "cpu", page_size=1, disable_radix_cache=True)

    def greedy(self, name: str, engine) -> list[list[int]]:
        """The batched greedy tokens of every prompt on `engine` (once per engine)."""
        return tokens(self.greedy_results(name, engine))

    def greedy_results(self, name: str, engine) -> list:
        """The batched greedy results of every prompt on `engine`, with their top-20 logprobs (once
        per engine)."""
        if name not in self._greedy:
            self._greedy[name] = engine.generate(self.prompts, greedy_params(self.b["greedy_tokens"],
                                                                             logprobs=TOP_LOGPROBS))
        return self._greedy[name]

    def record(self, check: str, ok: bool, **detail) -> None:
        self.checks.append(dict(section="engine", check=check, ok=bool(ok), **detail))

    def run_check(self, name: str, fn) -> None:
        """Run one check; an exception is recorded as its failure."""
        t0 = time.perf_counter()
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - the report says what broke; the other checks still run
            self.record(name, False, error=f"{type(e).__name__}: {e}", where=traceback.format_exc(limit=-3))
        log_progress(name, time.perf_counter() - t0)

    def close(self, name: str) -> None:
        """Shut down one engine no later check needs (its memory back before the next is built)."""
        self.engines.pop(name).shutdown()

    def shutdown(self) -> None:
        for engine in self.engines.values():
            engine.shutdown()
        self.engines.clear()


def greedy_params(n: int, **kw):
    from radixserve import SamplingParams

    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, **kw)


def sampled_params(n: int, seed: int):
    from radixserve import SamplingParams

    return SamplingParams(max_tokens=n, temperature=0.8, top_p=0.9, top_k=40, min_p=0.02, seed=seed,
                          repetition_penalty=1.1, frequency_penalty=0.3, presence_penalty=0.2, logprobs=5,
                          ignore_eos=True)


def tokens(results) -> list[list[int]]:
    return [r.token_ids for r in results]


def first_difference(a: list[int], b: list[int]):
    """The first position where two token lists differ (a length difference counts), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def tie_margin(engine, context: list[int], tok_a: int, tok_b: int) -> Optional[float]:
    """|logprob(tok_a) - logprob(tok_b)| for the token after `context` on `engine` (the logit gap:
    log-softmax shifts every logit alike); None when either is outside the top 20."""
    out = engine.generate(list(context), greedy_params(1, logprobs=20))[0]
    top = dict(out.logprobs[0].top)
    return abs(top[tok_a] - top[tok_b]) if tok_a in top and tok_b in top else None


def compare_greedy(got: list[list[int]], want: list[list[int]], prompts: list[list[int]], ref) -> tuple[bool, dict]:
    """Greedy tokens of fp32 engines: `got` (the device under test) against `want` (mostly the CPU
    reference), where `ref` is the engine that produced `want` and judges near ties.

    The criterion: with the same weights in fp32 the only difference is summation order (Triton
    kernels and cuBLAS against torch on the CPU; another chunking or split count), which moves
    logits by ~1e-4. That can flip a greedy choice only where the two best candidates are within
    that distance. So a prompt passes when its tokens are equal, or when they first differ at a
    position where `ref`'s log-probabilities of the two candidates are within NEAR_TIE_NATS (after
    it the contexts differ and nothing further is comparable). A real fault (a wrong mask, a stale or misplaced KV page,
    a bad kernel) moves logits by far more and flips tokens with a clear margin. A position
    counter ("the first N tokens equal") would add nothing: an early near tie is as legitimate as
    a late one. Against a small systematic error that only ever flips near ties, at most half the
    prompts (one of one or two) may differ at all.
    """
    diffs, exact = [], 0
    for i, (a, b, p) in enumerate(zip(got, want, prompts)):
        k = first_difference(a, b)
        if k is None:
            exact += 1
            continue
        margin = tie_margin(ref, p + b[:k], b[k], a[k]) if k < min(len(a), len(b)) else None
        diffs.append(dict(prompt=i, first_difference=k, margin_nats=margin, got=a[k:k + 4], want=b[k:k + 4]))
    near_ties = all(d["margin_nats"] is not None and d["margin_nats"] <= NEAR_TIE_NATS for d in diffs)
    ok = near_ties and len(diffs) <= max(1, len(got) // 2)
    return ok, dict(exact=f"{exact}/{len(got)}", differences=diffs)


def degenerate(outputs: list[list[int]]) -> bool:
    """Greedy text that compares nothing: every prompt continued alike, or mostly by repeating a
    token (random weights at std 0.02 give ~1 distinct token in 12; at 0.08, 12 in 12)."""
    if not outputs or not all(outputs):
        return False
    repeats = sum(len(set(t)) / len(t) for t in outputs) / len(outputs) < 0.5
    return repeats or (len(outputs) > 1 and len({tuple(t) for t in outputs}) == 1)


def check_greedy_vs_cpu(rig: EngineRig) -> None:
    got, want = rig.greedy("dev", rig.dev()), rig.greedy("ref", rig.ref())
    ok, detail = compare_greedy(got, want, rig.prompts, rig.ref())
    rig.record("greedy fp32 batch == cpu", ok and not degenerate(want), tokens=rig.b["greedy_tokens"],
               degenerate=degenerate(want), **detail)


def logprob_deltas(got, want) -> tuple[float, int, int]:
    """Along the positions where two greedy results of one prompt have seen the same context (up to
    and including their first differing token): the largest |difference| of the logprob of any token
    in both top-k lists, the positions compared and the fewest ids the two lists share."""
    k = first_difference(got.token_ids, want.token_ids)
    n = min(len(got.logprobs), len(want.logprobs))
    worst, fewest = 0.0, TOP_LOGPROBS
    positions = n if k is None else min(n, k + 1)
    for a, b in zip(got.logprobs[:positions], want.logprobs[:positions]):
        top_a, top_b = dict(a.top), dict(b.top)
        shared = top_a.keys() & top_b.keys()
        fewest = min(fewest, len(shared))
        worst = max([worst] + [abs(top_a[t] - top_b[t]) for t in shared])
    return worst, positions, fewest


def check_host_syncs(rig: EngineRig) -> None:
    """On CUDA: a decode step waits for the device once, reading its tokens back; uploads are
    pinned and asynchronous. torch's sync debug mode warns at every synchronising call."""
    if rig.device != "cuda":
        return   # the CPU has nothing to wait for
    import warnings

    engine, n = rig.dev(), rig.b["greedy_tokens"]
    engine.generate(rig.prompts, greedy_params(2))   # prefill shapes warmed
    steps_before = engine.steps
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:   # the engine thread's warnings too
            warnings.simplefilter("always")
            engine.generate(rig.prompts, greedy_params(n))
    finally:
        torch.cuda.set_sync_debug_mode(0)
    syncs = [w for w in caught if "synchroniz" in str(w.message).lower()]
    steps = engine.steps - steps_before
    where = sorted({f"{Path(w.filename).name}:{w.lineno}" for w in syncs})
    rig.record("host syncs: at most one per step", len(syncs) <= steps, syncs=len(syncs), steps=steps,
               where=where[:8])


def check_logprob_continuity(rig: EngineRig) -> None:
    """A continuous measure beside the greedy token comparison: the same fp32 weights on the device
    and the CPU give the same log-probabilities, to summation order, wherever the context is equal."""
    got, want = rig.greedy_results("dev", rig.dev()), rig.greedy_results("ref", rig.ref())
    per_prompt = [logprob_deltas(a, b) for a, b in zip(got, want)]
    worst = max(d for d, _, _ in per_prompt)
    fewest = min(f for _, _, f in per_prompt)
    # a near tie at the 20th place swaps an id or two in and out; more means different distributions
    ok = worst <= LOGPROB_TOLERANCE and fewest >= TOP_LOGPROBS - 3
    rig.record(f"top-{TOP_LOGPROBS} logprobs along equal prefixes == cpu", ok, max_abs_delta=worst,
               tolerance=LOGPROB_TOLERANCE, positions=sum(p for _, p, _ in per_prompt), fewest_shared_ids=fewest)


def logprobs_problems(result, k: int) -> list[str]:
    """What is wrong with one result's logprobs: one per token, finite, <= 0, k alternatives sorted."""
    lps = result.logprobs
    n = len(result.token_ids)
    problems = [] if len(lps) == n else [f"{len(lps)} logprobs for {n} tokens"]
    for i, lp in enumerate(lps):
        values = [lp.logprob] + [v for _, v in lp.top]
        if not all(math.isfinite(v) and v <= 0 for v in values):
            problems.append(f"token {i}: not finite or > 0: {values}")
        if len(lp.top) != k or any(x < y for x, y in zip(values[1:], values[2:])):
            problems.append(f"token {i}: top_logprobs not {k} sorted: {lp.top}")
        if lp.top and lp.logprob > lp.top[0][1] + 1e-6:
            problems.append(f"token {i}: sampled logprob {lp.logprob} above the best {lp.top[0][1]}")
    return problems[:3]


def check_sampling(rig: EngineRig) -> None:
    """Seeded requests repeat exactly, alone or in a batch; logprobs are well formed; the same
    seeded request on the CPU (sampling noise is meant to be the same on every device)."""
    engine, n = rig.dev(), rig.b["sampled_tokens"]
    prompt, others = rig.prompts[0], rig.prompts[1:] or [rig.chat(SYSTEM, QUESTIONS[-1])]
    first = engine.generate(prompt, sampled_params(n, seed=1234))[0]
    again = engine.generate(prompt, sampled_params(n, seed=1234))[0]
    rig.record("seeded sample repeats", first.token_ids == again.token_ids,
               first_difference=first_difference(first.token_ids, again.token_ids))
    # in a batch with greedy, unseeded and other-seed neighbours, admitted at the same step
    from radixserve import SamplingParams

    neighbours = [greedy_params(n), SamplingParams(max_tokens=n, temperature=1.0, ignore_eos=True),
                  sampled_params(n, seed=99)]
    batch = engine.generate([prompt] + others, [sampled_params(n, seed=1234)]
                            + [neighbours[i % 3] for i in range(len(others))])
    rig.record("seeded sample alone == in batch", batch[0].token_ids == first.token_ids,
               batch=len(batch), first_difference=first_difference(batch[0].token_ids, first.token_ids))
    problems = logprobs_problems(first, 5) + logprobs_problems(batch[0], 5)
    rig.record("logprobs finite, <= 0, top sorted", not problems, problems=problems)
    cpu = rig.ref().generate(prompt, sampled_params(n, seed=1234))[0]
    k = first_difference(first.token_ids, cpu.token_ids)
    # equality is reported as a figure; only a different first token (the first draw, from the
    # same logits within fp32 noise) counts as a failure
    rig.record("seeded sample vs cpu (figure)", k != 0,
               equal_tokens=f"{n if k is None else k}/{n}", first_difference=k)


def schema_problems(text: str) -> list[str]:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), TRIP_SCHEMA)
    except (ValueError, jsonschema.ValidationError) as e:
        return [f"{type(e).__name__}: {str(e).splitlines()[0][:120]} in {text[:200]!r}"]
    return []


def check_json_schema(rig: EngineRig) -> None:
    from radixserve import GrammarSpec, SamplingParams

    n, spec = rig.b["json_tokens"], GrammarSpec.json_schema(TRIP_SCHEMA)
    prompts = [rig.chat(SYSTEM, JSON_QUESTION), rig.chat("You plan holidays.", JSON_QUESTION)][:rig.b["json_prompts"]]
    greedy = SamplingParams(max_tokens=n, temperature=0.0, constraint=spec)
    sampled = [SamplingParams(max_tokens=n, temperature=0.9, seed=5 + i, constraint=spec) for i in range(len(prompts))]
    # greedy and sampled constrained requests in one batch
    results = rig.dev().generate(prompts + prompts, [greedy] * len(prompts) + sampled)
    problems = [p for r in results for p in schema_problems(r.text)]
    problems += [f"finish_reason {r.finish_reason}" for r in results if r.finish_reason != "stop"]
    rig.record("json_schema outputs validate", not problems, requests=len(results), problems=problems,
               example=results[0].text)
    want = tokens(rig.ref().generate(prompts, greedy))
    ok, detail = compare_greedy(tokens(results[:len(prompts)]), want, prompts, rig.ref())
    rig.record("json_schema greedy == cpu", ok, **detail)


def check_prefix_hit(rig: EngineRig) -> None:
    system = "You answer questions about European railways. " * rig.b["long_system_repeats"] * 4
    prompts = [rig.chat(system, QUESTIONS[0]), rig.chat(system, QUESTIONS[1])]
    engine, params = rig.dev(), greedy_params(rig.b["greedy_tokens"])
    first = engine.generate(prompts[0], params)[0]
    second = engine.generate(prompts[1], params)[0]
    ok, detail = compare_greedy([first.token_ids, second.token_ids], tokens(rig.ref().generate(prompts, params)),
                                prompts, rig.ref())
    rig.record("prefix hit: cached_tokens > 0, greedy == cpu", ok and second.cached_tokens > 0,
               prompt_tokens=len(prompts[1]), cached_tokens=second.cached_tokens, **detail)


def check_chunked_prefill(rig: EngineRig) -> None:
    chunk, n = rig.b["chunk"], rig.b["greedy_tokens"]
    system = SYSTEM * rig.b["long_system_repeats"] * 2
    prompt = rig.chat(system, QUESTIONS[2])
    chunked = rig.dev("chunked", chunked_prefill_size=chunk, max_batched_tokens=chunk)
    steps_before = getattr(chunked, "steps", None)
    got = chunked.generate(prompt, greedy_params(n))[0].token_ids
    # steps = prefill chunks + (n - 1) decodes: the last chunk samples the first token
    chunks = chunked.steps - steps_before - (n - 1) if steps_before is not None else "unknown"
    whole = rig.dev().generate(prompt, greedy_params(n))[0].token_ids
    cpu = rig.ref().generate(prompt, greedy_params(n))[0].token_ids
    # chunk boundaries change the attention kernels' summation order, so near ties are judged too
    ok_whole, vs_whole = compare_greedy([got], [whole], [prompt], rig.dev())
    ok_cpu, vs_cpu = compare_greedy([got], [cpu], [prompt], rig.ref())
    chunked_enough = chunks == "unknown" or chunks >= -(-len(prompt) // chunk)
    rig.record(f"chunked prefill ({chunk}) == whole == cpu", ok_whole and ok_cpu and chunked_enough,
               prompt_tokens=len(prompt), prefill_steps=chunks, vs_whole=vs_whole, vs_cpu=vs_cpu)
    rig.close("chunked")


def decode_graphs(engine):
    """The engine's CUDA-graph runner, or None; "unknown" when the runner has no such attribute
    (model_runner is being refactored: look, never assume)."""
    runner = getattr(engine, "runner", None)
    for name in ("graphs", "graph_runner", "decode_graphs", "cuda_graphs"):
        if hasattr(runner, name):
            return getattr(runner, name)
    return "unknown"


def graphs_captured(engine):
    """True / False / "unknown": whether the engine holds captured decode graphs."""
    graphs = decode_graphs(engine)
    if graphs is None or graphs == "unknown":
        return False if graphs is None else "unknown"
    captured = getattr(graphs, "graphs", None)
    return bool(captured) if isinstance(captured, dict) else "unknown"


def count_replays(engine):
    """Wrap the graph runner's `run` to count the decode steps it served; None when there is none."""
    graphs = decode_graphs(engine)
    run = getattr(graphs, "run", None)
    if not callable(run):
        return None
    served = [0]

    def counted(*args, **kwargs):
        out = run(*args, **kwargs)
        served[0] += out is not None
        return out
    graphs.run = counted
    return served


def check_cuda_graphs(rig: EngineRig) -> None:
    engine = rig.dev()
    with_graphs = rig.greedy("dev", engine)
    eager_engine = rig.dev("eager", disable_cuda_graph=True)
    eager = rig.greedy("eager", eager_engine)
    captured, served = graphs_captured(engine), rig.replays.get("dev")
    # near ties judged as against the CPU: a graph fixes the decode-attention split count for the
    # model's whole context, eager steps split by the batch's own length (another summation order)
    ok, detail = compare_greedy(with_graphs, eager, rig.prompts, eager_engine)
    if rig.device == "cuda":  # the graphs must exist and serve the decodes (unless the runner changed shape)
        ok = ok and captured is not False and not (captured is True and served is not None and served[0] == 0)
    rig.record("cuda graphs == eager (greedy batch)", ok, graphs_captured=captured,
               graph_sizes=getattr(decode_graphs(engine), "sizes", None) if captured is True else None,
               graph_steps=served[0] if served is not None else "unknown", **detail)
    rig.close("eager")


@contextlib.contextmanager
def openai_server(engine, name: str):
    """The real app (uvicorn, a free loopback port) around `engine`; yields the official client."""
    import openai
    import uvicorn

    from radixserve.api.server import build_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(build_app(engine, served_model_name=name), host="127.0.0.1",
                                           port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="gpu-check-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.05)
    try:
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def check_server(rig: EngineRig) -> None:
    n = rig.b["server_tokens"]
    ask = dict(model="gpu-check", messages=[{"role": "user", "content": QUESTIONS[3]}], max_tokens=n, temperature=0)
    with openai_server(rig.dev(), "gpu-check") as client:
        rig.run_check("server: chat completion", lambda: server_chat(rig, client, ask))
        rig.run_check("server: streamed chat", lambda: server_stream(rig, client, ask))
        rig.run_check("server: json_schema response_format", lambda: server_json(rig, client))


def server_chat(rig: EngineRig, client, ask: dict) -> None:
    reply = client.chat.completions.create(**ask)
    choice, used = reply.choices[0], reply.usage.completion_tokens
    rig.server_reply = (choice.message.content, choice.finish_reason, used)
    ended = choice.finish_reason == "stop" or (choice.finish_reason == "length" and used == ask["max_tokens"])
    ok = bool(choice.message.content) and ended
    rig.record("server: chat completion", ok, finish_reason=choice.finish_reason, usage=reply.usage.model_dump(),
               text=choice.message.content)


def server_stream(rig: EngineRig, client, ask: dict) -> None:
    """Every chunk arrives (text, finish_reason and token count equal the unstreamed greedy reply's),
    and finish_reason is set once, in the last chunk with a choice."""
    chunks, text, reasons, usage = 0, [], [], None
    for chunk in client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}):
        chunks += 1
        usage = chunk.usage or usage
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            if choice.finish_reason:
                reasons.append((chunks, choice.finish_reason))
    text = "".join(text)
    want_text, want_reason, want_tokens = rig.server_reply
    last_choice_chunk = chunks - (usage is not None)  # the usage chunk, when sent, comes after it
    ok = (reasons == [(last_choice_chunk, want_reason)] and text == want_text
          and usage is not None and usage.completion_tokens == want_tokens)
    rig.record("server: streamed chat", ok, chunks=chunks, finish_reasons=reasons,
               completion_tokens=usage.completion_tokens if usage else None,
               equal_to_unstreamed=text == want_text, text=text)


def server_json(rig: EngineRig, client) -> None:
    reply = client.chat.completions.create(
        model="gpu-check", messages=[{"role": "user", "content": JSON_QUESTION}], max_tokens=rig.b["json_tokens"],
        temperature=0, response_format={"type": "json_schema", "json_schema": {"name": "trip", "schema": TRIP_SCHEMA}})
    text = reply.choices[0].message.content or ""
    problems = schema_problems(text)
    rig.record("server: json_schema response_format", not problems and reply.choices[0].finish_reason == "stop",
               finish_reason=reply.choices[0].finish_reason, problems=problems, text=text)


# -- figures -------------------------------------------------------------------------------------
def random_prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(100, vocab, (count, length), generator=gen).tolist()


def timed_generate(engine, prompts, max_tokens: int) -> float:
    """Seconds for a cold run (the radix cache flushed first) of greedy requests."""
    engine.flush_cache()
    t0 = time.perf_counter()
    engine.generate(prompts, greedy_params(max_tokens))
    return time.perf_counter() - t0


def engine_throughput(rig: EngineRig, engine) -> dict:
    """Decode tokens/s at each batch size (time for 1 + D tokens minus time for 1 token isolates the
    D decode steps) and prefill prompt tokens/s (max_tokens 1, cold cache), as served."""
    b, vocab = rig.b, rig.files.config.vocab_size
    fig = {}
    for batch in b["decode_batches"]:
        prompts = random_prompts(batch, 32, vocab, seed=batch)
        timed_generate(engine, prompts, 2)  # warm-up
        prefill = min(timed_generate(engine, prompts, 1) for _ in range(b["repeats"]))
        whole = timed_generate(engine, prompts, 1 + b["decode_tokens"])
        fig[f"decode_tok_s_batch{batch}"] = round(batch * b["decode_tokens"] / max(1e-9, whole - prefill), 1)
    prompts = random_prompts(b["prefill_requests"], b["prefill_len"], vocab, seed=7)
    timed_generate(engine, prompts, 1)  # warm-up: kernels compile for these shapes
    sec = min(timed_generate(engine, prompts, 1) for _ in range(b["repeats"]))
    fig[f"prefill_tok_s_{b['prefill_requests']}x{b['prefill_len']}"] = round(len(prompts) * b["prefill_len"] / sec, 1)
    return fig


def transformers_model(files, dtype: torch.dtype, device: str):
    """transformers' own Llama with the engine's weights (None for other families)."""
    import transformers as tf

    c = files.config
    if c.model_type != "llama" or c.rope_scaling:
        return None
    with torch.device(device):
        hf = tf.LlamaForCausalLM(hf_llama_config(c)).to(dtype).eval()
    missing, unexpected = hf.load_state_dict(files.dequantized(), strict=False)
    missing = [n for n in missing if not (c.tie_word_embeddings and n == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"transformers' Llama and the engine's weights differ: {missing[:3]} {unexpected[:3]}")
    return hf


def transformers_throughput(rig: EngineRig, dtype: str) -> dict:
    """transformers' generate on the same weights and shapes as engine_throughput (decode only)."""
    b = rig.b
    hf = transformers_model(rig.files, getattr(torch, dtype), rig.device)
    if hf is None:
        return {}
    device = torch.device(rig.device)
    fig = {f"transformers_decode_tok_s_batch{batch}": round(hf_decode(hf, batch, 32, b["decode_tokens"], device), 1)
           for batch in b["decode_batches"]}
    del hf
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return fig


def measure_engine_figures(rig: EngineRig) -> None:
    for dtype in rig.b["throughput_dtypes"]:
        engine = rig.dev() if dtype == "float32" else rig.dev(dtype, dtype=dtype)
        fig = rig.figures[f"throughput_{dtype}"] = engine_throughput(rig, engine)
        if dtype != "float32":
            rig.close(dtype)
        fig.update(transformers_throughput(rig, dtype))
        for batch in rig.b["decode_batches"]:
            theirs = fig.get(f"transformers_decode_tok_s_batch{batch}")
            if theirs:
                fig[f"decode_vs_transformers_batch{batch}"] = round(fig[f"decode_tok_s_batch{batch}"] / theirs, 2)


ENGINE_CHECKS = [("greedy fp32 batch == cpu", check_greedy_vs_cpu), ("logprobs == cpu", check_logprob_continuity),
                 ("sampling", check_sampling),
                 ("json_schema", check_json_schema), ("prefix hit", check_prefix_hit),
                 ("chunked prefill", check_chunked_prefill), ("cuda graphs", check_cuda_graphs),
                 ("server", check_server), ("host syncs", check_host_syncs), ("figures", measure_engine_figures)]


def engine_model_files(model: Optional[str], random: bool, std: float):
    """The model under test: a GGUF file or model directory (None: the embedded default model),
    with its own weights or, for a config-and-tokenizer skeleton such as .gpu/model, random ones."""
    import dataclasses

    from radixserve.runtime.models.loader import load_model_files
    from radixserve.runtime.models.random_init import random_weights

    files = load_model_files(model, weights=not random)
    if random:
        files = dataclasses.replace(files, weights=random_weights(files.config, torch.float32, seed=0, std=std))
    return files


def check_engine(device: str, budget: str, files, progress=None) -> dict:
    """Run every engine check; one that raises is recorded as failed and the rest still run.
    `progress(results so far)` is called after each check."""
    t0 = time.perf_counter()
    rig = EngineRig(device, ENGINE_BUDGETS[budget], files)

    def results() -> dict:
        return dict(device=device, budget=budget, model=files.name, checks=rig.checks, figures=rig.figures,
                    seconds=round(time.perf_counter() - t0, 1))
    try:
        for name, check in ENGINE_CHECKS:
            rig.run_check(name, lambda: check(rig))
            if progress is not None:
                progress(results())
        # the fp32 comparisons assume true fp32 matmuls (TF32 moves CUDA logits by ~1e-3 relative):
        # the settings the engine left, as the checks ran
        rig.figures["float32_matmul_precision"] = torch.get_float32_matmul_precision()
        rig.figures["allow_tf32"] = dict(matmul=torch.backends.cuda.matmul.allow_tf32,
                                         cudnn=torch.backends.cudnn.allow_tf32)
    finally:
        rig.shutdown()
    return results()


# ---- report ------------------------------------------------------------------------------------
def table(title: str, rows: list[dict]) -> str:
    if not rows:
        return ""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else str(v)  # noqa: E731
    cells = [[fmt(r.get(k, "")) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    lines = [title, "  ".join(k.ljust(w) for k, w in zip(keys, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(lines) + "\n"


SECTIONS = ("kernels", "roofline", "throughput", "engine")
KERNEL_SECTIONS = SECTIONS[:3]


def log_progress(what: str, seconds: float) -> None:
    print(f"  {what}: {seconds:.1f} s", file=sys.stderr, flush=True)


def run_section(name: str, checks: list[dict], fn) -> None:
    """Run one section; an exception becomes a failed check of that section, the rest still run."""
    t0 = time.perf_counter()
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        checks.append(dict(section=name, check="runs", ok=False, error=f"{type(e).__name__}: {e}",
                           where=traceback.format_exc(limit=-3)))
    log_progress(f"section {name}", time.perf_counter() - t0)


def kernel_checks(rows: list[dict], dtype) -> list[dict]:
    """A kernel passes within fp32 rounding of its reference (bf16: bf16 rounding of its output)."""
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    return [dict(section="kernels", check=f"{r['kernel']} (page {r['page_size']}) ~ reference",
                 ok=r["rel_err"] <= tol, rel_err=r["rel_err"], tolerance=tol) for r in rows]


def run_throughput(s: dict, device, args, results: dict) -> None:
    rows, model, attn, kv, graphs = check_decode_throughput(s, device)
    results["prefill"] = check_prefill(s, model, kv, device)
    del model, attn, kv, graphs
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if not args.skip_transformers:
        add_hf_baseline(rows, s, device)
    results["decode_throughput"] = rows
    print(table("3. decode throughput (tokens/s; model forward + argmax + sync per step)", rows))
    print(table("4. prefill", results["prefill"]), flush=True)


def run_kernel_sections(sections: list[str], s: dict, device, args, results: dict, checks: list[dict], save) -> None:
    def kernels():
        results["kernels"] = check_kernels(s, device)
        checks.extend(kernel_checks(results["kernels"], s["dtype"]))
        if device.type == "cuda":   # on the CPU the staging buffer is the tensor: nothing is copied
            checks.append(check_staging(device))
        print(table("1. kernels vs torch reference (relative L2 error)", results["kernels"]), flush=True)

    def roofline():
        results["decode_roofline"] = check_roofline(s, device)
        print(table("2. decode attention vs memory roofline", results["decode_roofline"]), flush=True)

    with torch.inference_mode():
        for name, fn in (("kernels", kernels), ("roofline", roofline),
                         ("throughput", lambda: run_throughput(s, device, args, results))):
            missing = KERNELS_IMPORT_ERROR or (MODEL_IMPORT_ERROR if name == "throughput" else None)
            if name in sections and missing:
                checks.append(dict(section=name, check="imports", ok=False, error=missing))
            elif name in sections:
                run_section(name, checks, fn)
                save()


def summary(checks: list[dict]) -> str:
    def detail(c: dict) -> str:
        text = json.dumps({k: v for k, v in c.items() if k not in ("section", "check", "ok", "where")}, default=str)
        return text if len(text) <= 110 else text[:107] + "..."
    rows = [dict(section=c["section"], check=c["check"], result="ok" if c["ok"] else "FAIL", detail=detail(c))
            for c in checks]
    return table("checks", rows)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__.split("\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sections", default=None,
                    help=f"comma-separated subset of {','.join(SECTIONS)} (default: all; with --device cpu: engine)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None,
                    help="device under test (default cuda); cpu: the engine section as a CPU-vs-CPU self-test")
    ap.add_argument("--budget", choices=sorted(ENGINE_BUDGETS), default=None,
                    help="engine section sizes (default: full on CUDA, small on the CPU)")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="every section on the CPU: tiny shapes, Triton interpreter (implies --device cpu)")
    ap.add_argument("--json", "--out", dest="json", default=None,
                    help="results JSON (default bench/results/gpu_check.json on CUDA; on the CPU only when given)")
    ap.add_argument("--skip-transformers", action="store_true", help="no transformers baseline in throughput")
    ap.add_argument("--model", default=None,
                    help="engine section: a GGUF file or model directory (default: the embedded model)")
    ap.add_argument("--random-weights", action="store_true",
                    help="engine section: random weights of the model's shape (a config-and-tokenizer "
                         "skeleton such as .gpu/model needs them)")
    ap.add_argument("--weight-std", type=float, default=0.08,
                    help="their scale: at 0.02 greedy decoding collapses to one repeated token on every "
                         "prompt, and nothing is compared; 0.08 keeps it diverse and context-dependent")
    args = ap.parse_args(argv)
    args.device = "cpu" if args.cpu_smoke else (args.device or "cuda")
    if args.sections is None:
        args.sections = list(SECTIONS) if args.device == "cuda" or args.cpu_smoke else ["engine"]
    else:
        args.sections = [x.strip() for x in args.sections.split(",") if x.strip()]
        bad = sorted(set(args.sections) - set(SECTIONS))
        if bad:
            ap.error(f"unknown section(s) {', '.join(bad)}; choose from {', '.join(SECTIONS)}")
    if args.device == "cpu" and not args.cpu_smoke and set(args.sections) & set(KERNEL_SECTIONS):
        ap.error("the kernel sections run on the CPU only under --cpu-smoke (the Triton interpreter)")
    args.budget = args.budget or ("full" if args.device == "cuda" else "small")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (use --cpu-smoke or --device cpu to exercise the code on CPU)",
              file=sys.stderr)
        return 2
    kernel_sections = [x for x in args.sections if x in KERNEL_SECTIONS]
    triton = getattr(globals().get("ta"), "triton", None)
    if kernel_sections and not KERNELS_IMPORT_ERROR and triton is None:
        print("gpu_check: triton is not installed", file=sys.stderr)
        return 2
    s = SMOKE_SIZES if args.cpu_smoke else FULL
    device = torch.device(args.device)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    results: dict = dict(device=torch.cuda.get_device_name(device) if device.type == "cuda"
                         else "cpu (smoke)" if args.cpu_smoke else "cpu (engine self-test)",
                         torch=torch.__version__, triton=getattr(triton, "__version__", None),
                         sections=args.sections)
    if kernel_sections:
        results.update(model=vars(s["model"]) | {}, dtype=str(s["dtype"]))
    checks: list[dict] = []
    finished = False
    out = args.json or (str(Path(__file__).with_name("results") / "gpu_check.json") if args.device == "cuda" else None)

    def save() -> None:
        """The report so far: a run killed by its time limit keeps what it finished."""
        if out:
            engine_checks = results.get("engine", {}).get("checks", [])  # in `checks` once it is done
            results.update(checks=checks, all_passed=all(c["ok"] for c in checks + engine_checks),
                           complete=finished, seconds=time.perf_counter() - t0)
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            Path(out).write_text(json.dumps(results, indent=1, default=str))

    run_kernel_sections(kernel_sections, s, device, args, results, checks, save)
    if "engine" in args.sections:
        def engine():
            t_load = time.perf_counter()
            files = engine_model_files(args.model, args.random_weights, args.weight_std)
            load_s = round(time.perf_counter() - t_load, 2)

            def progress(part: dict) -> None:
                results["engine"] = part | dict(random_weights=args.random_weights)
                save()
            done = check_engine(args.device, args.budget, files, progress)
            done["figures"]["model_load_s"] = load_s
            progress(done)
            checks.extend(done["checks"])
            print(table("engine figures", [dict(figure=k, value=json.dumps(v)) for k, v in
                                              done["figures"].items()]), flush=True)
        run_section("engine", checks, engine)
    results["checks"] = checks
    results["all_passed"] = all(c["ok"] for c in checks)
    results["seconds"] = time.perf_counter() - t0
    print(summary(checks))
    failed = sum(not c["ok"] for c in checks)
    print(f"{len(checks) - failed}/{len(checks)} checks passed; total {results['seconds']:.0f} s")
    finished = True
    save()
    if out:
        print(f"wrote {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
