"""The data a GEMM case runs on: expert weights (cached across cases), R rotated inputs and routings,
the float32 reference, and the byte/flop accounting behind GB/s, TFLOP/s and % of floor.

The L2 trap: replaying one routing over and over measures cache, not memory (H200 L2 is 50 MB; the 8
experts of one Kimi decode step are 88 MB in bf16 but 25 MB in int4). Every case rotates R routings and
inputs inside one graph; when the weights touched by all R together still fit in twice the L2, the
timer also flushes L2 before every call. Which one was used is recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from moebench.gemm.cases import ROTATIONS, GemmCase
from moebench.gemm.quant import QuantWeight, quantize
from moebench.gemm.routing import make_routing

_BYTES_PER_WEIGHT = {"bf16": 2.0, "fp8-tensor": 1.0, "fp8-block128": 1.0, "int4-g32": 0.5, "int4-g128": 0.5,
                     "nvfp4": 0.5}


def _scale_bytes(dtype: str, n: int, k: int) -> float:
    """Bytes of scales per [n, k] weight (as our canonical format stores them: bf16/fp32/fp8)."""
    if dtype.startswith("int4-g"):
        return n * k / int(dtype.removeprefix("int4-g")) * 2  # bf16 scales on the wire
    if dtype == "fp8-block128":
        return -(-n // 128) * -(-k // 128) * 4
    if dtype == "nvfp4":
        return n * k / 16
    return 0.0


def matrix_bytes(dtype: str, n: int, k: int) -> float:
    """Bytes of one expert's [n, k] weight in `dtype` with its scales: what a kernel must read of it."""
    return n * k * _BYTES_PER_WEIGHT[dtype] + _scale_bytes(dtype, n, k)


@dataclass
class ExpertWeights:
    """w1 [E, 2I, K] (gate rows then up rows) and w2 [E, K, I] in bf16, plus quantized forms on demand."""

    w1: object
    w2: object
    quantized: dict = field(default_factory=dict)

    def quant(self, which: str, fmt: str) -> QuantWeight:
        """The canonical quantized form of w1, w1's gate half ("w1_gate") or w2; cached."""
        key = (which, fmt)
        if key not in self.quantized:
            src = {"w1": self.w1, "w2": self.w2, "w1_gate": self.w1[:, : self.w1.shape[1] // 2]}[which]
            self.quantized[key] = quantize(src, fmt)
        return self.quantized[key]


@lru_cache(maxsize=1)
def expert_weights(model: str, tp: int, device: str) -> ExpertWeights:
    """Seeded random bf16 weights for a preset, one copy per device (kept for the next cases; one model at
    a time so a GPU never holds two models' weights)."""
    import torch

    from moebench.gemm.presets import PRESETS

    p = PRESETS[model]
    i = p.intermediate_per_rank(tp)
    g = torch.Generator(device=device).manual_seed(1234)
    # Scaled so activations stay O(1) through both GEMMs (no overflow, no vanishing signal in bf16).
    w1 = (torch.randn(p.experts, 2 * i, p.hidden, device=device, generator=g) / p.hidden**0.5).to(torch.bfloat16)
    w2 = (torch.randn(p.experts, p.hidden, i, device=device, generator=g) / i**0.5).to(torch.bfloat16)
    return ExpertWeights(w1, w2)


class Workload:
    """R rotations of (input, routing) for one case shape on one device."""

    def __init__(self, case: GemmCase, device: str, rotations: int = ROTATIONS):
        import torch

        self.case, self.device, self.R = case, device, rotations
        p = case.preset
        self.E, self.K, self.I, self.topk, self.M = p.experts, p.hidden, case.intermediate, p.topk, case.m
        self.weights = expert_weights(case.model, case.tp, device)
        g = torch.Generator(device=device).manual_seed(case.seed)
        self.topk_ids, self.topk_weights, self.x = [], [], []
        for r in range(rotations):
            ids, w = make_routing(case.routing, self.M, self.E, self.topk, seed=case.seed + r)
            self.topk_ids.append(ids.to(device))
            self.topk_weights.append(w.to(device))
            if case.op == "gemm2":
                # gemm2's input is per (token, slot): the activated intermediate [M, topk, I].
                self.x.append(torch.randn(self.M, self.topk, self.I, device=device, generator=g).to(torch.bfloat16))
            else:
                self.x.append(torch.randn(self.M, self.K, device=device, generator=g).to(torch.bfloat16))
        self._host_ids = [ids.cpu() for ids in self.topk_ids]

    # --- the weights a case's op multiplies by ---------------------------------------------------
    def op_weight(self):
        """bf16 weight [E, N, K_in] that the op multiplies by (fused uses both w1 and w2)."""
        w = self.weights
        return {"expert": w.w1[:, : self.I], "gemm1": w.w1, "gemm2": w.w2, "fused": None}[self.case.op]

    def quant(self, which: str) -> QuantWeight:
        """Canonical quantized weight for this case's dtype: which in w1, w1_gate, w2."""
        return self.weights.quant(which, self.case.dtype)

    def _float_weight(self, which: str):
        if self.case.dtype == "bf16":
            w = {"w1": self.weights.w1, "w2": self.weights.w2, "w1_gate": self.weights.w1[:, : self.I]}[which]
            return w
        return self.quant(which).dequantize()

    # --- reference ----------------------------------------------------------------------------------
    def reference(self, r: int):
        """float32 expected output of rotation r, computed expert by expert (memory stays small).
        expert/gemm1/gemm2: [M, topk, N]; fused: [M, K]."""
        import torch

        op, x, ids = self.case.op, self.x[r].float(), self._host_ids[r]
        weights = self.topk_weights[r].float()
        if op == "fused":
            w1, w2 = self._float_weight("w1"), self._float_weight("w2")
            out = torch.zeros(self.M, self.K, device=self.device)
            for e in ids.unique().tolist():
                tok, slot = (ids == e).nonzero(as_tuple=True)
                h = x[tok.to(self.device)] @ w1[e].float().T
                a = torch.nn.functional.silu(h[:, : self.I]) * h[:, self.I:]
                y = a @ w2[e].float().T
                out.index_add_(0, tok.to(self.device), y * weights[tok, slot].unsqueeze(1))
            return out
        which = {"expert": "w1_gate", "gemm1": "w1", "gemm2": "w2"}[op]
        w = self._float_weight(which)
        n = w.shape[1]
        out = torch.zeros(self.M, self.topk, n, device=self.device)
        for e in ids.unique().tolist():
            tok, slot = (ids == e).nonzero(as_tuple=True)
            tok_d, slot_d = tok.to(self.device), slot.to(self.device)
            rows = x[tok_d, slot_d] if op == "gemm2" else x[tok_d]
            out[tok_d, slot_d] = rows @ w[e].float().T
        return out

    def reference_shape(self) -> tuple[int, ...]:
        """Shape of an output: [M, K] for fused, [M, topk, N] for the single GEMMs."""
        if self.case.op == "fused":
            return (self.M, self.K)
        return (self.M, self.topk, {"expert": self.I, "gemm1": 2 * self.I, "gemm2": self.K}[self.case.op])

    # --- accounting -------------------------------------------------------------------------------
    def experts_touched(self, r: int) -> int:
        return int(self._host_ids[r].unique().numel())

    def mean_experts_touched(self) -> float:
        return sum(self.experts_touched(r) for r in range(self.R)) / self.R

    def union_experts_touched(self) -> int:
        import torch

        return int(torch.cat([i.flatten() for i in self._host_ids]).unique().numel())

    def weight_bytes_per_expert(self) -> float:
        """Bytes of weights (and scales) one expert contributes to this op."""
        d, K, I = self.case.dtype, self.K, self.I
        mats = {"expert": [(I, K)], "gemm1": [(2 * I, K)], "gemm2": [(K, I)], "fused": [(2 * I, K), (K, I)]}[self.case.op]
        return sum(matrix_bytes(d, n, k) for n, k in mats)

    def bytes_per_call(self) -> float:
        """Minimum bytes a call must move: distinct experts' weights (mean over rotations) plus
        activations in and out (bf16)."""
        rows = self.M * self.topk
        act = {"expert": self.M * self.K + rows * self.I, "gemm1": self.M * self.K + rows * 2 * self.I,
               "gemm2": rows * self.I + rows * self.K, "fused": 2 * self.M * self.K}[self.case.op] * 2
        return self.mean_experts_touched() * self.weight_bytes_per_expert() + act

    def flops_per_call(self) -> float:
        rows = self.M * self.topk
        K, I = self.K, self.I
        return 2.0 * rows * {"expert": K * I, "gemm1": K * 2 * I, "gemm2": I * K, "fused": K * 2 * I + I * K}[self.case.op]

    def needs_l2_flush(self, l2_bytes: int) -> bool:
        """True when the weights touched by all R rotations fit in 2x L2 (rotation alone won't do)."""
        return self.union_experts_touched() * self.weight_bytes_per_expert() < 2 * l2_bytes
