"""Process-wide CPU facts and settings: the instruction-set flags kernels and dtypes are chosen by,
malloc tuning for a forward that allocates many multi-MB activations a step, and the KV pool's
memory, zeroed by the OS as it is first written."""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import mmap
from pathlib import Path

import torch


@functools.cache
def cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())



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


def zeroed_pages(nbytes: int) -> torch.Tensor:
    """A large zeroed buffer (the KV pool) that costs nothing at start-up and nothing resident
    until used: an anonymous mapping, whose pages the OS maps, zeroed, on first write.

    Zeroing the pool up front took 2.5 s of a 1B model's load here (6.8 GiB). Mapping it ahead in
    a background thread instead took ~1 ms of each 1B decode step from the kernels' two threads
    for the ~30 s it ran (bench/real_models.py's first cells), while first writes cost little: a
    decode step writes one KV slot per layer, a new 4 KiB page every few tokens."""
    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS), dtype=torch.uint8)
