"""Sampler filters on synthetic logits (no model needed)."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.kernels.sampling import sort_desc, topk_values
from radixserve.runtime.request import OutputStream, Request
from radixserve.runtime.sampler import Sampler, log_uniform, seeded_key, token_table
from radixserve.runtime.sampling_params import SamplingParams

V = 8


def req(**kw) -> Request:
    return Request("r", [0], SamplingParams(**kw), OutputStream("r"))


def draw(logits, n=400, **kw):
    s = Sampler(V, eos_token_ids=[7], seed=0)
    return {s.sample(logits.clone().unsqueeze(0), [req(**kw)])[0][0] for _ in range(n)}


LOGITS = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0, -1.0, -2.0, -3.0])


def test_greedy_picks_argmax():
    assert draw(LOGITS, n=3, temperature=0.0) == {0}


def test_top_k_keeps_only_k_best():
    assert draw(LOGITS, top_k=2) == {0, 1}


def test_top_p_keeps_smallest_set_reaching_p():
    probs = torch.softmax(LOGITS, 0)  # 0.64, 0.23, 0.086, ...
    assert probs[0] < 0.8 < probs[:2].sum()
    assert draw(LOGITS, top_p=0.8) == {0, 1}


def test_min_p_drops_tokens_below_fraction_of_best():
    # p1/p0 = e^-1 = 0.37, p2/p0 = 0.14
    assert draw(LOGITS, min_p=0.2) == {0, 1}


def test_min_tokens_masks_eos():
    logits = torch.full((V,), -5.0)
    logits[7] = 10.0
    s = Sampler(V, eos_token_ids=[7])
    assert s.sample(logits.clone().unsqueeze(0), [req(temperature=0.0, min_tokens=1)])[0] != [7]
    assert s.sample(logits.clone().unsqueeze(0), [req(temperature=0.0)])[0] == [7]


def test_repetition_penalty_demotes_seen_tokens():
    r = req(temperature=0.0, repetition_penalty=10.0)
    r.append_token(0)
    logits = LOGITS.clone().unsqueeze(0)
    assert Sampler(V, []).sample(logits, [r])[0] == [1]


def test_frequency_penalty_grows_with_count():
    r = req(temperature=0.0, frequency_penalty=2.0)
    logits = torch.tensor([[1.0, 0.5] + [-9.0] * (V - 2)])
    assert Sampler(V, []).sample(logits.clone(), [r])[0] == [0]
    r.append_token(0)
    assert Sampler(V, []).sample(logits.clone(), [r])[0] == [1]


def test_seeded_rows_do_not_depend_on_batch_neighbours():
    s = Sampler(V, [])
    flat = torch.zeros(V)
    alone = [s.sample(flat.clone().unsqueeze(0), [r])[0][0] for r in [req(seed=5)] for _ in range(1)]
    r = req(seed=5)
    batch = torch.stack([flat, flat, flat])
    together = s.sample(batch, [req(), r, req()])[0][1]
    assert together == alone[0]


def test_logprobs_are_normalised_and_ranked():
    s = Sampler(V, [])
    tokens, lps = s.sample(LOGITS.clone().unsqueeze(0), [req(temperature=0.0, logprobs=3)])
    lp = lps[0]
    expected = torch.log_softmax(LOGITS, 0)
    assert abs(lp.logprob - expected[0].item()) < 1e-5
    assert [t for t, _ in lp.top] == [0, 1, 2]


# ---- whole-batch sampling against a naive per-row reference ---------------------------------

def naive_penalised(row: torch.Tensor, r: Request, eos: list[int]) -> torch.Tensor:
    """One row through repetition / frequency / presence penalties and min_tokens bans, the obvious way."""
    row, p = row.clone(), r.params
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(r.token_ids)), dtype=torch.long)
        vals = row[seen]
        row[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    if r.output_ids and (p.frequency_penalty or p.presence_penalty):
        counts = torch.bincount(torch.tensor(r.output_ids), minlength=row.shape[0]).to(row.dtype)
        row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)
    if len(r.output_ids) < p.min_tokens and r.matcher is None:
        banned = p.stop_token_ids + ([] if p.ignore_eos else eos)
        if banned:
            row[banned] = float("-inf")
    return row


def naive_distribution(row: torch.Tensor, r: Request, eos: list[int]) -> torch.Tensor:
    """The distribution one row samples from: penalties, bans, then temperature, top-k (ties with
    the k-th value stay), top-p (the smallest top set reaching p, plus ties with its last value),
    min-p; a greedy row is one-hot."""
    x, p = naive_penalised(row, r, eos), r.params
    if p.greedy:
        return torch.nn.functional.one_hot(x.argmax(), x.shape[0]).float()
    x = x / p.temperature
    if 0 < p.top_k < x.shape[0]:
        kth = x.sort(descending=True).values[p.top_k - 1]
        x[x < kth] = float("-inf")
    probs = torch.softmax(x, 0)
    keep = torch.ones_like(probs, dtype=torch.bool)
    if p.top_p < 1.0:
        desc = probs.sort(descending=True).values
        last = 0
        while last + 1 < len(desc) and desc[: last + 1].sum() < p.top_p:
            last += 1
        keep &= probs >= desc[last]
    if p.min_p > 0:
        keep &= probs >= probs.max() * p.min_p
    probs = torch.where(keep, probs, 0.0)
    return probs / probs.sum()


def make_req(prompt: list[int], outputs: list[int], **kw) -> Request:
    r = Request("r", prompt, SamplingParams(max_tokens=100, **kw), OutputStream("r"))
    for t in outputs:
        r.append_token(t)
    return r


def test_presence_and_repetition_penalties_in_a_mixed_batch_equal_the_naive_reference():
    width, eos = 64, [5]
    gen = torch.Generator().manual_seed(0)
    reqs = [make_req([1, 2, 3], [2, 9, 9], temperature=0.0, repetition_penalty=1.3, presence_penalty=0.5),
            make_req([4], [], temperature=0.0),
            make_req([7, 8], [8, 8, 8, 40], temperature=0.0, frequency_penalty=0.7, presence_penalty=-0.4),
            make_req([3], [3], temperature=0.0, repetition_penalty=0.8, min_tokens=5, stop_token_ids=[6]),
            make_req([1], [11, 12, 11], temperature=0.0, frequency_penalty=-1.5, repetition_penalty=2.0)]
    logits = torch.randn(len(reqs), width, generator=gen) * 3
    expected = torch.stack([naive_penalised(logits[i], r, eos) for i, r in enumerate(reqs)])
    padded = torch.cat([logits, torch.full((len(reqs), 7), 50.0)], 1)  # wider than the vocabulary
    tokens, _ = Sampler(width, eos).sample(padded, reqs)
    assert torch.equal(padded[:, :width], expected)  # every row greedy: the logits are left penalised
    assert tokens == expected.argmax(-1).tolist()


def test_greedy_rows_beside_sampled_rows_take_the_argmax_of_their_penalised_logits():
    width = 300
    gen = torch.Generator().manual_seed(1)
    reqs = [make_req([1, 2], [3, 4, 4], temperature=0.0, repetition_penalty=1.5, frequency_penalty=0.3),
            make_req([1], [2], temperature=0.9, top_p=0.5, repetition_penalty=1.2),
            make_req([5], [], temperature=0.0, min_tokens=2),
            make_req([6], [], temperature=1.2, top_k=3, seed=4)]
    logits = torch.randn(len(reqs), width, generator=gen)
    logits[0, 3] = logits[2, 0] = 30.0  # penalised and banned: no longer the argmax
    expected = [naive_penalised(logits[i], r, [0]).argmax().item() for i, r in enumerate(reqs)]
    tokens, _ = Sampler(width, [0]).sample(logits.clone(), reqs)
    assert tokens[0] == expected[0] and tokens[2] == expected[2]


settings_kw = dict(max_examples=60, deadline=None)
row_params = st.fixed_dictionaries({
    "temperature": st.sampled_from([0.0, 0.5, 1.0, 1.7]),
    "top_k": st.sampled_from([-1, 1, 3, 10, 40]),
    "top_p": st.sampled_from([1.0, 0.9, 0.5, 0.1]),
    "min_p": st.sampled_from([0.0, 0.05, 0.3]),
    "repetition_penalty": st.sampled_from([1.0, 1.3, 0.7]),
    "frequency_penalty": st.sampled_from([0.0, 0.5, -1.0]),
    "presence_penalty": st.sampled_from([0.0, 1.0, -0.5]),
    "min_tokens": st.sampled_from([0, 3]),
    "ignore_eos": st.booleans(),
    "stop_token_ids": st.sampled_from([[], [2], [2, 30]]),
})


@settings(**settings_kw)
@given(rows=st.lists(st.tuples(row_params, st.lists(st.integers(0, 31), max_size=8),
                               st.lists(st.integers(0, 31), max_size=6)), min_size=1, max_size=6),
       seed=st.integers(0, 2 ** 16))
def test_filtered_distribution_of_random_mixed_batches_equals_the_naive_reference(rows, seed):
    width, eos = 32, [1]
    reqs = [make_req(prompt or [0], outputs, **kw) for kw, prompt, outputs in rows]
    logits = torch.randn(len(reqs), width, generator=torch.Generator().manual_seed(seed)) * 2
    expected = torch.stack([naive_distribution(logits[i], r, eos) for i, r in enumerate(reqs)])
    got = Sampler(width, eos).probabilities(logits.clone(), reqs)
    assert torch.equal(got > 0, expected > 0)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    tokens, _ = Sampler(width, eos).sample(logits.clone(), reqs)
    assert all(expected[i, t] > 0 for i, t in enumerate(tokens))


# ---- counter-based noise -----------------------------------------------------------------------

def steps_of(sampler: Sampler, target: Request, logits: list[torch.Tensor], neighbours, at: int) -> list[int]:
    """Sample `target` at row `at` among `neighbours` (fresh requests each step) for len(logits) steps."""
    tokens = []
    for step_logits in logits:
        batch = [n() for n in neighbours]
        batch.insert(at, target)
        rows = [torch.randn(step_logits.shape[0]) for _ in neighbours]
        rows.insert(at, step_logits)
        t = sampler.sample(torch.stack(rows), batch)[0][at]
        target.append_token(t)
        tokens.append(t)
    return tokens


def test_seeded_rows_give_the_same_tokens_alone_at_another_row_and_beside_other_neighbours():
    width = 500
    logits = [torch.randn(width, generator=torch.Generator().manual_seed(s)) for s in range(6)]
    kw = dict(temperature=0.9, top_p=0.95, top_k=100, seed=1234)
    alone = steps_of(Sampler(width, [], seed=0), make_req([1], [], **kw), logits, [], 0)
    crowds = [
        [lambda: make_req([2], [], temperature=1.0), lambda: make_req([3], [], temperature=0.0)],
        [lambda: make_req([2], [7], temperature=0.3, seed=99, min_p=0.1),
         lambda: make_req([4], [], temperature=2.0, repetition_penalty=1.5, logprobs=3),
         lambda: make_req([5], [], temperature=1.0, top_k=2)],
    ]
    for neighbours in crowds:
        for at in range(len(neighbours) + 1):
            together = steps_of(Sampler(width, [], seed=7), make_req([1], [], **kw), logits, neighbours, at)
            assert together == alone


def test_a_seeded_request_draws_differ_across_steps():
    s = Sampler(1000, [])
    r = req(seed=3)
    flat = torch.zeros(1, 1000)
    draws = []
    for _ in range(10):
        draws.append(s.sample(flat.clone(), [r])[0][0])
        r.append_token(draws[-1])
    assert len(set(draws)) > 5
    again = req(seed=3)
    assert s.sample(flat.clone(), [again])[0][0] == draws[0]  # the step, not the call, picks the noise


def test_unseeded_rows_vary_between_calls_and_between_rows():
    s = Sampler(1000, [], seed=0)
    flat = torch.zeros(1000)
    per_call = {s.sample(flat.clone().unsqueeze(0), [req()])[0][0] for _ in range(10)}
    assert len(per_call) > 5
    per_row = s.sample(flat.repeat(8, 1), [req() for _ in range(8)])[0]
    assert len(set(per_row)) > 5
    # an engine seed makes the unseeded draws reproducible
    runs = [[Sampler(1000, [], seed=5).sample(flat.repeat(4, 1), [req() for _ in range(4)])[0]] for _ in range(2)]
    assert runs[0] == runs[1]


@pytest.mark.parametrize("kw", [dict(), dict(temperature=0.7, top_p=0.8), dict(top_k=12, min_p=0.1)],
                         ids=["plain", "top-p", "top-k-min-p"])
def test_a_sweep_of_2000_seeds_draws_tokens_at_the_frequencies_of_the_distribution(kw):
    width, n = 32, 2000
    logits = torch.linspace(1.5, -1.5, width)[torch.randperm(width, generator=torch.Generator().manual_seed(0))]
    s = Sampler(width, [])
    probs = s.probabilities(logits.clone().unsqueeze(0), [req(**kw)])[0].double()
    reqs = [req(seed=seed, **kw) for seed in range(n)]
    tokens = s.sample(logits.repeat(n, 1), reqs)[0]
    counts = torch.bincount(torch.tensor(tokens), minlength=width).double()
    assert counts[probs == 0].sum() == 0
    live = probs > 0
    expected = probs[live] * n
    chi2 = (((counts[live] - expected) ** 2) / expected).sum().item()
    dof = int(live.sum()) - 1
    # mean dof, sd sqrt(2 dof): 4 sd above the mean is a p-value far below 0.001
    assert chi2 < dof + 4 * math.sqrt(2 * dof), (chi2, dof)
    assert (counts / n - probs).abs().max() < 0.035


def py_log_uniform(key: int, token: int) -> float:
    """The noise hash in plain Python integers: the bits any device must produce."""
    m32 = 0xFFFFFFFF
    z = (int(token_table(token + 1)[token]) ^ key) & m32
    z = z * 0x85EBCA6B & m32
    z ^= z >> 16
    z = z * 0xC2B2AE35 & m32
    z ^= z >> 15
    z = z * 0x7FEB352D & m32
    return torch.tensor((2 * (z >> 9) + 1) * 2.0 ** -24, dtype=torch.float32).log().item()


def test_the_noise_is_the_same_integer_hash_as_plain_python():
    keys = [seeded_key(s, step) for s, step in [(0, 0), (1, 0), (1, 1), (-5, 3), (2 ** 40, 7)]]
    tokens = [0, 1, 2, 31, 1000, 49151]
    got = log_uniform(torch.tensor(keys, dtype=torch.int32), token_table(49152))
    for i, k in enumerate(keys):
        assert [got[i, t].item() for t in tokens] == [py_log_uniform(k, t) for t in tokens]
    assert bool((got < 0).all()) and bool(torch.isfinite(got).all())


# ---- device placement ----------------------------------------------------------------------------

def meta_batch() -> list[Request]:
    """One row for every branch: greedy, penalties, bans, temperature, top-k, top-p, min-p, seeds, logprobs."""
    return [make_req([1, 2], [3], temperature=0.0, repetition_penalty=1.2, logprobs=2),
            make_req([4], [5, 5], temperature=0.8, frequency_penalty=0.5, presence_penalty=0.1, min_tokens=4),
            make_req([6], [], temperature=1.0, top_k=5, seed=3, logprobs=0),
            make_req([7], [8], temperature=0.6, top_p=0.7, min_p=0.05)]


def test_every_tensor_sample_tensors_makes_stays_on_the_logits_device():
    """The meta device rejects mixing with CPU tensors as CUDA does: the whole step up to the read-back runs there."""
    width = 3000
    meta = torch.device("meta")
    for reqs in (meta_batch(), meta_batch()[:1], meta_batch()[1:]):
        out = Sampler(width, [0], seed=1).sample_tensors(torch.empty(len(reqs), width + 64, device=meta), reqs)
        tensors = [out.tokens, out.token_logprobs, out.top_logprobs, out.top_ids]
        assert all(t.device == meta for t in tensors if t is not None)
        assert out.tokens.shape == (len(reqs),)


@pytest.mark.parametrize("width", [49152, 50])
def test_cpu_sort_and_topk_helpers_equal_torch(width):
    x = torch.randn(6, width, generator=torch.Generator().manual_seed(width))
    x[0, :10] = 9.0  # ties
    assert torch.equal(sort_desc(x), x.sort(dim=-1, descending=True).values)
    for k in (1, 20, width - 1):
        assert torch.equal(topk_values(x, k), x.topk(k).values)
    meta = torch.empty(2, width, device="meta")
    assert sort_desc(meta).device == topk_values(meta, 3).device == meta.device


@pytest.mark.parametrize("kw", [dict(top_p=5e-324), dict(temperature=1e-300), dict(repetition_penalty=5e-324),
                                dict(repetition_penalty=5e-324, top_p=5e-324, temperature=1e-300)])
def test_extreme_valid_parameters_draw_the_best_allowed_token(kw):
    # float32 turns each of these into 0; the draw must stay on the tokens a grammar left open
    logits = LOGITS.clone()
    logits[0] = float("-inf")  # masked, as the grammar bitmask leaves it
    r = Request("r", [0, 1, 5], SamplingParams(**kw), OutputStream("r"))
    for _ in range(20):
        tokens, _ = Sampler(V, eos_token_ids=[7]).sample(logits.clone().unsqueeze(0), [r])
        # token 1 is the best open one; a tiny repetition penalty lifts it (seen) to float max
        assert tokens == [1]


def test_one_read_back_returns_what_separate_reads_would():
    """Tokens, their logprobs and the top ids and logprobs cross in one copy (packed as float64):
    ids past float32's exact range and float32 logprobs come back unchanged."""
    from radixserve.runtime.sampler import SampledTensors, read_back

    gen = torch.Generator().manual_seed(0)
    tokens = torch.tensor([151_643, 7, 16_777_217, 3])
    out = SampledTensors(tokens, logprob_rows=[0, 2], top_counts=[3, 0],
                         token_logprobs=-torch.rand(2, generator=gen), top_logprobs=-torch.rand(2, 3, generator=gen),
                         top_ids=torch.tensor([[16_777_217, 5, 151_643], [1, 2, 3]]))
    assert read_back(out) == (tokens.tolist(), out.token_logprobs.tolist(), out.top_ids.tolist(),
                              out.top_logprobs.tolist())
    none = SampledTensors(tokens, logprob_rows=[1], top_counts=[0], token_logprobs=torch.tensor([-0.5]))
    assert read_back(none) == (tokens.tolist(), [-0.5], [[]], [[]])
