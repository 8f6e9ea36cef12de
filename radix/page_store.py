"""KV pages on disk: the prefix cache's second tier, below the radix tree.

One file per page, named by the page's chained hash (`prefix_hash`), so a file stands for "the KV
of these tokens after exactly that prefix" and a lookup needs no tree: follow a prompt's page
hashes until one is missing. Files live in a directory named by the cache key (model, tokenizer,
template, dtype, page size, KV shape), so another configuration never even lists them; the key is
in each header too.

A file is a header, the page's token ids and the payload (the page's K and V), with a CRC-32 over
all of it. Files appear by rename, so a killed process leaves a whole file or a stray temporary one;
a file that is short, or whose checksum or tokens are wrong, is deleted, logged and counted, never
read into the pool.

Writes run on one writer thread behind a queue bounded in bytes: a full queue drops the write (the
page stays in memory; the caller may offer it again when it is evicted), so the engine never waits
on the disk. Reads run on one reader thread. The directory is bounded by `max_bytes`, least
recently used first, except pages whose retention (`prompt_cache_retention: 24h`) has not expired.
"""
from __future__ import annotations

import logging
import os
import queue
import struct
import threading
import time
import zlib
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

log = logging.getLogger("radixserve.cache_dir")

MAGIC = b"RSKVPAGE"
VERSION = 1
# magic, version, cache key, page hash, tenant (root hash of the salt), tokens, payload bytes, crc32
_HEADER = struct.Struct("<8sI16sQQIQI")
_SUFFIX = ".kv"


@dataclass(frozen=True)
class PageWrite:
    """One page to store: `payload` is any buffer (the loop's copy of the page's K and V)."""
    hash: int
    tenant: int
    tokens: Sequence[int]
    payload: object
    retain_until: float = 0.0    # unix time before which LRU may not delete it (0: plain LRU)


@dataclass(frozen=True)
class PageRead:
    hash: int
    payload: memoryview   # writable (a tensor may view it)


@dataclass
class StoreStats:
    files: int = 0
    bytes: int = 0
    pages_written: int = 0
    bytes_written: int = 0
    pages_read: int = 0
    bytes_read: int = 0
    corrupt_dropped: int = 0      # files deleted because they were short, torn or failed their checksum
    writes_dropped: int = 0       # pages not written: the queue was full, or the disk full of retained pages
    evicted: int = 0              # files deleted by the size bound


@dataclass
class _Entry:
    path: Path
    size: int
    tenant: int
    retain_until: float


@dataclass(frozen=True)
class _Retain:
    hash: int
    until: float


@dataclass(frozen=True)
class _Drop:
    tenant: Optional[int]   # None: every page


@dataclass(frozen=True)
class _Barrier:
    done: threading.Event


class PageStore:
    def __init__(self, root: str | os.PathLike, key: bytes, page_tokens: int, payload_bytes: int,
                 max_bytes: int, queue_bytes: int = 256 << 20):
        if len(key) != 16:
            raise ValueError("the cache key is 16 bytes")
        self.key, self.page_tokens, self.payload_bytes = key, page_tokens, payload_bytes
        self.file_bytes = self.file_size(page_tokens, payload_bytes)
        if max_bytes < self.file_bytes:
            raise ValueError(f"cache-dir-size must hold at least one page ({self.file_bytes} bytes)")
        self.max_bytes, self.queue_bytes = max_bytes, queue_bytes
        self.dir = Path(root) / key.hex()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.stats = StoreStats()
        self._lock = threading.Lock()
        self._index: OrderedDict[int, _Entry] = OrderedDict()   # least recently used first
        self._queued: set[int] = set()                           # hashes waiting to be written
        self._queued_bytes = 0
        self._closed = False
        self._scan()
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._writer = threading.Thread(target=self._write_loop, name="radixserve-cache-dir-writer", daemon=True)
        self._writer.start()
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="radixserve-cache-dir-reader")

    @staticmethod
    def file_size(page_tokens: int, payload_bytes: int) -> int:
        return _HEADER.size + 4 * page_tokens + payload_bytes

    # ---- start-up --------------------------------------------------------------------------------
    def _scan(self) -> None:
        """Index what an earlier process left: whole files by last use; temporaries and wrong sizes go."""
        found = []
        for entry in os.scandir(self.dir):
            path = Path(entry.path)
            parsed = _parse_name(entry.name)
            try:
                st = entry.stat()
            except FileNotFoundError:
                continue
            if parsed is None or st.st_size != self.file_bytes:
                if entry.name.endswith(_SUFFIX):
                    log.warning("cache dir: dropping %s (%d bytes, a page file is %d)", entry.name,
                                st.st_size, self.file_bytes)
                    self.stats.corrupt_dropped += 1
                _unlink(path)
                continue
            found.append((st.st_mtime, parsed, path))
        for _, (h, tenant, until), path in sorted(found, key=lambda f: f[0]):
            self._index[h] = _Entry(path, self.file_bytes, tenant, until)
        self.stats.files, self.stats.bytes = len(self._index), len(self._index) * self.file_bytes
        if found:
            log.info("cache dir %s: %d pages (%.1f MB) from earlier runs", self.dir, len(found),
                     self.stats.bytes / 1e6)
        self._make_room(0)

    # ---- any thread ----------------------------------------------------------------------------
    def has(self, page_hash: int) -> bool:
        """On disk, or queued to be."""
        with self._lock:
            return page_hash in self._index or page_hash in self._queued

    def stored(self, page_hash: int) -> bool:
        with self._lock:
            return page_hash in self._index

    def retention(self, page_hash: int) -> float:
        with self._lock:
            e = self._index.get(page_hash)
            return e.retain_until if e is not None else 0.0

    def write(self, pages: list[PageWrite]) -> bool:
        """Queue pages for writing; False (nothing queued) when the queue is full."""
        size = len(pages) * self.file_bytes
        with self._lock:
            if self._closed or self._queued_bytes + size > self.queue_bytes:
                self.stats.writes_dropped += len(pages)
                return False
            self._queued_bytes += size
            self._queued.update(p.hash for p in pages)
        self._inbox.put(pages)
        return True

    def retain(self, page_hash: int, until: float) -> None:
        """Keep a stored page at least until `until` (unix time)."""
        self._inbox.put(_Retain(page_hash, until))

    def drop(self, tenant: Optional[int] = None) -> None:
        """Delete one tenant's pages (None: all), after the writes already queued."""
        self._inbox.put(_Drop(tenant))

    def flush(self, timeout: float = 60.0) -> bool:
        """Wait until everything queued so far is on disk."""
        done = threading.Event()
        self._inbox.put(_Barrier(done))
        return done.wait(timeout)

    def read(self, hashes: list[int], tokens: list[Sequence[int]], tenant: int) -> Future:
        """On the reader thread: the leading pages of `hashes` that are stored and whole, as a list of
        PageRead (stops at the first missing or bad one)."""
        return self._reader.submit(self._read, list(hashes), [list(t) for t in tokens], tenant)

    def close(self, timeout: float = 30.0) -> None:
        """Finish the queued writes (up to `timeout`), then stop both threads."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._inbox.put(None)
        self._writer.join(timeout)
        self._reader.shutdown(wait=True, cancel_futures=True)

    # ---- reader thread -----------------------------------------------------------------------------
    def _read(self, hashes: list[int], tokens: list[list[int]], tenant: int) -> list[PageRead]:
        out = []
        for h, want in zip(hashes, tokens):
            with self._lock:
                entry = self._index.get(h)
            if entry is None:
                break
            payload = self._read_file(entry.path, h, tenant, want)
            if payload is None:
                break
            with self._lock:
                if h in self._index:
                    self._index.move_to_end(h)
                self.stats.pages_read += 1
                self.stats.bytes_read += entry.size
            out.append(PageRead(h, payload))
        return out

    def _read_file(self, path: Path, page_hash: int, tenant: int, want: list[int]) -> Optional[memoryview]:
        data = bytearray(self.file_bytes)   # writable: the payload becomes a tensor without a copy
        try:
            with open(path, "rb") as f:
                n = f.readinto(data)
                if n == self.file_bytes and f.read(1):
                    n += 1
            os.utime(path)   # its last use, for the LRU order after a restart
        except FileNotFoundError:   # deleted by the bound or a flush meanwhile
            self._forget(page_hash, None)
            return None
        problem = self._check(data, n, page_hash, tenant, want)
        if problem is not None:
            log.warning("cache dir: dropping %s: %s", path.name, problem)
            self._forget(page_hash, path, corrupt=True)
            return None
        return memoryview(data)[_HEADER.size + 4 * self.page_tokens:]

    def _check(self, data: bytearray, size: int, page_hash: int, tenant: int, want: list[int]) -> Optional[str]:
        if size != self.file_bytes:
            return f"{size} bytes or more, a page file is {self.file_bytes}"
        magic, version, key, h, t, n, payload, crc = _HEADER.unpack_from(data)
        if (magic, version) != (MAGIC, VERSION):
            return "not a page file of this version"
        if zlib.crc32(memoryview(data)[_HEADER.size:], zlib.crc32(memoryview(data)[:_HEADER.size - 4])) != crc:
            return "checksum mismatch"
        if key != self.key or h != page_hash or t != tenant or n != self.page_tokens or payload != self.payload_bytes:
            return "written for another model, configuration, tenant or page"
        if np.frombuffer(data, np.int32, n, _HEADER.size).tolist() != want:
            return "its tokens differ from the prompt's (a hash collision)"
        return None

    def _forget(self, page_hash: int, path: Optional[Path], corrupt: bool = False) -> None:
        with self._lock:
            entry = self._index.pop(page_hash, None)
            if entry is not None:
                self.stats.files -= 1
                self.stats.bytes -= entry.size
            if corrupt:
                self.stats.corrupt_dropped += 1
        if path is not None:
            _unlink(path)

    # ---- writer thread -----------------------------------------------------------------------------
    def _write_loop(self) -> None:
        while True:
            op = self._inbox.get()
            if op is None:
                return
            try:
                if isinstance(op, list):
                    self._write_pages(op)
                elif isinstance(op, _Retain):
                    self._retain(op)
                elif isinstance(op, _Drop):
                    self._drop(op.tenant)
                else:
                    op.done.set()
            except Exception:   # a failing disk costs the pages, never the engine
                log.exception("cache dir: %s failed", type(op).__name__)

    def _write_pages(self, pages: list[PageWrite]) -> None:
        for page in pages:
            try:
                self._write_page(page)
            except Exception:   # e.g. the disk is full: this page is lost, later ones may fit
                log.exception("cache dir: writing a page failed")
                with self._lock:
                    self.stats.writes_dropped += 1
            finally:
                with self._lock:
                    self._queued.discard(page.hash)
                    self._queued_bytes -= self.file_bytes

    def _write_page(self, page: PageWrite) -> None:
        with self._lock:
            if page.hash in self._index:
                return
        if not self._make_room(self.file_bytes):
            with self._lock:
                self.stats.writes_dropped += 1
            return
        tokens = np.asarray(page.tokens, dtype=np.int32)
        payload = memoryview(page.payload).cast("B")
        if len(tokens) != self.page_tokens or payload.nbytes != self.payload_bytes:
            raise ValueError(f"a page is {self.page_tokens} tokens and {self.payload_bytes} bytes")
        head = _HEADER.pack(MAGIC, VERSION, self.key, page.hash, page.tenant, self.page_tokens,
                            self.payload_bytes, 0)[:-4]
        crc = zlib.crc32(payload, zlib.crc32(tokens.tobytes(), zlib.crc32(head)))
        path = self.dir / _name(page.hash, page.tenant, page.retain_until)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        with open(tmp, "wb") as f:
            f.write(head + struct.pack("<I", crc))
            f.write(tokens.tobytes())
            f.write(payload)
        os.replace(tmp, path)
        with self._lock:
            self._index[page.hash] = _Entry(path, self.file_bytes, page.tenant, float(int(page.retain_until)))
            self.stats.files += 1
            self.stats.bytes += self.file_bytes
            self.stats.pages_written += 1
            self.stats.bytes_written += self.file_bytes

    def _retain(self, op: _Retain) -> None:
        with self._lock:
            entry = self._index.get(op.hash)
        until = float(int(op.until))   # whole seconds, as the file name holds them
        if entry is None or entry.retain_until >= until:
            return
        path = self.dir / _name(op.hash, entry.tenant, until)
        try:
            os.replace(entry.path, path)
        except FileNotFoundError:
            self._forget(op.hash, None)
            return
        with self._lock:
            entry.path, entry.retain_until = path, until

    def _drop(self, tenant: Optional[int]) -> None:
        with self._lock:
            gone = [h for h, e in self._index.items() if tenant is None or e.tenant == tenant]
        for h in gone:
            with self._lock:
                entry = self._index.get(h)
            if entry is not None:
                self._forget(h, entry.path)

    def _make_room(self, size: int) -> bool:
        """Delete least recently used pages (retained ones only once expired) until `size` more bytes
        fit under the bound; False if they cannot."""
        now = time.time()
        while True:
            with self._lock:
                if self.stats.bytes + size <= self.max_bytes:
                    return True
                victim = next(((h, e) for h, e in self._index.items() if e.retain_until <= now), None)
                if victim is None:
                    return False
                h, entry = victim
                del self._index[h]
                self.stats.files -= 1
                self.stats.bytes -= entry.size
                self.stats.evicted += 1
            _unlink(entry.path)


def _name(page_hash: int, tenant: int, retain_until: float) -> str:
    return f"{page_hash:016x}-{tenant:016x}-{int(retain_until):x}{_SUFFIX}"


def _parse_name(name: str) -> Optional[tuple[int, int, float]]:
    if not name.endswith(_SUFFIX):
        return None
    parts = name[: -len(_SUFFIX)].split("-")
    try:
        h, tenant, until = (int(p, 16) for p in parts)
    except ValueError:
        return None
    return (h, tenant, float(until)) if len(parts) == 3 and len(parts[0]) == len(parts[1]) == 16 else None


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
