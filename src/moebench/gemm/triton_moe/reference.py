"""float32 torch references the kernels are checked against (tests and the H200 sweep).

Quantized cases take dequantized float32 weights (quant.dequantize_weight), so a comparison measures
the kernel, not the format's rounding. fp8_w8a8 also rounds the activations, as the kernels do.
"""

import torch

from .quant import fake_quant_fp8_act


def _acts(a: torch.Tensor, act_group: int | None) -> torch.Tensor:
    return a.float() if act_group is None else fake_quant_fp8_act(a, act_group)


def fused_moe_ref(x, w1, w2, topk_weights, topk_ids, act_group: int | None = None,
                  h_dtype: torch.dtype | None = torch.bfloat16) -> torch.Tensor:
    """float32 [M, K]. w1 [E, 2I, K], w2 [E, K, I] float. act_group: None (bf16 activations) or the
    fp8 activation group (0: per token). h_dtype: the kernels store the SiLU-and-mul output in x's
    dtype; the reference rounds it the same way (None keeps float32)."""
    M, K = x.shape
    topk = topk_ids.shape[1]
    I = w1.shape[1] // 2
    xs = _acts(x, act_group)
    out = torch.zeros(M, K, dtype=torch.float32, device=x.device)
    h = torch.empty(M * topk, I, dtype=torch.float32, device=x.device)
    ids = topk_ids.reshape(-1).long()
    for e in ids.unique().tolist():  # one matmul per used expert keeps the float32 weights small
        p = (ids == e).nonzero().squeeze(1)
        gu = xs[p // topk] @ w1[e].float().T
        h[p] = torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]
    if h_dtype is not None:
        h = h.to(h_dtype).float()
    hs = _acts(h, act_group)
    for e in ids.unique().tolist():
        p = (ids == e).nonzero().squeeze(1)
        y = (hs[p] @ w2[e].float().T) * topk_weights.reshape(-1)[p].float().unsqueeze(1)
        out.index_add_(0, p // topk, y)
    return out


def grouped_gemm_ref(x, w, topk_ids, op: str, act_group: int | None = None) -> torch.Tensor:
    """float32 [M, topk, N]: op "gemm1" (x [M, K]) or "gemm2" (x [M, topk, K]) against w [E, N, K] float."""
    M, topk = topk_ids.shape
    a = x if op == "gemm1" else x.reshape(M * topk, x.shape[-1])
    a = _acts(a, act_group)
    rows = torch.arange(M * topk, device=x.device)
    if op == "gemm1":
        rows = rows // topk
    ids = topk_ids.reshape(-1).long()
    out = torch.empty(M * topk, w.shape[1], dtype=torch.float32, device=x.device)
    for e in ids.unique().tolist():
        p = (ids == e).nonzero().squeeze(1)
        out[p] = a[rows[p]] @ w[e].float().T
    return out.view(M, topk, -1)
