"""The per-kernel view of one measured call window under ncu, and the metrics a case records from it.

A window is what the timer times: the R rotated calls of a case (each rotation once), so the counters count
the experts the timer's rotations touch. A counter of work (bytes, instructions) is summed over a kernel's
launches in the window and divided by the number of calls: per call, like the time. A launch property (grid
size, registers per thread) is the mean over the kernel's launches. The case total sums the work counters
over its kernels. Kernels are grouped by their short name (ncu.short_name), one name launched with several
launch configurations in each call split by its place in the call (kernel_names: `name#1`, `name#2`).

Metric names: `ncu_<counter>` for the case total, `ncu_<counter>@<kernel>` for one kernel (metric_name,
parse_metric_name). Generic: no family.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from moebench.core.kinds import COUNTER_REL_TOL, DEVICE_COUNTER
from moebench.core.metrics import Metric
from moebench.core.ncu import Launch, short_name


@dataclass(frozen=True)
class Counter:
    """One recorded counter: its metric-name stem, the ncu metric, its words, its unit once normalised, how it
    aggregates ("call": summed over launches, per call; "launch": mean per launch), whether it gates, and the
    smallest value that gates (min_gated: below it the counter is recorded only)."""

    key: str
    ncu: str
    label: str
    unit: str
    per: str
    gated: bool
    min_gated: float = 0.0


COUNTERS: tuple[Counter, ...] = (
    # gated from 1 MiB a call: a small kernel's DRAM read is a few hundred bytes of noise on top of its work. Two
    # processes on one H200 (session 18, the 18 int4 triton cases) read the same kernels within 0.03% from
    # 1 MB up, 0.4% at 0.1-1 MB, 3.7% at 10-100 KB and 14% under 10 KB (an elementwise kernel 3,248 then 2,800
    # B), while their instruction counts were identical: what such a kernel does differently shows there
    Counter("dram_read_bytes", "dram__bytes_read.sum", "dram read bytes", "B", "call", True, min_gated=1 << 20),
    # recorded, not gated: a gemm's output (KBs to MBs) stays in the 50 MB L2, so DRAM writes during a kernel
    # are evictions whose timing varies (the Kimi int4 M = 1 case read 80, 80 and 112 B a call in three
    # processes on one H200, DeepSeek's 496 and 320, Kimi M = 16 533,712 and 489,680), not the kernel's work
    Counter("dram_write_bytes", "dram__bytes_write.sum", "dram write bytes", "B", "call", False),
    Counter("inst_executed", "sm__inst_executed.sum", "instructions", "inst", "call", True),
    # launch properties: a change is a different build of the kernel, which the work counters then show
    Counter("grid_size", "launch__grid_size", "grid size", "blocks", "launch", False),
    Counter("registers_per_thread", "launch__registers_per_thread", "registers per thread", "registers", "launch",
            False),
)
BY_KEY = {c.key: c for c in COUNTERS}
DURATION = "gpu__time_duration.sum"  # for the achieved DRAM throughput only (never gated: it is a time)
NCU_METRICS: tuple[str, ...] = tuple(c.ncu for c in COUNTERS) + (DURATION,)
PREFIX = "ncu_"
PCT_KEY = "dram_pct_of_read_ceiling"


@dataclass(frozen=True)
class KernelCounters:
    """One kernel's counters in a window: launches per call, each counter (per call or per launch, as its
    Counter says) and its time under ncu per call (seconds)."""

    name: str
    launches_per_call: float
    values: dict[str, float]
    seconds_per_call: float


def kernel_names(launches: Sequence[Launch], calls: int) -> list[str]:
    """Each launch's kernel as the metrics name it: its short name; or, where launches of one name ran with
    more than one launch configuration (block and grid: one Triton function compiled twice, an up and a down
    kernel) the same number of times in each of the window's `calls` calls, `name#1`, `name#2`, ... by its
    place among that name's launches in a call. The place, not the grid, names them, so a retuned or
    routing-dependent grid keeps its kernel's metrics; a name launched unevenly over the calls (a loop over
    the touched experts) stays one kernel."""
    by_name: dict[str, list[int]] = defaultdict(list)
    for i, launch in enumerate(launches):
        by_name[short_name(launch.kernel)].append(i)
    out = [short_name(launch.kernel) for launch in launches]
    for name, idx in by_name.items():
        per_call, uneven = divmod(len(idx), calls)
        if per_call < 2 or uneven or len({launches[i].config for i in idx}) < 2:
            continue
        for k, i in enumerate(idx):
            out[i] = f"{name}#{k % per_call + 1}"
    return out


def per_kernel(launches: Iterable[Launch], calls: int) -> dict[str, KernelCounters]:
    """The launches of one window of `calls` calls, grouped by kernel (kernel_names; in order of first
    launch)."""
    if calls < 1:
        raise ValueError(f"a window has at least one call, got {calls}")
    launches = list(launches)
    sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    counts: dict[str, int] = defaultdict(int)
    for launch, name in zip(launches, kernel_names(launches, calls)):
        counts[name] += 1
        for m, v in launch.values.items():
            sums[name][m] += v
    out = {}
    for name, n in counts.items():
        s = sums[name]
        values = {c.key: s[c.ncu] / (calls if c.per == "call" else n) for c in COUNTERS if c.ncu in s}
        out[name] = KernelCounters(name, n / calls, values, s.get(DURATION, 0.0) / calls)
    return out


def case_total(view: Mapping[str, KernelCounters]) -> dict[str, float]:
    """The work counters summed over the window's kernels, per call (launch properties have no total)."""
    return {c.key: sum(k.values.get(c.key, 0.0) for k in view.values()) for c in COUNTERS if c.per == "call"}


def metric_name(key: str, kernel: str | None = None) -> str:
    """`ncu_<key>` for a case total, `ncu_<key>@<kernel>` for one kernel."""
    return f"{PREFIX}{key}" + (f"@{kernel}" if kernel else "")


def parse_metric_name(name: str) -> tuple[str, str | None] | None:
    """(counter key, kernel or None for the total) of a counter metric's name, else None."""
    if not name.startswith(PREFIX):
        return None
    key, _, kernel = name[len(PREFIX):].partition("@")
    return (key, kernel or None) if key in BY_KEY or key == PCT_KEY else None


def counter_metric(c: Counter, value: float) -> Metric:
    """One counter's value as a metric: lower is better, the counter kind's tolerance (COUNTER_REL_TOL); gated
    when the counter gates and the value is at least its min_gated."""
    # gated only above 0: a stored metric is > 0 (the schema), and a 0 has no relative change to gate
    return Metric(value, c.unit, "lower", rel_tol=COUNTER_REL_TOL, gated=c.gated and value > 0 and value >= c.min_gated,
                  kind=DEVICE_COUNTER)


def counter_metrics(view: Mapping[str, KernelCounters], read_ceiling: float | None) -> dict[str, Metric]:
    """Every kernel's counters and the case totals as metrics (work counters gated, kind DEVICE_COUNTER), and
    each kernel's achieved DRAM throughput (read + write bytes over its time under ncu) as % of the in-run
    read ceiling (bytes/s; informational: a time under the profiler)."""
    out: dict[str, Metric] = {}
    for k in view.values():
        for key, v in k.values.items():
            out[metric_name(key, k.name)] = counter_metric(BY_KEY[key], v)
        moved = k.values.get("dram_read_bytes", 0.0) + k.values.get("dram_write_bytes", 0.0)
        pct = 100.0 * moved / k.seconds_per_call / read_ceiling if k.seconds_per_call and read_ceiling else math.nan
        out[metric_name(PCT_KEY, k.name)] = Metric(pct, "%", "higher", gated=False, kind=DEVICE_COUNTER)
    for key, v in case_total(view).items():
        out[metric_name(key)] = counter_metric(BY_KEY[key], v)
    return out
