"""Workarounds applied when the kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1).

Triton 3.6's interpreter gets three conversions wrong; the GPU does all of them correctly:
  * tl.dot multiplies bfloat16 operands as their raw uint16 bit patterns (silently wrong results);
  * float32 -> bfloat16 casts truncate instead of rounding to nearest even (2x the rounding error,
    biased), which would make the CPU tests measure the interpreter instead of the kernels;
  * float32 -> float8e4nv casts that round up across a power of two lose the carry into the
    exponent (127.6 becomes 64, not 128).
And one that NumPy broke: the interpreter holds a scalar (a kernel argument, tl.program_id) as a
1-element array and turns it into a loop bound with int(array), which NumPy 2.4 refuses for arrays
with ndim > 0 (TypeError "only 0-dimensional arrays can be converted to Python scalars"). Every
`range()` with a runtime bound failed, e.g. the fp8 activation quantization's. Fixed upstream after
3.6 (triton-lang/triton#9171, PR #9172); the pinned Triton 3.6.0 still has it.
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

    patch_tensor = interpreter._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        patch_tensor(tensor, scope)
        # After the interpreter's own __index__, so its scope restores both in order after the launch.
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    # _patch_lang looks this module global up at every launch, so replacing it here takes effect.
    interpreter._patch_lang_tensor = patch_lang_tensor
    builder.moebench_patched = True
