"""Scheduling under memory pressure: policies, in-batch prefix sharing, budgets, preemption, fairness.

Policy comparisons run the real Scheduler / KVManager / radix tree on a fake clock without a
model (tests/schedule_sim.py): exact and deterministic. End-to-end behaviour (outputs through
eviction and preemption, admission order, rejections, counters) runs on the real default model;
there, every waiting request is queued behind a running one before any admission decision, so
the order is deterministic too. Everything is count-based; nothing asserts on time.
"""
from __future__ import annotations

import logging
import random
import re
import time

import pytest

from radixserve.radix import KVPagePool, RequestPageTable
from radixserve.runtime.config import EngineConfig
from radixserve.runtime.decode_reservation import DecodeReservation
from radixserve.runtime.engine import collect
from radixserve.runtime.engine_client import EngineRefusal, RefusalKind
from radixserve.runtime.kv_manager import KVManager
from radixserve.runtime.request import OutputStream, Request
from radixserve.runtime.sampling_params import SamplingParams
from radixserve.runtime.schedule_policy import CACHE_AWARE_MAX_QUEUE, DFSWeightPolicy, LongestPrefixPolicy
from radixserve.runtime.scheduler import SHARED_RUN_ROWS

from .schedule_sim import SimEngine


def random_tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(200, 40000) for _ in range(n)]


def shuffled_system_prompt_workload(seed: int = 0, n_system: int = 4, users: int = 16, system_len: int = 1000):
    rng = random.Random(seed)
    systems = [random_tokens(rng, system_len) for _ in range(n_system)]
    prompts = [(i, systems[i] + random_tokens(rng, rng.randrange(20, 60)))
               for i in range(n_system) for _ in range(users)]
    rng.shuffle(prompts)
    return prompts


def run_sim(prompts, max_tokens: int = 64, **config) -> SimEngine:
    sim = SimEngine(**config)
    for p in prompts:
        sim.submit(p, max_tokens=max_tokens)
    sim.run()
    return sim


# ---- policies on the simulator -------------------------------------------------------------

def test_lpm_reaches_a_higher_prefix_hit_ratio_than_fcfs_on_shuffled_system_prompts():
    # pool of about two of the four 1,000-token system prompts
    prompts = [p for _, p in shuffled_system_prompt_workload()]
    ratios = {policy: run_sim(prompts, kv_cache_tokens=2400, schedule_policy=policy).hit_ratio
              for policy in ("lpm", "dfs-weight", "fcfs")}
    print(f"prefix hit ratio, 4 system prompts x 16 users, pool ~2 prompts: {ratios}")
    assert ratios["lpm"] > ratios["fcfs"], ratios
    assert ratios["dfs-weight"] > ratios["fcfs"], ratios


def test_in_batch_sharing_prefills_each_shared_prompt_once():
    workload = shuffled_system_prompt_workload()
    shared = 1000 // 16 * 16  # page-aligned part of a system prompt

    def misses(policy: str) -> dict[int, int]:
        sim = SimEngine(schedule_policy=policy)  # ample pool: nothing is evicted
        reqs = [(group, sim.submit(p, max_tokens=16)) for group, p in workload]
        sim.run()
        counts = {g: 0 for g in range(4)}
        for group, req in reqs:
            counts[group] += req.cached_tokens < shared
        return counts

    assert misses("lpm") == {0: 1, 1: 1, 2: 1, 3: 1}
    # without holding, a burst admits several requests of one prompt in the same step
    assert sum(misses("fcfs").values()) > 4


def test_hold_for_sharing_is_bounded_in_steps():
    # the leader prefills 512 shared tokens 16 per step (32 steps); the follower stops waiting after 16
    rng = random.Random(3)
    system = random_tokens(rng, 512)
    sim = SimEngine(chunked_prefill_size=16, max_batched_tokens=32, page_size=16)
    leader = sim.submit(system + random_tokens(rng, 8), max_tokens=2)
    follower = sim.submit(system + random_tokens(rng, 8), max_tokens=2)
    for _ in range(20):
        sim.step()
    assert leader.request_id in sim.admitted and follower.request_id in sim.admitted
    assert 0 < sim.scheduler.stats.held_for_sharing <= sim.scheduler.sharing.max_hold_steps


def test_a_request_held_in_a_step_that_preempts_is_counted_once(monkeypatch):
    rng = random.Random(6)
    a, b = random_tokens(rng, 300), random_tokens(rng, 300)
    sim = SimEngine(chunked_prefill_size=32, page_size=16)
    sim.submit(a, max_tokens=2)
    sim.submit(b, max_tokens=2)
    sim.step()                                                    # both prefill their first chunk
    follower = sim.submit(a[:280] + random_tokens(rng, 20), max_tokens=2)
    real_alloc = sim.kv.alloc
    # no page for anyone until a request is preempted: every running prompt is stuck, so the step
    # is planned twice, the follower held (behind the leader's prefill of what they share) each time
    monkeypatch.setattr(sim.kv, "alloc", lambda req, n, **kw: sim.scheduler.stats.preemptions > 0 and real_alloc(req, n, **kw))
    batch = sim.step()
    assert sim.scheduler.stats.preemptions == 1 and batch.extends
    assert batch.held == [follower]
    assert follower.held_steps == 1 and sim.scheduler.stats.held_for_sharing == 1


def test_short_shared_header_does_not_hold_requests():
    rng = random.Random(4)
    header = random_tokens(rng, 16)  # e.g. a chat template's first tokens
    sim = SimEngine(page_size=16)
    for _ in range(4):
        sim.submit(header + random_tokens(rng, 300), max_tokens=2)
    sim.step()
    assert len(sim.admitted) == 4 and sim.scheduler.stats.held_for_sharing == 0


def test_cold_request_behind_a_hot_stream_is_admitted_by_its_boost_deadline():
    rng = random.Random(5)
    hot_prefix = random_tokens(rng, 256)

    def admitted_after(boost: float) -> tuple[float, bool]:
        sim = SimEngine(max_running_requests=2, max_queue_wait_boost=boost, step_seconds=0.05)
        sim.submit(hot_prefix + random_tokens(rng, 8), max_tokens=4)
        sim.run()  # the hot prefix is cached now
        for _ in range(3):
            sim.submit(hot_prefix + random_tokens(rng, 8), max_tokens=4)
        cold = sim.submit(random_tokens(rng, 64), max_tokens=4)
        for _ in range(200):  # a hot request arrives every step
            sim.submit(hot_prefix + random_tokens(rng, 8), max_tokens=4)
            sim.step()
            if cold.first_admitted:
                return sim.now - cold.arrival_time, True
        return sim.now - cold.arrival_time, False

    waited, admitted = admitted_after(boost=0.5)
    # the first hot request arriving after its deadline makes it jump; then it takes the next
    # free slot (a hot request runs 4 steps)
    assert admitted and waited <= 0.5 + 6 * 0.05
    assert admitted_after(boost=1e9) == (pytest.approx(10.0), False)  # plain lpm starves it


def test_priority_policy_admits_lower_values_first_and_fcfs_within_a_level():
    rng = random.Random(6)
    sim = SimEngine(schedule_policy="priority", max_running_requests=1)
    for i, prio in enumerate([5, 0, 5, 0, -3]):
        sim.submit(random_tokens(rng, 40), max_tokens=2, priority=prio, request_id=f"p{i}")
    sim.run()
    assert sim.admitted == ["p4", "p1", "p3", "p0", "p2"]


def test_lpm_keeps_queue_order_beyond_its_queue_limit():
    rng = random.Random(7)
    sim = SimEngine()
    cached = random_tokens(rng, 64)
    sim.submit(cached + [1], max_tokens=1)
    sim.run()
    hit = sim.submit(cached + [2], max_tokens=1)
    colds = [sim.submit(random_tokens(rng, 32), max_tokens=1) for _ in range(CACHE_AWARE_MAX_QUEUE)]
    policy = LongestPrefixPolicy(max_queue_wait_boost=1e9)
    assert policy.order(colds[:10] + [hit], sim.kv.tree).requests[0] is hit
    queue = colds + [hit]
    assert policy.order(queue, sim.kv.tree).requests == queue


def test_dfs_weight_runs_the_heaviest_cached_subtree_first():
    rng = random.Random(8)
    a, b = random_tokens(rng, 64), random_tokens(rng, 64)
    sim = SimEngine()
    sim.submit(a + [1], max_tokens=1)
    sim.submit(b + [1], max_tokens=1)
    sim.run()
    a_reqs = [sim.submit(a + random_tokens(rng, 20), max_tokens=1) for _ in range(2)]
    b_reqs = [sim.submit(b + random_tokens(rng, 20), max_tokens=1) for _ in range(3)]
    cold = sim.submit(random_tokens(rng, 80), max_tokens=1)
    queue = [cold, a_reqs[0], b_reqs[0], a_reqs[1], b_reqs[1], b_reqs[2]]
    order = DFSWeightPolicy(max_queue_wait_boost=1e9).order(queue, sim.kv.tree)
    assert order.requests == b_reqs + a_reqs + [cold]


@pytest.mark.parametrize("page_size", [1, 16])
def test_read_only_match_agrees_with_match_prefix(page_size):
    rng = random.Random(11)
    sim = run_sim([p for _, p in shuffled_system_prompt_workload(system_len=100, users=4)], max_tokens=4,
                  page_size=page_size)
    tree = sim.kv.tree
    assert tree.num_pages > 0
    cached = [p for _, p in shuffled_system_prompt_workload(system_len=100, users=4)]
    for prompt in cached + [random_tokens(rng, 120)]:
        for tokens in (prompt, prompt[:37], prompt[:100] + random_tokens(rng, 5), prompt[:-3]):
            length, _ = tree.match_length(tokens, len(tokens))
            assert length == len(tree.match_prefix(tokens)[0]) * page_size


# ---- budgets and preemption on the simulator ----------------------------------------------

def test_reservation_ratio_decays_without_preemption_and_resets_on_one():
    r = DecodeReservation(initial_ratio=0.7, min_ratio=0.1, decay_steps=10)
    for _ in range(5):
        r.on_step()
    assert r.ratio == pytest.approx(0.4)
    for _ in range(100):
        r.on_step()
    assert r.ratio == pytest.approx(0.1)
    r.on_preemption()
    assert r.ratio == 0.7


def test_preemption_takes_the_request_with_least_progress_not_the_newest():
    rng = random.Random(9)
    # 8 pages; both start in the same step, but the older one prefills 80 tokens in chunks of 16
    # while the newer one is already decoding: when pages run out the older has fewer outputs
    sim = SimEngine(kv_cache_tokens=128, page_size=16, chunked_prefill_size=16, max_batched_tokens=32)
    sim.scheduler.reservation.ratio = 0.0  # reserve nothing, so that both are admitted at once
    older = sim.submit(random_tokens(rng, 80), max_tokens=40)
    newer = sim.submit(random_tokens(rng, 16), max_tokens=40)
    sim.step()
    assert sim.scheduler.running == [older, newer]
    while sim.scheduler.stats.preemptions == 0:
        sim.step()
    assert older.preemptions == 1 and newer.preemptions == 0
    assert len(older.output_ids) < len(newer.output_ids)
    sim.run()
    assert len(older.output_ids) == len(newer.output_ids) == 40


def test_tiny_pool_workload_finishes_with_evictions_and_preemptions_in_the_simulator():
    rng = random.Random(10)
    systems = [random_tokens(rng, n) for n in (210, 190, 230)]
    prompts = [systems[i % 3] + random_tokens(rng, rng.randrange(10, 25)) for i in range(40)]
    sim = run_sim(prompts, max_tokens=40, kv_cache_tokens=512, max_running_requests=16)
    assert len(sim.finished) == 40
    assert sim.scheduler.stats.preemptions >= 1 and sim.kv.evicted_tokens >= 1
    sim.kv.flush()
    assert sim.kv.pool.num_free == sim.kv.pool.num_pages


def test_leaked_tree_lock_breaks_the_idle_invariant():
    kv = KVManager(KVPagePool(8, 4), RequestPageTable(2, 4))
    req = Request("x", list(range(10)), SamplingParams(max_tokens=1), OutputStream("x"))
    kv.match(req)
    kv.alloc(req, 9)
    req.kv_len = 9
    kv.cache_prefix(req)          # locks the cached part for req
    kv.check_invariant([req])
    kv.table.free_row(req.page_row)
    kv.pool.free(req.pages[req.tree_len // 4:])  # released without unlocking its tree node
    with pytest.raises(AssertionError, match="locked"):
        kv.check_invariant([])


# ---- end to end on the default model ------------------------------------------------------

def chat(tokenizer, system: str, user: str) -> list[int]:
    return tokenizer.encode(tokenizer.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": user}]))


SYSTEMS = [
    "You are a careful travel assistant. Recommend concrete places, mention the best season to visit, "
    "warn about crowds, and keep every answer short and practical. " * 3,
    "You are a patient math tutor for teenagers. Explain each step, use small numbers in examples, "
    "and end with one practice question for the student. " * 3,
    "You are a cooking assistant. Suggest recipes with common ingredients, give quantities in grams, "
    "and say how long each step takes. " * 3,
]


def test_tiny_pool_outputs_equal_ample_pool_with_evictions_and_preemptions(make_engine, default_tokenizer):
    prompts = [chat(default_tokenizer, SYSTEMS[i % 3], f"Question number {i}: what would you suggest?")
               for i in range(40)]
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    ample = make_engine(max_running_requests=40)
    expected = [r.token_ids for r in ample.generate(prompts, params)]
    tiny = make_engine(kv_cache_tokens=640)  # 40 pages: ~5 requests' worth next to the 3 prompts
    got = [r.token_ids for r in tiny.generate(prompts, params)]
    stats = tiny.stats()
    print(f"tiny pool: {stats.preemptions} preemptions, {stats.evicted_tokens} evicted tokens")
    assert got == expected
    assert stats.preemptions >= 1 and stats.evicted_tokens >= 1
    assert stats.num_running == stats.num_waiting == 0
    tiny.check_idle_invariant()
    assert stats.kv_pages_used + stats.kv_pages_cached + stats.kv_pages_free == tiny.pool.num_pages


def start_blocker(engine, tokenizer, request_id: str):
    """A request on SYSTEMS[0] that holds the only running slot for 48 steps; returns once it runs,
    so that requests submitted next all queue up behind it (admission order is then deterministic)."""
    stream = engine.submit(chat(tokenizer, SYSTEMS[0], "Plan a long trip."),
                           SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True), request_id=request_id)
    next(iter(stream))
    return stream


def admission_order(caplog) -> list[str]:
    return [m.group(1) for r in caplog.records if (m := re.match(r"admit (\S+):", r.getMessage()))]


def test_high_priority_request_submitted_last_is_admitted_first(make_engine, default_tokenizer, caplog):
    engine = make_engine(schedule_policy="priority", max_running_requests=1)
    greedy = dict(max_tokens=4, temperature=0.0, ignore_eos=True)
    low = [chat(default_tokenizer, SYSTEMS[1], f"Question {i}.") for i in range(4)]
    urgent = chat(default_tokenizer, SYSTEMS[2], "Urgent question.")
    with caplog.at_level(logging.DEBUG, logger="radixserve.scheduler"):
        streams = [start_blocker(engine, default_tokenizer, "blocker")]
        streams += [engine.submit(p, SamplingParams(**greedy), request_id=f"low{i}") for i, p in enumerate(low)]
        streams.append(engine.submit(urgent, SamplingParams(priority=-1, **greedy), request_id="urgent"))
        for s in streams:
            collect(s)
    assert admission_order(caplog) == ["blocker", "urgent", "low0", "low1", "low2", "low3"]


@pytest.mark.parametrize("boost,cold_position", [(0.01, 1), (1e9, 5)])
def test_cold_request_jumps_hot_ones_arriving_after_its_boost(make_engine, default_tokenizer, caplog, boost,
                                                              cold_position):
    engine = make_engine(schedule_policy="lpm", max_running_requests=1, max_queue_wait_boost=boost)
    greedy = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    cold = chat(default_tokenizer, SYSTEMS[1], "A cold question.")
    hot = [chat(default_tokenizer, SYSTEMS[0], f"Hot question {i}.") for i in range(4)]
    with caplog.at_level(logging.DEBUG, logger="radixserve.scheduler"):
        # the blocker caches the hot system prompt and holds the only slot while the rest queue up
        streams = [start_blocker(engine, default_tokenizer, "blocker")]
        streams.append(engine.submit(cold, greedy, request_id="cold"))
        time.sleep(0.05)  # the hot ones arrive more than the small boost after the cold one
        streams += [engine.submit(p, greedy, request_id=f"hot{i}") for i, p in enumerate(hot)]
        for s in streams:
            collect(s)
    assert admission_order(caplog).index("cold") == cold_position


def test_request_larger_than_the_pool_is_rejected_at_submit(make_engine):
    engine = make_engine(kv_cache_tokens=256)
    with pytest.raises(EngineRefusal, match="KV cache of 256 tokens") as refused:
        engine.submit([7] * 200, SamplingParams(max_tokens=100))
    assert (refused.value.kind, refused.value.field) == (RefusalKind.CONTEXT_LENGTH, "max_tokens")
    assert engine.generate([7] * 200, SamplingParams(max_tokens=8, temperature=0.0))[0].finish_reason


def test_full_queue_fails_fast_with_overloaded(make_engine):
    engine = make_engine(max_running_requests=1, max_waiting_requests=2)
    params = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)
    streams = [engine.submit([7] * 20, params, request_id=f"r{i}") for i in range(3)]
    with pytest.raises(EngineRefusal, match="overloaded") as refused:
        engine.submit([7] * 20, params)
    assert refused.value.kind is RefusalKind.OVERLOADED
    for i in range(3):
        engine.abort(f"r{i}")
    assert [collect(s).finish_reason for s in streams] == ["abort"] * 3


def test_stats_and_debug_log_describe_each_step(make_engine, default_tokenizer, caplog):
    engine = make_engine()
    with caplog.at_level(logging.DEBUG, logger="radixserve.engine"):
        engine.generate([chat(default_tokenizer, SYSTEMS[0], f"Question {i}.") for i in range(3)],
                        SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    steps = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert steps and all("decodes" in s and "prefill tokens" in s and "cache-hit tokens" in s for s in steps)
    s = engine.stats()
    assert s.last_batch_size >= 1 and s.last_step_seconds > 0
    assert s.kv_pages_used == 0 and s.kv_pages_cached > 0
    assert s.kv_pages_cached + s.kv_pages_free == engine.pool.num_pages


def test_broken_page_invariant_is_logged_loudly_when_idle(make_engine, caplog, monkeypatch):
    engine = make_engine()

    def broken(running):
        raise AssertionError("KV page accounting broken: test")

    monkeypatch.setattr(engine.kv, "check_invariant", broken)
    with caplog.at_level(logging.ERROR, logger="radixserve.engine"):
        engine.generate([7] * 20, SamplingParams(max_tokens=2, temperature=0.0))
        engine.flush_cache()  # a round trip through the loop: it has gone idle since
    monkeypatch.undo()
    assert any("INVARIANT BROKEN" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)


def test_priority_must_be_an_integer(make_engine):
    engine = make_engine()
    with pytest.raises(EngineRefusal) as refused:
        engine.submit([7] * 5, SamplingParams(priority=1.5))
    assert refused.value.field == "priority"


def test_lpm_is_the_default_policy():
    assert EngineConfig().schedule_policy == "lpm"


def forced_runs_scheduled(requests: int, run: int) -> list[int]:
    """Rows each running request gets in the step after a forced run of `run` tokens follows its
    newest token (jump-forward), in the simulator."""
    sim = SimEngine()
    rng = random.Random(0)
    reqs = [sim.submit(random_tokens(rng, 20), max_tokens=64) for _ in range(requests)]
    while any(not r.output_ids for r in reqs):
        sim.step()
    for r in reqs:
        for _ in range(run):
            r.append_token(7)
    return [it.num_tokens for it in sim.scheduler.schedule().decodes]


def test_forced_runs_beside_other_requests_share_one_budget_of_rows_a_step():
    rows = forced_runs_scheduled(requests=4, run=6)
    assert len(rows) == 4 and min(rows) >= 1   # every request still moves
    assert sum(n - 1 for n in rows) == SHARED_RUN_ROWS


def test_a_request_running_alone_computes_its_whole_forced_run_in_one_step():
    assert forced_runs_scheduled(requests=1, run=20) == [21]
