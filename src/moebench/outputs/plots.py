"""`moebench report`'s trend plots: one case's metric over the runs (the page around them is
moebench.outputs.report_page).

Each plot shows one case's metric over the runs' dates: the measured values coloured by that run's
verdict with their noise as error bars, the baseline as a line and its tolerance band shaded, and each
change point of the history (`moebench changes`) as a vertical line at the first run after it.

matplotlib is an optional dependency (`pip install 'moebench[plots]'`); `require_matplotlib()` says so
in one line when it is missing. Plots use the Agg backend: no display is needed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from moebench.baselines.compare import Outcome, pass_band
from moebench.baselines.store import BaselineSet
from moebench.core.provenance import parse_date
from moebench.history.changes import ChangePoint
from moebench.outputs.report import fmt_pct, fmt_value
from moebench.results.document import ResultsDoc
from moebench.history.runs import latest_runs

# One colour per verdict, the same in the plots and the HTML index (colour-blind-safe-ish: red/blue differ
# in lightness too, and every point also carries its verdict in the legend).
VERDICT_COLOURS = {
    Outcome.PASS: "#2ca02c", Outcome.IMPROVEMENT: "#1f77b4", Outcome.REGRESSION: "#d62728",
    Outcome.AMBIGUOUS: "#ff7f0e", Outcome.NEW: "#7f7f7f", Outcome.STALE: "#9467bd", Outcome.ENV_MISMATCH: "#8c564b",
    Outcome.FAIL: "#d62728", Outcome.ERROR: "#d62728", Outcome.SKIP: "#bbbbbb", Outcome.MISSING: "#bbbbbb",
}


class PlotsUnavailable(RuntimeError):
    """matplotlib is not installed."""


def require_matplotlib():
    """Import matplotlib with the Agg backend, or raise PlotsUnavailable with the install hint."""
    try:
        import matplotlib
    except ImportError:
        raise PlotsUnavailable("matplotlib is not installed: pip install 'moebench[plots]' (or pip install matplotlib)") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


@dataclass(frozen=True)
class Point:
    """A case's metric in one run."""

    when: datetime
    value: float
    noise: float
    verdict: str
    baseline: float | None
    rel_tol: float
    label: str


@dataclass
class CaseTrend:
    """A case over the runs: its points, the metric plotted, and its latest state for the index."""

    key: str
    family: str
    hardware_key: str
    metric: str
    unit: str
    direction: str
    points: list[Point]
    in_latest: bool
    png: str | None = None
    changes: list[ChangePoint] = field(default_factory=list)

    @property
    def latest(self) -> Point:
        return self.points[-1]


def trends(runs: list[ResultsDoc], *, metric: str | None = None, baselines: dict[str, BaselineSet] | None = None) -> list[CaseTrend]:
    """Collect each case's points over `runs` (oldest first). The metric is `metric` or the case's primary
    in its latest run. With `baselines` (hardware key -> BaselineSet) the stored baseline and its rel_tol
    draw the line and band; otherwise each run's own recorded baseline and the metric's rel_tol do."""
    latest = latest_runs(runs)
    keys = sorted({k for r in runs for k in r.cases})
    out: list[CaseTrend] = []
    for key in keys:
        last_run = next(r for r in reversed(runs) if key in r.cases)
        last = last_run.cases[key]
        name = metric or last.primary or next(iter(last.metrics), None)
        if name is None:
            continue
        pts: list[Point] = []
        hw = ""
        for r in runs:
            c = r.cases.get(key)
            if c is None or name not in c.metrics:
                continue
            sm = c.metrics[name]
            # the tolerance the run's gate applied (a ruled 3%, a cliff), not the measurement's default
            base = sm.baseline
            tol = sm.comparison.rel_tol if sm.comparison and sm.comparison.rel_tol is not None else sm.metric.rel_tol
            stored = baselines.get(r.hardware_key) if baselines else None
            entry = stored.entry(c.family, key) if stored else None
            if entry is not None and name in entry.metrics:
                base, tol = entry.metrics[name].value, entry.metrics[name].rel_tol
            pts.append(Point(parse_date(r.started), sm.metric.value, sm.metric.noise,
                             sm.verdict or c.verdict, base, tol, r.label))
            hw = r.hardware_key
        if not pts:
            continue
        m = last.metrics[name].metric if name in last.metrics else None
        out.append(CaseTrend(key, last.family, hw, name, m.unit if m else "", m.direction if m else "lower", pts,
                             key in latest[last_run.hardware_key, last.family].cases))
    return out


def png_name(key: str, metric: str) -> str:
    """A file name from a case key: 'selfcheck[copy-64MiB-cpu]' -> 'selfcheck_copy-64MiB-cpu__copy_GBps.png'."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", f"{key}__{metric}") + ".png"


def plot_trend(t: CaseTrend, path: Path) -> None:
    """Draw one case's trend into `path` (PNG)."""
    plt = require_matplotlib()
    import matplotlib.dates as mdates
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(9, 4.6), dpi=110)
    xs = [p.when for p in t.points]
    # The baseline as a step line (it changes only when a reviewer promotes new values), with the band of
    # values that still PASS (compare.pass_band: baseline +- rel_tol, as slowdown's ratio) shaded around it.
    bx = [p.when for p in t.points if p.baseline is not None]
    if bx:
        by = [p.baseline for p in t.points if p.baseline is not None]
        bands = [pass_band(p.baseline, p.rel_tol, t.direction) for p in t.points if p.baseline is not None]
        lo = [b[0] for b in bands]
        # a rate's upper edge runs away as rel_tol nears 1 (none from 1): capped at 3x, past any plot's top
        hi = [min(b[1], 3 * v) for b, v in zip(bands, by)]
        if len(bx) == 1:  # a single run: stretch the line across the visible range
            bx = [bx[0] - timedelta(hours=12), bx[0] + timedelta(hours=12)]
            by, lo, hi = by * 2, lo * 2, hi * 2
        ax.fill_between(bx, lo, hi, step="post", color="#2ca02c", alpha=0.12, linewidth=0)
        ax.step(bx, by, where="post", color="#333333", linewidth=1.4, linestyle="--")
    ax.plot(xs, [p.value for p in t.points], color="#999999", linewidth=1, zorder=2)
    for p in t.points:
        ax.errorbar([p.when], [p.value], yerr=[[p.value * p.noise], [p.value * p.noise]], fmt="o", markersize=7,
                    color=VERDICT_COLOURS.get(p.verdict, "#000000"), ecolor="#666666", elinewidth=1, capsize=3,
                    zorder=3)
    for cp in t.changes:  # a change point: a line at the first run after it, labelled with its size
        when = parse_date(cp.after.started)
        colour = "#d62728" if cp.worse else "#1f77b4"
        ax.axvline(when, color=colour, linestyle=":", linewidth=1.6, zorder=1)
        ax.annotate(f"{fmt_pct(100 * cp.change, signed=True)}", (when, 1.0), xycoords=("data", "axes fraction"),
                    xytext=(3, -12), textcoords="offset points", color=colour, fontsize=9, fontweight="bold")
    latest = t.latest
    ax.annotate(f"latest {fmt_value(latest.value, t.unit)}", (latest.when, latest.value), textcoords="offset points",
                xytext=(-10, 10), ha="right", fontsize=9,
                bbox=dict(boxstyle="round,pad=0.2", facecolor="white", edgecolor="none", alpha=0.8))
    better = "lower is better" if t.direction == "lower" else "higher is better"
    ax.set_title(f"{t.key}\n{t.metric} on {t.hardware_key}: latest {latest.verdict}", fontsize=11)
    ax.set_ylabel(f"{t.metric} ({t.unit}), {better}" if t.unit else f"{t.metric}, {better}")
    ax.grid(True, alpha=0.3)
    span = xs[-1] - xs[0]
    # Room on both sides so the first and last points are not on the frame (an hour around a single run).
    pad = max(span * 0.08, timedelta(minutes=2)) if span else timedelta(hours=1)
    ax.set_xlim(xs[0] - pad, xs[-1] + pad)
    ax.xaxis.set_major_locator(mdates.AutoDateLocator(minticks=3, maxticks=8))
    # Days on the axis for a nightly history; hours too when the runs are less than two days apart.
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%b %d" if span >= timedelta(days=2) else "%b %d\n%H:%M"))
    ax.set_xlabel(f"run date (UTC), {xs[0].year}" + (f"-{xs[-1].year}" if xs[-1].year != xs[0].year else ""))
    # y from 0 when the values are not far from it: a 10% step then looks like 10%.
    lo_y, hi_y = ax.get_ylim()
    if lo_y > 0 and lo_y < 0.5 * hi_y:
        lo_y = 0
    ax.set_ylim(lo_y, hi_y + 0.12 * (hi_y - lo_y))  # headroom for the label of the latest value
    handles = [Line2D([], [], marker="o", linestyle="", color=VERDICT_COLOURS.get(v, "#000"), label=v)
               for v in dict.fromkeys(p.verdict for p in t.points)]
    handles.append(Line2D([], [], marker="", color="#666666", label="error bar: noise (relative spread)"))
    if t.changes:
        handles.append(Line2D([], [], color="#d62728", linestyle=":", label="change point (worse; blue: better)"))
    if bx:
        tol = t.latest.rel_tol
        handles += [Line2D([], [], color="#333333", linestyle="--", label="baseline"),
                    Patch(color="#2ca02c", alpha=0.25, label=f"tolerance band (\u00b1{100 * tol:.0f}%)")]
    else:
        handles.append(Line2D([], [], linestyle="", label="no baseline stored"))
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
