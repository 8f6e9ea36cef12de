"""A GGUF file's tensor data moved, after the engine starts, from the file's memory map to anonymous
memory on 2 MiB pages at the same addresses: what the CPU's block kernels stream fastest.

A decode step streams every weight once. From the file's map (4 KiB pages) the 1B Q4_K_M's step
took 24.8 ms against 20.6 from huge pages, 1.17x by the median of 16 alternating pairs on a Zen 4
EPYC (bench/decode_step.py --forms fused mmap): the hardware prefetchers stop at every 4 KiB page
boundary, and the TLB misses add up.

Huge pages cost time to get where memory is fragmented (the kernel compacts it first): reading the
1B Q4_1 file into them at load took 0.4-1.0 s, and the server's start went 2.2-2.4 -> 3.3-5.0 s
(`bench/real_models.py --load-only`). So the engine loads from the map and serves at once, and a
thread of its own then reads the bytes into huge pages elsewhere and moves those pages over the
map's (`mremap`): every pointer into the weights stays valid, and a kernel reading them meanwhile
reads the same bytes from either page. The file is read with pread, so afterwards its page cache
is out of the process's resident memory. Linux only; elsewhere the weights stay in the map.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HUGE_PAGE = 2 << 20
PIECE = 64 << 20
_MREMAP_MAYMOVE, _MREMAP_FIXED = 1, 2


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    for name, args in (("mmap", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]),
                       ("mremap", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]),
                       ("munmap", [ctypes.c_void_p, ctypes.c_size_t]),
                       ("madvise", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]),
                       ("mprotect", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int])):
        getattr(libc, name).argtypes = args
    libc.mmap.restype = libc.mremap.restype = ctypes.c_void_p
    return libc


_MAP_FAILED = ctypes.c_void_p(-1).value


@dataclass(eq=False)   # identity: it owns a mapping's pages
class MappedWeights:
    """A GGUF file's tensor data: `data` (a view of the file's read-only map) holds the file's bytes
    from `offset` on; every tensor is a view of it."""
    path: Path
    offset: int
    data: np.ndarray
    moved: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def to_huge_pages(self) -> bool:
        """Move the whole 2 MiB pages of `data` (its ends stay 4 KiB file pages) to anonymous huge
        pages holding the same bytes at the same addresses. True once moved (again: a no-op); False
        where it cannot (not Linux, a region under 2 MiB, a failed call: the map stays)."""
        with self._lock:
            if self.moved:
                return True
            base = self.data.ctypes.data
            lo, hi = -(-base // HUGE_PAGE) * HUGE_PAGE, (base + self.data.nbytes) // HUGE_PAGE * HUGE_PAGE
            if hi <= lo or not sys.platform.startswith("linux"):
                return False
            libc, size = _libc(), hi - lo
            raw = libc.mmap(None, size + HUGE_PAGE, mmap.PROT_READ | mmap.PROT_WRITE,
                            mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
            if raw in (None, _MAP_FAILED):
                return False
            src = -(-raw // HUGE_PAGE) * HUGE_PAGE   # huge pages need the same 2 MiB phase on both sides
            try:
                libc.madvise(src, size, mmap.MADV_HUGEPAGE)
                _read(self.path, self.offset + (lo - base), memoryview((ctypes.c_char * size).from_address(src)).cast("B"))
                libc.mprotect(src, size, mmap.PROT_READ)   # read-only, as the map was
                moved = libc.mremap(src, size, size, _MREMAP_MAYMOVE | _MREMAP_FIXED, lo)
            except OSError:
                moved = None
            if moved in (None, _MAP_FAILED):
                libc.munmap(raw, size + HUGE_PAGE)
                return False
            # what the move left of the reservation: the slack before and after the aligned part
            if src > raw:
                libc.munmap(raw, src - raw)
            if raw + size + HUGE_PAGE > src + size:
                libc.munmap(src + size, raw + HUGE_PAGE - src)
            self.moved = True
            return True


def _read(path: Path, offset: int, out: memoryview) -> None:
    """The file's bytes from `offset` into `out`, a piece at a time; OSError if the file is shorter."""
    fd = os.open(path, os.O_RDONLY)
    try:
        for at in range(0, len(out), PIECE):
            end = min(len(out), at + PIECE)
            while at < end:
                got = os.preadv(fd, [out[at:end]], offset + at)
                if got <= 0:
                    raise OSError(f"{path} ends before byte {offset + end}")
                at += got
    finally:
        os.close(fd)
