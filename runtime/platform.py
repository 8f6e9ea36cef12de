"""Everything that differs between devices, chosen once at start-up.

The engine picks its `Platform` once (`get_platform`) and passes it down: generic modules never
probe `torch.cuda` or the CPU themselves. What differs lives here: which linear-layer form and
attention backend to build, default dtype, free memory, host-to-device copies, pinned buffers and
the order of the grammar-mask fill. The forms themselves live with the model (runtime/models/linear.py),
CPU flags and malloc tuning in runtime/cpu_tuning.py.
"""
from __future__ import annotations

import functools
import logging
import math
import time
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

import torch

from radixserve.runtime.cpu_tuning import cpu_flags, retain_freed_memory, zeroed_pages
from radixserve.runtime.models.linear import (BF16_GEMM_ROWS, BF16_GEMM_ROWS_NO_AMX, INT8_GEMM_ROWS, BlockEmbedding,
                                              BlockLinear, CpuLinear, Embedding, Linear)
from radixserve.runtime.models.quant import BlockTensor

log = logging.getLogger("radixserve")


class HostStaging:
    """A host buffer that is refilled every step and copied to the device after each fill (the
    grammar bitmask, the CUDA graphs' static inputs). Fill what `writable()` returns, then
    `upload`. Here the copy is synchronous (on the CPU there is none: the buffer is the tensor)."""

    def __init__(self, host: torch.Tensor, device: torch.device):
        self.host, self.device = host, device

    def writable(self) -> torch.Tensor:
        return self.host

    def upload(self, rows: Optional[int] = None, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The first `rows` rows (all when None) on the device: into `out` when given."""
        src = self.host if rows is None else self.host[:rows]
        return src.to(self.device) if out is None else out.copy_(src)


class CudaHostStaging(HostStaging):
    """Pinned, so the copy is asynchronous and overlaps the forward; the next fill then must not
    start before the copy has read the buffer, whatever else happens to synchronise in between:
    `writable` waits for the event recorded behind the last copy."""

    def __init__(self, host: torch.Tensor, device: torch.device):
        super().__init__(host if host.is_pinned() else host.pin_memory(), device)
        self._copied = torch.cuda.Event()
        self._in_flight = False

    def writable(self) -> torch.Tensor:
        if self._in_flight:
            self._copied.synchronize()
            self._in_flight = False
        return self.host

    def upload(self, rows: Optional[int] = None, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        src = self.host if rows is None else self.host[:rows]
        dst = src.to(self.device, non_blocking=True) if out is None else out.copy_(src, non_blocking=True)
        self._copied.record()
        self._in_flight = True
        return dst


class Platform:
    """CUDA and any other torch device: plain torch ops, no process-wide tuning."""

    # pinned host buffers: the grammar bitmask's copy to the device can overlap the forward
    pin_host_buffers = False
    # Fill the grammar bitmask while the forward's kernels run (an asynchronous device), or before
    # the forward (the CPU, see CpuPlatform)
    fill_mask_before_forward = False
    # decode steps replayed from CUDA graphs
    decode_graphs = False
    # a GGUF file's quantized matrices moved from the file's map to huge-page host memory once the
    # engine serves (CpuPlatform): a device copies them over anyway
    weights_in_memory = False

    def __init__(self, device: torch.device):
        self.device = device

    def default_dtype(self, block_quantized: bool = False) -> torch.dtype:
        """The model's dtype when none is asked for; `block_quantized`: its matrices are a GGUF
        file's quantized blocks."""
        return torch.bfloat16

    def default_attention_backend(self) -> str:
        return "torch"

    def free_memory_bytes(self) -> int:
        return 4 << 30

    def prepare_process(self) -> None:
        """Process-wide settings, before the engine thread starts."""

    def linear(self, parts: Sequence, bias: Optional[torch.Tensor], dtype: torch.dtype) -> Linear:
        """The fastest form here of one linear layer whose weight is `parts` (dense tensors or
        BlockTensors) stacked along the output dim."""
        return Linear(self.dense(parts, dtype), None if bias is None else bias.to(self.device, dtype))

    def embedding(self, weight, dtype: torch.dtype):
        """The embedding lookup of `weight` (a dense tensor or a BlockTensor): ids -> float32 rows."""
        return Embedding(self.dense([weight], dtype))

    def dense(self, parts: Sequence, dtype: torch.dtype) -> torch.Tensor:
        """`parts` stacked, dequantised where they are blocks, on this device in `dtype`."""
        tensors = [torch.from_numpy(p.dense()) if isinstance(p, BlockTensor) else p for p in parts]
        return (tensors[0] if len(tensors) == 1 else torch.cat(tensors)).to(self.device, dtype)

    def warm_up_kernels(self, vocab_size: int, forward: Callable[[], None]) -> None:
        """Compile what the first step would otherwise stall on; `forward` runs a dummy step of the
        model (every attention kernel of a mixed batch), where compiling happens at the first launch."""

    def zeroed_pair(self, shape: tuple, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Two zeroed tensors: the KV pool's K and V."""
        zeros = lambda: torch.zeros(shape, dtype=dtype, device=self.device)  # noqa: E731
        return zeros(), zeros()

    def grouped_experts(self, experts: list[tuple], act):
        """A MoE layer's experts ((gate_up, down) linear layers; `act`: their ExpertAct) as one
        call where this device has one (kernels/triton_moe.py on CUDA, the C++ kernels' dense
        experts on the CPU), else None: the per-expert loop."""
        return None

    def staging(self, host: torch.Tensor) -> HostStaging:
        """`host`, as a buffer refilled and copied to the device every step (see HostStaging)."""
        return HostStaging(host, self.device)

    def row_index(self, rows: list[int]) -> Union[list[int], torch.Tensor]:
        """Row indices (the grammar mask's) as this device's kernels take them: one upload here."""
        return self.upload(rows, torch.int64)

    def kernels(self):
        """The CPU kernels (kernels/cpu_kernels.py) where this device runs them, else None."""
        return None

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

    def prepare_process(self) -> None:
        # float32 means float32: TF32 matmuls move logits by ~1e-3 relative, past the fp32 parity
        # bench/gpu_check.py holds the engine to (bf16 and fp16 models are unaffected)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    def staging(self, host: torch.Tensor) -> HostStaging:
        return CudaHostStaging(host, self.device)

    def grouped_experts(self, experts: list[tuple], act):
        from radixserve.kernels import triton_moe
        if triton_moe.triton is None or not all(type(layer) is Linear for pair in experts for layer in pair):
            return None
        return triton_moe.GroupedExperts.of(experts)

    def warm_up_kernels(self, vocab_size: int, forward: Callable[[], None]) -> None:
        # Triton compiles a kernel at its first launch (seconds each, cached on disk after): here,
        # not inside the first requests' steps. The bitmask kernel as the engine calls it (rows given)
        from radixserve.kernels import triton_attention
        from radixserve.kernels.bitmask import apply_token_bitmask_
        t0 = time.perf_counter()
        logits = torch.zeros(1, vocab_size, dtype=torch.float32, device=self.device)
        words = torch.full((1, (vocab_size + 31) // 32), -1, dtype=torch.int32, device=self.device)
        apply_token_bitmask_(logits, words, self.row_index([0]), vocab_size)
        if triton_attention.triton is not None:
            forward()
        torch.cuda.synchronize(self.device)
        log.info("CUDA kernels warmed up in %.1f s", time.perf_counter() - t0)

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


class CpuPlatform(Platform):
    # The forward runs on this thread and streams the weights through every cache: filling the
    # mask before it, while the matchers' state is still cached from the last accept, takes half as
    # long (0.22 vs 0.44 ms a step at 32 constrained rows)
    fill_mask_before_forward = True
    # the block kernels stream them from huge pages (runtime/models/weight_memory.py)
    weights_in_memory = True

    def __init__(self, device: torch.device):
        super().__init__(device)
        flags = cpu_flags()
        # AMX or AVX512-BF16: bf16 matmuls run ~2x faster than fp32 and read half the bytes
        self.fast_bf16 = "amx_bf16" in flags or "avx512_bf16" in flags
        # oneDNN's bf16 weight reorder refuses CPUs without these (an AVX2-only EPYC, say)
        self.onednn_bf16 = torch.backends.mkldnn.is_available() and (
            {"avx512bw", "avx512vl", "avx512dq"} <= flags or "avx_ne_convert" in flags)
        # the GEMMs a prefill's block-quantized matrices may take, first choice first, and from how
        # many rows (none: the block kernels at every size): AMX's bf16 tiles; else the kernels'
        # int8 one where VNNI exists, with bf16 panels for the widths it does not take
        vnni = ("avx512_vnni" in flags and "avx512vl" in flags) or "avx_vnni" in flags
        bf16 = self.fast_bf16 and self.onednn_bf16
        self.prefill_gemms: list[tuple[str, int]] = \
            [("bf16", BF16_GEMM_ROWS)] if bf16 and "amx_bf16" in flags else \
            ([("int8", INT8_GEMM_ROWS)] if vnni else []) + ([("bf16", BF16_GEMM_ROWS_NO_AMX)] if bf16 else [])

    def default_dtype(self, block_quantized: bool = False) -> torch.dtype:
        # block-quantized matrices run on the block kernels, whose activations are float32
        if block_quantized and self.kernels() is not None:
            return torch.float32
        return torch.bfloat16 if self.fast_bf16 else torch.float32

    def default_attention_backend(self) -> str:
        return "cpu" if self.kernels() is not None else "torch"

    def zeroed_pair(self, shape: tuple, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # zeroed by the OS on first write: no seconds of memset at load (bench/real_models.py's
        # load time), and only the pages used are resident
        numel = math.prod(shape)
        k, v = zeroed_pages(2 * numel * torch.empty(0, dtype=dtype).element_size()).view(dtype).view(2, *shape).unbind(0)
        return k, v

    def grouped_experts(self, experts: list[tuple], act):
        from radixserve.runtime.models.moe import CpuExperts
        return CpuExperts.of(self.kernels(), experts, act)

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

    def linear(self, parts: Sequence, bias: Optional[torch.Tensor], dtype: torch.dtype) -> Linear:
        kernels = self.kernels()
        if kernels is not None and all(isinstance(p, BlockTensor) for p in parts):
            return BlockLinear(parts, bias, kernels, self.prefill_gemms)
        weight = self.dense(parts, dtype)
        return CpuLinear(weight, None if bias is None else bias.to(dtype),
                         onednn=weight.dtype == torch.bfloat16 and self.onednn_bf16)

    def embedding(self, weight, dtype: torch.dtype):
        kernels = self.kernels()
        if kernels is not None and isinstance(weight, BlockTensor):
            return BlockEmbedding(weight, kernels)
        return super().embedding(weight, dtype)

    def row_index(self, rows: list[int]) -> Union[list[int], torch.Tensor]:
        return rows   # the C++ mask takes a list: no tensor to build and read back


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


def pick_dtype(name: str, device: torch.device, block_quantized: bool = False) -> torch.dtype:
    if name == "auto":
        return get_platform(device).default_dtype(block_quantized)
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
