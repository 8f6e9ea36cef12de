"""A sparse mixture-of-experts MLP (Mixtral, Qwen3-MoE): a router picks each token's top-k experts,
and each expert runs once over the tokens routed to it.

Each expert's gate-up and down projections are the platform's linear layers, so a GGUF's blocks
run on the block kernels and a step reads only the experts its tokens chose: the cost follows the
active parameters, not the total. A token's output adds its experts' weighted outputs in
expert order, whatever else is in the batch, so routing and sums are the same alone or batched.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


class SparseMoE:
    def __init__(self, router: torch.Tensor, experts: list[tuple], top_k: int, normalize: bool, ops):
        """router: [experts, hidden] float32; experts: (gate_up, down) linear layers of each expert."""
        self.router, self.experts, self.top_k, self.normalize, self.ops = router, experts, top_k, normalize, ops

    def route(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's [T, k] expert weights (float32) and ids, highest first; ties go to the
        lower id (topk on the CPU is stable), the same in any batch."""
        probs = F.linear(h.float(), self.router).softmax(dim=-1)
        weights, ids = probs.topk(self.top_k, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, ids

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        """h: [T, hidden] normed activations -> [T, hidden] float32."""
        weights, ids = self.route(h)
        out = torch.zeros(h.shape[0], h.shape[1], dtype=torch.float32, device=h.device)
        hit = torch.zeros(len(self.experts), dtype=torch.bool, device=ids.device)
        hit[ids.flatten()] = True
        for e in hit.nonzero().flatten().tolist():
            tokens, slot = (ids == e).nonzero(as_tuple=True)
            gate_up, down = self.experts[e]
            y = down(self.ops.silu_mul(gate_up(h.index_select(0, tokens)))).float()
            out.index_add_(0, tokens, y * weights[tokens, slot].unsqueeze(1))
        return out
