"""A GGUF file's tensor data in anonymous memory on 2 MiB pages: what the CPU's block kernels
stream fastest.

A decode step streams every weight once. From the file's memory map (4 KiB pages) the 1B Q4_K_M's
step took 24.8 ms against 20.6 from huge pages, 1.17x by the median of 16 alternating pairs on a
Zen 4 EPYC (bench/decode_step.py --forms fused mmap): the hardware prefetchers stop at every 4 KiB
page boundary, and the TLB misses add up. The file is read with pread, never through a mapping, so
its page cache stays out of the process's resident memory.

The price is paid at load: where memory is fragmented the kernel compacts it to find 2 MiB pages,
and reading the 1B Q4_1 file took 0.4-1.0 s here where the map takes nothing (the server's start
2.2-2.4 -> 2.7-3.2 s). Starting the read on a thread while the CLI imports torch made the start
slower (3.8-4.2 s): a fault that compacts holds the process's memory-map lock, which every import
of a shared library waits on.
"""
from __future__ import annotations

import mmap
import os
import threading
from pathlib import Path

import numpy as np

HUGE_PAGE = 2 << 20
PIECE = 64 << 20


def read_into_huge_pages(path: Path, offset: int, nbytes: int, threads: int = 2) -> np.ndarray:
    """Bytes offset..offset + nbytes of the file, read by `threads` threads (a copy from the page
    cache is bound by memory, not one core) into anonymous memory advised to huge pages
    (transparent huge pages in 'madvise' or 'always' mode; 4 KiB pages elsewhere)."""
    area = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        area.madvise(mmap.MADV_HUGEPAGE)
    everything = np.frombuffer(area, dtype=np.uint8)
    start = -everything.ctypes.data % HUGE_PAGE   # the mapping need not start on a huge page
    out = everything[start:start + nbytes]
    view, lock, cursor, errors = memoryview(out), threading.Lock(), [0], []

    def work(fd: int) -> None:
        try:
            while not errors:
                with lock:   # pieces in file order, to whichever thread is free
                    at = cursor[0]
                    cursor[0] += PIECE
                if at >= nbytes:
                    return
                end = min(nbytes, at + PIECE)
                while at < end:
                    got = os.preadv(fd, [view[at:end]], offset + at)
                    if got <= 0:
                        raise OSError(f"{path} ends before byte {offset + end}")
                    at += got
        except OSError as e:   # the loader reports it; never a half-read model
            errors.append(e)

    fd = os.open(path, os.O_RDONLY)
    try:
        workers = [threading.Thread(target=work, args=(fd,), name="radixserve-weight-read") for _ in range(threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
    finally:
        os.close(fd)
    if errors:
        raise errors[0]
    return out
