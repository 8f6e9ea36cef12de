"""Random-weight GGUFs of real model shapes, made here (nothing is downloaded), for the benches
that compare radixserve with llama.cpp's server on the same file.

    python bench/make_gguf.py --shape 1b        # bench/models/llama-1b-F16.gguf, then with
    python bench/make_gguf.py --shape 8b --type Q8_0   # llama-quantize (make bench-peers):
    python bench/make_gguf.py --shape 1b --quantize Q4_K_M Q6_K Q8_0 Q4_1

Shapes: Llama-3.2-1B (hidden 2048, 16 layers, 32 heads, 8 KV heads, FFN 8192, tied embeddings)
and Llama-3.1-8B (4096, 32, 32, 8, 14336, separate output), both with the default model's
tokenizer (SmolLM2's 49,152 tokens). Tensors are written one at a time: an 8B F16 file is 16 GB
and is never whole in memory. Weights ~ N(0, 0.02), norms ~ U(0.5, 1.5): the logits are noise,
the bytes and the work are a real model's.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SHAPES = {
    "1b": dict(hidden=2048, layers=16, heads=32, kv_heads=8, ffn=8192, tied=True, theta=500000.0),
    "8b": dict(hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336, tied=False, theta=500000.0),
}
QUANTIZE = HERE / "peers" / "llama.cpp" / "bin" / "llama-quantize"


def tensors(shape: dict, vocab: int):
    """(GGUF name, numpy shape rows x cols, is a norm) in file order."""
    h, d = shape["hidden"], shape["hidden"] // shape["heads"]
    yield "token_embd.weight", (vocab, h), False
    for i in range(shape["layers"]):
        p = f"blk.{i}."
        yield p + "attn_norm.weight", (h,), True
        yield p + "attn_q.weight", (shape["heads"] * d, h), False
        yield p + "attn_k.weight", (shape["kv_heads"] * d, h), False
        yield p + "attn_v.weight", (shape["kv_heads"] * d, h), False
        yield p + "attn_output.weight", (h, shape["heads"] * d), False
        yield p + "ffn_norm.weight", (h,), True
        yield p + "ffn_gate.weight", (shape["ffn"], h), False
        yield p + "ffn_up.weight", (shape["ffn"], h), False
        yield p + "ffn_down.weight", (h, shape["ffn"]), False
    yield "output_norm.weight", (h,), True
    if not shape["tied"]:
        yield "output.weight", (vocab, h), False


def write(path: Path, name: str, shape: dict, kind: str, seed: int = 0) -> Path:
    import gguf

    sys.path.insert(0, str(HERE.parent.parent))
    from radixserve.runtime.models.gguf_file import read_gguf
    from radixserve.runtime.models.loader import default_model_path

    fields, _ = read_gguf(default_model_path())
    vocab = len(fields["tokenizer.ggml.tokens"])
    qtype = gguf.GGMLQuantizationType[kind]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_block_count(shape["layers"])
    w.add_context_length(8192)
    w.add_embedding_length(shape["hidden"])
    w.add_feed_forward_length(shape["ffn"])
    w.add_head_count(shape["heads"])
    w.add_head_count_kv(shape["kv_heads"])
    w.add_rope_freq_base(shape["theta"])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type({"F16": 1, "Q8_0": 7}[kind])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(fields["tokenizer.ggml.pre"])
    w.add_token_list(fields["tokenizer.ggml.tokens"])
    w.add_token_types(fields["tokenizer.ggml.token_type"])
    w.add_token_merges(fields["tokenizer.ggml.merges"])
    for key in ("bos", "eos"):
        if f"tokenizer.ggml.{key}_token_id" in fields:
            getattr(w, f"add_{key}_token_id")(fields[f"tokenizer.ggml.{key}_token_id"])
    if "tokenizer.chat_template" in fields:
        w.add_chat_template(fields["tokenizer.chat_template"])
    rng = np.random.default_rng(seed)
    plan = list(tensors(shape, vocab))
    for tname, dims, norm in plan:   # infos first: the header lists every tensor before the data
        t = qtype if not norm else gguf.GGMLQuantizationType.F32
        nbytes = int(np.prod(dims)) * 4 if norm else gguf.quant_shape_to_byte_shape(dims, qtype)[-1] * int(
            np.prod(dims[:-1]))
        w.add_tensor_info(tname, gguf.quant_shape_to_byte_shape(dims, t) if not norm else dims,
                          np.float32 if norm else np.uint8, nbytes, raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for tname, dims, norm in plan:
        if norm:
            a = rng.uniform(0.5, 1.5, dims).astype(np.float32)
        else:   # row chunks: an 8B embedding is 2 GB of float32 before quantizing
            parts = []
            for r0 in range(0, dims[0], 4096):
                rows = min(4096, dims[0] - r0)
                x = (rng.standard_normal((rows, dims[1]), dtype=np.float32) * 0.02)
                parts.append(x.astype(np.float16).view(np.uint8) if kind == "F16" else gguf.quants.quantize(x, qtype))
            a = np.concatenate(parts)
        w.write_tensor_data(a)
    w.close()
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    ap.add_argument("--type", choices=["F16", "Q8_0"], default="F16", help="the base file's type")
    ap.add_argument("--quantize", nargs="*", default=[], help="llama-quantize types to make from the base file")
    ap.add_argument("--out", type=Path, default=HERE / "models")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    base = args.out / f"llama-{args.shape}-{args.type}.gguf"
    need = sum(int(np.prod(d)) for _, d, _ in tensors(SHAPES[args.shape], 49152)) * (2 if args.type == "F16" else 1.07)
    if not base.exists():
        free = shutil.disk_usage(args.out).free
        if free < need * 1.2:
            sys.exit(f"{args.out}: {free / 1e9:.1f} GB free, {need / 1e9:.1f} GB needed")
        write(base.with_suffix(".part"), f"llama-{args.shape}-random", SHAPES[args.shape], args.type).rename(base)
        print(f"wrote {base} ({base.stat().st_size / 1e9:.2f} GB)")
    for q in args.quantize:
        dest = args.out / f"llama-{args.shape}-{q}.gguf"
        if dest.exists():
            continue
        if not QUANTIZE.exists():
            sys.exit(f"{QUANTIZE} is missing: make bench-peers builds it")
        # from a Q8_0 base (the 8B's, half an F16 file's disk) llama-quantize wants leave to requantize
        again = ["--allow-requantize"] if args.type != "F16" else []
        done = subprocess.run([str(QUANTIZE), *again, str(base), str(dest), q], capture_output=True, text=True)
        if done.returncode:
            dest.unlink(missing_ok=True)   # what it wrote before failing would pass for the file next time
            sys.exit(f"llama-quantize failed:\n{done.stderr[-3000:]}")
        print(f"wrote {dest} ({dest.stat().st_size / 1e9:.2f} GB)")


if __name__ == "__main__":
    main()
