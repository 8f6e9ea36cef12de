"""What xgrammar generates from a normalised schema is valid under the original schema: random walks
through the compiled grammar (a random allowed token each step, leaning towards closing quotes and
brackets so that walks end) over generated real-world-shaped schemas, each finished walk checked
with jsonschema under the original's draft. This catches a keyword the backend silently drops,
which the property tests against jsonschema alone cannot see (patternProperties on a declared
property was one)."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixserve.grammar import GrammarSpec, make_grammar_backend
from radixserve.grammar.json_schema import validator_class
from radixserve.grammar.schema_support import SchemaRefusal

from .test_json_schema_properties import documents

CLOSERS = ('"', "}", "]", ",", "0", "1", "true", "null")
WALKS: list[bool] = []  # whether each walk finished, for the check that they are not all cut


@pytest.fixture(scope="module")
def walker(default_model_files, default_tokenizer):
    vocab = default_tokenizer.vocab_info(default_model_files.config.vocab_size)
    backend = make_grammar_backend("xgrammar", vocab)
    bitmask = backend.allocate_bitmask(1)
    texts = {i: default_tokenizer.token_text(i) for i in range(len(vocab.token_bytes))
             if vocab.token_bytes[i] is not None}
    closing = np.zeros(vocab.bitmask_width * 32, dtype=bool)
    closing[[i for i, t in texts.items() if t.strip() in CLOSERS]] = True
    stops = np.zeros_like(closing)
    stops[list(vocab.stop_token_ids)] = True

    def walk(compiled, rng: random.Random, steps: int = 400):
        matcher = backend.matcher(compiled)
        tokens = []
        for _ in range(steps):
            backend.fill_bitmask([matcher], bitmask, [0])
            allowed = np.unpackbits(bitmask[0].numpy().view(np.uint8), bitorder="little").astype(bool)
            if (allowed & stops).any() and rng.random() < 0.7:
                return default_tokenizer.decode(tokens)
            allowed &= ~stops
            near_end = np.flatnonzero(allowed & closing)
            choices = near_end if len(near_end) and rng.random() < 0.6 else np.flatnonzero(allowed)
            if not len(choices):
                return default_tokenizer.decode(tokens)
            pick = int(choices[rng.randrange(len(choices))])
            assert matcher.accept_token(pick)
            tokens.append(pick)
        return None
    return backend, walk


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(schema=documents(), seed=st.integers(0, 2 ** 16))
def test_random_walks_through_the_grammar_are_valid_under_the_original(walker, schema, seed):
    backend, walk = walker
    try:
        compiled = backend.compile(GrammarSpec.json_schema(schema))
    except SchemaRefusal:
        return
    original = validator_class(schema)(schema)
    rng = random.Random(seed)
    for _ in range(3):
        text = walk(compiled, rng)
        WALKS.append(text is not None)
        if text is not None:
            assert original.is_valid(json.loads(text)), (text, schema)


def test_most_walks_finish():
    if not WALKS:
        pytest.skip("the walks did not run")
    assert sum(WALKS) >= 0.8 * len(WALKS), f"{sum(WALKS)} of {len(WALKS)} walks finished"
