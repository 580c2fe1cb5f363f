"""The gemm family's counters (--counters): one more run of a case under ncu, its kernels' counters as metrics.

The case's window is counted in a child process that ncu profiles (moebench.gemm.counter_child), one child for
a chunk of the session's cases (moebench.gemm.counter_batch). The child builds each case as the test does and
profiles one window per case: the R rotated calls the timer times, each once, so the counters count the
experts the timer's rotations touch; a counter of work is per call (sum over the window / R). Before each
window, inside the profiled range, the child launches a boundary marker (one tiny Triton kernel,
counter_protocol.BOUNDARY_KERNEL, whose grid names the case) that splits ncu's table by case; the marker is
excluded from every case's counters. A case's bytes and instructions are what it counts alone: ncu serialises
the profiled kernels and flushes the caches before each one (--cache-control all), so neither the marker nor
the cases before it in the chunk leave anything in L2 for it, and the order of the cases does not matter.

How it counts (COUNTING) is recorded with every counted run (info["counters"]["counting"]) and not in the case
definition: turning --counters on or off must not make the case's timing entry STALE. A change to COUNTING
changes what the counter metrics mean: re-record them (docs/counters.md). A machine without a GPU or a usable
ncu records why in the case's info["counters"] and times the case as usual; an ncu or child failure is recorded
too, and the test fails on it after the timing is gated (failure()): --counters was asked for and did not count.
"""

from __future__ import annotations

from typing import Callable, Mapping

from moebench.core.metrics import Metric
from moebench.core.ncu_kernels import NCU_METRICS, counter_metrics, per_kernel
from moebench.core.ncu_launch import NcuTool
from moebench.gemm.cases import ROTATIONS, GemmCase
from moebench.gemm.counter_batch import CounterBatch
from moebench.gemm.counter_protocol import BOUNDARY_KERNEL
from moebench.outputs.counter_lines import counter_moved_most

# How the counters count, recorded with each counted run: another window or other flags change what they mean.
COUNTING = {"tool": "ncu", "metrics": list(NCU_METRICS),
            "window": f"the {ROTATIONS} rotated calls the timer times, each once; per call = sum over the window / "
                      f"{ROTATIONS}",
            "boundary": f"one {BOUNDARY_KERNEL} launch before each case's window, inside the profiled range (it "
                        f"names the case: several cases are counted in one child); launched and excluded from "
                        f"the counters",
            "flags": "--page raw --print-units base --clock-control none --cache-control all "
                     "--profile-from-start off --target-processes all"}


def failure(info: Mapping) -> str | None:
    """The line to fail the case with when ncu or the child failed (info["counters"]["failed"]), else None: a
    machine that cannot count (no GPU, no ncu, no permission) is a recorded reason, not a failure."""
    failed = (info.get("counters") or {}).get("failed")
    return f"--counters: the case was timed and gated, but not counted: {failed}" if failed else None


def tool_of(fingerprint: Mapping) -> NcuTool:
    """The ncu the hardware fingerprint found (path and version; none when it found none)."""
    found = fingerprint.get("ncu") or {}
    return NcuTool(found.get("path"), found.get("version"))


def count(case: GemmCase, device: str, read_ceiling: float | None, batch: CounterBatch,
          progress: Callable[[str], None] = lambda s: None) -> tuple[dict[str, Metric], dict]:
    """The case's counter metrics and what to record of them (info["counters"]), from the session's `batch`
    (which runs the case's chunk under ncu if it has not yet): {"ncu", "version", "calls", "counting",
    "chunk", "kernels"} when counted, {"skipped": reason} when this machine cannot count, {"failed": line}
    when ncu or the child failed, or the child did not count the case. Never raises for those: the timing of
    the case stands."""
    if device == "cpu":
        return {}, {"skipped": "counters need a GPU: ncu profiles CUDA kernels"}
    got = batch.count(case.id, progress)
    if got.reason:
        return {}, dict(got.reason)
    view = per_kernel(got.launches, batch.calls)
    info = {"ncu": batch.tool.path, "version": batch.tool.version, "calls": batch.calls, "counting": COUNTING,
            "chunk": got.chunk,
            "kernels": {k.name: {"launches_per_call": k.launches_per_call, **k.values} for k in view.values()}}
    return counter_metrics(view, read_ceiling), info


def explain(comparisons, metrics: Mapping[str, Metric]) -> str:
    """The verdict's phrase: the kernel counter that moved most (outputs.counter_lines), "" if none did."""
    return counter_moved_most(comparisons, {n: m.unit for n, m in metrics.items()})
