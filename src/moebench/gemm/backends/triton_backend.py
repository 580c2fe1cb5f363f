"""moebench's own Triton kernels (moebench.gemm.triton_moe) as three backends:

    triton        the grouped GEMM and decode-first fused MoE; int4-g32 fused runs the tensor-core int4
                  kernels: pair-major (w4_kernels.DEFAULT, "mma") at M <= 16, expert-major ("mma_experts") above
    triton_rows4  int4-g32 fused at decode M on the earlier rows-4 CUDA-core kernel (w4.py), kept for
                  comparison (w4_kernels.py says why mma became the default)
    triton_experts int4-g32 fused on the expert-major tensor-core kernel (w4_experts.py) at every M, M <= 16
                  included, where `triton` runs the pair-major one: the two kernels side by side at every M
    triton_fused  int4-g32 fused at M = 1 in one launch (w4_fused.py, version 7 in docs/triton-moe-notes.md):
                  the pair-major kernel's weights and tiles, up, SiLU and down without the launch between
                  them; outside the default selection (-m "full and triton_fused"): it measured slower than
                  `triton` (docs/triton-moe-notes.md, version 7)
"""

from __future__ import annotations

from moebench.gemm.backends.base import Backend, Built
from moebench.gemm.cases import GemmCase
from moebench.gemm.presets import PRESETS


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


def w4_operands(wl, config=None, kernel: str | None = None):
    """(kernel, w1, w2, (up, down)) for one of our int4 decode kernels (triton_moe/w4_kernels.py: "mma",
    the default, or "rows4") on the workload: its weights packed for that kernel once (cached on the model's
    weights) and the tiles its calls run at (config, default that kernel's table, which w4_tune.py writes).
    build_w4 and the leave-one-out split (triton_moe/w4_split.py) both take them from here."""
    from moebench.gemm.triton_moe import w4_kernels

    k = w4_kernels.get(kernel)
    # keyed by the packing, not the kernel: mma and mma_experts share one copy of the tiles
    key = ("triton-w4", f"{k.pack.__module__}.{k.pack.__name__}", wl.case.dtype)
    cache = wl.weights.quantized
    if key not in cache:
        cache[key] = tuple(k.pack(*_triton_weight(wl, n)[:2]) for n in ("w1", "w2"))
    w1, w2 = cache[key]
    return k, w1, w2, tuple(config or k.config(wl.M, wl.K, wl.I, wl.E, wl.topk))


def build_w4(case: GemmCase, wl, config=None, kernel: str | None = None) -> Built:
    """int4 g32 fused MoE at decode M on one of our int4 decode kernels (w4_operands: the kernel, its packed
    weights and tiles). config: (up, down) KernelConfigs (default: that kernel's table)."""
    k, w1, w2, (up, down) = w4_operands(wl, config, kernel)
    calls = [lambda x=x, ids=ids, w=w: k.fused_moe(x, w1, w2, w, ids, config=(up, down))
             for x, ids, w in zip(wl.x, wl.topk_ids, wl.topk_weights)]
    cfg = {"path": f"w4_{k.name}", "up": up.__dict__, "down": down.__dict__}
    return Built(calls, [], {"impl": k.fused_moe.__module__, "op": case.op, "config": cfg})


def build(case: GemmCase, wl, config=None) -> Built:
    """The R calls of the case on the workload. config: a triton_moe.MoEConfig every call uses (the config
    sweep's candidates); None: each call takes config_for's choice, as a user's call would."""
    from moebench.gemm import triton_moe
    from moebench.gemm.triton_moe.config import GEMV_MAX_M

    op = case.op
    # A MoEConfig (the config sweep's candidate) tiles the gemv/grouped kernels; the int4 kernels have their
    # own tables and tuner (w4_tune.py), so they run only when no config is forced. Pair-major (mma) up to
    # GEMV_MAX_M, expert-major above: session 20 measured it 1.8-2.3x the grouped path at M = 32-128, and the
    # pair-major kernel 1.05-1.45x it at M = 8-16 (docs/triton-moe-notes.md, version 6).
    if config is None and op == "fused" and case.dtype == "int4-g32":
        return build_w4(case, wl, kernel=None if wl.M <= GEMV_MAX_M else "mma_experts")
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
    cfg = config or default_config(case, wl)
    return Built(calls, [], {"impl": "moebench.gemm.triton_moe", "op": op, "config": cfg.as_dict()})


def default_config(case: GemmCase, wl):
    """The MoEConfig the gemv / grouped path's calls pick when none is forced: config_for with the inputs
    api.py gives it (recorded, not chosen here; the config sweep's starting point)."""
    from moebench.gemm import triton_moe

    quant = None
    if case.dtype != "bf16":  # config_for reads the format (kind, group), not the scales
        quant = triton_moe.Quant.for_dtype(case.dtype, (None,), (None,) if case.dtype == "nvfp4" else ())
    if case.op == "fused":
        return triton_moe.config_for(wl.M, wl.K, wl.I, wl.E, wl.topk, quant, op="fused",
                                     pdl=triton_moe.pdl_capable(wl.x[0].device))
    n, k = {"gemm2": (wl.K, wl.I), "gemm1": (2 * wl.I, wl.K), "expert": (wl.I, wl.K)}[case.op]
    return triton_moe.config_for(wl.M, k, n, wl.E, wl.topk, quant, op="gemm2" if case.op == "gemm2" else "gemm1")


triton = Backend("triton", frozenset({"expert", "gemm1", "gemm2", "fused"}), frozenset(
    {"bf16", "int4-g32", "int4-g128", "fp8-tensor", "fp8-block128", "nvfp4"}), build,
    "moebench's own Triton grouped GEMM / fused MoE", modules=("triton",), min_cc=(8, 0),
    dtype_min_cc={"fp8-tensor": (8, 9), "fp8-block128": (8, 9)})


def build_rows4(case: GemmCase, wl) -> Built:
    """int4-g32 fused MoE on the rows-4 CUDA-core int4 decode kernel, at its own tiles."""
    return build_w4(case, wl, kernel="rows4")


# M <= 16: the range both int4 decode kernels' tiles were tuned for (w4_tune.py)
triton_rows4 = Backend("triton_rows4", frozenset({"fused"}), frozenset({"int4-g32"}), build_rows4,
                       "moebench's rows-4 int4 W4A16 decode kernel (CUDA cores; the tensor-core kernel is triton's)",
                       modules=("triton",), min_cc=(8, 0), max_m=16)


def build_experts(case: GemmCase, wl) -> Built:
    """int4-g32 fused MoE on the expert-major tensor-core kernel, at its own tiles."""
    return build_w4(case, wl, kernel="mma_experts")


# every M: beside the pair-major kernel at M <= 16, and what `triton` runs above
triton_experts = Backend("triton_experts", frozenset({"fused"}), frozenset({"int4-g32"}), build_experts,
                         "moebench's expert-major int4 W4A16 kernel (tensor cores, one weight decode per expert's "
                         "tokens)",
                         modules=("triton",), min_cc=(8, 0))

def build_fused(case: GemmCase, wl) -> Built:
    """int4-g32 fused MoE in one launch, on the pair-major kernel's packed weights and tiles (w4_operands). Each
    rotation's call is planned here, before any graph capture: its workspace and counters are allocated zero
    once, and each call leaves them zero for the next. A program whose pair wait gives up reads activations that
    plan_fused left NaN, so the suite's reference check (each rotation's first call) catches a grid that was not
    resident at once."""
    from moebench.gemm.triton_moe import w4_fused, w4_mma

    _, w1, w2, (up, down) = w4_operands(wl, kernel="mma")
    planned = [w4_fused.plan_fused(w4_mma.plan_call(x, w1, w2, w, ids, config=(up, down)))
               for x, ids, w in zip(wl.x, wl.topk_ids, wl.topk_weights)]
    calls = [lambda fc=fc: w4_fused.fused_launch(fc) for fc in planned]
    cfg = {"path": "w4_mma_fused", "up": up.__dict__, "down": down.__dict__, "warps": planned[0].ks}
    return Built(calls, [], {"impl": w4_fused.__name__, "op": case.op, "config": cfg})


def fused_gpu_fit(case: GemmCase) -> str | None:
    """Why this machine's GPU (device 0, the one the suite times) has too few SMs for the case's one-launch grid,
    or None."""
    import torch

    from moebench.gemm.triton_moe.w4_fused import grid_too_large

    p = PRESETS[case.model]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return grid_too_large(case.m, p.intermediate_per_rank(case.tp), p.topk, sms)


# M = 1 only: at M = 2 the Kimi-K2.5 and DeepSeek-V3 TP8 grid is 256 programs, more than an H100's or H200's SMs
triton_fused = Backend("triton_fused", frozenset({"fused"}), frozenset({"int4-g32"}), build_fused,
                       "moebench's int4 W4A16 decode in one launch (up, SiLU and down; pair-major tensor-core tiles)",
                       modules=("triton",), min_cc=(8, 0), max_m=1, gpu_fit=fused_gpu_fit)

TRITON_BACKENDS = (triton, triton_rows4, triton_experts, triton_fused)
