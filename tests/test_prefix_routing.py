"""The replica-choice policy behind `--replicas` (api/cluster/prefix_routing.py), on fake replica reports:
no Ray workers."""
from __future__ import annotations

import pytest

from radixserve.api.cluster.prefix_routing import BALANCE, CACHED, COLD, KEY, PENDING, PrefixRoutingPolicy
from radixserve.api.cluster.protocol import ReplicaReport
from radixserve.radix.prefix_hash import page_hashes

P = 16
SYSTEM_A = list(range(1000, 1800))       # 50 pages
SYSTEM_B = list(range(5000, 5800))


def prompt(system: list[int], user: int) -> list[int]:
    return system + [user] * 40


def report(replica: str, cached: list[list[int]] = (), taken_at: float = 1.0, queue: int = 0,
           kv_usage: float = 0.0) -> ReplicaReport:
    hashes = frozenset(h for tokens in cached for h in page_hashes(tokens, P))
    return ReplicaReport(replica=replica, taken_at=taken_at, alive=True, page_size=P, hashes=hashes,
                         truncated=False, num_running=queue, num_waiting=0, kv_usage=kv_usage,
                         kv_capacity_tokens=4096, prefix_hit_tokens=0, prefix_queried_tokens=0,
                         prompt_tokens=0, generation_tokens=0)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def policy(**kwargs) -> PrefixRoutingPolicy:
    clock = kwargs.pop("clock", Clock())
    return PrefixRoutingPolicy(clock=clock, **kwargs)


def test_request_goes_to_the_replica_whose_tree_holds_its_prefix():
    p = policy()
    p.update("r1", report("r1", [prompt(SYSTEM_B, 1)]))
    p.update("r2", report("r2", [prompt(SYSTEM_A, 1)]))
    d = p.choose(page_hashes(prompt(SYSTEM_A, 2), P), {"r1": 0, "r2": 3})
    assert (d.ranked[0], d.reason, d.matched_pages) == ("r2", CACHED, 50)


def test_longest_cached_prefix_wins_over_a_shorter_one():
    p = policy()
    p.update("r1", report("r1", [SYSTEM_A[:320]]))
    p.update("r2", report("r2", [SYSTEM_A]))
    d = p.choose(page_hashes(prompt(SYSTEM_A, 2), P), {"r1": 0, "r2": 0})
    assert d.ranked[0] == "r2" and d.matched_pages == 50


def test_cold_prefix_goes_to_the_replica_holding_the_fewest_prefix_pages():
    p = policy()
    p.update("r1", report("r1", [prompt(SYSTEM_B, 1)]))
    p.update("r2", report("r2", []))
    d = p.choose(page_hashes(prompt(SYSTEM_A, 1), P), {"r1": 0, "r2": 3})
    assert (d.ranked, d.reason) == (["r2", "r1"], COLD)


def test_prefixes_just_sent_count_toward_a_replicas_footprint():
    p = policy()
    p.update("r1", report("r1", []))
    p.update("r2", report("r2", [SYSTEM_B[:160]]))
    p.routed("r1", "q1", page_hashes(SYSTEM_B, P))  # not reported yet: 50 pages on their way to r1
    assert p.choose(page_hashes(prompt(SYSTEM_A, 1), P), {"r1": 0, "r2": 0}).ranked[0] == "r2"


def test_cold_prefix_on_equal_footprints_goes_to_the_least_loaded_replica():
    p = policy()
    p.update("r1", report("r1", [SYSTEM_B]))
    p.update("r2", report("r2", [SYSTEM_B]))
    assert p.choose(page_hashes(prompt(SYSTEM_A, 1), P), {"r1": 4, "r2": 1}).ranked[0] == "r2"


def test_cold_prefix_never_goes_to_an_overloaded_replica_however_small_its_tree():
    p = policy(imbalance=4)
    p.update("r1", report("r1", [SYSTEM_B]))
    p.update("r2", report("r2", []))
    assert p.choose(page_hashes(prompt(SYSTEM_A, 1), P), {"r1": 1, "r2": 9}).ranked[0] == "r1"


def test_cold_ties_on_footprint_and_load_go_to_the_replica_with_more_free_kv():
    p = policy()
    p.update("r1", report("r1", [], kv_usage=0.9))
    p.update("r2", report("r2", [], kv_usage=0.1))
    assert p.choose(page_hashes(prompt(SYSTEM_A, 1), P), {"r1": 1, "r2": 1}).ranked[0] == "r2"


def test_a_match_on_only_the_shared_opening_tokens_counts_as_cold():
    p = policy(min_match_ratio=0.1)
    shared_opening = SYSTEM_A[:16]
    p.update("r1", report("r1", [shared_opening + SYSTEM_B]))
    p.update("r2", report("r2", []))
    d = p.choose(page_hashes(shared_opening + SYSTEM_A[16:], P), {"r1": 3, "r2": 0})
    assert (d.ranked[0], d.reason) == ("r2", COLD)


def test_replica_with_a_much_longer_queue_is_skipped_despite_its_cache():
    p = policy(imbalance=4)
    p.update("r1", report("r1", [SYSTEM_A]))
    p.update("r2", report("r2", []))
    d = p.choose(page_hashes(prompt(SYSTEM_A, 1), P), {"r1": 9, "r2": 2})
    assert (d.ranked[0], d.reason) == ("r2", BALANCE)
    within = p.choose(page_hashes(prompt(SYSTEM_A, 1), P), {"r1": 6, "r2": 2})
    assert (within.ranked[0], within.reason) == ("r1", CACHED)


def test_burst_on_a_new_prompt_follows_the_first_request_before_any_report():
    p = policy()
    p.update("r1", report("r1", []))
    p.update("r2", report("r2", []))
    loads = {"r1": 0, "r2": 0}
    first = p.choose(page_hashes(prompt(SYSTEM_A, 0), P), loads)
    p.routed(first.ranked[0], "q0", page_hashes(prompt(SYSTEM_A, 0), P))
    loads[first.ranked[0]] += 1
    for user in range(1, 4):
        d = p.choose(page_hashes(prompt(SYSTEM_A, user), P), loads)
        assert (d.ranked[0], d.reason, d.matched_pages) == (first.ranked[0], PENDING, 50)
        p.routed(d.ranked[0], f"q{user}", page_hashes(prompt(SYSTEM_A, user), P))
        loads[d.ranked[0]] += 1


def served_on_r1(**kwargs) -> PrefixRoutingPolicy:
    """Two replicas that reported empty trees at t=0; a request on SYSTEM_A went to r1 and ended at t=3."""
    clock = Clock()
    p = policy(clock=clock, **kwargs)
    p.update("r1", report("r1", [], taken_at=0.0))
    p.update("r2", report("r2", [], taken_at=0.0))
    p.routed("r1", "q", page_hashes(prompt(SYSTEM_A, 0), P))
    clock.now = 3.0
    p.completed("r1", "q")
    return p


def test_finished_request_keeps_its_prefix_pending_until_a_later_report():
    p = served_on_r1()
    p.update("r1", report("r1", [], taken_at=2.0))  # taken before the request ended
    d = p.choose(page_hashes(prompt(SYSTEM_A, 1), P), {"r1": 1, "r2": 0})
    assert (d.ranked[0], d.reason) == ("r1", PENDING)


def test_without_sticky_a_prefix_a_later_report_does_not_show_is_cold_again():
    p = served_on_r1(sticky=False)
    p.update("r1", report("r1", [SYSTEM_B], taken_at=5.0))  # served, then evicted for B
    d = p.choose(page_hashes(prompt(SYSTEM_A, 1), P), {"r1": 0, "r2": 1})
    assert (d.ranked[0], d.reason) == ("r2", COLD)  # the smaller tree


def test_sticky_sends_an_evicted_prefix_back_where_it_was_last_sent():
    p = served_on_r1(sticky=True)
    p.update("r1", report("r1", [SYSTEM_B], taken_at=5.0))
    d = p.choose(page_hashes(prompt(SYSTEM_A, 1), P), {"r1": 3, "r2": 0})
    assert (d.ranked[0], d.reason) == ("r1", PENDING)


def test_request_never_reported_finished_is_forgotten_after_the_ttl():
    clock = Clock()
    p = policy(clock=clock, pending_ttl=5.0)
    p.update("r1", report("r1", []))
    p.update("r2", report("r2", []))
    p.routed("r1", "q", page_hashes(SYSTEM_A, P))
    clock.now = 6.0
    d = p.choose(page_hashes(prompt(SYSTEM_A, 1), P), {"r1": 1, "r2": 0})
    assert (d.ranked[0], d.reason) == ("r2", COLD)


def test_evicted_prefix_stops_attracting_requests_once_reported():
    p = policy()
    p.update("r1", report("r1", [SYSTEM_A], taken_at=1.0))
    p.update("r2", report("r2", [], taken_at=1.0))
    p.update("r1", report("r1", [SYSTEM_B], taken_at=2.0))  # r1 evicted A for B
    d = p.choose(page_hashes(prompt(SYSTEM_A, 1), P), {"r1": 0, "r2": 1})
    assert (d.ranked[0], d.reason) == ("r2", COLD)  # the smaller tree; nothing attracts it to r1


def test_an_older_report_never_replaces_a_newer_one():
    p = policy()
    p.update("r1", report("r1", [SYSTEM_A], taken_at=5.0))
    p.update("r1", report("r1", [], taken_at=4.0))
    assert len(p.report("r1").hashes) == 50


def test_removed_replica_is_never_ranked():
    p = policy()
    p.update("r1", report("r1", [SYSTEM_A]))
    p.update("r2", report("r2", []))
    p.remove("r1")
    d = p.choose(page_hashes(prompt(SYSTEM_A, 1), P), {"r2": 0})
    assert d.ranked == ["r2"] and p.report("r1") is None


def test_requests_remembered_per_replica_are_bounded():
    p = policy(max_pending=10)
    p.update("r1", report("r1", []))
    for i in range(12):
        p.routed("r1", f"q{i}", page_hashes(prompt(SYSTEM_A, i), P))
    assert len(p._replicas["r1"].inflight) == 10 and len(p._replicas["r1"].sent) <= 10


def test_a_request_sent_elsewhere_than_chosen_is_pending_only_where_it_went():
    p = policy()
    p.update("r1", report("r1", []))
    p.update("r2", report("r2", []))
    p.routed("r1", "q", page_hashes(prompt(SYSTEM_A, 0), P))
    p.routed("r2", "q", page_hashes(prompt(SYSTEM_A, 0), P))  # r1 was full: r2 took it
    d = p.choose(page_hashes(prompt(SYSTEM_A, 1), P), {"r1": 0, "r2": 1})
    assert (d.ranked[0], d.reason) == ("r2", PENDING)


def test_no_replica_is_an_error():
    with pytest.raises(ValueError):
        policy().choose([1, 2], {})


def test_report_survives_the_wire_format():
    r = report("SERVE_REPLICA::app#EngineReplica#x", [SYSTEM_A, SYSTEM_B], taken_at=12.5, queue=3, kv_usage=0.4)
    stats = r.to_stats()
    assert isinstance(stats["hashes"], bytes) and len(stats["hashes"]) == 8 * 100
    assert ReplicaReport.from_stats(stats) == r


def test_stats_that_are_not_a_report_read_as_none():
    assert ReplicaReport.from_stats({}) is None
    assert ReplicaReport.from_stats({"something": 1}) is None


def test_a_replica_reporting_the_prefix_beats_one_it_was_only_routed_to():
    p = policy()
    p.update("r1", report("r1", []))
    p.update("r2", report("r2", [SYSTEM_A]))
    p.routed("r1", "q", page_hashes(prompt(SYSTEM_A, 0), P))
    d = p.choose(page_hashes(prompt(SYSTEM_A, 1), P), {"r1": 0, "r2": 2})
    assert (d.ranked[0], d.reason) == ("r2", CACHED)


# ---- prompt_cache_key: one key, one replica --------------------------------------------------
REPLICAS = {"r1": 0, "r2": 0, "r3": 0}


def test_one_prompt_cache_key_always_goes_to_one_replica_whatever_the_prompt():
    p = policy()
    homes = {p.choose(page_hashes(prompt(system, user), P), dict(REPLICAS), "agent-7").ranked[0]
             for system in (SYSTEM_A, SYSTEM_B) for user in range(5)}
    assert len(homes) == 1
    assert p.choose(page_hashes(prompt(SYSTEM_A, 1), P), dict(REPLICAS), "agent-7").reason == KEY


def test_the_key_wins_over_a_cached_prefix_elsewhere():
    p = policy()
    home = p.choose([], dict(REPLICAS), "agent-7").ranked[0]
    other = next(r for r in REPLICAS if r != home)
    p.update(other, report(other, [SYSTEM_A]))
    assert p.choose(page_hashes(prompt(SYSTEM_A, 1), P), dict(REPLICAS), "agent-7").ranked[0] == home


def test_keys_spread_over_the_replicas():
    p = policy()
    homes = {p.choose([], dict(REPLICAS), f"agent-{i}").ranked[0] for i in range(30)}
    assert homes == set(REPLICAS)


def test_a_key_moves_only_when_its_replica_leaves():
    p = policy()
    keys = [f"agent-{i}" for i in range(30)]
    before = {k: p.choose([], dict(REPLICAS), k).ranked[0] for k in keys}
    gone = "r3"
    after = {k: p.choose([], {r: 0 for r in REPLICAS if r != gone}, k).ranked[0] for k in keys}
    assert all(after[k] == before[k] for k in keys if before[k] != gone)


def test_an_overloaded_home_is_passed_over_by_the_balance_guard():
    p = policy(imbalance=4)
    for r in REPLICAS:
        p.update(r, report(r))
    home = p.choose([], dict(REPLICAS), "agent-7").ranked[0]
    loads = {r: (20 if r == home else 1) for r in REPLICAS}
    d = p.choose(page_hashes(prompt(SYSTEM_A, 1), P), loads, "agent-7")
    assert d.ranked[0] != home and d.reason != KEY
