import pytest

from radixserve.radix import KVPagePool, OutOfPagesError


def test_alloc_hands_out_distinct_pages_until_empty():
    pool = KVPagePool(num_pages=8, page_size=4)
    pages = pool.alloc(5) + pool.alloc(3)
    assert sorted(pages) == list(range(8))
    assert pool.num_free == 0
    with pytest.raises(OutOfPagesError):
        pool.alloc(1)


def test_freed_pages_can_be_allocated_again():
    pool = KVPagePool(num_pages=4, page_size=1)
    pages = pool.alloc(4)
    pool.free(pages[:2])
    assert sorted(pool.alloc(2)) == sorted(pages[:2])


def test_double_free_raises():
    pool = KVPagePool(num_pages=4, page_size=1)
    pages = pool.alloc(2)
    pool.free(pages)
    with pytest.raises(RuntimeError, match="double free"):
        pool.free(pages[:1])


def test_freeing_the_same_page_twice_in_one_call_raises():
    pool = KVPagePool(num_pages=4, page_size=1)
    page = pool.alloc(1)[0]
    with pytest.raises(RuntimeError, match="double free"):
        pool.free([page, page])

