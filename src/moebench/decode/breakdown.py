"""Where a decode step's time goes: GPU time per category per step, GPU busy time, and the host gap.

From one profiled trial (kept apart from the timed ones: the profiler slows the host) the steps'
kernels are sorted into categories (moebench.decode.categories). Per category the figure is its GPU
time per step (the mean over complete steps; its noise the spread between steps). The host gap is the
timed trials' steady ms/token minus the GPU busy time per step: the time the GPU waited for the host
(scheduling, sampling on the CPU, Python) in an unprofiled step.

Kernels of one step can overlap (vLLM runs a MoE layer's shared expert on a second stream beside the
routed experts), and a kernel that shares the GPU with another runs longer. So a category's kernel time
counts an overlapped microsecond in each kernel that ran in it, and the categories add up to more than
the GPU busy time. Beside them the breakdown keeps each category's share of the busy time (every
microsecond split evenly among the kernels running in it: these add up to the busy time), the overlap
(kernel time minus busy time), and the largest kernels of each category, so a category that grew can
be told apart from one that was slowed by a neighbour. The gated step_<category>_ms metrics are the
kernel times (breakdown map version 2).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Mapping

from moebench.decode.categories import CATEGORIES, LABELS, category
from moebench.decode.trace import Kernel, Steps, busy_us
from moebench.core.metrics import Metric, relative_spread
from moebench.outputs.report import fmt_pct, fmt_value

PREFIX = "step_"  # metric names: step_<category>_ms, step_gpu_busy_ms, step_host_gap_ms
UNIT = "ms"


@dataclass
class Breakdown:
    """Per-step GPU time of each category (ms), GPU busy time per step, and what fell into `other`."""

    steps: int
    source: str
    per_step_ms: dict[str, list[float]]  # category -> one value per step (all CATEGORIES present)
    busy_ms: list[float]
    top_other: list[tuple[str, float]] = field(default_factory=list)  # (kernel name, ms per step)
    busy_share_ms: dict[str, float] = field(default_factory=dict)  # category -> its share of the busy time per step
    top_kernels: dict[str, list[tuple[str, float]]] = field(default_factory=dict)  # category -> (name, ms per step)

    def mean_ms(self, cat: str) -> float:
        """A category's mean GPU time per step (ms)."""
        return sum(self.per_step_ms[cat]) / self.steps

    @property
    def gpu_busy_ms(self) -> float:
        """Mean GPU busy time per step (ms): the union of kernel intervals, overlaps counted once."""
        return sum(self.busy_ms) / self.steps

    def to_json(self) -> dict:
        """The breakdown for the results JSON: ms per step and share of GPU time, by category."""
        total = sum(self.mean_ms(c) for c in CATEGORIES) or 1.0
        cats = {c: {"ms_per_step": round(self.mean_ms(c), 4), "share": round(self.mean_ms(c) / total, 4)}
                for c in CATEGORIES}
        for c, ms in self.busy_share_ms.items():
            cats[c]["busy_share_ms_per_step"] = round(ms, 4)
        for c, top in self.top_kernels.items():
            cats[c]["top_kernels"] = [[n, round(ms, 4)] for n, ms in top]
        return {"steps": self.steps, "source": self.source, "gpu_busy_ms_per_step": round(self.gpu_busy_ms, 4),
                "overlap_ms_per_step": round(total - self.gpu_busy_ms, 4) if self.busy_share_ms else None,
                "categories": cats, "top_other_kernels": [[n, round(ms, 4)] for n, ms in self.top_other]}


def busy_shares(kernels: list[Kernel], cat_of) -> dict[str, float]:
    """Each category's share of the busy time of these kernels (us): every interval in which n kernels run
    is split evenly among them. The shares add up to trace.busy_us(kernels)."""
    events = sorted([(k.ts, 1, i) for i, k in enumerate(kernels)] + [(k.ts + k.dur, -1, i) for i, k in enumerate(kernels)])
    out: dict[str, float] = defaultdict(float)
    running: set[int] = set()
    last = None
    for t, kind, i in events:
        if running and last is not None and t > last:
            for j in running:
                out[cat_of(kernels[j])] += (t - last) / len(running)
        last = t
        if kind == 1:
            running.add(i)
        else:
            running.discard(i)
    return dict(out)


def breakdown(steps: Steps, classify: Callable[[Kernel], str] = category) -> Breakdown:
    """Sort every kernel of the complete steps into categories (by `classify`: the category map, or an
    engine's own rules in front of it); sums per step in ms."""
    if steps.count == 0:
        raise ValueError("no complete decode step in the profiled window")
    per_step = {c: [0.0] * steps.count for c in CATEGORIES}
    by_name: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    shares: dict[str, float] = {c: 0.0 for c in CATEGORIES}
    busy = []
    for i, ks in enumerate(steps.kernels):
        for k in ks:
            cat = classify(k)
            per_step[cat][i] += k.dur / 1e3
            by_name[cat][k.name[:120]] += k.dur / 1e3 / steps.count
        for c, us in busy_shares(ks, classify).items():  # the same rules as the kernel times
            shares[c] += us / 1e3 / steps.count
        busy.append(busy_us(ks) / 1e3)
    top = {c: sorted(names.items(), key=lambda kv: -kv[1])[:5] for c, names in by_name.items()}
    return Breakdown(steps.count, steps.source, per_step, busy, top.get("other", []), shares, top)


def breakdown_metrics(b: Breakdown, steady_ms: float, gated: tuple[str, ...], rel_tol: float,
                      rel_tols: Mapping[str, float] | None = None) -> dict[str, Metric]:
    """Metrics of a breakdown: step_<category>_ms per category (gated for the categories in `gated`, at
    rel_tols[category] where given, else rel_tol), step_gpu_busy_ms and step_host_gap_ms (informational).
    Per-step spread is the noise when steps were told apart; for a window average (no step boundaries)
    it is unknown, so the category is not gated."""
    rel_tols = rel_tols or {}
    by_steps = not b.source.startswith("assumed")  # the engine's annotations or its graph launches told steps apart
    out: dict[str, Metric] = {}
    for c in CATEGORIES:
        xs = b.per_step_ms[c]
        out[f"{PREFIX}{c}_ms"] = Metric(b.mean_ms(c), UNIT, "lower", noise=relative_spread(xs) if by_steps else 0.0,
                                        n=b.steps, rel_tol=rel_tols.get(c, rel_tol),
                                        gated=by_steps and c in gated and b.mean_ms(c) > 0)
    out[f"{PREFIX}gpu_busy_ms"] = Metric(b.gpu_busy_ms, UNIT, "lower", noise=relative_spread(b.busy_ms), n=b.steps,
                                         gated=False)
    # May be negative by a little: the profiled trial's kernels are timed under the profiler.
    out[f"{PREFIX}host_gap_ms"] = Metric(steady_ms - b.gpu_busy_ms, UNIT, "lower", n=b.steps, gated=False)
    return out


def category_of_metric(name: str) -> str | None:
    """The category a metric name stands for (step_routed_experts_ms -> routed_experts), else None."""
    if name.startswith(PREFIX) and name.endswith("_ms"):
        c = name[len(PREFIX):-len("_ms")]
        return c if c in CATEGORIES else None
    return None


def moved_most(measured: Mapping[str, Metric], baselines: Mapping[str, float | None]) -> str | None:
    """The category whose time per step grew most against its baseline, as one phrase
    ("routed experts +18.0%: 1.46 -> 1.72 ms/step"), or None when no category has a baseline."""
    best: tuple[float, str] | None = None
    for name, m in measured.items():
        c = category_of_metric(name)
        base = baselines.get(name)
        if c is None or not base:
            continue
        grew = m.value - base
        if best is None or grew > best[0]:
            best = (grew, f"{LABELS[c]} {fmt_pct(100 * grew / base, signed=True)}: {fmt_value(base)} -> "
                          f"{fmt_value(m.value, 'ms/step')}")
    return best[1] if best else None


def combine_instances(per_instance: list[Mapping[str, Metric]]) -> dict[str, Metric]:
    """One metric set from several engine instances (the A/A): each value the median of the instances',
    its noise the larger of the spread between instances and the spread inside them."""
    if len(per_instance) == 1:
        return dict(per_instance[0])
    out: dict[str, Metric] = {}
    for name, first in per_instance[0].items():
        ms = [p[name] for p in per_instance if name in p]
        vals = [m.value for m in ms]
        between = relative_spread(vals)
        # with 2-3 instances MAD can read 0 (two equal medians); the half range is the honest floor then
        if len(vals) > 1 and statistics.median(vals):
            between = max(between, (max(vals) - min(vals)) / 2 / abs(statistics.median(vals)))
        out[name] = Metric(statistics.median(vals), first.unit, first.direction,
                           noise=max([between] + [m.noise for m in ms]), n=sum(m.n for m in ms),
                           rel_tol=first.rel_tol, gated=first.gated and len(ms) == len(per_instance),
                           samples=tuple(x for m in ms for x in m.samples), cliff=first.cliff,
                           kind=first.kind)
    return out
