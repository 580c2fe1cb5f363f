"""`moebench report`'s page (index.html and index.md), read top down:

1. the tally of the latest runs: the same rows, by the same function (CaseDoc.row), as the run's own
   closing table and summary.md, so the two cannot disagree; then the change points' count;
2. the change points over the history (`moebench changes --json`), failing ones first;
3. the MoE backends side by side per model and dtype, and the decode step breakdown per scenario
   (moebench.outputs.charts, from what the latest runs' results documents describe);
4. every case with its latest verdict and its trend plot (moebench.outputs.plots).
"""

from __future__ import annotations

import collections
import html
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from moebench.baselines.compare import Outcome, display_rank
from moebench.baselines.store import BaselineSet
from moebench.history.changes import ChangePoint
from moebench.outputs.charts import backend_panels, breakdown_groups, plot_backends, plot_breakdown
from moebench.core.files import atomic_write_text
from moebench.outputs.plots import VERDICT_COLOURS, CaseTrend, plot_trend, png_name, require_matplotlib, trends
from moebench.outputs.family_tables import family_tables
from moebench.outputs.report import (CHANGE_HEADER, change_cells, changes_markdown, changes_tally, clip, fmt_pct,
                             fmt_value, markdown_grid, table, tables_markdown, tables_text, tally)
from moebench.results.document import CaseDoc, ResultsDoc, Row
from moebench.history.runs import latest_runs

CASE_HEADER = ["verdict", "case", "metric", "latest", "baseline", "delta", "runs", "plot", "note"]
# The terminal's index folds its skips into one line: the most common reasons named, each cut to this width.
SKIP_REASONS_SHOWN = 3
SKIP_REASON_WIDTH = 80


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


@dataclass
class Page:
    """What the page shows: its title, the tally line, the rows, the change points (None: not looked
    for), and the charts as (section, caption, png path relative to the page)."""

    title: str
    summary: str
    rows: list[IndexRow]
    changes: list[ChangePoint] | None
    charts: list[tuple[str, str, str]]
    breakdown_md: str = ""
    breakdown_text: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # lines shown under the tally (ci/nightly.sh: the baselines not written)


def _newest(runs: list[ResultsDoc]) -> list[ResultsDoc]:
    """The latest run of each family on each hardware key, and the latest run of all."""
    return list({id(r): r for r in [*latest_runs(runs).values(), *runs[-1:]]}.values())


def latest_cases(runs: list[ResultsDoc]) -> list[CaseDoc]:
    """Each case as the latest run of its family on its hardware key measured it."""
    return [c for (hw, family), run in latest_runs(runs).items() for c in run.cases.values() if c.family == family]


def latest_rows(runs: list[ResultsDoc]) -> list[Row]:
    """The rows of the latest runs, as their closing tables had them: each case's row and the tests they
    did not measure. For one run, exactly the rows of its summary.md."""
    not_measured = {r.key or r.nodeid: r for run in _newest(runs) for r in run.not_measured}
    return [c.row() for c in latest_cases(runs)] + list(not_measured.values())


def index_rows(case_trends: list[CaseTrend], runs: list[ResultsDoc]) -> list[IndexRow]:
    """Index lines, worst first: every plotted case (its verdict and note from its row, its figures from
    its trend), then what the latest runs did not measure. `runs` oldest first."""
    latest = latest_runs(runs)
    rows = []
    for t in case_trends:
        p = t.latest
        delta = fmt_pct(100 * (p.value - p.baseline) / p.baseline if p.baseline else None, signed=True)
        if t.in_latest:
            row = latest[t.hardware_key, t.family].cases[t.key].row()
            verdict, note = row.verdict, row.note
        else:
            verdict = Outcome.MISSING.value
            note = f"not in the latest {t.family} run on {t.hardware_key} (last seen {p.label})"
        rows.append(IndexRow(verdict, t.key, t.metric, fmt_value(p.value, t.unit), fmt_value(p.baseline, t.unit), delta,
                             len(t.points), t.png, note))
    not_measured = {r.key or r.nodeid: r for run in _newest(runs) for r in run.not_measured}
    for name, r in not_measured.items():
        rows.append(IndexRow(r.verdict, name, "-", "-", "-", "-", 0, None, r.note))
    return sorted(rows, key=lambda r: (display_rank(r.verdict), r.key))


def summary_line(runs: list[ResultsDoc], rows: list[IndexRow], changes: Sequence[ChangePoint] | None) -> str:
    """'latest run: 3 PASS, 2 NEW; 1 MISSING from earlier runs; 2 change points (...)'."""
    out = f"latest run{'s' if len(_newest(runs)) > 1 else ''}: {tally(r.verdict for r in latest_rows(runs))}"
    missing = sum(r.verdict == Outcome.MISSING for r in rows)
    if missing:
        out += f"; {missing} MISSING (measured by earlier runs only)"
    if changes is not None:
        out += f"; {changes_tally(changes)}"
    return out


def index_text(rows: list[IndexRow]) -> str:
    """The index for a terminal (`moebench report`): the rows in a table, worst first, except the skips,
    which are one line under it (skip_line). On a CPU box nearly every case is a GPU case that skips: the
    table ended a nightly with dozens of SKIP rows and not one reason. The page lists each skip, with its reason."""
    listed = [r for r in rows if r.verdict != Outcome.SKIP]
    out = []
    if listed or not rows:
        out.append(table(CASE_HEADER[:7], [[r.verdict, r.key, r.metric, r.value, r.baseline, r.delta, str(r.runs)]
                                           for r in listed], right=(3, 4, 5, 6)))
    out += [line for line in [skip_line(rows)] if line]
    return "\n".join(out)


def skip_line(rows: Sequence[IndexRow]) -> str:
    """The skipped rows in one line, by reason, most common first: "37 SKIP, not listed: needs 1 CUDA GPU,
    NVML sees 0 visible here (30); vllm is not installed (7)"; past SKIP_REASONS_SHOWN reasons, a count of
    the others; "" when nothing skipped."""
    reasons = collections.Counter(r.note or "no reason given" for r in rows if r.verdict == Outcome.SKIP)
    if not reasons:
        return ""
    ranked = sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))
    parts = [f"{clip(reason, SKIP_REASON_WIDTH)} ({n})" for reason, n in ranked[:SKIP_REASONS_SHOWN]]
    rest = ranked[SKIP_REASONS_SHOWN:]
    if rest:
        parts.append(f"{len(rest)} other reason{'s' if len(rest) != 1 else ''} ({sum(n for _, n in rest)})")
    return f"{sum(reasons.values())} SKIP, not listed: " + "; ".join(parts)


def index_markdown(page: Page) -> str:
    """The page as GitHub-flavoured markdown (links relative to the index)."""
    out = [f"# {page.title}", "", page.summary, ""]
    if page.notes:
        out += ["```", *page.notes, "```", ""]
    if page.changes is not None:
        out += [changes_markdown(page.changes, "##")]
    for section in dict.fromkeys(s for s, _, _ in page.charts):
        out += [f"## {section}", ""] + [f"![{caption}]({png})\n" for s, caption, png in page.charts if s == section]
    if page.breakdown_md:
        out += [page.breakdown_md]
    body = [[r.verdict, f"`{r.key}`", r.metric, r.value, r.baseline, r.delta, str(r.runs),
             f"[png]({r.png})" if r.png else "-", r.note] for r in page.rows]
    out += ["## Cases", ""] + markdown_grid(CASE_HEADER, body)
    return "\n".join(out) + "\n"


def _html_table(header: list[str], body: list[str]) -> list[str]:
    return ["<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>", *body, "</table>"]


def index_html(page: Page) -> str:
    """The page as standalone HTML: the tally, the change points, the charts, then the verdict-coloured
    case rows with their trend thumbnails."""
    e = html.escape
    lines = [
        "<!doctype html>", "<html lang=\"en\"><head><meta charset=\"utf-8\">", f"<title>{e(page.title)}</title>",
        "<style>body{font-family:system-ui,sans-serif;margin:1.5em}table{border-collapse:collapse;margin-bottom:1em}"
        "td,th{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:middle}"
        "th{background:#f4f4f4}.v{color:#fff;font-weight:bold}img.t{width:320px}.n{max-width:30em;font-size:90%}.k{max-width:24em;overflow-wrap:anywhere}"
        ".charts{display:flex;flex-wrap:wrap;gap:12px}.charts figure{margin:0;width:calc(50% - 6px);min-width:480px}"
        ".charts img{width:100%}figcaption{font-size:90%;color:#555}"
        "code{font-size:90%}.tally{font-size:120%;font-weight:bold}.worse{color:#d62728}.better{color:#1f77b4}</style>",
        "</head><body>", f"<h1>{e(page.title)}</h1>", f"<p class=\"tally\">{e(page.summary)}</p>",
    ]
    if page.notes:
        lines.append("<pre class=\"worse\">" + e("\n".join(page.notes)) + "</pre>")
    if page.changes is not None:
        lines.append("<h2>Change points over the history</h2>")
        ordered = sorted(sorted(page.changes, key=lambda c: c.after.started, reverse=True), key=lambda c: not c.failing)
        body = ["<tr>" + "".join(f"<td class=\"{'worse' if c.worse else 'better'}\">{e(x)}</td>" if i == 4 else
                                 f"<td>{e(x)}</td>" for i, x in enumerate(change_cells(c))) + "</tr>" for c in ordered]
        lines += _html_table(CHANGE_HEADER, body) if ordered else [f"<p>{e(changes_tally(ordered))}</p>"]
    for section in dict.fromkeys(s for s, _, _ in page.charts):
        lines += [f"<h2>{e(section)}</h2>", "<div class=\"charts\">"]
        lines += [f"<figure><a href=\"{e(png)}\"><img src=\"{e(png)}\" alt=\"{e(section)}: {e(caption)}\"></a>"
                  f"<figcaption>{e(caption)}</figcaption></figure>" for s, caption, png in page.charts if s == section]
        lines.append("</div>")
    lines += [f"<pre>{e(t)}</pre>" for t in page.breakdown_text]
    body = []
    for r in page.rows:
        colour = VERDICT_COLOURS.get(r.verdict, "#000000")
        img = f"<a href=\"{e(r.png)}\"><img class=\"t\" src=\"{e(r.png)}\" alt=\"trend of {e(r.key)}\"></a>" if r.png else "-"
        body.append(f"<tr><td class=\"v\" style=\"background:{colour}\">{e(r.verdict)}</td><td class=\"k\"><code>{e(r.key)}</code></td>"
                    f"<td>{e(r.metric)}</td><td>{e(r.value)}</td><td>{e(r.baseline)}</td><td>{e(r.delta)}</td>"
                    f"<td>{r.runs}</td><td>{img}</td><td class=\"n\">{e(r.note)}</td></tr>")
    lines += ["<h2>Cases</h2>", *_html_table(CASE_HEADER[:7] + ["trend", "note"], body), "</body></html>"]
    return "\n".join(lines) + "\n"


def _charts(cases: list[CaseDoc], out: Path) -> list[tuple[str, str, str]]:
    """Draw the backends and breakdown charts of the latest cases; (section, caption, relative png path) each."""
    charts = []
    for p in backend_panels(cases):
        png = f"charts/{png_name('backends ' + p.title, p.metric)}"
        plot_backends(p, out / png)
        charts.append(("MoE backends side by side", p.title, png))
    for group, bars in breakdown_groups(cases).items():
        png = f"charts/{png_name('breakdown ' + group, 'ms_per_step')}"
        plot_breakdown(group, bars, out / png)
        charts.append(("Decode step breakdown", group, png))
    return charts


def write_report(runs: list[ResultsDoc], out: Path, *, metric: str | None = None,
                 baselines: dict[str, BaselineSet] | None = None, case_filter=None,
                 changes: list[ChangePoint] | None = None,
                 notes: tuple[str, ...] = ()) -> tuple[list[IndexRow], list[Path]]:
    """Plot every case's trend into out/plots/ (with its change points) and the charts into out/charts/,
    and write out/index.html and out/index.md, `notes` under the tally. Returns the index rows and the
    files written."""
    require_matplotlib()
    out = Path(out)
    case_trends = [t for t in trends(runs, metric=metric, baselines=baselines) if case_filter is None or case_filter(t.key)]
    for t in case_trends:
        t.changes = [c for c in changes or () if (c.hardware_key, c.key, c.metric) == (t.hardware_key, t.key, t.metric)]
        t.png = f"plots/{png_name(t.key, t.metric)}"
        plot_trend(t, out / t.png)
    rows = index_rows(case_trends, runs)
    if case_filter is not None:
        rows = [r for r in rows if r.png or case_filter(r.key)]
    hw = ", ".join(dict.fromkeys(r.hardware_key for r in runs))
    title = f"moebench on {hw}: {len(runs)} run{'s' if len(runs) != 1 else ''}"
    if runs:
        title += f", latest {runs[-1].label}"
    cases = [c for c in latest_cases(runs) if case_filter is None or case_filter(c.key)]
    latest = list(runs[-1].cases.values()) if runs else []
    page = Page(title, summary_line(runs, rows, changes), rows, changes, _charts(cases, out),
                tables_markdown(family_tables(latest), "##"), tuple(tables_text(family_tables(latest))), tuple(notes))
    written = [out / t.png for t in case_trends] + [out / png for _, _, png in page.charts]
    for name, text in (("index.md", index_markdown(page)), ("index.html", index_html(page))):
        atomic_write_text(out / name, text)
        written.append(out / name)
    return rows, written
