"""Check, then time, one built backend on its workload; turn the samples into metrics."""

from __future__ import annotations

import math

from moebench.core.method import cpu_timer_method, gpu_timer_method
from moebench.core.kinds import DEVICE_KERNEL, HOST_BOUND
from moebench.core.metrics import Metric
from moebench.core.timing import StopRule, cpu_timer, eager_timer, graph_timer

# Relative error bound (||out - ref|| / ||ref||) against the float32 reference of the (dequantized)
# weights. fp8 w8a8 also rounds the activations to e4m3 (3 mantissa bits, ~4% RMS per element, twice
# in the fused MoE: a kernel measured 5.4e-2 on CPU), hence its looser bound; garbage reads ~1.
ERROR_BOUND = {"bf16": 1e-2, "int4-g32": 1e-2, "int4-g128": 1e-2, "nvfp4": 1e-2, "fp8-tensor": 1e-1,
               "fp8-block128": 1e-1}
GPU_RULE = StopRule(min_samples=10, max_samples=100, max_seconds=0.4, target_noise=0.01)
CPU_RULE = StopRule(min_samples=5, max_samples=30, max_seconds=2.0, target_noise=0.02)
# How the GPU timing keeps L2 out of the number (Workload.needs_l2_flush decides per case and device).
L2_RULE = "R rotated routings and inputs; L2 flushed before every call when their weights are under 2x L2"


def definition(case, device: str) -> dict:
    """A gemm case's definition on a device: its axes (GemmCase.definition) and the method that times its
    gated metric there (graph time on a GPU, wall clock on a CPU). A changed method makes entries STALE."""
    method = cpu_timer_method(CPU_RULE) if device == "cpu" else gpu_timer_method(GPU_RULE, mode="graph", l2=L2_RULE)
    return {**case.definition(), "method": method}


def _poison(built, wl) -> None:
    """NaN into every output buffer; for backends that allocate their output, hand the caching allocator
    a NaN-filled block of the output's size first, so a kernel that writes nothing cannot pass on the
    leftovers of an earlier correct call."""
    import torch

    for out in built.out_buffers:
        out.fill_(float("nan"))
    if not built.out_buffers:
        shape = (wl.M, wl.K) if wl.case.op == "fused" else tuple(wl.reference_shape())
        torch.full(shape, float("nan"), dtype=torch.bfloat16, device=wl.device)  # freed at once


def check(built, wl, bound: float | None = None, key: str | None = None) -> dict:
    """Run rotations 0 and R-1 on poisoned outputs and compare with the float32 reference. Raises
    AssertionError naming the case (`key`, else the workload's shape key), rotation and error; returns the
    worst error seen."""
    import torch

    key = key or wl.case.key
    bound = bound if bound is not None else ERROR_BOUND[wl.case.dtype]
    worst = 0.0
    for r in sorted({0, wl.R - 1}):
        _poison(built, wl)
        out = built.calls[r]()
        if wl.device != "cpu":
            torch.cuda.synchronize()
        ref = wl.reference(r)
        got = out.float().reshape(ref.shape)
        if torch.isnan(got).any():
            raise AssertionError(f"{key}: rotation {r}: output has {int(torch.isnan(got).sum())} NaN "
                                 f"of {got.numel()} (unwritten or broken)")
        err = ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()
        if not err < bound:
            raise AssertionError(f"{key}: rotation {r}: relative error {err:.3e} >= bound {bound:.0e}")
        worst = max(worst, err)
    return {"rel_error": worst, "bound": bound}


def measure(built, wl, *, ceiling: float, l2_bytes: int | None, rule: StopRule | None = None,
            eager: bool = True) -> tuple[dict[str, Metric], dict]:
    """Time the R calls (graph and eager on a GPU, wall clock on CPU) and derive bandwidth, throughput
    and % of the memory floor from a ceiling measured on this device (bytes/s; the suite passes the
    session's read ceiling, moebench.core.bandwidth). rule: the stopping rule (default GPU_RULE / CPU_RULE);
    eager=False leaves out the eager time (the config sweep ranks configs by graph time only)."""
    info: dict = {}
    if wl.device == "cpu":
        t = Metric.from_samples([s * 1e6 for s in cpu_timer(built.calls, rule or CPU_RULE)], "us", "lower",
                                rel_tol=built.rel_tol or 0.15, kind=HOST_BOUND)
        metrics = {"wall_us": t}
        info["l2"] = "CPU: wall clock, rotated inputs"
    else:
        flush = wl.needs_l2_flush(l2_bytes or 0)
        info["l2"] = (f"rotate {wl.R} routings; union of experts touched {wl.union_experts_touched()} "
                      f"({wl.union_experts_touched() * wl.weight_bytes_per_expert() / 1e6:.0f} MB) vs L2 "
                      f"{(l2_bytes or 0) / 1e6:.0f} MB" + ("; L2 flushed before every call" if flush else ""))
        t = Metric.from_samples([s * 1e6 for s in graph_timer(built.calls, rule or GPU_RULE, flush_l2=flush)], "us",
                                "lower", rel_tol=built.rel_tol or 0.05, kind=DEVICE_KERNEL)
        # Eager time is host launch overhead (Python + driver) as much as GPU work, and on the lent
        # H200s it moved -45%..+75% between two runs of the same code while each run's own spread
        # read 1-3%: a gate on it would cry wolf. It is reported (and compared by `moebench compare`
        # for a human), not gated; host-side regressions are gated where users feel them, in the
        # decode family's ms/token.
        metrics = {"graph_us": t}
        if eager:
            metrics["eager_us"] = Metric.from_samples([s * 1e6 for s in eager_timer(built.calls, rule or GPU_RULE)],
                                                      "us", "lower", rel_tol=0.10, gated=False,
                                                      kind=HOST_BOUND)
    nbytes, flops = wl.bytes_per_call(), wl.flops_per_call()
    floor_us = nbytes / ceiling * 1e6
    sec = t.value * 1e-6
    metrics.update({
        "floor_us": t.derived(floor_us, "us", "lower"),
        "pct_of_floor": t.derived(100.0 * floor_us / t.value if t.value else math.nan, "%", "higher"),
        "GBps": t.derived(nbytes / sec / 1e9, "GB/s", "higher"),
        "TFLOPs": t.derived(flops / sec / 1e12, "TFLOP/s", "higher"),
        "experts_touched": t.derived(wl.mean_experts_touched(), "experts", "higher"),
    })
    info.update({"bytes_per_call": nbytes, "flops_per_call": flops, "ceiling_GBps": ceiling / 1e9})
    return metrics, info
