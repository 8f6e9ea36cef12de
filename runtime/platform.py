"""Everything that differs between devices, chosen once at start-up.

Generic modules take the engine's device (or its `Platform`) and never probe `torch.cuda` or the
CPU themselves: process-wide tuning, weight forms, default dtype, free memory, pinned buffers and
the order of the grammar-mask fill live here.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import time
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

log = logging.getLogger("radixserve")


class Linear:
    """y = x W^T + b in plain torch: every device."""

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None):
        self.weight, self.bias = weight, bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class Platform:
    """CUDA and any other torch device: plain torch ops, no process-wide tuning."""

    # pinned host buffers: the grammar bitmask's copy to the device can overlap the forward
    pin_host_buffers = False
    # Fill the grammar bitmask while the forward's kernels run (an asynchronous device), or before
    # the forward (the CPU, see CpuPlatform)
    fill_mask_before_forward = False
    # decode steps replayed from CUDA graphs
    decode_graphs = False

    def __init__(self, device: torch.device):
        self.device = device

    def default_dtype(self) -> torch.dtype:
        return torch.bfloat16

    def default_attention_backend(self) -> str:
        return "torch"

    def free_memory_bytes(self) -> int:
        return 4 << 30

    def prepare_process(self) -> None:
        """Process-wide settings, before the engine thread starts."""

    def linear(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
               quantized_parts: Optional[Sequence] = None) -> Linear:
        """The fastest form of one linear layer here; `quantized_parts`: the exact block-quantized
        forms of the weight's row blocks (runtime/models/loader.py, from GGUF files), where this
        device has kernels for them."""
        return Linear(weight, bias)

    def warm_up_kernels(self, vocab_size: int) -> None:
        """Compile what the first step would otherwise stall on."""

    def layer_ops(self):
        """The form of a decoder layer's elementwise steps (runtime/models/layer_ops.py)."""
        from radixserve.runtime.models.layer_ops import TorchLayerOps
        return TorchLayerOps()

    def upload(self, values: Sequence, dtype: torch.dtype) -> torch.Tensor:
        """Host values (a step's indices or parameters) as one tensor on the device."""
        return torch.tensor(values, dtype=dtype, device=self.device)

    def is_fatal(self, error: BaseException) -> bool:
        """Whether a failed step leaves the device unusable, so that no later step can succeed."""
        return False


class CudaPlatform(Platform):
    pin_host_buffers = True
    decode_graphs = True

    def upload(self, values: Sequence, dtype: torch.dtype) -> torch.Tensor:
        # from pageable memory the copy would wait for the stream, i.e. for the forward still queued
        return torch.tensor(values, dtype=dtype).pin_memory().to(self.device, non_blocking=True)

    def default_attention_backend(self) -> str:
        from radixserve.kernels import triton_attention
        return "triton" if triton_attention.triton is not None else "torch"

    def free_memory_bytes(self) -> int:
        return torch.cuda.mem_get_info(self.device)[0]

    def is_fatal(self, error: BaseException) -> bool:
        # A CUDA error (illegal address, ECC, device lost) is sticky: the context is poisoned and every
        # later kernel launch fails. Out-of-memory is not: the next, smaller step may fit.
        if isinstance(error, torch.cuda.OutOfMemoryError):
            return False
        accelerator_error = getattr(torch, "AcceleratorError", ())
        return isinstance(error, accelerator_error) or "CUDA error" in str(error)


# At up to this many tokens a step is bound by reading weights, and the 4-bit form reads 4x fewer
# bytes (measured on an AVX512-BF16 EPYC: 3.5 ms vs 16.6 ms for all SmolLM2 layers at one token);
# above it, bf16 wins.
QUANTIZED_MAX_TOKENS = 8
# A float32 model's block kernels beat float32 F.linear further: all SmolLM2 layers and the LM head
# at 8 / 32 / 48 tokens took 28 / 93 / 147 ms vs 84 / 144 / 164 ms on an AVX2-only EPYC
BLOCKS_FLOAT32_MAX_TOKENS = 48


class CpuLinear(Linear):
    """Chooses per call the weight form that is fastest for the batch size: small batches run on
    a quantized form where there is one, either torch's int4 kernel (bf16 activations) or the
    block kernels of kernels/cpu_kernels.cpp (float32 ones)."""

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, int4=None, blocks=None,
                 kernels=None, onednn: bool = False):
        super().__init__(weight, bias)
        self.int4 = int4  # (packed weight, group size, scales and zeros) or None
        self.blocks, self.kernels = blocks, kernels  # a cpu_kernels.BlockWeight or None
        self.matrix = None if blocks is None else blocks.matrix(None if bias is None else bias.float().contiguous())
        # oneDNN's blocked bf16 weight layout, packed once, is ~1.4x faster than F.linear at 16-256
        # tokens (measured on this model's shapes) and gives identical results
        self.onednn = torch.ops.mkldnn._reorder_linear_weight(weight, None) if onednn else None
        # picked once: a decode step makes ~120 of these calls
        self.small = self._blocks if blocks is not None else self._int4 if int4 is not None else None
        self.small_max = (BLOCKS_FLOAT32_MAX_TOKENS if blocks is not None and weight.dtype == torch.float32
                          else QUANTIZED_MAX_TOKENS)

    @property
    def quantized(self) -> bool:
        return self.small is not None

    def _blocks(self, x: torch.Tensor) -> torch.Tensor:
        # the bias is added in the kernel, in float32
        if x.dtype != torch.float32 or not x.is_contiguous():
            return self.kernels.block_linear(x.float().contiguous(), self.matrix).to(x.dtype)
        return self.kernels.block_linear(x, self.matrix)

    def _int4(self, x: torch.Tensor) -> torch.Tensor:
        packed, group, scales_zeros = self.int4
        y = torch._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), packed, group, scales_zeros).to(x.dtype)
        return y if self.bias is None else y + self.bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.small is not None and x.shape[0] <= self.small_max:
            return self.small(x)
        if self.onednn is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.onednn, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


def pack_int4(parts: Sequence) -> tuple:
    """Concatenate Int4Weights along the output dim and pack them for the CPU int4 matmul."""
    q = torch.from_numpy(np.concatenate([p.q for p in parts])).to(torch.int32)
    scale = torch.from_numpy(np.concatenate([p.scale for p in parts]))
    zero = torch.from_numpy(np.concatenate([p.zero for p in parts]))
    scales_zeros = torch.stack([scale.t(), zero.t()], dim=-1).contiguous().to(torch.bfloat16)
    return torch._convert_weight_to_int4pack_for_cpu(q, 1), parts[0].group, scales_zeros


@functools.cache
def cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


class CpuPlatform(Platform):
    # The forward runs on this thread and streams the weights through every cache: filling the
    # mask before it, while the matchers' state is still cached from the last accept, takes half as
    # long (0.22 vs 0.44 ms a step at 32 constrained rows)
    fill_mask_before_forward = True

    def __init__(self, device: torch.device):
        super().__init__(device)
        flags = cpu_flags()
        # AMX or AVX512-BF16: bf16 matmuls run ~2x faster than fp32 and read half the bytes
        self.fast_bf16 = "amx_bf16" in flags or "avx512_bf16" in flags
        # oneDNN's bf16 weight reorder refuses CPUs without these (an AVX2-only EPYC, say)
        self.onednn_bf16 = torch.backends.mkldnn.is_available() and (
            {"avx512bw", "avx512vl", "avx512dq"} <= flags or "avx_ne_convert" in flags)

    def default_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.fast_bf16 else torch.float32

    def default_attention_backend(self) -> str:
        return "cpu" if self.kernels() is not None else "torch"

    def kernels(self):
        """The CPU kernels (kernels/cpu_kernels.py), built on first use; None without a compiler."""
        from radixserve.kernels import cpu_kernels
        return cpu_kernels.load()

    def layer_ops(self):
        from radixserve.runtime.models.layer_ops import CpuLayerOps, TorchLayerOps
        kernels = self.kernels()
        return TorchLayerOps() if kernels is None else CpuLayerOps(kernels)

    def free_memory_bytes(self) -> int:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
        return super().free_memory_bytes()

    def prepare_process(self) -> None:
        retain_freed_memory()

    def linear(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
               quantized_parts: Optional[Sequence] = None) -> Linear:
        from radixserve.kernels.cpu_kernels import BlockWeight
        from radixserve.runtime.models.loader import Int4Weight
        bf16 = weight.dtype == torch.bfloat16
        onednn = bf16 and self.onednn_bf16
        parts = list(quantized_parts or [])
        kernels = self.kernels()
        kinds = {type(p) for p in parts}
        if weight.dtype not in (torch.bfloat16, torch.float32) or len(kinds) != 1 or None in parts:
            return CpuLinear(weight, bias, onednn=onednn)
        # a bf16 model's 4-bit weights: torch's int4 kernel takes its bf16 activations as they are
        # (3.5 ms for all layers at one token on an AVX512-BF16 EPYC); float32 activations, and
        # 8-bit weights, take the block kernels
        if kinds == {Int4Weight} and (bf16 or kernels is None):
            return CpuLinear(weight, bias, int4=pack_int4(parts), onednn=onednn)
        if kernels is None:
            return CpuLinear(weight, bias, onednn=onednn)
        return CpuLinear(weight, bias, blocks=BlockWeight.of(parts), kernels=kernels, onednn=onednn)

    def warm_up_kernels(self, vocab_size: int) -> None:
        # the token-bitmask kernel compiles on the engine thread, whose OpenMP team it then uses
        from radixserve.kernels.bitmask import warm_up_compiled_bitmask
        t0 = time.perf_counter()
        compiled = warm_up_compiled_bitmask(vocab_size)
        log.info("token-bitmask kernel %s in %.1f s", "compiled" if compiled else "unavailable (eager path)",
                 time.perf_counter() - t0)


def retain_freed_memory() -> bool:
    """Ask glibc malloc to keep freed blocks up to 32 MiB instead of returning them to the OS.

    A CPU forward allocates many multi-MB activations per step; by default glibc maps each one
    fresh (or trims it back) and every reuse pays page faults: measured here, the offline benchmark
    ran ~15% faster and prefill ~30% faster with these settings. Process-wide; no-op off glibc.
    """
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        m_trim_threshold, m_mmap_threshold, m_arena_max = -1, -3, -8
        # one arena: a thread arena's heaps are capped at 64 MiB and given back piecemeal
        return bool(libc.mallopt(m_mmap_threshold, 32 << 20) and libc.mallopt(m_trim_threshold, 1 << 30)
                    and libc.mallopt(m_arena_max, 1))
    except (OSError, AttributeError):
        return False


@functools.cache
def get_platform(device: torch.device) -> Platform:
    """The one Platform of a device (built on first use, without touching the device)."""
    if device.type == "cpu":
        return CpuPlatform(device)
    if device.type == "cuda":
        return CudaPlatform(device)
    return Platform(device)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: cuda was asked for but no CUDA device is available")
    return torch.device(name)


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return get_platform(device).default_dtype()
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
