"""Device placement without a GPU: the engine's per-step tensor code runs with its tensors on the
`meta` device, which (like CUDA) refuses an operand left on the CPU and any read-back of values.
Values are not checked here, only that everything stays on the engine's device."""
from __future__ import annotations

import pytest
import torch

import radixserve.runtime.attention_torch as attention_torch
from radixserve.kernels.bitmask import apply_token_bitmask_
from radixserve.runtime.attention_torch import torch_attention_backend
from radixserve.runtime.attention_triton import TritonAttentionBackend
from radixserve.runtime.forward_batch import BatchLayout, ForwardBatch
from radixserve.runtime.kv_cache import KVCache
from radixserve.runtime.models.config import ModelConfig
from radixserve.runtime.models.llama import LlamaForCausalLM
from radixserve.runtime.models.random_init import random_weights
from radixserve.runtime.platform import get_platform
from .triton_interpreter import needs_triton

META = torch.device("meta")
ON_META = get_platform(META)
PAGE = 4
CFG = ModelConfig(model_type="llama", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                  intermediate_size=128, vocab_size=256, max_context_len=256)
SYSTEM = list(range(10, 18))   # 8 shared pages: a cached system prompt


def kv_cache() -> KVCache:
    return KVCache(CFG.num_layers, 64, PAGE, CFG.num_kv_heads, CFG.head_dim, torch.float32, META)


def a_mixed_layout() -> BatchLayout:
    """Three decodes (two on one cached prefix), a prefill after that prefix, one without any."""
    pages = [SYSTEM + [40, 41], SYSTEM + [42], [43, 44, 45], SYSTEM + [46, 47], [48, 49]]
    layout = BatchLayout(PAGE)
    layout.add_decode(5, 8 * PAGE + 6, 0, pages[0])
    layout.add_decode(6, 8 * PAGE + 2, 1, pages[1])
    layout.add_decode(7, 9, 2, pages[2])
    layout.add_extend(list(range(8 * PAGE + 5)), 8 * PAGE, 5, 3, pages[3], samples=True)
    layout.add_extend(list(range(7)), 0, 7, 4, pages[4], samples=True)
    return layout


def page_table(layout: BatchLayout) -> torch.Tensor:
    rows = [d.pages for d in layout.decodes] + [s.pages for s in layout.extends]
    width = max(map(len, rows))
    return torch.tensor([list(r) + [0] * (width - len(r)) for r in rows])


def tensors_in(obj, seen=None) -> list[torch.Tensor]:
    """Every tensor reachable from a metadata object's fields."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for x in obj for t in tensors_in(x, seen)]
    if isinstance(obj, dict):
        return [t for x in obj.values() for t in tensors_in(x, seen)]
    if hasattr(obj, "__dict__"):
        return [t for x in vars(obj).values() for t in tensors_in(x, seen)]
    return []


@pytest.fixture
def every_decode_group_shares(monkeypatch):
    """Production thresholds would leave prefixes this short to per-request attention."""
    monkeypatch.setattr(attention_torch, "MIN_SHARED_DECODE_SAVING", 1)
    monkeypatch.setattr(attention_torch, "MIN_GROUP_SAVING", 1)


def test_torch_backend_metadata_is_built_on_the_engines_device(every_decode_group_shares):
    layout = a_mixed_layout()
    backend = torch_attention_backend(kv_cache(), page_table(layout).to(META), CFG.num_heads)
    meta = backend.prepare(layout)
    assert meta.decodes.shared is not None and meta.scored_extends and meta.sdpa_extends, "a path was not built"
    found = tensors_in(meta)
    assert found and {t.device for t in found} == {META}


@needs_triton
def test_triton_backend_metadata_is_built_on_the_engines_device(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")   # its constructor otherwise insists on CUDA
    layout = a_mixed_layout()
    backend = TritonAttentionBackend(kv_cache(), page_table(layout).to(META), CFG.num_heads, ON_META)
    meta = backend.prepare(layout)
    assert meta.decode_rows is not None and meta.extend_meta is not None
    assert {t.device for t in tensors_in(meta)} == {META}


def test_forward_batch_rows_go_to_the_engines_device():
    batch = ForwardBatch.of(a_mixed_layout(), None, ON_META)
    assert {t.device for t in (batch.input_ids, batch.positions, batch.out_slots, batch.sample_rows)} == {META}


def test_a_whole_forward_on_the_torch_backend_stays_on_the_engines_device(every_decode_group_shares):
    layout = a_mixed_layout()
    model = LlamaForCausalLM(CFG, random_weights(CFG), torch.float32, ON_META)
    backend = torch_attention_backend(kv_cache(), page_table(layout).to(META), CFG.num_heads)
    logits = model.forward(ForwardBatch.of(layout, backend.prepare(layout), ON_META), backend)
    assert logits.device == META and logits.shape == (len(layout.sample_rows), CFG.vocab_size)


def test_bitmask_apply_takes_a_host_bitmask_to_the_logits_device():
    logits = torch.empty(4, 256, device=META)
    bitmask = torch.full((8, 8), -1, dtype=torch.int32)   # filled on the host by the matchers
    apply_token_bitmask_(logits, bitmask, [1, 2], vocab_size=250)
    assert logits.device == META
