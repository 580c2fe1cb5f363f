"""`triton`: moebench's own Triton grouped GEMM and decode-first fused MoE (moebench.gemm.triton_moe)."""

from __future__ import annotations

from moebench.gemm.backends.base import Backend, Built
from moebench.gemm.cases import GemmCase


def _triton_weight(wl, which: str):
    """(data, scale, global_scale) in the Triton kernels' layout, repacked from the canonical quantized
    weight (so both dequantize to the same floats); cached on the model's weights."""
    key = ("triton", which, wl.case.dtype)
    cache = wl.weights.quantized
    if key not in cache:
        from moebench.gemm.quant import pack_int4_uint4b8, pack_nibbles

        qw = wl.quant(which)
        if qw.fmt.startswith("int4"):
            cache[key] = (pack_int4_uint4b8(qw.q), qw.scale, None)
        elif qw.fmt.startswith("fp8"):
            cache[key] = (qw.q, qw.scale, None)
        else:
            cache[key] = (pack_nibbles(qw.q), qw.scale, qw.global_scale)
    return cache[key]


def build(case: GemmCase, wl, config=None) -> Built:
    """The R calls of the case on the workload. config: a triton_moe.MoEConfig every call uses (the config
    sweep's candidates); None: each call takes config_for's choice, as a user's call would."""
    from moebench.gemm import triton_moe

    op = case.op
    names = {"fused": ("w1", "w2"), "expert": ("w1_gate",), "gemm1": ("w1",), "gemm2": ("w2",)}[op]
    if case.dtype == "bf16":
        bf = {"w1": wl.weights.w1, "w2": wl.weights.w2, "w1_gate": wl.weights.w1[:, : wl.I].contiguous()}
        data, quant = [bf[n] for n in names], None
    else:
        packed = [_triton_weight(wl, n) for n in names]
        data = [p[0] for p in packed]
        gs = tuple(p[2] for p in packed) if case.dtype == "nvfp4" else ()
        quant = triton_moe.Quant.for_dtype(case.dtype, tuple(p[1] for p in packed), gs)
    calls = []
    for r in range(wl.R):
        x, ids, w = wl.x[r], wl.topk_ids[r], wl.topk_weights[r]
        if op == "fused":
            calls.append(lambda x=x, ids=ids, w=w: triton_moe.fused_moe(x, data[0], data[1], w, ids, quant=quant,
                                                                        config=config))
        else:
            gop = "gemm2" if op == "gemm2" else "gemm1"
            calls.append(lambda x=x, ids=ids, gop=gop: triton_moe.grouped_gemm(x, data[0], ids, op=gop, quant=quant,
                                                                               config=config))
    # The config the calls will pick (same inputs to config_for as api.py uses): recorded, not chosen here.
    if config is not None:
        cfg = config
    elif op == "fused":
        cfg = triton_moe.config_for(wl.M, wl.K, wl.I, wl.E, wl.topk, quant, op="fused",
                                    pdl=triton_moe.pdl_capable(wl.x[0].device))
    else:
        n, k = (wl.K, wl.I) if op == "gemm2" else (data[0].shape[1], wl.K)
        cfg = triton_moe.config_for(wl.M, k, n, wl.E, wl.topk, quant, op="gemm2" if op == "gemm2" else "gemm1")
    return Built(calls, [], {"impl": "moebench.gemm.triton_moe", "op": op, "config": cfg.as_dict()})


triton = Backend("triton", frozenset({"expert", "gemm1", "gemm2", "fused"}), frozenset(
    {"bf16", "int4-g32", "int4-g128", "fp8-tensor", "fp8-block128", "nvfp4"}), build,
    "moebench's own Triton grouped GEMM / fused MoE", modules=("triton",), min_cc=(8, 0),
    dtype_min_cc={"fp8-tensor": (8, 9), "fp8-block128": (8, 9)})

TRITON_BACKENDS = (triton,)
