"""Readable output: the closing verdict table (terminal and markdown) and results JSON writing."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

from moebench.baselines.compare import Outcome, display_rank
from moebench.files import atomic_write_text
from moebench.results import CaseDoc, Row

# Terminal columns are clipped to CELL_WIDTH, the note (last) column to NOTE_WIDTH: a failure's message
# is what the reader came for, and as the last column it only wraps.
CELL_WIDTH = 90
NOTE_WIDTH = 200


def clip(text: str, width: int) -> str:
    """text cut to at most width characters, ending in '...' when cut."""
    return text if len(text) <= width else text[:width - 3] + "..."


def failure_note(rep) -> str:
    """A failed pytest report's note: the first line of its exception's message (the pytest.fail text,
    "AssertionError: <msg>", "ModuleNotFoundError: ..."), clipped to NOTE_WIDTH. Not the traceback
    text's last line: in pytest's default style that is only `file:line: AssertionError`."""
    crash = getattr(rep.longrepr, "reprcrash", None)
    text = (crash.message if crash is not None else rep.longreprtext).strip()
    first = text.removeprefix("Failed: ").splitlines()[0] if text else "failed"
    return clip(first, NOTE_WIDTH)


def _fmt(x: float | None, unit: str = "") -> str:
    if x is None:
        return "-"
    return f"{x:.4g} {unit}".strip()


def _cells(r: Row) -> list[str]:
    return [r.verdict, r.key or r.nodeid, r.metric or "-", _fmt(r.value, r.unit), _fmt(r.baseline, r.unit),
            f"{r.delta_pct:+.1f}%" if r.delta_pct is not None else "-", r.note]


HEADER = ["verdict", "case", "metric", "value", "baseline", "delta", "note"]


def sorted_rows(rows: Iterable[Row]) -> list[Row]:
    """Worst first, then by case key."""
    return sorted(rows, key=lambda r: (display_rank(r.verdict), r.key or r.nodeid))


def display_rows(rows: Iterable[Row]) -> list[Row]:
    """Sorted rows with skips that share a reason folded into one row ("22 cases"): a CPU box skips
    hundreds of GPU cases for a handful of reasons, and the measured rows must not drown in them. Every
    skip stays in the results JSON."""
    out: list[Row] = []
    skips: dict[str, list[Row]] = {}
    for r in sorted_rows(rows):
        if r.verdict == Outcome.SKIP:
            skips.setdefault(r.note, []).append(r)
        else:
            out.append(r)
    for note, group in skips.items():
        out.append(group[0] if len(group) == 1 else Row("", f"{len(group)} cases", Outcome.SKIP.value, note=note))
    return out


def aligned(header: list[str], body: Iterable[list[str]]) -> str:
    """Any table in fixed-width columns for the terminal: cells clipped to CELL_WIDTH, the last column
    (a note) to NOTE_WIDTH, a dashed line under the header."""
    limits = [CELL_WIDTH] * (len(header) - 1) + [NOTE_WIDTH]
    data = [[clip(cell, limits[i]) for i, cell in enumerate(row)] for row in [header] + list(body)]
    widths = [max(len(row[i]) for row in data) for i in range(len(header))]
    lines = []
    for j, row in enumerate(data):
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_grid(header: list[str], body: Iterable[list[str]]) -> list[str]:
    """Any table as GitHub-flavoured markdown lines (pipes in cells escaped)."""
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in body]
    return out


def text_table(rows: Iterable[Row]) -> str:
    """The verdict table for the terminal."""
    return aligned(HEADER, [_cells(r) for r in display_rows(rows)])


def counts(rows: Iterable[Row]) -> str:
    """'3 PASS, 1 REGRESSION' in severity order."""
    tally: dict[str, int] = {}
    for r in rows:
        tally[r.verdict] = tally.get(r.verdict, 0) + 1
    return ", ".join(f"{tally[v]} {v}" for v in sorted(tally, key=display_rank))


def markdown_table(rows: Iterable[Row], title: str = "moebench") -> str:
    """The same table as GitHub-flavoured markdown, for job summaries."""
    rows = list(rows)
    out = [f"### {title}", "", counts(rows) or "no cases", ""]
    out += markdown_grid(HEADER, [_cells(r) for r in display_rows(rows)])
    return "\n".join(out) + "\n"


def breakdowns_text(cases: Iterable[CaseDoc]) -> list[str]:
    """The decode step breakdown of every case that has one, as terminal tables under their titles."""
    from moebench.decode.breakdown_report import HEADER, breakdown_tables

    return [f"{title}\n{aligned(HEADER, rows)}" for title, rows in breakdown_tables(cases)]


def breakdowns_markdown(cases: Iterable[CaseDoc], level: str = "####") -> str:
    """The same as markdown sections ("" when no case has a breakdown)."""
    from moebench.decode.breakdown_report import HEADER, breakdown_tables

    return "\n".join(f"{level} {title}\n\n" + "\n".join(markdown_grid(HEADER, rows)) + "\n"
                     for title, rows in breakdown_tables(cases))


def write_markdown(rows: list[Row], path: str | None, title: str, extra: str = "") -> list[str]:
    """Write the markdown summary (the verdict table, then `extra` sections) to `path` (atomically) and
    append it to $GITHUB_STEP_SUMMARY when set. Returns the paths written."""
    text = markdown_table(rows, title) + (f"\n{extra}" if extra else "")
    written = []
    if path:
        atomic_write_text(Path(path), text)
        written.append(path)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8") as f:
            f.write(text)
        written.append(summary)
    return written


def write_json(path: str, doc: dict) -> None:
    """Atomic, stable JSON."""
    atomic_write_text(Path(path), json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n")
