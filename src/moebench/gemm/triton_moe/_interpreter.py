"""Workarounds applied when the kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1).

Triton 3.6's interpreter gets three conversions wrong; the GPU does all of them correctly:
  * tl.dot multiplies bfloat16 operands as their raw uint16 bit patterns (silently wrong results);
  * float32 -> bfloat16 casts truncate instead of rounding to nearest even (2x the rounding error,
    biased), which would make the CPU tests measure the interpreter instead of the kernels;
  * float32 -> float8e4nv casts that round up across a power of two lose the carry into the
    exponent (127.6 becomes 64, not 128).
"""

import numpy as np
import torch
import triton.language as tl
from triton.runtime import interpreter


def _f32_to_bf16_rne(data: np.ndarray) -> np.ndarray:
    bits = data.astype(np.float32).view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(data), np.uint16(0x7FC0), rounded)


def _widen_bf16(t):
    if t.dtype.scalar != tl.bfloat16:
        return t
    data = interpreter._convert_float(t.data, tl.bfloat16, tl.float32, None).view(np.float32)
    return interpreter.TensorHandle(data.reshape(t.data.shape), tl.float32)


def _f32_to_fp8e4nv(data: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.ascontiguousarray(data, dtype=np.float32)).to(torch.float8_e4m3fn).view(
        torch.uint8).numpy()


def patch():
    """Install the fixes into the interpreter (idempotent)."""
    builder = interpreter.InterpreterBuilder
    if getattr(builder, "moebench_patched", False):
        return
    dot, cast, fp_to_fp = builder.create_dot, builder.cast_impl, builder.create_fp_to_fp

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return dot(self, _widen_bf16(a), _widen_bf16(b), d, input_precision, max_num_imprecise_acc)

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return interpreter.TensorHandle(_f32_to_bf16_rne(src.data), tl.bfloat16)
        return cast(self, src, dst_type)

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.float8e4nv:
            return interpreter.TensorHandle(_f32_to_fp8e4nv(src.data), tl.float8e4nv)
        return fp_to_fp(self, src, dst_type, rounding_mode)

    builder.create_dot, builder.cast_impl, builder.create_fp_to_fp = create_dot, cast_impl, create_fp_to_fp
    builder.moebench_patched = True
