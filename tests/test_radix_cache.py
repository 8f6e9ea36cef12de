"""RadixCache against a naive reference: a dict from cached page-aligned prefixes to their pages.

The tree has no pool; each test keeps one and frees into it itself, as KVManager does.
"""
import inspect
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.radix import KVPagePool, RadixCache, TreeNode
from radixserve.radix.prefix_hash import page_hashes, root_hash


def make(page_size=1, pages=64):
    return KVPagePool(pages, page_size), RadixCache(page_size)


def insert_fresh(pool, tree, tokens):
    """Insert `tokens` with newly allocated pages, as a finished request would; returns the result."""
    pages = pool.alloc(len(tokens) // pool.page_size)
    return tree.insert(tokens, pages)


def nodes(tree: RadixCache) -> list[TreeNode]:
    out, stack = [], list(tree.root.children.values())
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children.values())
    return out


def cached(tree: RadixCache, salted: bool = False) -> dict[tuple, int]:
    """Every cached page-aligned prefix -> the id of its last page, read without touching LRU times;
    `salted`: keys are (salt, *tokens)."""
    p, out = tree.page_size, {}
    stack: list[tuple[TreeNode, tuple]] = [(tree.root, ())]
    while stack:
        node, prefix = stack.pop()
        for child in node.children.values():
            assert len(child.pages) * p == len(child.key)
            start = (child.salt,) if salted and node is tree.root else prefix
            for i, page in enumerate(child.pages):
                out[start + tuple(child.key[: (i + 1) * p])] = page
            stack.append((child, start + tuple(child.key)))
    return out


def test_match_returns_longest_cached_prefix_as_pages():
    pool, tree = make()
    insert_fresh(pool, tree, [1, 2, 3, 4])
    pages = cached(tree)
    got, node = tree.match_prefix([1, 2, 3, 9, 9])
    assert got == [pages[(1,)], pages[(1, 2)], pages[(1, 2, 3)]]
    assert node.key == [1, 2, 3] and node.pages == got  # the edge was split at the mismatch


def test_split_keeps_one_page_per_page_of_key():
    pool, tree = make(page_size=2)
    pages = pool.alloc(3)
    tree.insert([1, 2, 3, 4, 5, 6], pages)
    got, node = tree.match_prefix([1, 2, 3, 4, 9, 9])
    assert got == pages[:2] and node.pages == pages[:2]
    (child,) = node.children.values()
    assert child.key == [5, 6] and child.pages == pages[2:]


def test_insert_returns_the_callers_duplicate_pages_instead_of_freeing_them():
    pool, tree = make()
    first = pool.alloc(3)
    assert tree.insert([1, 2, 3], first).present == 0
    second = pool.alloc(5)
    free_before = pool.num_free
    result = tree.insert([1, 2, 3, 4, 5], second)
    assert result.present == 3
    assert result.duplicates == second[:3]
    assert pool.num_free == free_before          # handed back, not freed
    assert tree.match_prefix([1, 2, 3, 4, 5])[0] == first + second[3:]
    assert tree.total_size == 5


def test_insert_of_the_trees_own_pages_returns_no_duplicates():
    pool, tree = make(page_size=2)
    insert_fresh(pool, tree, [1, 2, 3, 4])
    matched, _ = tree.match_prefix([1, 2, 3, 4])     # a request reading the cached prefix
    result = tree.insert([1, 2, 3, 4, 5, 6], matched + pool.alloc(1))
    assert result.present == 4 and result.duplicates == []


def test_insert_needs_one_page_per_whole_page_of_tokens():
    pool, tree = make(page_size=4)
    with pytest.raises(ValueError):
        tree.insert(list(range(8)), pool.alloc(1))
    assert tree.insert(list(range(10)), pool.alloc(2)).present == 0  # the 2-token tail is dropped
    assert tree.total_size == 8


def test_page_size_matches_whole_pages_only():
    pool, tree = make(page_size=4)
    insert_fresh(pool, tree, list(range(8)))
    pages, _ = tree.match_prefix(list(range(7)) + [99])
    assert len(pages) == 1                           # the partial second page does not count


def test_locked_nodes_are_not_evicted():
    pool, tree = make()
    insert_fresh(pool, tree, [1, 2, 3])
    insert_fresh(pool, tree, [7, 8])
    _, node = tree.match_prefix([1, 2, 3])
    tree.lock(node)
    pool.free(tree.evict(100))
    assert tree.match_prefix([1, 2, 3])[0]
    assert not tree.match_prefix([7, 8])[0]
    tree.unlock(node)
    pool.free(tree.evict(100))
    assert tree.total_size == 0
    assert pool.num_free == pool.num_pages


def test_evict_removes_least_recently_used_leaf_first():
    pool, tree = make()
    insert_fresh(pool, tree, [1, 1])
    insert_fresh(pool, tree, [2, 2])
    tree.match_prefix([1, 1])                        # touch: [2, 2] is now the oldest
    dropped = tree.evict(1)
    assert len(dropped) == 2
    assert tree.match_prefix([1, 1])[0] and not tree.match_prefix([2, 2])[0]


def test_evict_returns_the_pages_it_dropped_and_frees_nothing():
    pool, tree = make(page_size=2)
    pages = pool.alloc(3)
    tree.insert([1, 2, 3, 4, 5, 6], pages)
    free_before = pool.num_free
    dropped = tree.evict(10 ** 9)
    assert sorted(dropped) == sorted(pages)
    assert pool.num_free == free_before and tree.total_size == 0
    pool.free(dropped)                               # still allocated: freeing them once is legal
    assert pool.num_free == pool.num_pages


def test_reset_returns_every_page():
    pool, tree = make(page_size=2)
    a = pool.alloc(2)
    b = pool.alloc(2)
    tree.insert([1, 2, 3, 4], a)
    assert tree.insert([1, 2, 5, 6], b).duplicates == b[:1]
    pool.free(b[:1])
    free_before = pool.num_free
    pages = tree.reset()
    assert sorted(pages) == sorted(a + b[1:])
    assert pool.num_free == free_before and tree.total_size == 0
    pool.free(pages)
    assert pool.num_free == pool.num_pages


def test_reset_refuses_while_a_prefix_is_locked():
    pool, tree = make()
    insert_fresh(pool, tree, [1, 2])
    tree.lock(tree.match_prefix([1, 2])[1])
    with pytest.raises(RuntimeError):
        tree.reset()


def test_the_tree_never_calls_the_pool():
    # it is built from a page size alone, so it cannot reach a pool to free into
    assert list(inspect.signature(RadixCache).parameters) == ["page_size"]
    tree = RadixCache(page_size=2)
    tree.insert([1, 2, 3, 4], [7, 3])
    tree.insert([1, 2, 5, 6], [9, 4])
    tree.lock(tree.match_prefix([1, 2, 5, 6])[1])
    assert tree.evict(10) == [3]
    with pytest.raises(RuntimeError):
        tree.reset()
    assert not any(isinstance(v, KVPagePool) for v in vars(tree).values())


# ---- random requests against the reference ------------------------------------------------

@dataclass
class FakeRequest:
    salt: object
    tokens: list[int]    # page-aligned
    node: TreeNode
    matched: list[int]   # the tree's pages it reads (locked)
    own: list[int]       # pages allocated for it alone


ops = st.lists(
    st.tuples(st.sampled_from(["insert", "match", "start", "finish", "abort", "evict", "drop"]),
              st.lists(st.integers(0, 3), min_size=0, max_size=12),
              st.integers(0, 20),
              st.sampled_from([None, None, "a", "b"])),   # the request's cache salt (None: shared)
    max_size=40)


@settings(max_examples=150, deadline=None)
@given(ops=ops, page_size=st.sampled_from([1, 2, 4]), num_pages=st.sampled_from([6, 24]))
def test_random_requests_keep_every_page_free_cached_or_held_once(ops, page_size, num_pages):
    p = page_size
    pool, tree = make(page_size=p, pages=num_pages)
    reference: dict[tuple, int] = {}     # (salt, *cached page-aligned prefix) -> its last page
    running: list[FakeRequest] = []

    def evict(n_tokens: int) -> None:
        nonlocal reference
        free_before = pool.num_free
        access = {q: node.last_access for node in nodes(tree) for q in node.pages}   # as they were
        dropped = tree.evict(n_tokens)
        # least recently used first: nothing evictable that is left was used before anything dropped
        left = [node.last_access for node in nodes(tree) if not node.children and node.lock_ref == 0]
        assert not dropped or not left or max(access[q] for q in dropped) <= min(left)
        assert pool.num_free == free_before  # the tree freed nothing itself
        after = cached(tree, salted=True)
        gone = {k: v for k, v in reference.items() if k not in after}
        assert all(reference.get(k) == v for k, v in after.items())   # eviction only removes
        assert sorted(dropped) == sorted(gone.values())
        if len(gone) * p < n_tokens:
            assert tree.evictable_size == 0  # stopped short only when nothing unlocked was left
        reference = after
        pool.free(dropped)

    def alloc(n: int):
        if pool.num_free < n:
            evict((n - pool.num_free) * p)
        return pool.alloc(n) if pool.num_free >= n else None

    def insert(salt, tokens: list[int], pages: list[int]) -> None:
        expected_present, expected_dups = 0, []
        for i, page in enumerate(pages):
            key = (salt, *tokens[: (i + 1) * p])
            if key in reference:
                expected_present += p
                if reference[key] != page:
                    expected_dups.append(page)
            else:
                reference[key] = page
        result = tree.insert(tokens, pages, salt)
        assert (result.present, result.duplicates) == (expected_present, expected_dups)
        pool.free(result.duplicates)     # the test, not the tree, frees them

    def longest_cached(salt, tokens: list[int]) -> list[int]:
        pages = []
        for end in range(p, len(tokens) + 1, p):
            if (salt, *tokens[:end]) not in reference:
                break
            pages.append(reference[(salt, *tokens[:end])])
        return pages

    def check_summary(limit: int) -> None:
        """The page hashes a replica reports name exactly the cached prefixes; cut short, they are
        still closed under taking prefixes (a router matching page by page never skips a gap)."""
        hashes, truncated = tree.page_hash_summary(limit)
        named = {page_hashes(list(k[1:]), p, root_hash(k[0]))[-1]: k for k in reference}
        if not truncated:
            assert sorted(hashes) == sorted(named)
        assert len(hashes) <= limit and set(hashes) <= set(named)
        for h in hashes:
            key = named[h]
            salt, tokens = key[0], list(key[1:])
            assert all(page_hashes(tokens[:end], p, root_hash(salt))[-1] in set(hashes) for end in range(p, len(tokens), p))

    for op, tokens, n, salt in ops:
        aligned = tokens[: len(tokens) - len(tokens) % p]
        if op == "insert":
            pages = alloc(len(aligned) // p)
            if pages is not None:
                insert(salt, aligned, pages)
        elif op == "match":
            num_nodes = tree.num_nodes
            assert tree.prefix_pages(tokens, salt) == longest_cached(salt, tokens)
            assert tree.num_nodes == num_nodes   # read only: no edge was split
            assert tree.match_prefix(tokens, salt)[0] == longest_cached(salt, tokens)
            assert tree.match_length(tokens, len(tokens), salt)[0] == len(longest_cached(salt, tokens)) * p
            check_summary(limit=n)
        elif op == "start":
            matched, node = tree.match_prefix(aligned, salt)
            assert matched == longest_cached(salt, aligned)
            tree.lock(node)
            own = alloc(len(aligned) // p - len(matched))
            if own is None:
                tree.unlock(node)
            else:
                running.append(FakeRequest(salt, aligned, node, matched, own))
        elif op in ("finish", "abort") and running:
            req = running.pop(n % len(running))
            if op == "finish":
                insert(req.salt, req.tokens, req.matched + req.own)
            else:
                pool.free(req.own)
            tree.unlock(req.node)
        elif op == "evict":
            evict(n)
        elif op == "drop":   # DELETE /v1/cache: every tree (n even) or only `salt`'s
            every = n % 2 == 0
            dropped = tree.drop_unused(salt, every_salt=every)
            after = cached(tree, salted=True)
            gone = {k: v for k, v in reference.items() if k not in after}
            assert all(reference.get(k) == v for k, v in after.items())
            assert sorted(dropped) == sorted(gone.values())
            assert every or all(k[0] == salt for k in gone)
            in_scope = [node for node in nodes(tree) if every or node.salt == salt]
            assert all(node.lock_ref > 0 for node in in_scope)   # what is left there is in use
            reference = after
            pool.free(dropped)

        assert cached(tree, salted=True) == reference
        check_summary(limit=10**6)
        assert tree.total_size == len(reference) * p
        assert tree.evictable_size + tree.protected_size == tree.total_size
        for req in running:              # locked paths survive every eviction
            assert longest_cached(req.salt, req.tokens)[: len(req.matched)] == req.matched
        # every page is in exactly one place: free, owned by the tree, or held by one request
        free = pool.alloc(pool.num_free)
        pool.free(free)
        owned = list(reference.values())
        held = [q for req in running for q in req.own]
        assert sorted(free + owned + held) == list(range(num_pages))

    for req in running:
        pool.free(req.own)
        tree.unlock(req.node)
    pool.free(tree.reset())
    assert pool.num_free == pool.num_pages


def test_evicting_a_page_does_not_walk_the_whole_tree(monkeypatch):
    pool, tree = make(page_size=1, pages=2100)
    for i in range(1000):
        insert_fresh(pool, tree, [i, 1])   # a thousand unlocked leaves
    oldest = list(tree.match_prefix([0, 1])[0])
    for i in range(1, 1000):
        tree.match_prefix([i, 1])          # [0, 1] is now the least recently used

    def walk():
        raise AssertionError("evict walked the whole tree")

    monkeypatch.setattr(tree, "_nodes", walk)
    assert tree.evict(2) == oldest


# ---- the cache view: longest prefixes and how often each was reused -------------------------------
def hit(tree: RadixCache, tokens: list[int]) -> int:
    """What KVManager does for a request about to run: match, count the hit; returns its length."""
    pages, node = tree.match_prefix(tokens)
    tree.record_hit(node)
    return len(pages) * tree.page_size


def test_top_prefixes_are_listed_longest_first_with_their_length():
    pool, tree = make()
    insert_fresh(pool, tree, [1, 2, 3, 4, 5])
    insert_fresh(pool, tree, [1, 2, 9])
    assert [p.tokens for p in tree.top_prefixes(10)] == [5, 3, 2]   # [1 2 3 4 5], [1 2 9], [1 2]


def test_top_prefixes_stop_at_the_limit():
    pool, tree = make()
    for first in range(5):
        insert_fresh(pool, tree, [first, 1, 2])
    assert len(tree.top_prefixes(3)) == 3


def test_a_hit_counts_for_every_prefix_the_request_reused():
    pool, tree = make()
    insert_fresh(pool, tree, [1, 2, 3, 4])
    insert_fresh(pool, tree, [1, 2, 7, 8])
    hit(tree, [1, 2, 3, 4, 5])
    hit(tree, [1, 2, 6])
    listed = {tuple(p.token_ids): p.hits for p in tree.top_prefixes(10, with_tokens=True)}
    assert listed == {(1, 2, 3, 4): 1, (1, 2, 7, 8): 0, (1, 2): 2}


def test_by_hits_the_most_reused_prefixes_come_first():
    pool, tree = make()
    insert_fresh(pool, tree, [1, 2, 3, 4, 5])
    insert_fresh(pool, tree, [7, 8])
    hit(tree, [7, 8, 9])
    hit(tree, [7, 8, 6])
    hit(tree, [1, 2])
    assert [(p.tokens, p.hits) for p in tree.top_prefixes(3, by="hits")] == [(2, 2), (2, 1), (5, 0)]


def test_a_listed_prefix_is_named_by_its_page_hash():
    pool, tree = make(page_size=2)
    tree.insert([1, 2, 3, 4], pool.alloc(2), salt="a")
    assert tree.top_prefixes(1)[0].hash == page_hashes([1, 2, 3, 4], 2, root_hash("a"))[-1]


def test_prefix_token_ids_are_given_only_when_asked_for():
    pool, tree = make()
    insert_fresh(pool, tree, [5, 6, 7])
    assert tree.top_prefixes(1)[0].token_ids is None
    assert tree.top_prefixes(1, with_tokens=True)[0].token_ids == [5, 6, 7]


def test_a_locked_prefix_is_shown_in_use():
    pool, tree = make()
    insert_fresh(pool, tree, [1, 2])
    _, node = tree.match_prefix([1, 2])
    tree.lock(node)
    assert tree.top_prefixes(1)[0].in_use
    tree.unlock(node)
    assert not tree.top_prefixes(1)[0].in_use


def test_evicting_a_reused_leaf_keeps_its_hits_on_the_prefix_left():
    pool, tree = make()
    insert_fresh(pool, tree, [1, 2, 3])
    insert_fresh(pool, tree, [1, 2, 9])
    hit(tree, [1, 2, 3])
    tree.match_prefix([1, 2, 9])   # [1 2 3] is now the least recently used leaf
    pool.free(tree.evict(1))
    assert {p.tokens: p.hits for p in tree.top_prefixes(10)} == {3: 0, 2: 1}


@settings(max_examples=60, deadline=None)
@given(prompts=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=6), min_size=1, max_size=12),
       page_size=st.sampled_from([1, 2]))
def test_prefix_hits_match_a_naive_count_of_reused_prefixes(prompts, page_size):
    """Each prompt is looked up (a hit where something matched), then cached, as requests are. A
    cached prefix's hits are the lookups whose reused part contains it."""
    pool, tree = make(page_size, pages=256)
    reused: list[tuple] = []
    for prompt in prompts:
        n = hit(tree, prompt)
        if n:
            reused.append(tuple(prompt[:n]))
        aligned = len(prompt) - len(prompt) % page_size
        pool.free(insert_fresh(pool, tree, prompt[:aligned]).duplicates)
    listed = tree.top_prefixes(1000, with_tokens=True)
    assert len(listed) == len(nodes(tree))
    assert [p.tokens for p in listed] == sorted((p.tokens for p in listed), reverse=True)
    for p in listed:
        path = tuple(p.token_ids)
        assert p.tokens == len(path) and path in cached(tree)
        assert p.hits == sum(1 for r in reused if r[:len(path)] == path), path


# ---- tenants: a cache salt keys a prompt's first page, so salted subtrees never meet --------------
def test_a_salted_prefix_is_found_only_with_the_same_salt():
    pool, tree = make()
    tree.insert([1, 2, 3], pool.alloc(3), salt="a")
    assert len(tree.match_prefix([1, 2, 3], salt="a")[0]) == 3
    assert tree.match_prefix([1, 2, 3], salt="b")[0] == []
    assert tree.match_prefix([1, 2, 3])[0] == []                       # nor by unsalted requests
    assert tree.match_length([1, 2, 3], 3, salt="b")[0] == 0


def test_the_same_tokens_under_two_salts_keep_two_copies():
    pool, tree = make()
    a, b = pool.alloc(2), pool.alloc(2)
    assert tree.insert([1, 2], a, salt="a").duplicates == []
    assert tree.insert([1, 2], b, salt="b").duplicates == []            # not a duplicate: another tenant
    assert tree.match_prefix([1, 2], salt="a")[0] == a and tree.match_prefix([1, 2], salt="b")[0] == b


def test_salted_page_hashes_differ_from_the_shared_trees():
    pool, tree = make(page_size=2)
    tree.insert([1, 2, 3, 4], pool.alloc(2))
    tree.insert([1, 2, 3, 4], pool.alloc(2), salt="a")
    hashes, _ = tree.page_hash_summary(100)
    assert len(set(hashes)) == 4
    assert set(page_hashes([1, 2, 3, 4], 2)) < set(hashes)


def test_splitting_and_evicting_a_salted_edge_keep_it_in_its_tenants_tree():
    pool, tree = make()
    tree.insert([1, 2, 3], pool.alloc(3), salt="a")
    assert len(tree.match_prefix([1, 2, 9], salt="a")[0]) == 2           # splits [1 2 3] under the salt
    assert tree.match_prefix([1, 2], salt="b")[0] == []
    pool.free(tree.evict(100))
    assert tree.total_size == 0 and pool.num_free == pool.num_pages


def test_dropping_unused_prefixes_keeps_those_in_use():
    pool, tree = make()
    insert_fresh(pool, tree, [1, 2, 3])
    pool.free(insert_fresh(pool, tree, [1, 2, 7]).duplicates)
    insert_fresh(pool, tree, [5, 6])
    _, node = tree.match_prefix([1, 2, 3])
    tree.lock(node)
    pool.free(tree.drop_unused())
    assert cached(tree) == {(1,): 0, (1, 2): 1, (1, 2, 3): 2}
    tree.unlock(node)
    pool.free(tree.drop_unused())
    assert tree.total_size == 0 and tree.evictable_size == 0 and pool.num_free == pool.num_pages


def test_dropping_one_salts_prefixes_leaves_the_other_trees():
    pool, tree = make()
    tree.insert([1, 2], pool.alloc(2), salt="a")
    tree.insert([1, 2], pool.alloc(2), salt="b")
    tree.insert([1, 2], pool.alloc(2))
    pool.free(tree.drop_unused("a", every_salt=False))
    assert tree.match_prefix([1, 2], "a")[0] == []
    assert len(tree.match_prefix([1, 2], "b")[0]) == 2 and len(tree.match_prefix([1, 2])[0]) == 2
    assert pool.num_free == pool.num_pages - 4
