"""RadixCache against a naive reference: a dict from cached token tuples to their slots."""

from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.radix import KVPagePool, RadixCache


def make(page_size=1, pages=64):
    pool = KVPagePool(pages, page_size)
    return pool, RadixCache(pool)


def insert_fresh(pool, tree, tokens):
    """Insert `tokens` with newly allocated pages, as a finished request would."""
    p = pool.page_size
    n = len(tokens) // p
    pages = pool.alloc(n)
    slots = pool.slots_of(pages)
    present = tree.insert(tokens[: n * p], slots)
    return present


def test_match_returns_longest_cached_prefix():
    pool, tree = make()
    insert_fresh(pool, tree, [1, 2, 3, 4])
    slots, node = tree.match_prefix([1, 2, 3, 9, 9])
    assert len(slots) == 3
    assert node.key == [1, 2, 3]  # the edge was split at the mismatch


def test_insert_of_present_prefix_frees_duplicate_pages():
    pool, tree = make()
    insert_fresh(pool, tree, [1, 2, 3])
    free_before = pool.num_free
    present = insert_fresh(pool, tree, [1, 2, 3, 4, 5])
    assert present == 3
    # five pages were taken, three were duplicates and came back
    assert pool.num_free == free_before - 2
    assert tree.total_size == 5


def test_page_size_matches_whole_pages_only():
    pool, tree = make(page_size=4)
    insert_fresh(pool, tree, list(range(10)))       # the 2-token tail is not cached
    assert tree.total_size == 8
    slots, _ = tree.match_prefix(list(range(7)) + [99])
    assert len(slots) == 4                           # the partial second page does not count


def test_locked_nodes_are_not_evicted():
    pool, tree = make()
    insert_fresh(pool, tree, [1, 2, 3])
    insert_fresh(pool, tree, [7, 8])
    _, node = tree.match_prefix([1, 2, 3])
    tree.lock(node)
    tree.evict(100)
    assert tree.match_prefix([1, 2, 3])[0]
    assert not tree.match_prefix([7, 8])[0]
    tree.unlock(node)
    tree.evict(100)
    assert tree.total_size == 0
    assert pool.num_free == pool.num_pages


def test_evict_removes_least_recently_used_leaf_first():
    pool, tree = make()
    insert_fresh(pool, tree, [1, 1])
    insert_fresh(pool, tree, [2, 2])
    tree.match_prefix([1, 1])                        # touch: [2, 2] is now the oldest
    freed = tree.evict(1)
    assert len(freed) == 2
    assert tree.match_prefix([1, 1])[0] and not tree.match_prefix([2, 2])[0]


def test_reset_returns_every_page():
    pool, tree = make(page_size=2)
    insert_fresh(pool, tree, [1, 2, 3, 4])
    insert_fresh(pool, tree, [1, 2, 5, 6])
    tree.reset()
    assert pool.num_free == pool.num_pages and tree.total_size == 0


ops = st.lists(
    st.tuples(st.sampled_from(["insert", "match", "lock", "unlock", "evict"]),
              st.lists(st.integers(0, 3), min_size=0, max_size=12),
              st.integers(0, 20)),
    max_size=40)


@settings(max_examples=150, deadline=None)
@given(ops=ops, page_size=st.sampled_from([1, 2, 4]))
def test_random_operations_match_reference(ops, page_size):
    pool, tree = make(page_size=page_size, pages=256)
    reference: dict[tuple, list[int]] = {}    # cached page-aligned prefix -> its slots
    locked = []                               # (node, tokens) pairs currently locked
    for op, tokens, n in ops:
        aligned = tokens[: len(tokens) - len(tokens) % page_size]
        if op == "insert":
            if pool.num_free * page_size < len(aligned):
                tree.evict(len(aligned))
                # eviction changed what is cached: rebuild the reference from the tree
                reference = {k: v for k, v in reference.items() if tree.match_prefix(list(k))[0] == v}
            if pool.num_free * page_size < len(aligned):
                continue
            pages = pool.alloc(len(aligned) // page_size)
            slots = pool.slots_of(pages)
            present = tree.insert(aligned, slots)
            got = tree.match_prefix(aligned)[0]
            assert len(got) == len(aligned)
            assert got[present:] == slots[present:]   # the new part keeps the inserted slots
            for i in range(page_size, len(aligned) + 1, page_size):
                reference[tuple(aligned[:i])] = got[:i]
        elif op == "match":
            got, _ = tree.match_prefix(tokens)
            longest = max((len(k) for k in reference if list(k) == tokens[: len(k)]), default=0)
            assert len(got) == longest
            if longest:
                assert got == reference[tuple(tokens[:longest])]
        elif op == "lock":
            _, node = tree.match_prefix(tokens)
            tree.lock(node)
            locked.append((node, tokens, len(tree.match_prefix(tokens)[0])))
        elif op == "unlock" and locked:
            node, _, _ = locked.pop(n % len(locked))
            tree.unlock(node)
        elif op == "evict":
            tree.evict(n)
            reference = {k: v for k, v in reference.items() if tree.match_prefix(list(k))[0] == v}
        # locked paths survive every eviction
        for _, locked_tokens, length in locked:
            assert len(tree.match_prefix(locked_tokens)[0]) >= length
        # pages are conserved: free + in tree == total (nothing is held outside in this test)
        assert pool.num_free + tree.num_pages == pool.num_pages
        assert tree.evictable_size + tree.protected_size == tree.total_size
    for node, _, _ in locked:
        tree.unlock(node)
    tree.evict(10 ** 9)
    assert pool.num_free == pool.num_pages
