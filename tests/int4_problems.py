"""A small int4 (g32) MoE decode problem for the int4 kernels' CPU tests (test_w4.py, test_w4_mma.py,
test_w4_fused.py): the same activations, weights, routing and float32 reference for every kernel layout."""

from __future__ import annotations

from dataclasses import dataclass

import torch

import moebench.gemm.triton_moe as tm


@dataclass
class Int4Problem:
    x: torch.Tensor      # bf16 [M, K]
    d1: torch.Tensor     # int4 data of w1 [E, 2I, K] (quant.py's generic layout)
    d2: torch.Tensor     # int4 data of w2 [E, K, I]
    q: object            # the quantization (scales) of both
    tw: torch.Tensor     # top-k weights [M, topk]
    ids: torch.Tensor    # int32 top-k ids [M, topk]; with M > 1 two tokens share an expert

    def reference(self) -> torch.Tensor:
        """The float32 fused MoE on the dequantized weights."""
        w1, w2 = tm.dequantize_weight(self.d1, self.q, 0), tm.dequantize_weight(self.d2, self.q, 1)
        return tm.fused_moe_ref(self.x, w1, w2, self.tw, self.ids)


def int4_problem(M: int, K: int, I: int, topk: int, E: int = 8, seed: int = 0) -> Int4Problem:
    """Random activations (scale 3), weights scaled to unit outputs, quantized int4 g32; seeded."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(M, K, generator=g) * 3).bfloat16()
    w1, w2 = torch.randn(E, 2 * I, K, generator=g) / K ** 0.5, torch.randn(E, K, I, generator=g) / I ** 0.5
    ids = torch.stack([torch.randperm(E, generator=g)[:topk] for _ in range(M)]).int()
    if M > 1:
        ids[1, -1] = ids[0, 0]  # two tokens share an expert
    tw = torch.softmax(torch.randn(M, topk, generator=g), -1)
    d1, d2, q = tm.quantize_moe(w1, w2, "int4_w4a16", 32)
    return Int4Problem(x, d1, d2, q, tw, ids)


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref||, after checking out is a finite bf16 tensor of ref's shape."""
    assert out.shape == ref.shape and out.dtype == torch.bfloat16 and not torch.isnan(out).any()
    return ((out.float() - ref).norm() / ref.norm()).item()
