"""`flashinfer_cutlass`: FlashInfer's CUTLASS fused MoE (flashinfer.fused_moe.cutlass_fused_moe), the
kernel vLLM's FLASHINFER_CUTLASS MoE backend runs, for bf16 (SM90+) and nvfp4 (native fp4: SM100 and
SM120 only).

Written from FlashInfer's API and from how vLLM 0.21 calls it (FlashInferExperts.apply,
convert_to_unquantized_kernel_format, prepare_nvfp4_moe_layer_for_fi_or_cutlass); not run here (no
FlashInfer on the H200 image):

  cutlass_fused_moe(input, token_selected_experts, token_final_scales, fc1_expert_weights,
      fc2_expert_weights, output_dtype, quant_scales, ..., input_sf=None, ..., output=None, ...)

- fc1 is [w3; w1] = [up rows; gate rows] (vLLM swaps its [gate; up] w13 with swap_w13_to_w31 for this
  kernel), fc2 is w2 [E, K, I]; activation Swiglu; routing int32 ids and float32 weights.
- nvfp4 is W4A4 here: the kernel quantizes the activations to nvfp4 too (FlashInfer has no fp4
  weight-only CUTLASS MoE). quant_scales = [a1_gscale, w1 block scales (swizzled, as int32), g1_alphas,
  a2_gscale, w2 block scales, g2_alphas], with a_gscale = 448*6/amax (per expert, one value) and
  g_alpha = weight global scale * activation dequant scale, as vLLM builds them. The activation amaxes
  are static, calibrated at build from this workload's inputs (the way a checkpoint's input_scale is).
  Its error is therefore that of fp4 activations, not of weight-only nvfp4.
"""

from __future__ import annotations

import inspect

from moebench.gemm.backends.base import Backend, Built
from moebench.gemm.quant import pack_nibbles
from moebench.gemm.cases import GemmCase

FP4_MAX, FP8_MAX = 6.0, 448.0


def swizzle_blockscale(scale):
    """fp8 block scales [B, M, K] -> the 128x4-tiled layout of CUTLASS/FlashInfer fp4 kernels
    [B, roundup(M,128), roundup(K,4)] (same as vLLM's nvfp4_utils.swizzle_blockscale, minus its .cuda())."""
    import torch

    if scale.dim() != 3:
        raise ValueError(f"expected [B, M, K] block scales, got {tuple(scale.shape)}")
    B, M, K = scale.shape
    mp, kp = -(-M // 128) * 128, -(-K // 4) * 4
    padded = torch.zeros((B, mp, kp), dtype=scale.dtype, device=scale.device)
    padded[:, :M, :K] = scale
    tiles = padded.reshape(B, mp // 128, 4, 32, kp // 4, 4)
    return tiles.permute(0, 1, 4, 3, 2, 5).contiguous().reshape(B, mp, kp)


def swizzled_offset(m: int, k: int, kp: int) -> int:
    """Where element (m, k) of one expert's scales lands in the swizzled buffer (for the tests)."""
    return ((m // 128) * (kp // 4) + k // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + k % 4


def up_then_gate(t, i: int):
    """[E, 2I, ...] gate rows then up rows -> up rows then gate rows (vLLM's swap_w13_to_w31)."""
    import torch

    return torch.cat([t[:, i:], t[:, :i]], dim=1).contiguous()


def _act_amax(wl, q1) -> tuple[float, float]:
    """amax of the MoE input and of the SiLU-and-mul intermediate over all R rotations, with the
    dequantized w1 (one expert at a time): the static activation scales' calibration."""
    import torch

    from moebench.gemm.quant import QuantWeight

    amax_x = max(float(x.float().abs().max()) for x in wl.x)
    rows: dict[int, list] = {}
    for r in range(wl.R):
        ids = wl._host_ids[r]
        for e in ids.unique().tolist():
            tok = (ids == e).nonzero(as_tuple=True)[0].to(wl.x[r].device)
            rows.setdefault(e, []).append(wl.x[r][tok].float())
    amax_h = 0.0
    for e, xs in rows.items():
        w = QuantWeight(q1.fmt, q1.q[e:e + 1], q1.scale[e:e + 1], q1.global_scale[e:e + 1]).dequantize()[0]
        h = torch.cat(xs) @ w.T
        a = torch.nn.functional.silu(h[:, : wl.I]) * h[:, wl.I:]
        amax_h = max(amax_h, float(a.abs().max()))
    return amax_x, amax_h


def _weights(case: GemmCase, wl) -> dict:
    import torch

    E, K, I = wl.E, wl.K, wl.I
    cache = wl.weights.quantized
    key = ("moebench.flashinfer_cutlass", case.dtype)
    if key in cache:
        return cache[key]
    if case.dtype == "bf16":
        fc1, fc2 = up_then_gate(wl.weights.w1, I), wl.weights.w2.contiguous()
        if tuple(fc1.shape) != (E, 2 * I, K) or tuple(fc2.shape) != (E, K, I):
            raise ValueError(f"bf16 weights: w1 {tuple(fc1.shape)}, w2 {tuple(fc2.shape)}")
        cache[key] = {"fc1": fc1, "fc2": fc2}
        return cache[key]
    q1, q2 = wl.quant("w1"), wl.quant("w2")
    if q1.scale.dtype != torch.float8_e4m3fn or tuple(q1.scale.shape) != (E, 2 * I, K // 16):
        raise ValueError(f"nvfp4 w1 block scales: {q1.scale.dtype} {tuple(q1.scale.shape)}")
    if (K // 2) % 8 or (I // 2) % 8:
        raise ValueError(f"FlashInfer takes fp4 weights viewed as int64: K/2={K // 2} and I/2={I // 2} must be multiples of 8")
    fc1 = pack_nibbles(up_then_gate(q1.q, I)).view(torch.long)   # [E, 2I, K/16]
    fc2 = pack_nibbles(q2.q).view(torch.long)                      # [E, K, I/16]
    s1 = swizzle_blockscale(up_then_gate(q1.scale, I)).view(torch.int32)
    s2 = swizzle_blockscale(q2.scale.contiguous()).view(torch.int32)
    amax_x, amax_h = _act_amax(wl, q1)
    dev = fc1.device
    a1 = torch.full((E,), max(amax_x, 1e-12) / (FP8_MAX * FP4_MAX), dtype=torch.float32, device=dev)
    a2 = torch.full((E,), max(amax_h, 1e-12) / (FP8_MAX * FP4_MAX), dtype=torch.float32, device=dev)
    cache[key] = {"fc1": fc1, "fc2": fc2, "quant_scales": [
        1.0 / a1, s1, (q1.global_scale.float() * a1).contiguous(),
        1.0 / a2, s2, (q2.global_scale.float() * a2).contiguous()],
        "amax": (amax_x, amax_h)}
    return cache[key]


def build(case: GemmCase, wl) -> Built:
    import torch

    try:
        from flashinfer.fused_moe import cutlass_fused_moe
    except ImportError as e:
        raise RuntimeError(f"flashinfer is importable but flashinfer.fused_moe.cutlass_fused_moe is not: {e}") from e
    import flashinfer

    if case.op != "fused" or case.dtype not in ("bf16", "nvfp4"):
        raise ValueError(f"flashinfer_cutlass runs op 'fused' with bf16 or nvfp4, not {case.op} {case.dtype}")
    for r in range(wl.R):
        if wl.x[r].dtype != torch.bfloat16 or wl.topk_ids[r].dtype != torch.int32 or wl.topk_weights[r].dtype != torch.float32:
            raise ValueError(f"rotation {r}: expected bf16 x, int32 ids, float32 weights")
    p = _weights(case, wl)
    params = inspect.signature(cutlass_fused_moe).parameters
    use_out = "output" in params
    dev = wl.x[0].device
    outs = [torch.empty(wl.M, wl.K, dtype=torch.bfloat16, device=dev) for _ in range(wl.R)] if use_out else []
    quant_scales = p.get("quant_scales", [])
    calls = []
    for r in range(wl.R):
        kw = {"input": wl.x[r], "token_selected_experts": wl.topk_ids[r], "token_final_scales": wl.topk_weights[r],
              "fc1_expert_weights": p["fc1"], "fc2_expert_weights": p["fc2"], "output_dtype": torch.bfloat16,
              "quant_scales": quant_scales}
        if "input_sf" in params:
            kw["input_sf"] = None
        if use_out:
            kw["output"] = outs[r]

            def call(kw=kw, out=outs[r]):
                cutlass_fused_moe(**kw)
                return out
        else:
            def call(kw=kw):
                res = cutlass_fused_moe(**kw)
                return res[0] if isinstance(res, (list, tuple)) else res
        calls.append(call)
    calls[0]()  # JIT build / module load outside the timed region; a broken call fails here
    torch.cuda.synchronize()
    info = {"impl": "flashinfer.fused_moe.cutlass_fused_moe", "flashinfer_version": getattr(flashinfer, "__version__", "unknown"),
            "config_file": "none (default CUTLASS tactic; FlashInfer autotuner not run)",
            "fc1_layout": "[up; gate] rows (vLLM swap_w13_to_w31), activation Swiglu"}
    if case.dtype == "nvfp4":
        amax_x, amax_h = p["amax"]
        info["quant_layout"] = ("nvfp4 W4A4: e2m1 weights packed 2/byte viewed as int64, fp8 block scales (16) "
                                "swizzled 128x4, per-expert global scales; activations quantized in-kernel")
        info["activation_scales"] = f"static, calibrated on this workload: amax x {amax_x:.4g}, intermediate {amax_h:.4g}"
    else:
        info["quant_layout"] = "bf16"
    return Built(calls, outs, info)


flashinfer_cutlass = Backend(
    "flashinfer_cutlass", frozenset({"fused"}), frozenset({"bf16", "nvfp4"}), build,
    "FlashInfer CUTLASS fused MoE (bf16; nvfp4 W4A4 on SM100/SM120)",
    min_cc=(9, 0), modules=("flashinfer",), gpu_only=True, dtype_min_cc={"nvfp4": (10, 0)},
    # nvfp4 here is W4A4: the activations are rounded to e2m1 (1 mantissa bit) too, unlike the
    # weight-only reference bound; not yet measured on a Blackwell GPU.
    error_bounds={"nvfp4": 2e-1})

FLASHINFER_BACKENDS = (flashinfer_cutlass,)
