"""Dynamic fp8 activation quantization for the fp8_w8a8 path (one small launch per GEMM input)."""

import torch
import triton
import triton.language as tl

from .quant import FP8_MAX


@triton.jit
def _fp8_act_quant_kernel(x_ptr, q_ptr, s_ptr, K, stride_xm, stride_qm, stride_sm,
                          GROUP: tl.constexpr, BLOCK: tl.constexpr, QMAX: tl.constexpr):
    """Row pid(0), group pid(1): scale = max|x| / QMAX over the group (GROUP == 0: the whole row,
    read twice: once for the max, once to quantize), q = x / scale as float8_e4m3fn."""
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    start = g * GROUP
    end = K if GROUP == 0 else start + GROUP
    amax = tl.zeros([BLOCK], dtype=tl.float32)
    for k0 in range(start, end, BLOCK):
        offs = k0 + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_xm + offs, mask=offs < end, other=0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    scale = tl.maximum(tl.max(amax, axis=0), 1e-10) / QMAX
    tl.store(s_ptr + row * stride_sm + g, scale)
    for k0 in range(start, end, BLOCK):
        offs = k0 + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_xm + offs, mask=offs < end, other=0).to(tl.float32)
        q = tl.clamp(x / scale, -QMAX, QMAX)
        tl.store(q_ptr + row * stride_qm + offs, q.to(q_ptr.dtype.element_ty), mask=offs < end)


def fp8_act_quant(x: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize x [rows, K] to float8_e4m3fn with one float32 scale per row (group_size 0) or per
    1 x group_size group. Returns (q [rows, K], scale [rows, 1] or [rows, K // group_size])."""
    rows, K = x.shape
    if group_size and K % group_size:
        raise ValueError(f"K={K} is not a multiple of the activation group {group_size}")
    groups = 1 if group_size == 0 else K // group_size
    q = torch.empty((rows, K), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty((rows, groups), dtype=torch.float32, device=x.device)
    block = min(triton.next_power_of_2(K if group_size == 0 else group_size), 1024)
    _fp8_act_quant_kernel[(rows, groups)](x, q, scale, K, x.stride(0), q.stride(0), scale.stride(0),
                                          GROUP=group_size, BLOCK=block, QMAX=FP8_MAX, num_warps=4)
    return q, scale
