"""Pure-decode steps of a float32 model on block-quantized weights, each decoder layer as one call of
the CPU kernels (`decoder_layer` in kernels/cpu_kernels.cpp) instead of ~10 from Python.

At one user and a short context a decode step of separate calls is ~300 Python-to-C round trips
of a few microseconds each: 9.3 ms a step vs 6.0 fused for one request at 130 tokens, 102 vs 92 ms
for 8 at 3,000 (bench/decode_step.py --forms fused separate). The fused call computes what the layer's
separate kernels compute, stage for stage, so the two forms give identical results; the model runs
it where the attention backend hands over its step (`paged_decode`) and falls back to the
separate ops otherwise (steps with prefills, the torch backend, another dtype).

A model without MoE layers runs the whole step in one call: the embedding lookup before the layers
and the final norm and LM head after them too (`logits`), by the same kernels the separate calls
use. After the layers have streamed their weights through the caches, each call from Python ran
cold: ~0.35 ms a 1B Q4_K_M step at one request (bench/decode_step.py --forms fused layers).
"""
from __future__ import annotations

import ctypes
from typing import Callable, Optional, Sequence

import torch

from radixserve.kernels.cpu_kernels import BlockMatrix, CpuKernels, DecodeEnds, DecodeStep, LayerWeights, PagedDecode


class FusedDecodeLayers:
    def __init__(self, kernels: CpuKernels, weights: list[tuple[int, LayerWeights, Optional[Callable]]],
                 cos: torch.Tensor, sin: torch.Tensor):
        # (KV cache layer, weights, the layer's experts or None) of each layer
        self.kernels, self.weights = kernels, weights
        self.cos, self.sin = cos, sin
        # without MoE layers, every layer in one call (see CpuKernels.decoder_layers)
        self.all_layers = None
        if all(moe is None for *_, moe in weights):
            n = len(weights)
            self.all_layers = ((ctypes.POINTER(LayerWeights) * n)(*(ctypes.pointer(w) for _, w, _ in weights)),
                               (ctypes.c_int64 * n)(*(layer for layer, *_ in weights)))
        # the model's ends around the layers, where a step runs whole (see `logits`)
        self.ends: Optional[DecodeEnds] = None
        self.embed: Optional[Callable] = None
        self.head = None

    @classmethod
    def of(cls, kernels: CpuKernels, layers: Sequence, cos: torch.Tensor, sin: torch.Tensor,
           ends: Optional[tuple] = None) -> Optional["FusedDecodeLayers"]:
        """The fused form of `layers` (runtime/models/llama.py's DecoderLayers), or None where one
        of them has a part the kernel does not do: another dtype, a dense linear layer, partial
        rotary, windows, sinks, sandwich norms. A MoE layer's kernel call ends at its experts'
        input; the experts run as their own call.
        `ends`: the model's (embedding, final norm weight, eps, LM head) where nothing else comes
        between them and the layers; a step then runs whole in one call where the head is on
        block weights."""
        def linears(la):
            return (la.qkv, la.o) if la.moe is not None else (la.qkv, la.o, la.gate_up, la.down)

        if cos.dtype != torch.float32 or not all(
                la.dtype == torch.float32 and la.fusable
                and all(getattr(lin, "matrix", None) is not None for lin in linears(la)) for la in layers):
            return None
        ptr = lambda t: None if t is None else t.data_ptr()  # noqa: E731
        weights = []
        for la in layers:
            # a MoE layer's MLP: no rows (the kernel stops at the experts' input)
            mlp = (BlockMatrix(), BlockMatrix()) if la.moe is not None else (la.gate_up.matrix, la.down.matrix)
            w = LayerWeights(la.qkv.matrix, la.o.matrix, *mlp, la.input_norm.data_ptr(), la.post_attn_norm.data_ptr(),
                             la.eps, ptr(la.q_norm), ptr(la.k_norm))
            w.keep = la
            weights.append((la.index, w, la.moe))
        fused = cls(kernels, weights, cos.contiguous(), sin.contiguous())
        if ends is not None:
            fused._take_ends(*ends)
        return fused

    def _take_ends(self, embed, norm: torch.Tensor, eps: float, head) -> None:
        matrix = getattr(head, "matrix", None)
        if self.all_layers is None or matrix is None or norm.dtype != torch.float32:
            return
        segment = getattr(embed, "segment", None)   # a block embedding is looked up in the call too
        self.embed = None if segment is not None else embed
        self.ends = DecodeEnds(None if segment is None else ctypes.pointer(segment),
                               embed.table.rows if segment is not None else 0, norm.data_ptr(), eps,
                               ctypes.pointer(matrix))
        self.ends.keep = (embed, norm, head)
        self.head = head

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, out_slots: torch.Tensor,
                 paged: Optional[PagedDecode]) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer over the residual stream x [T, hidden] (updated in place) -> (x, the last
        layer's MLP output), as the layers' own calls return them; None where this step is not
        one the kernel runs (`paged` None)."""
        if paged is None or paged.dtype != torch.float32:
            return None
        delta, step = self._step(x, positions, out_slots, paged)
        if self.all_layers is not None:
            self.kernels.decoder_layers(*self.all_layers, step)
            return x, delta
        for i, (layer, w, moe) in enumerate(self.weights):
            self.kernels.decoder_layer(w, step, layer, i > 0)
            if moe is not None:   # delta holds the experts' normed input: their output replaces it
                delta.copy_(moe(delta))
        return x, delta

    def logits(self, ids: torch.Tensor, positions: torch.Tensor, out_slots: torch.Tensor,
               paged: Optional[PagedDecode]) -> Optional[torch.Tensor]:
        """A whole step in one call, token ids [T] -> float32 logits of every row, as the model's
        embedding, these layers, its final norm and LM head compute them one by one; None where
        this step is not one the call runs (no ends, MoE layers, `paged` None, rows for the GEMM).
        Each of those calls from Python ran cold after the layers had streamed their weights
        through the caches."""
        if self.ends is None or paged is None or paged.dtype != torch.float32:
            return None
        if self.head.prefill_gemm is not None and ids.shape[0] >= self.head.gemm_rows:
            return None   # from there the head takes the platform's GEMM (BlockLinear), as it would apart
        x = self.embed(ids) if self.embed is not None else torch.empty(ids.shape[0], self.ends.head.contents.cols)
        _, step = self._step(x, positions, out_slots, paged)
        return self.kernels.decoder_model(*self.all_layers, step, self.ends, ids)

    def _step(self, x: torch.Tensor, positions: torch.Tensor, out_slots: torch.Tensor,
              paged: PagedDecode) -> tuple[torch.Tensor, DecodeStep]:
        assert x.dtype == torch.float32 and x.is_contiguous()
        assert positions.dtype == out_slots.dtype == torch.int64 and positions.is_contiguous() and out_slots.is_contiguous()
        delta = torch.empty_like(x)
        step = DecodeStep(x.data_ptr(), delta.data_ptr(), x.shape[0], self.cos.data_ptr(), self.sin.data_ptr(),
                          positions.data_ptr(), out_slots.data_ptr(), ctypes.pointer(paged))
        step.keep = (x, delta)
        return delta, step
