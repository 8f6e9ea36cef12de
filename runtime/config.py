"""Engine configuration: one dataclass shared by the CLI, the engine and tests."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

SCHEDULE_POLICIES = ("lpm", "dfs-weight", "fcfs", "priority")
GRAMMAR_BACKENDS = ("xgrammar", "outlines-core")
ATTENTION_BACKENDS = ("auto", "triton", "cpu", "torch")
# Output tokens not yet computed (a run a grammar forced, by jump-forward) are laid out as that many
# decode rows, each attending to the context up to itself, up to this many: the step stays a decode
# step (the CPU's whole-layer kernel, CUDA graphs) and every row is computed as a decode computes it,
# so the text is the same as decoding the run token by token. Longer runs go as an extend.
MAX_DECODE_ROWS = 32


@dataclass
class EngineConfig:
    model: Optional[str] = None          # GGUF file or HF directory; None = embedded default
    device: str = "auto"                 # auto | cpu | cuda
    # CPU: a GGUF file's quantized matrices stay in the file's memory map (shared by processes on
    # one host) instead of moving to huge pages once the engine serves (faster decode)
    mmap: bool = False
    dtype: str = "auto"                  # auto | float32 | bfloat16
    page_size: int = 16
    kv_cache_tokens: Optional[int] = None
    mem_fraction: float = 0.3            # of free memory, when kv_cache_tokens is not given
    max_running_requests: int = 64
    max_batched_tokens: int = 2048
    chunked_prefill_size: int = 1024
    max_waiting_requests: int = 4096
    schedule_policy: str = "lpm"         # lpm | dfs-weight | fcfs | priority
    # lpm / dfs-weight never let a request be overtaken by one that arrived more than this many
    # seconds after it: it jumps ahead once it has waited this long behind newer requests
    max_queue_wait_boost: float = 5.0
    disable_radix_cache: bool = False
    # sliding-window layers keep K/V only for positions some window still reads, in a pool this
    # share of the KV pool's size (SGLang's name); what is cached beyond it keeps its global layers
    swa_full_tokens_ratio: float = 0.5
    disable_hybrid_swa_memory: bool = False   # every layer keeps every position (and CUDA graphs stay on)
    # the prefix cache's disk tier: evicted and new pages are kept under this directory, bounded
    # by `cache_dir_size` bytes (LRU), and read back on a hit, after restarts too
    cache_dir: Optional[str] = None
    cache_dir_size: int = 16 << 30
    attention_backend: str = "auto"      # auto (triton on CUDA, cpu on CPU) | triton | cpu | torch
    disable_cuda_graph: bool = False     # CUDA: run decode steps eagerly instead of replaying graphs
    grammar_backend: str = "xgrammar"    # xgrammar | outlines-core
    grammar_compile_timeout: float = 30.0  # seconds
    # JSON comes out compact (no whitespace between tokens, as OpenAI's); True lets the model put
    # any whitespace there (vLLM's structured outputs default; a small model may loop on it)
    grammar_any_whitespace: bool = False
    # text a grammar forces (keys, `":`, closing brackets, tool-call markup) is appended without
    # sampling and computed as decode rows of the next step: one step instead of one per token
    jump_forward: bool = True
    # consecutive failed steps after which the engine stops serving (a CUDA error is sticky: every
    # later step fails too); the server then exits non-zero so that a supervisor restarts it
    max_failed_steps: int = 3
    seed: int = 0
    log_level: str = "info"

    def validate(self) -> None:
        def positive(name: str) -> None:
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")

        for name in ("page_size", "max_running_requests", "max_batched_tokens",
                     "chunked_prefill_size", "max_waiting_requests", "max_failed_steps"):
            positive(name)
        if self.kv_cache_tokens is not None and self.kv_cache_tokens < self.page_size:
            raise ValueError("kv-cache-tokens must hold at least one page")
        if not 0.0 < self.swa_full_tokens_ratio <= 1.0:
            raise ValueError("swa-full-tokens-ratio must be in (0, 1]")
        if not 0.0 < self.mem_fraction <= 0.95:
            raise ValueError("mem-fraction must be in (0, 0.95]")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise ValueError(f"schedule-policy must be one of {', '.join(SCHEDULE_POLICIES)}")
        if not self.max_queue_wait_boost >= 0:
            raise ValueError("max-queue-wait-boost must be >= 0 seconds")
        if self.grammar_backend not in GRAMMAR_BACKENDS:
            raise ValueError(f"grammar-backend must be one of {', '.join(GRAMMAR_BACKENDS)}, got {self.grammar_backend!r}")
        if not self.grammar_compile_timeout > 0:
            raise ValueError("grammar-compile-timeout must be > 0 seconds")
        if self.cache_dir is not None and self.disable_radix_cache:
            raise ValueError("cache-dir is the radix cache's lower tier: it needs the radix cache on")
        if not isinstance(self.cache_dir_size, int) or self.cache_dir_size < 1:
            raise ValueError(f"cache-dir-size must be a positive number of bytes, got {self.cache_dir_size!r}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention-backend must be one of {', '.join(ATTENTION_BACKENDS)}, "
                             f"got {self.attention_backend!r}")


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes from "16G", "512M", "1.5T", "4096" (binary units; a trailing B or iB is allowed)."""
    s = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = s[-1:] if s[-1:] in _UNITS and s[-1:] else ""
    try:
        value = float(s[: len(s) - len(unit)])
    except ValueError:
        raise ValueError(f"not a size: {text!r} (e.g. 16G, 512M)") from None
    if value <= 0:
        raise ValueError(f"a size must be positive, got {text!r}")
    return int(value * _UNITS[unit])
