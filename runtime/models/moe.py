"""A sparse mixture-of-experts MLP (Mixtral, Qwen3-MoE, gpt-oss): a router picks each token's top-k
experts, and each expert runs once over the tokens routed to it.

Each expert's gate-up and down projections are the platform's linear layers, so a GGUF's blocks
run on the block kernels and a step reads only the experts its tokens chose: the cost follows the
active parameters, not the total. On CUDA the loop, which reads the chosen experts back to the
host, gives way to two grouped matmuls over every expert (kernels/triton_moe.py). A token's
output adds its experts' weighted outputs in expert order, whatever else is in the batch, so
routing and sums are the same alone or batched.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F


def clamped_swiglu(limit: float, alpha: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """gpt-oss's expert activation on rows [gate | up]: gate clamped above at `limit`, up to
    [-limit, limit], then (up + 1) * gate * sigmoid(alpha * gate)."""
    def act(gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        gate = gate.clamp(max=limit)
        return (up.clamp(-limit, limit) + 1) * (gate * torch.sigmoid(gate * alpha))
    return act


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
        if self.grouped is not None:
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
