"""The report page's pictures of the latest runs, drawn from what the results document says, never from
a family's code: a family describes its cases in their `info`, and these charts read it.

- Backends side by side: cases whose info holds `chart = {"panel": str, "x": number, "x_label": str,
  "series": str, "tokens": number}` (the gemm family: panel = model, op and dtype; x = M; series = the MoE
  backend; tokens = the tokens one measured call serves). One figure per panel: the case's primary metric
  over x, one line per series; beside it the `pct_of_floor` metric (% of the memory floor) where the cases
  have one, and the DRAM bytes read per token (the counted `ncu_dram_read_bytes` over `tokens`) where they
  were counted (--counters): "slower because it reads more" and "slower at the same bytes" side by side.
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

from typing import NamedTuple

from moebench.core.ncu_kernels import metric_name
from moebench.outputs.plots import require_matplotlib
from moebench.results.document import CaseDoc

FLOOR_METRIC = "pct_of_floor"
READ_METRIC = metric_name("dram_read_bytes")  # a case's counted DRAM read per call (--counters)


class Point(NamedTuple):
    """One case on a panel: x, its primary metric, % of the floor and DRAM bytes read per token (None:
    not known)."""

    x: float
    value: float
    pct_of_floor: float | None = None
    bytes_per_token: float | None = None


@dataclass
class BackendPanel:
    """One model+dtype's cases: {series: [Point]}, sorted by x."""

    title: str
    x_label: str
    metric: str
    unit: str
    direction: str
    series: dict[str, list[Point]] = field(default_factory=dict)


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
        p.series.setdefault(series, []).append(
            Point(float(x), m.value, _finite(c, FLOOR_METRIC), _per_token(c, spec.get("tokens"))))
    for p in panels.values():
        for points in p.series.values():
            points.sort()
    return [panels[k] for k in sorted(panels)]


def _finite(c: CaseDoc, name: str) -> float | None:
    """The case's metric `name`, None when it has none or it is not a finite number."""
    m = c.metrics.get(name)
    return m.metric.value if m is not None and math.isfinite(m.metric.value) else None


def _per_token(c: CaseDoc, tokens) -> float | None:
    """The counted DRAM read per token, None without a count or a token number."""
    read = _finite(c, READ_METRIC)
    ok = isinstance(tokens, (int, float)) and not isinstance(tokens, bool) and tokens > 0
    return read / tokens if read is not None and ok else None


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
    """Draw one panel: the metric over x per series; beside it % of the floor and the DRAM bytes read per
    token, each where the panel's cases have it."""
    plt = require_matplotlib()
    extra = [(field, label, ref) for field, label, ref in (
        ("pct_of_floor", "% of the memory floor, higher is better", 100.0),
        ("bytes_per_token", "DRAM read per token (MB, counted), lower is better", None))
        if any(getattr(pt, field) is not None for pts in p.series.values() for pt in pts)]
    cols = 1 + len(extra)
    fig, axes = plt.subplots(1, cols, figsize=(6.5 + 4.5 * (cols - 1), 4.2), dpi=110, squeeze=False)
    for name, pts in sorted(p.series.items()):
        line, = axes[0][0].plot([pt.x for pt in pts], [pt.value for pt in pts], marker="o", label=name)
        for ax, (field, _, _) in zip(axes[0][1:], extra):
            known = [(pt.x, getattr(pt, field)) for pt in pts if getattr(pt, field) is not None]
            scale = 1e-6 if field == "bytes_per_token" else 1.0
            ax.plot([x for x, _ in known], [v * scale for _, v in known], marker="o", color=line.get_color(),
                    label=name)
    better = "lower is better" if p.direction == "lower" else "higher is better"
    axes[0][0].set_ylabel(f"{p.metric} ({p.unit}), {better}" if p.unit else f"{p.metric}, {better}")
    for ax, (_, label, ref) in zip(axes[0][1:], extra):
        ax.set_ylabel(label)
        if ref is not None:
            ax.axhline(ref, color="#999999", linewidth=1, linestyle="--")
    ticks = sorted({pt.x for pts in p.series.values() for pt in pts})
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
