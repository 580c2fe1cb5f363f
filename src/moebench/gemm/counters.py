"""The gemm family's counters (--counters): one more run of a case under ncu, its kernels' counters as metrics.

The child (moebench.gemm.counter_child) builds the case as the test does and profiles one window: the R
rotated calls the timer times, each once, so the counters count the experts the timer's rotations touch; a
counter of work is per call (sum over the window / R). How it counts (COUNTING) is recorded with every counted
run (info["counters"]["counting"]) and not in the case definition: turning --counters on or off must not make
the case's timing entry STALE. A change to COUNTING changes what the counter metrics mean: re-record them
(docs/counters.md). A machine without a GPU or a usable ncu records why in the case's info["counters"] and times
the case as usual; an ncu or child failure is recorded too, and the test fails on it after the timing is gated
(failure()): --counters was asked for and did not count.
"""

from __future__ import annotations

from typing import Mapping

from moebench.core.metrics import Metric
from moebench.core.ncu import NcuFormatError
from moebench.core.ncu_kernels import NCU_METRICS, counter_metrics, per_kernel
from moebench.core.ncu_launch import NcuFailed, NcuTool, NcuUnavailable, keep_path, run_under_ncu, why_unavailable
from moebench.gemm.cases import ROTATIONS, GemmCase
from moebench.outputs.counter_lines import counter_moved_most

CHILD = "moebench.gemm.counter_child"
TIMEOUT_S = 600.0
# How the counters count, recorded with each counted run: another window or other flags change what they mean.
COUNTING = {"tool": "ncu", "metrics": list(NCU_METRICS),
            "window": f"the {ROTATIONS} rotated calls the timer times, each once; per call = sum over the window / "
                      f"{ROTATIONS}",
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


def count(case: GemmCase, device: str, read_ceiling: float | None, tool: NcuTool, *, calls: int = ROTATIONS,
          timeout_s: float = TIMEOUT_S) -> tuple[dict[str, Metric], dict]:
    """The case's counter metrics and what to record of them (info["counters"]): {"ncu", "version",
    "kernels"} when counted, {"skipped": reason} when this machine cannot count, {"failed": line} when ncu
    or the child failed. Never raises for those: the timing of the case stands."""
    if device == "cpu":
        return {}, {"skipped": "counters need a GPU: ncu profiles CUDA kernels"}
    why = why_unavailable(tool)
    if why:
        return {}, {"skipped": why}
    try:
        launches = run_under_ncu(tool.path, NCU_METRICS, CHILD, ["--case", case.id, "--calls", str(calls)],
                                 timeout_s=timeout_s, keep=keep_path(case.id))
    except NcuUnavailable as e:
        return {}, {"skipped": str(e)}
    except (NcuFailed, NcuFormatError) as e:
        return {}, {"failed": str(e)}
    view = per_kernel(launches, calls)
    info = {"ncu": tool.path, "version": tool.version, "calls": calls, "counting": COUNTING,
            "kernels": {k.name: {"launches_per_call": k.launches_per_call, **k.values} for k in view.values()}}
    return counter_metrics(view, read_ceiling), info


def explain(comparisons, metrics: Mapping[str, Metric]) -> str:
    """The verdict's phrase: the kernel counter that moved most (outputs.counter_lines), "" if none did."""
    return counter_moved_most(comparisons, {n: m.unit for n, m in metrics.items()})
