"""The report page's pictures of the latest runs, drawn from what the results document says, never from
a family's code: a family describes its cases in their `info`, and these charts read it.

- Backends side by side: cases whose info holds `chart = {"panel": str, "x": number, "x_label": str,
  "series": str}` (the gemm family: panel = model, op and dtype; x = M; series = the MoE backend). One
  figure per panel: the case's primary metric over x, one line per series, and beside it the
  `pct_of_floor` metric (% of the memory floor) where the cases have one.
- Step breakdown: cases whose info holds `breakdown = {"categories": {name: {"ms_per_step": number}}}`
  (the decode family's profiled trial). One figure per case group (a decode scenario): a stacked bar per
  case, labelled by what tells the group's cases apart (the MoE kernel's token of the key), one colour
  per category.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from moebench.outputs.plots import require_matplotlib
from moebench.results.document import CaseDoc

FLOOR_METRIC = "pct_of_floor"


@dataclass
class BackendPanel:
    """One model+dtype's cases: {series: [(x, value, % of floor or None)]}, sorted by x."""

    title: str
    x_label: str
    metric: str
    unit: str
    direction: str
    series: dict[str, list[tuple[float, float, float | None]]] = field(default_factory=dict)


def backend_panels(cases: list[CaseDoc]) -> list[BackendPanel]:
    """The cases with a usable `info["chart"]`, grouped into panels (a malformed one is left out: a
    picture is not worth failing a report over)."""
    panels: dict[str, BackendPanel] = {}
    for c in cases:
        spec = c.info.get("chart")
        if not isinstance(spec, dict) or not c.primary or c.primary not in c.metrics:
            continue
        panel, x, series = spec.get("panel"), spec.get("x"), spec.get("series") or c.backend
        if not isinstance(panel, str) or not isinstance(x, (int, float)) or not isinstance(series, str):
            continue
        m = c.metrics[c.primary].metric
        p = panels.setdefault(f"{panel} / {c.primary}",
                              BackendPanel(panel, str(spec.get("x_label") or "x"), c.primary, m.unit, m.direction))
        floor = c.metrics.get(FLOOR_METRIC)
        pct = floor.metric.value if floor is not None and math.isfinite(floor.metric.value) else None
        p.series.setdefault(series, []).append((float(x), m.value, pct))
    for p in panels.values():
        for points in p.series.values():
            points.sort()
    return [panels[k] for k in sorted(panels)]


def _distinct_tokens(key: str, group: str) -> str:
    """What a case's key has that its group does not: 'moe_moebench_w4' of a decode key."""
    shared = set(re.split(r"[-\[\] ]+", group))
    own = [t for t in re.split(r"[-\[\] ]+", key) if t and t not in shared]
    return "-".join(own) or key


def breakdown_groups(cases: list[CaseDoc]) -> dict[str, list[tuple[str, dict[str, float]]]]:
    """{group: [(bar label, {category: ms per step})]} of the cases with a step breakdown."""
    out: dict[str, list[tuple[str, dict[str, float]]]] = {}
    for c in cases:
        cats = (c.info.get("breakdown") or {}).get("categories") if isinstance(c.info.get("breakdown"), dict) else None
        if not isinstance(cats, dict):
            continue
        parts = {n: float(v["ms_per_step"]) for n, v in cats.items()
                 if isinstance(v, dict) and isinstance(v.get("ms_per_step"), (int, float))}
        group = c.group or c.key
        out.setdefault(group, []).append((c.backend or _distinct_tokens(c.key, group), parts))
    return {g: sorted(bars) for g, bars in sorted(out.items())}


def plot_backends(p: BackendPanel, path: Path) -> None:
    """Draw one panel: the metric over x per series, and % of the floor beside it when known."""
    plt = require_matplotlib()
    with_floor = any(pct is not None for pts in p.series.values() for _, _, pct in pts)
    fig, axes = plt.subplots(1, 2 if with_floor else 1, figsize=(11 if with_floor else 6.5, 4.2), dpi=110,
                             squeeze=False)
    for name, pts in sorted(p.series.items()):
        xs = [x for x, _, _ in pts]
        line, = axes[0][0].plot(xs, [v for _, v, _ in pts], marker="o", label=name)
        if with_floor:
            fl = [(x, pct) for x, _, pct in pts if pct is not None]
            axes[0][1].plot([x for x, _ in fl], [pct for _, pct in fl], marker="o", color=line.get_color(), label=name)
    better = "lower is better" if p.direction == "lower" else "higher is better"
    axes[0][0].set_ylabel(f"{p.metric} ({p.unit}), {better}" if p.unit else f"{p.metric}, {better}")
    if with_floor:
        axes[0][1].set_ylabel("% of the memory floor, higher is better")
        axes[0][1].axhline(100, color="#999999", linewidth=1, linestyle="--")
    ticks = sorted({x for pts in p.series.values() for x, _, _ in pts})
    for ax in axes[0]:
        ax.set_xlabel(p.x_label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [f"{x:g}" for x in ticks])
        ax.minorticks_off()
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(p.title, fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def plot_breakdown(group: str, bars: list[tuple[str, dict[str, float]]], path: Path) -> None:
    """Draw one group's stacked bars: a bar per case, a segment per category (ms per step)."""
    plt = require_matplotlib()
    cats = sorted({n for _, parts in bars for n in parts}, key=lambda n: -max(p.get(n, 0.0) for _, p in bars))
    fig, ax = plt.subplots(figsize=(max(5.5, 1.6 * len(bars) + 3.5), 4.6), dpi=110)
    bottoms = [0.0] * len(bars)
    colours = plt.get_cmap("tab10")
    for i, cat in enumerate(cats):
        heights = [parts.get(cat, 0.0) for _, parts in bars]
        ax.bar(range(len(bars)), heights, bottom=bottoms, color=colours(i % 10), label=cat.replace("_", " "), width=0.6)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    for i, total in enumerate(bottoms):
        ax.annotate(f"{total:.2f}", (i, total), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=9)
    ax.set_ylim(0, max(bottoms, default=1.0) * 1.1 or 1.0)  # room for the totals above the bars
    ax.set_xticks(range(len(bars)), [label for label, _ in bars], fontsize=9)
    ax.set_ylabel("ms per decode step (GPU time, profiled trial)")
    ax.set_title(group, fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
