"""GPU check: one command on a CUDA machine with torch, triton and transformers installed.

    python bench/gpu_check.py              # CUDA only; < 8 minutes on one H100/H200-class GPU
    python bench/gpu_check.py --cpu-smoke  # tiny shapes, Triton interpreter, torch CPU: code paths only

Prints a table and writes bench/results/gpu_check.json (--out to change; --cpu-smoke writes only
with --out):
1. each Triton kernel against its torch reference on realistic shapes (relative L2 error);
2. decode attention time against the memory roofline: K/V bytes read / the bandwidth of a large
   device-to-device copy, at batch 1/32/128 and context 1k/8k;
3. decode throughput of a random-weight Llama-3-8B-shaped model (bf16) at batch 1/16/64/256 with
   CUDA graphs on and off (model forward + greedy argmax + host sync per step, as the engine does;
   no scheduler), and transformers' generate on the same shapes as the baseline;
4. prefill tokens/s at 2k-token prompts, with and without a 1.5k-token cached prefix.

Imports only torch, triton, transformers and the model/kernel modules (no server, no grammar).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

SMOKE = "--cpu-smoke" in sys.argv
if SMOKE:  # triton reads it when kernels are decorated, i.e. at import
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from radixserve.kernels import triton_attention as ta  # noqa: E402
from radixserve.kernels.paged_attention import attention_bias, decode_attention, decode_kv_rows, extend_attention, write_kv  # noqa: E402
from radixserve.runtime.attention import TritonAttentionBackend  # noqa: E402
from radixserve.runtime.cuda_graph import DecodeGraphRunner  # noqa: E402
from radixserve.runtime.forward_batch import ExtendSegment, ForwardBatch  # noqa: E402
from radixserve.runtime.kv_cache import KVCache  # noqa: E402
from radixserve.runtime.models.config import ModelConfig  # noqa: E402
from radixserve.runtime.models.llama import LlamaForCausalLM  # noqa: E402
from radixserve.runtime.models.random_init import random_weights  # noqa: E402

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
    segs = s["extend_segments"]
    pc = Paged([p + n for p, n in segs], 16, kvh, dim, dtype, device)
    total = sum(n for _, n in segs)
    q = torch.randn(total, heads, dim, device=device, dtype=dtype)
    want, meta, start = torch.empty(total, heads, dim, device=device), [], 0
    for r, (pre, n) in enumerate(segs):
        slots = pc.slots(r, pre + n)
        kf, vf = pc.k.view(-1, kvh, dim)[slots[pre:]].float(), pc.v.view(-1, kvh, dim)[slots[pre:]].float()
        want[start:start + n] = extend_attention(q[start:start + n].float(), kf, vf, pc.k.float(), pc.v.float(),
                                                 slots if pre else None, pre, scale)
        meta.append((start, n, pre, r))
        start += n
    meta_t = torch.tensor(meta, dtype=torch.long, device=device).t().contiguous()
    got = ta.extend_attention_triton(q, pc.k, pc.v, pc.table, meta_t, max(n for _, n in segs), scale,
                                     torch.empty_like(q))
    rows.append(dict(kernel="extend_attention", page_size=16, shape=f"segments(prefix,new)={segs}",
                     rel_err=rel_err(got, want)))
    k = torch.randn(total, kvh, dim, device=device, dtype=dtype)
    v = torch.randn(total, kvh, dim, device=device, dtype=dtype)
    slots = torch.cat([pc.slots(r, p + n)[p:] for r, (p, n) in enumerate(segs)])
    kr, vr = pc.k.clone(), pc.v.clone()
    write_kv(kr, vr, slots, k, v)
    ta.write_kv_triton(pc.k, pc.v, slots, k, v)
    rows.append(dict(kernel="write_kv", page_size=16, shape=f"T={total}",
                     rel_err=max(rel_err(pc.k, kr), rel_err(pc.v, vr))))
    return rows


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
def decode_batch(ids, lens, slots, table) -> ForwardBatch:
    """Decode rows with the Triton backend's metadata (what ModelRunner builds), one copy."""
    n, dev = len(ids), table.device
    flat = torch.tensor(ids + [x - 1 for x in lens] + slots + list(range(n)) + lens, dtype=torch.long).to(dev)
    i, pos, out, rows, ln = flat.split([n] * 5)
    return ForwardBatch(input_ids=i, positions=pos, out_slots=out, num_decode=n, sample_rows=None,
                        page_table=table, decode_rows=rows, decode_lens=ln, decode_max_len=max(lens))


def our_decode(model, attn, kv: KVCache, table, batch: int, ctx: int, steps: int, graphs) -> float:
    """Tokens/s over `steps` greedy decode steps of `batch` requests that start at `ctx` tokens."""
    p = kv.k.shape[2]
    ids, lens = [1] * batch, [ctx + 1] * batch
    host_table = table.tolist()  # slots are computed on the host, as the engine does

    def step():
        nonlocal ids
        slot = [host_table[r][(n - 1) // p] * p + (n - 1) % p for r, n in enumerate(lens)]
        if graphs is not None:
            logits = graphs.run([ids, [n - 1 for n in lens], slot, list(range(batch)), lens])
        else:
            logits = model.forward(decode_batch(ids, lens, slot, table), attn)
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
    model = LlamaForCausalLM(cfg, random_weights(cfg, dtype, device), dtype, device)
    per_req = -(-(ctx + steps + 4) // p)
    pages = max(max_b * per_req, s["prefill_requests"] * -(-s["prefill_len"] // p))
    kv = KVCache(cfg.num_layers, pages, p, cfg.num_kv_heads, cfg.head_dim, dtype, device)
    table = torch.arange(max_b * per_req, device=device).view(max_b, per_req)
    attn = TritonAttentionBackend(kv, cfg.head_dim)
    graphs = DecodeGraphRunner(model, attn, table, max_b, cfg.max_context_len, kv.pad_page * p,
                               capture=device.type == "cuda")
    rows = []
    for b in s["decode_batches"]:
        eager = our_decode(model, attn, kv, table, b, ctx, steps, None)
        graphed = our_decode(model, attn, kv, table, b, ctx, steps, graphs)
        rows.append(dict(batch=b, context=ctx, eager_tok_s=eager, cuda_graph_tok_s=graphed))
    return rows, model, attn, kv, graphs


def add_hf_baseline(rows: list[dict], s: dict, device) -> None:
    import transformers as tf

    cfg, dtype = s["model"], s["dtype"]
    hf_cfg = tf.LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                            num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
                            num_key_value_heads=cfg.num_kv_heads, max_position_embeddings=cfg.max_context_len,
                            rope_theta=cfg.rope_theta, tie_word_embeddings=False)
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
def check_prefill(s: dict, model, attn, kv: KVCache, device) -> list[dict]:
    p, n_req, length = kv.k.shape[2], s["prefill_requests"], s["prefill_len"]
    per_req = -(-length // p)
    table = torch.arange(n_req * per_req, device=device).view(n_req, per_req)
    host_table, rows = table.tolist(), []
    for cached in (0, s["prefill_cached"]):
        new = length - cached
        ids, positions, slots, meta = [], [], [], [[], [], [], []]
        for r in range(n_req):
            start = len(ids)
            ids += [(r * 7 + i) % model.cfg.vocab_size for i in range(new)]
            positions += list(range(cached, length))
            slots += [host_table[r][q // p] * p + q % p for q in range(cached, length)]
            for col, val in zip(meta, (start, new, cached, r)):
                col.append(val)
        t = len(ids)
        flat = torch.tensor(ids + positions + slots + sum(meta, []), dtype=torch.long, device=device)
        i, pos, out, m = flat.split([t, t, t, 4 * n_req])
        batch = ForwardBatch(input_ids=i, positions=pos, out_slots=out, num_decode=0,
                             extends=[ExtendSegment(a, b, c, None) for a, b, c in zip(*meta[:3])],
                             sample_rows=torch.tensor(meta[0], device=device) + new - 1, page_table=table,
                             extend_meta=m.view(4, n_req), extend_max_len=new)
        sec = timed(lambda: model.forward(batch, attn), max(1, s["iters"] // 4), device)
        rows.append(dict(requests=n_req, prompt_len=length, cached_prefix=cached, new_tokens_per_s=t / sec,
                         prompt_tokens_per_s=n_req * length / sec, ms=sec * 1e3))
    return rows


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on CPU under the Triton interpreter")
    ap.add_argument("--out", default=None, help="results JSON (default bench/results/gpu_check.json on CUDA)")
    ap.add_argument("--skip-transformers", action="store_true", help="no transformers baseline")
    args = ap.parse_args()
    if not args.cpu_smoke and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (use --cpu-smoke to exercise the code paths on CPU)", file=sys.stderr)
        return 2
    if ta.triton is None:
        print("gpu_check: triton is not installed", file=sys.stderr)
        return 2
    s = SMOKE_SIZES if args.cpu_smoke else FULL
    device = torch.device("cpu" if args.cpu_smoke else "cuda")
    torch.manual_seed(0)
    t0 = time.perf_counter()
    results: dict = dict(device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (smoke)",
                         torch=torch.__version__, triton=ta.triton.__version__, model=vars(s["model"]) | {},
                         dtype=str(s["dtype"]))
    with torch.inference_mode():
        results["kernels"] = check_kernels(s, device)
        print(table("1. kernels vs torch reference (relative L2 error)", results["kernels"]), flush=True)
        results["decode_roofline"] = check_roofline(s, device)
        print(table("2. decode attention vs memory roofline", results["decode_roofline"]), flush=True)
        rows, model, attn, kv, graphs = check_decode_throughput(s, device)
        results["prefill"] = check_prefill(s, model, attn, kv, device)
        del model, attn, kv, graphs
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if not args.skip_transformers:
            add_hf_baseline(rows, s, device)
        results["decode_throughput"] = rows
    print(table("3. decode throughput (tokens/s; model forward + argmax + sync per step)", rows))
    print(table("4. prefill", results["prefill"]))
    results["seconds"] = time.perf_counter() - t0
    print(f"total {results['seconds']:.0f} s")
    out = args.out or (None if args.cpu_smoke else str(Path(__file__).with_name("results") / "gpu_check.json"))
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(results, indent=1, default=str))
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
