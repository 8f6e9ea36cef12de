"""The CUDA MoE path (kernels/triton_moe.py): the grouped matmuls against SparseMoE's loop under the
Triton interpreter, and which platform builds them."""
from __future__ import annotations

import torch

from radixserve.runtime.models.linear import Linear
from radixserve.runtime.models.moe import SWIGLU
from radixserve.runtime.platform import get_platform

from .triton_interpreter import needs_triton, run_check_under_interpreter


@needs_triton
def test_grouped_experts_equal_the_per_expert_loop_under_interpreter():
    run_check_under_interpreter("triton_moe_check.py")


def dense_experts(n: int = 3) -> list[tuple]:
    return [(Linear(torch.randn(8, 4)), Linear(torch.randn(4, 4))) for _ in range(n)]


@needs_triton
def test_cuda_platform_groups_dense_experts_into_one_copy():
    experts = dense_experts()
    grouped = get_platform(torch.device("cuda")).grouped_experts(experts, SWIGLU)   # builds on the experts' device
    assert grouped.gate_up.shape == (3, 8, 4) and grouped.down.shape == (3, 4, 4)
    # the experts' own weights are now views of the stacks: one copy in memory
    assert all(g.weight.data_ptr() == grouped.gate_up[e].data_ptr() for e, (g, _) in enumerate(experts))
