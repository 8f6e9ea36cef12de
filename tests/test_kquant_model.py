"""The embedded SmolLM2 with its feed-forward outputs requantized to K-quants by tests/kquants.py
(Q4_K, Q5_K and Q6_K by layer; its 576-wide matrices keep Q4_1, as llama.cpp falls back for
widths that are not whole super-blocks) loads as blocks and answers under greedy decoding."""
from __future__ import annotations

import pytest

from radixserve.runtime.models.loader import default_model_path, load_model_files
from radixserve.runtime.models.quant import BlockTensor
from radixserve.runtime.sampling_params import SamplingParams

from .kquants import requantize_gguf

K_KINDS = ("Q4_K", "Q5_K", "Q6_K")


@pytest.fixture(scope="module")
def kquant_files(tmp_path_factory):
    path = tmp_path_factory.mktemp("kquant") / "SmolLM2-135M-Instruct.K.gguf"
    requantize_gguf(default_model_path(), path, {f"blk.{i}.ffn_down.weight": K_KINDS[i % 3] for i in range(30)})
    return load_model_files(str(path))


def test_the_requantized_matrices_load_as_k_quant_blocks(kquant_files):
    kinds = {kquant_files.weights[f"model.layers.{i}.mlp.down_proj.weight"].kind for i in range(30)}
    assert kinds == set(K_KINDS)
    assert isinstance(kquant_files.weights["model.layers.0.self_attn.q_proj.weight"], BlockTensor)


def test_a_k_quant_smollm2_answers_the_capital_of_france(make_engine, kquant_files):
    engine = make_engine(kquant_files, dtype="auto", kv_cache_tokens=2048)
    assert all(layer.down.quantized for layer in engine.model.layers)
    prompt = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}])
    out = engine.generate(prompt, SamplingParams(max_tokens=16, temperature=0))[0]
    assert "Paris" in out.text
