"""The disk tier's page files (radix/page_store.py): what is written is read back byte for byte, after
a restart too; what is torn, flipped, foreign or written for other tokens is never served; the
directory stays under its bound, least recently used first, retained pages last; and the engine
never waits on it."""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from radixserve.radix.page_store import PageStore, PageWrite

KEY = bytes(range(16))
TOKENS = 4
PAYLOAD = 256


def store(tmp_path, key: bytes = KEY, pages_bound: int = 100, **kw) -> PageStore:
    return PageStore(tmp_path, key, TOKENS, PAYLOAD, max_bytes=pages_bound * PageStore.file_size(TOKENS, PAYLOAD), **kw)


def page(h: int, tenant: int = 0, retain_until: float = 0.0) -> PageWrite:
    rng = np.random.default_rng(h)
    return PageWrite(h, tenant, [h, h + 1, h + 2, h + 3], rng.integers(0, 256, PAYLOAD, dtype=np.uint8),
                     retain_until)


def read(s: PageStore, hashes: list[int], tenant: int = 0) -> list[bytes]:
    pages = s.read(hashes, [[h, h + 1, h + 2, h + 3] for h in hashes], tenant).result(timeout=10)
    return [bytes(p.payload) for p in pages]


def written(s: PageStore, pages: list[PageWrite]) -> None:
    assert s.write(pages)
    assert s.flush()


def test_pages_read_back_byte_for_byte(tmp_path):
    s = store(tmp_path)
    written(s, [page(1), page(2)])
    assert read(s, [1, 2]) == [bytes(page(1).payload), bytes(page(2).payload)]
    assert s.stats.pages_written == 2 and s.stats.pages_read == 2
    s.close()


def test_a_restarted_store_finds_the_pages_of_the_last_one(tmp_path):
    s = store(tmp_path)
    written(s, [page(1), page(2)])
    s.close()
    again = store(tmp_path)
    assert again.stats.files == 2
    assert read(again, [1, 2]) == [bytes(page(1).payload), bytes(page(2).payload)]
    again.close()


def test_reading_stops_at_the_first_missing_page(tmp_path):
    s = store(tmp_path)
    written(s, [page(1), page(3)])
    assert read(s, [1, 2, 3]) == [bytes(page(1).payload)]
    s.close()


def test_a_flipped_byte_is_detected_dropped_and_never_served(tmp_path):
    s = store(tmp_path)
    written(s, [page(1), page(2)])
    s.close()
    victim = next(p for p in s.dir.iterdir() if p.name.startswith(f"{2:016x}"))
    data = bytearray(victim.read_bytes())
    data[-10] ^= 0x40
    victim.write_bytes(bytes(data))
    again = store(tmp_path)
    assert read(again, [1, 2]) == [bytes(page(1).payload)]
    assert again.stats.corrupt_dropped == 1 and not victim.exists()
    assert not again.stored(2)
    again.close()


def test_a_page_written_for_other_tokens_is_not_served(tmp_path):
    """Two prefixes whose 64-bit hashes collide: the file's tokens decide."""
    s = store(tmp_path)
    written(s, [page(1)])
    assert s.read([1], [[9, 9, 9, 9]], 0).result(timeout=10) == []
    s.close()


def test_another_tenants_page_is_not_served(tmp_path):
    s = store(tmp_path)
    written(s, [page(1, tenant=7)])
    assert read(s, [1], tenant=8) == []
    s.close()


def test_another_cache_key_sees_none_of_the_pages(tmp_path):
    written(s := store(tmp_path), [page(1)])
    s.close()
    other = store(tmp_path, key=bytes(16))
    assert other.stats.files == 0 and read(other, [1]) == []
    other.close()
    assert store(tmp_path).stored(1)


def test_torn_and_temporary_files_are_removed_at_start(tmp_path):
    s = store(tmp_path)
    written(s, [page(1), page(2)])
    s.close()
    torn = next(p for p in s.dir.iterdir() if p.name.startswith(f"{1:016x}"))
    torn.write_bytes(torn.read_bytes()[:-1])
    (s.dir / f"{3:016x}-{0:016x}-0.tmp123").write_bytes(b"half a page")
    again = store(tmp_path)
    assert sorted(p.name[:16] for p in again.dir.iterdir()) == [f"{2:016x}"]
    assert again.stats.corrupt_dropped == 1 and again.stats.files == 1
    again.close()


def test_the_bound_evicts_the_least_recently_used_page(tmp_path):
    s = store(tmp_path, pages_bound=2)
    written(s, [page(1), page(2)])
    read(s, [1])                       # 2 is now the older
    written(s, [page(3)])
    assert s.stored(1) and s.stored(3) and not s.stored(2)
    assert s.stats.evicted == 1 and s.stats.bytes <= s.max_bytes
    assert len(list(s.dir.iterdir())) == 2
    s.close()


def test_retained_pages_outlive_the_lru_until_they_expire(tmp_path):
    s = store(tmp_path, pages_bound=2)
    written(s, [page(1, retain_until=time.time() + 3600), page(2)])
    written(s, [page(3)])
    assert s.stored(1) and not s.stored(2)
    written(s, [page(4, retain_until=time.time() - 1)])    # expired: plain LRU
    assert s.stored(1) and s.stored(4) and not s.stored(3)
    s.close()


def test_a_directory_full_of_retained_pages_drops_new_writes(tmp_path):
    s = store(tmp_path, pages_bound=1)
    written(s, [page(1, retain_until=time.time() + 3600)])
    written(s, [page(2)])
    assert s.stored(1) and not s.stored(2) and s.stats.writes_dropped == 1
    s.close()


def test_retention_can_be_extended_and_survives_a_restart(tmp_path):
    s = store(tmp_path)
    written(s, [page(1)])
    until = time.time() + 3600
    s.retain(1, until)
    assert s.flush() and s.retention(1) == int(until)
    s.close()
    assert store(tmp_path).retention(1) == int(until)


def test_dropping_a_tenant_deletes_only_its_pages(tmp_path):
    s = store(tmp_path)
    written(s, [page(1, tenant=7), page(2, tenant=8), page(3)])
    s.drop(7)
    assert s.flush()
    assert not s.stored(1) and s.stored(2) and s.stored(3)
    s.drop()
    assert s.flush() and s.stats.files == 0 and list(s.dir.iterdir()) == []
    s.close()


def test_a_full_queue_drops_the_write_without_waiting(tmp_path):
    s = store(tmp_path, queue_bytes=1)
    t0 = time.monotonic()
    assert not s.write([page(1)])
    assert time.monotonic() - t0 < 1.0
    assert s.stats.writes_dropped == 1 and not s.has(1)
    s.close()


def test_closing_finishes_queued_writes_and_stops_its_threads(tmp_path):
    before = {t.name for t in threading.enumerate()}
    s = store(tmp_path)
    assert s.write([page(h) for h in range(1, 9)])
    s.close()
    assert s.stats.pages_written == 8
    leftover = {t.name for t in threading.enumerate()} - before
    assert not [n for n in leftover if "cache-dir" in n]


def test_a_page_of_the_wrong_size_is_refused_not_half_written(tmp_path):
    s = store(tmp_path)
    bad = PageWrite(1, 0, [1, 2, 3, 4], np.zeros(PAYLOAD - 1, np.uint8))
    assert s.write([bad]) and s.flush()
    assert not s.stored(1) and not [p for p in s.dir.iterdir()]
    s.close()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["write", "read"]), st.integers(1, 6)), max_size=30))
def test_the_store_keeps_exactly_what_a_naive_lru_keeps(tmp_path_factory, ops):
    """Against a list in use order: after any writes and reads, the pages kept are the most recent."""
    bound = 3
    s = store(tmp_path_factory.mktemp("lru"), pages_bound=bound)
    order: list[int] = []
    for op, h in ops:
        if op == "write":
            written(s, [page(h)])
            if h not in order:
                order.append(h)
                del order[:-bound]
        else:
            got = read(s, [h])
            assert got == ([bytes(page(h).payload)] if h in order else [])
            if h in order:
                order.remove(h)
                order.append(h)
    assert sorted(h for h in range(1, 7) if s.stored(h)) == sorted(order)
    assert len(os.listdir(s.dir)) == len(order)
    s.close()


def test_the_cache_key_must_be_16_bytes(tmp_path):
    with pytest.raises(ValueError):
        PageStore(tmp_path, b"short", TOKENS, PAYLOAD, 1 << 20)
