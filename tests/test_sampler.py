"""Sampler filters on synthetic logits (no model needed)."""
import torch

from radixserve.runtime.request import OutputStream, Request
from radixserve.runtime.sampler import Sampler
from radixserve.runtime.sampling_params import SamplingParams

V = 8


def req(**kw) -> Request:
    r = Request("r", [0], SamplingParams(**kw), OutputStream("r"))
    if r.params.seed is not None:
        r.generator = torch.Generator().manual_seed(r.params.seed)
    return r


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
