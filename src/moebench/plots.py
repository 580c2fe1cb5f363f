"""`moebench report`: a trend plot per case over runs, and an index page (index.html + index.md).

Each plot shows one case's metric over the runs' dates: the measured values coloured by that run's
verdict with their noise as error bars, the baseline as a line and its tolerance band shaded. The index
lists every case with its latest verdict and links the PNGs.

matplotlib is an optional dependency (`pip install 'moebench[plots]'`); `require_matplotlib()` says so
in one line when it is missing. Plots use the Agg backend: no display is needed.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from moebench.baselines.compare import Outcome, display_rank
from moebench.baselines.store import BaselineSet
from moebench.files import atomic_write_text
from moebench.family_tables import family_tables
from moebench.report import fmt_pct, fmt_value, markdown_grid, tables_markdown, tables_text, tally
from moebench.results import ResultsDoc
from moebench.runs import latest_runs

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


def parse_date(s: str) -> datetime:
    """An ISO date as the harness writes it ('2026-11-29T22:04:32Z'), as an aware datetime."""
    d = datetime.fromisoformat(s.replace("Z", "+00:00"))
    return d if d.tzinfo else d.replace(tzinfo=timezone.utc)


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
            base, tol = sm.baseline, sm.metric.rel_tol
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
    # values that still PASS (baseline +- rel_tol) shaded around it.
    bx = [p.when for p in t.points if p.baseline is not None]
    if bx:
        by = [p.baseline for p in t.points if p.baseline is not None]
        lo = [p.baseline * (1 - p.rel_tol) for p in t.points if p.baseline is not None]
        hi = [p.baseline * (1 + p.rel_tol) for p in t.points if p.baseline is not None]
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


@dataclass(frozen=True)
class IndexRow:
    """A line of the index: a case's latest state."""

    verdict: str
    key: str
    metric: str
    value: str
    baseline: str
    delta: str
    runs: int
    png: str | None
    note: str = ""


def index_rows(case_trends: list[CaseTrend], runs: list[ResultsDoc]) -> list[IndexRow]:
    """Index lines, worst first: every plotted case, then what the latest run of each family on each
    hardware key (and the latest run of all) did not measure. `runs` oldest first."""
    rows = []
    for t in case_trends:
        p = t.latest
        delta = fmt_pct(100 * (p.value - p.baseline) / p.baseline if p.baseline else None, signed=True)
        verdict = p.verdict if t.in_latest else Outcome.MISSING.value
        note = "" if t.in_latest else f"not in the latest {t.family} run on {t.hardware_key} (last seen {p.label})"
        rows.append(IndexRow(verdict, t.key, t.metric, fmt_value(p.value, t.unit), fmt_value(p.baseline, t.unit), delta,
                             len(t.points), t.png, note))
    newest = {id(r) for r in [*latest_runs(runs).values(), *runs[-1:]]}
    not_measured = {r.key or r.nodeid: r for run in runs if id(run) in newest for r in run.not_measured}
    for name, r in not_measured.items():
        rows.append(IndexRow(r.verdict, name, "-", "-", "-", "-", 0, None, r.note))
    return sorted(rows, key=lambda r: (display_rank(r.verdict), r.key))


def index_markdown(rows: list[IndexRow], title: str) -> str:
    """The index as GitHub-flavoured markdown (links relative to the index)."""
    body = [[r.verdict, f"`{r.key}`", r.metric, r.value, r.baseline, r.delta, str(r.runs),
             f"[png]({r.png})" if r.png else "-", r.note] for r in rows]
    out = [f"# {title}", "", tally(r.verdict for r in rows), ""]
    out += markdown_grid(["verdict", "case", "metric", "latest", "baseline", "delta", "runs", "plot", "note"], body)
    return "\n".join(out) + "\n"


def index_html(rows: list[IndexRow], title: str) -> str:
    """The index as a standalone HTML page: verdict-coloured rows, each with its plot as a thumbnail."""
    e = html.escape
    lines = [
        "<!doctype html>", "<html lang=\"en\"><head><meta charset=\"utf-8\">", f"<title>{e(title)}</title>",
        "<style>body{font-family:system-ui,sans-serif;margin:1.5em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:middle}"
        "th{background:#f4f4f4}.v{color:#fff;font-weight:bold}img{width:360px}code{font-size:90%}</style>",
        "</head><body>", f"<h1>{e(title)}</h1>", f"<p>{e(tally(r.verdict for r in rows))}</p>",
        "<table><tr><th>verdict</th><th>case</th><th>metric</th><th>latest</th><th>baseline</th><th>delta</th>"
        "<th>runs</th><th>trend</th><th>note</th></tr>",
    ]
    for r in rows:
        colour = VERDICT_COLOURS.get(r.verdict, "#000000")
        img = f"<a href=\"{e(r.png)}\"><img src=\"{e(r.png)}\" alt=\"trend of {e(r.key)}\"></a>" if r.png else "-"
        lines.append(f"<tr><td class=\"v\" style=\"background:{colour}\">{e(r.verdict)}</td><td><code>{e(r.key)}</code></td>"
                     f"<td>{e(r.metric)}</td><td>{e(r.value)}</td><td>{e(r.baseline)}</td><td>{e(r.delta)}</td>"
                     f"<td>{r.runs}</td><td>{img}</td><td>{e(r.note)}</td></tr>")
    lines += ["</table>", "</body></html>"]
    return "\n".join(lines) + "\n"


def write_report(runs: list[ResultsDoc], out: Path, *, metric: str | None = None,
                 baselines: dict[str, BaselineSet] | None = None, case_filter=None) -> tuple[list[IndexRow], list[Path]]:
    """Plot every case's trend into out/plots/ and write out/index.html and out/index.md.
    Returns the index rows and the files written."""
    require_matplotlib()
    out = Path(out)
    case_trends = [t for t in trends(runs, metric=metric, baselines=baselines) if case_filter is None or case_filter(t.key)]
    written: list[Path] = []
    for t in case_trends:
        t.png = f"plots/{png_name(t.key, t.metric)}"
        plot_trend(t, out / t.png)
        written.append(out / t.png)
    latest = runs[-1] if runs else None
    rows = index_rows(case_trends, runs)
    if case_filter is not None:
        rows = [r for r in rows if r.png or case_filter(r.key)]
    hw = ", ".join(dict.fromkeys(r.hardware_key for r in runs))
    title = f"moebench on {hw}: {len(runs)} run{'s' if len(runs) != 1 else ''}"
    if latest is not None:
        title += f", latest {latest.label}"
    cases = list(latest.cases.values()) if latest is not None else []
    tables = family_tables(cases)
    extra = tables_markdown(tables, "##")
    md = index_markdown(rows, title) + (f"\n{extra}" if extra else "")
    page = index_html(rows, title).replace("</body></html>", "".join(
        f"<pre>{html.escape(t)}</pre>" for t in tables_text(tables)) + "</body></html>")
    for name, text in (("index.md", md), ("index.html", page)):
        atomic_write_text(out / name, text)
        written.append(out / name)
    return rows, written
