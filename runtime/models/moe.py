"""A sparse mixture-of-experts MLP (Mixtral, Qwen3-MoE, gpt-oss): a router picks each token's top-k
experts, and each expert runs once over the tokens routed to it.

Each expert's gate-up and down projections are the platform's linear layers, so a GGUF's blocks
run on the block kernels and a step reads only the experts its tokens chose: the cost follows the
active parameters, not the total. On CUDA the loop, which reads the chosen experts back to the
host, gives way to two grouped matmuls over every expert (kernels/triton_moe.py); on the CPU, a
decode step's experts, dense or block-quantized, run as one C++ call (`CpuExperts`). A token's
output adds its experts' weighted outputs in expert order, whatever else is in the batch, so
routing and sums are the same alone or batched.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from radixserve.runtime.models.linear import BlockLinear, Linear


@dataclass(frozen=True)
class ExpertAct:
    """An expert's activation on rows [gate | up]: SwiGLU, silu(gate) * up; or, with `limit`,
    gpt-oss's clamped form: gate clamped above at `limit`, up to [-limit, limit], then
    (up + 1) * gate * sigmoid(alpha * gate). A value, so that a kernel can take it as its own."""
    limit: Optional[float] = None
    alpha: float = 1.0

    def __call__(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        if self.limit is None:
            return F.silu(gate) * up
        gate = gate.clamp(max=self.limit)
        return (up.clamp(-self.limit, self.limit) + 1) * (gate * torch.sigmoid(gate * self.alpha))


SWIGLU = ExpertAct()


def clamped_swiglu(limit: float, alpha: float) -> ExpertAct:
    return ExpertAct(limit, alpha)


class CpuExperts:
    """A MoE layer's experts as one C++ call over the chosen experts (kernels/cpu_kernels.cpp:
    dense_experts for float32 / bfloat16 weights, block_experts for a GGUF's block-quantized ones),
    for steps of up to `max_tokens` tokens: the per-expert loop spends ~10 torch ops an expert,
    which at one token costs as much as reading its weights (bench/families.py). Longer steps
    (prefill) take the loop, whose matmuls tile for cache."""
    max_tokens = 128   # beyond, the loop's matmuls won at 512 tokens in float32 here (2-core Zen 3)

    def __init__(self, kernels, experts: list[tuple], act: ExpertAct):
        from radixserve.kernels.cpu_kernels import BlockExperts, DenseExperts
        gate_up, down = [g for g, _ in experts], [d for _, d in experts]
        self.kernels, self.act = kernels, act
        clamped, limit = act.limit is not None, act.limit or 0.0
        if gate_up[0].quantized:
            self.m = BlockExperts.of([g.matrix for g in gate_up], [d.matrix for d in down], clamped, limit, act.alpha)
            return
        bias = lambda layers: None if layers[0].bias is None else [layer.bias for layer in layers]  # noqa: E731
        self.m = DenseExperts.of([g.weight for g in gate_up], [d.weight for d in down], bias(gate_up), bias(down),
                                 clamped, limit, act.alpha)

    @classmethod
    def of(cls, kernels, experts: list[tuple], act: ExpertAct) -> Optional["CpuExperts"]:
        """None unless the experts are all block-quantized, or all dense contiguous float32 or
        bfloat16 layers of one shape and dtype."""
        layers = [layer for pair in experts for layer in pair]
        if kernels is None or not isinstance(act, ExpertAct):
            return None
        if all(isinstance(layer, BlockLinear) for layer in layers):
            g, d = experts[0][0].matrix, experts[0][1].matrix
            shape = lambda a, b: (a.rows, a.cols, b.rows, b.cols)  # noqa: E731
            same = all(shape(gu.matrix, dn.matrix) == shape(g, d) for gu, dn in experts)
            return cls(kernels, experts, act) if same and g.rows == 2 * d.cols and g.cols == d.rows else None
        if not all(isinstance(layer, Linear) and not layer.quantized and layer.weight.is_contiguous()
                   for layer in layers):
            return None
        gate_up, down = experts[0][0].weight, experts[0][1].weight
        if gate_up.dtype not in (torch.float32, torch.bfloat16) or gate_up.shape[0] != 2 * down.shape[1] or any(
                g.weight.shape != gate_up.shape or d.weight.shape != down.shape or g.weight.dtype != gate_up.dtype
                or d.weight.dtype != gate_up.dtype or (g.bias is None) != (experts[0][0].bias is None)
                or (d.bias is None) != (experts[0][1].bias is None) for g, d in experts):
            return None
        return cls(kernels, experts, act)

    def __call__(self, h: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, act: ExpertAct) -> torch.Tensor:
        assert act == self.act
        return self.kernels.experts(self.m, h.float().contiguous(), ids.contiguous(), weights.float().contiguous())


class SparseMoE:
    def __init__(self, router: torch.Tensor, experts: list[tuple], top_k: int, normalize: bool,
                 act: Callable[[torch.Tensor], torch.Tensor], router_bias: Optional[torch.Tensor] = None,
                 softmax_after_topk: bool = False, grouped=None):
        """router: [experts, hidden] float32 (and its bias); experts: (gate_up, down) linear layers
        of each expert; act: gate_up rows -> the down projection's input. Routing is Mixtral's and
        Qwen3-MoE's (softmax over all experts, then top-k, renormalised if `normalize`) or, with
        `softmax_after_topk`, gpt-oss's (top-k logits, then their softmax). `grouped`: the experts
        as two grouped matmuls (kernels/triton_moe.py on CUDA), run instead of the loop."""
        self.router, self.router_bias, self.experts, self.grouped = router, router_bias, experts, grouped
        self.top_k, self.normalize, self.act, self.softmax_after_topk = top_k, normalize, act, softmax_after_topk

    def route(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's [T, k] expert weights (float32) and ids, highest first; ties go to the
        lower id (topk on the CPU is stable), the same in any batch."""
        logits = F.linear(h.float(), self.router, self.router_bias)
        if self.softmax_after_topk:
            top, ids = logits.topk(self.top_k, dim=-1)
            return top.softmax(dim=-1), ids
        weights, ids = logits.softmax(dim=-1).topk(self.top_k, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, ids

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        """h: [T, hidden] normed activations -> [T, hidden] in h's dtype (summed in float32)."""
        weights, ids = self.route(h)
        if self.grouped is not None and h.shape[0] <= self.grouped.max_tokens:
            return self.grouped(h, weights, ids, self.act).to(h.dtype)
        out = torch.zeros(h.shape[0], h.shape[1], dtype=torch.float32, device=h.device)
        hit = torch.zeros(len(self.experts), dtype=torch.bool, device=ids.device)
        hit[ids.flatten()] = True
        for e in hit.nonzero().flatten().tolist():
            tokens, slot = (ids == e).nonzero(as_tuple=True)
            gate_up, down = self.experts[e]
            y = down(self.act(gate_up(h.index_select(0, tokens)))).float()
            out.index_add_(0, tokens, y * weights[tokens, slot].unsqueeze(1))
        return out.to(h.dtype)
