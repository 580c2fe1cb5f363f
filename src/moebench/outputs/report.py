"""The report layer: number formats, tallies and tables for the terminal, markdown, `moebench` commands
and plots, and the closing verdict table of a run (terminal and markdown) with its results JSON writing.

Everything that shows a number, counts outcomes or lays out a table goes through here, so the closing
table of `pytest`, `moebench compare|backends|baselines|report|predict` and the report's index agree.
The gate (moebench.baselines.compare) returns numbers and reasons; the lines it fails with are made here
(`one_line`). This layer knows no family: a family's own tables come to it as `Table`s, collected by
moebench.outputs.family_tables.
"""

from __future__ import annotations

import json
import math
import os
import textwrap
from pathlib import Path
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from moebench.baselines.compare import NOISE_FACTOR, UNKNOWN_MACHINE_SPREAD, Comparison, Outcome, Verdict, display_rank
from moebench.baselines.rules import GateRule
from moebench.core.kinds import kind_of
from moebench.history.changes import RECENT, ChangePoint
from moebench.core.files import atomic_write_text
from moebench.results.document import Row


# --- number formats -----------------------------------------------------------------------------

def fmt_value(x: float | None, unit: str = "") -> str:
    """A measured value in every table, line and plot: 4 significant digits without trailing zeros, and
    without an exponent in the range benchmarks live in (46870 us, not 4.687e+04; 0.0123 ms); "-" for None."""
    if x is None:
        return "-"
    if x == 0 or not math.isfinite(x) or not 1e-3 <= abs(x) < 1e7:
        text = f"{x:.4g}"
    else:
        text = f"{x:.{max(0, 3 - math.floor(math.log10(abs(x))))}f}"
        text = text.rstrip("0").rstrip(".") if "." in text else text
    return f"{text} {unit}".strip()


def fmt_pct(x: float | None, signed: bool = False, digits: int = 1) -> str:
    """A percentage ("12.5%", "+3.0%" when signed: a change); "-" for None."""
    return "-" if x is None else f"{x:{'+' if signed else ''}.{digits}f}%"


def fmt_fixed(x: float | None, digits: int = 3) -> str:
    """A fixed number of decimals, for a column of like values (ms/step of a breakdown); "-" for None."""
    return "-" if x is None else f"{x:.{digits}f}"


# --- the gate's numbers as lines --------------------------------------------------------------

def one_line(case_key: str, metric: str, c: Comparison, unit: str = "") -> str:
    """The single line a regressed test fails with: case, metric, value, baseline, delta, tolerance, noise."""
    delta = c.delta_pct
    parts = [
        f"{c.verdict.value} {case_key} {metric}: {fmt_value(c.value, unit)}",
        f"baseline {fmt_value(c.baseline, unit)}" if c.baseline is not None else "no baseline",
        f"delta {fmt_pct(delta, signed=True)}" if delta is not None else "",
        f"tolerance {fmt_pct(100 * c.rel_tol)}" if c.rel_tol is not None else "",
        f"noise {fmt_pct(100 * c.noise)}" if c.noise is not None else "",
        machine_phrase(c),
    ]
    return ", ".join(p for p in parts if p)


def machine_phrase(c: Comparison) -> str:
    """What a verdict says when the baseline came from another machine of the kind ("" otherwise)."""
    if not c.other_machine:
        return ""
    if c.other_gpu:  # the box that recorded it, another of its GPUs: gated as another machine
        where = f"baseline from GPU {c.other_gpu} of this machine, gated as another machine"
        spread = (f"spread between machines {_measured_between(c.machine_spread, c.measured_machine_spread, c.machines)}"
                  if c.machine_spread is not None else
                  f"spread between machines not recorded: {fmt_pct(100 * UNKNOWN_MACHINE_SPREAD, digits=0)} assumed")
        return f"{where} ({spread})"
    if c.machine_spread is not None:
        return (f"baseline from another machine of this kind (spread between machines "
                f"{_measured_between(c.machine_spread, c.measured_machine_spread, c.machines)})")
    assumed = c.assumed_spread if c.assumed_spread is not None else UNKNOWN_MACHINE_SPREAD
    return (f"baseline from another machine of this kind (spread between machines not recorded: "
            f"{_pct_short(assumed)} assumed for {kind_of(c.kind).words})")


def new_metrics_phrase(comparisons: Mapping[str, Comparison]) -> str:
    """What a NEW case with an entry says: which gated metrics the entry lacks and how the others compared
    ("no entry for 6 of 7 gated metrics (ncu_dram_read_bytes, ...); graph_us PASS"), so that a case whose time
    passed reads as such when it gained metrics (--counters on an entry recorded without them); "" when
    every metric is new."""
    new = [n for n, c in comparisons.items() if c.verdict is Verdict.NEW]
    compared = [f"{n} {c.verdict.value}" for n, c in comparisons.items() if c.verdict is not Verdict.NEW]
    if not new or not compared:
        return ""
    shown = ", ".join(new[:2]) + (", ..." if len(new) > 2 else "")
    return f"no entry for {len(new)} of {len(comparisons)} gated metrics ({shown}); {', '.join(compared)}"


def _pct_short(x: float) -> str:
    """A fraction as a percentage without a needless decimal: 0.02 -> "2%", 0.005 -> "0.5%"."""
    return fmt_pct(100 * x, digits=0 if round(100 * x, 1) == round(100 * x) else 1)


def _measured_between(applied: float, measured: float | None, machines: int) -> str:
    """A measured spread between machines as the gate takes it: "0.9% (0.5% over 3)" where the half range of
    `machines` recorders was widened for one more (kinds.further_machine_factor), else "0.5%"."""
    text = fmt_pct(100 * applied)
    if measured is not None and fmt_pct(100 * measured) != text:
        text += f" ({fmt_pct(100 * measured)} over {machines})"
    return text


def fmt_rule(r: GateRule) -> str:
    """The gate a stored metric gets, in words: "rel 3% + 2x noise(0.4%; machines 0.5%)", "cliff (fails at
    2x)", "none (noise too wide)"; an assumed spread between machines names its kind, a measured one widened
    for a further machine says from what ("machines 0.9% (0.5% over 3)")."""
    if r.gate == "none":
        return "none (noise too wide)"
    if r.gate == "cliff":
        return "cliff (fails at 2x)"
    between = (_measured_between(r.machine_spread, r.measured_spread, r.machines) if r.measured_between
               else f"{_pct_short(r.machine_spread)} assumed, {kind_of(r.kind).words}")
    ruled = " (ruled: 3+ machines within 1%)" if r.ruled else ""
    return (f"rel {_pct_short(r.rel_tol)}{ruled} + {NOISE_FACTOR:g}x noise({fmt_pct(100 * r.noise)}; "
            f"machines {between})")


def fmt_changes(changes: Iterable[tuple[str, str, str]]) -> str:
    """compare.recorded_changes as one phrase ("attention: FLASH_ATTN_MLA -> TRITON_MLA"); "" for none."""
    return "; ".join(f"{name}: {before} -> {now}" for name, before, now in changes)


# --- tallies and tables -------------------------------------------------------------------------

def tally(outcomes: Iterable[str]) -> str:
    """'3 PASS, 1 REGRESSION' in DISPLAY_ORDER, worst first; "no cases" when there are none."""
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o] = counts.get(o, 0) + 1
    return ", ".join(f"{counts[o]} {o}" for o in sorted(counts, key=display_rank)) or "no cases"


def table(header: Sequence[str], body: Iterable[Sequence[str]], right: Sequence[int] = ()) -> str:
    """Any table in fixed-width columns, a dashed line under the header; columns listed in `right` are
    right-aligned (numbers)."""
    data = [list(header)] + [list(r) for r in body]
    widths = [max(len(r[i]) for r in data) for i in range(len(header))]

    def line(r: list[str]) -> str:
        return "  ".join(c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(r)).rstrip()

    return "\n".join([line(data[0]), "  ".join("-" * w for w in widths)] + [line(r) for r in data[1:]])


def markdown_grid(header: list[str], body: Iterable[list[str]]) -> list[str]:
    """Any table as GitHub-flavoured markdown lines (pipes in cells escaped)."""
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in body]
    return out


# --- the closing verdict table ------------------------------------------------------------------

# The closing table fits a terminal of WIDTH columns: notes wrap inside their column, and when the case ids
# are too long for one line per case, each case takes two (the id alone, then its figures). A case id is
# never cut; a note longer than NOTE_WIDTH is (a failure's first line can be a whole repr). A skip's note is
# a reason written for the reader, ending in what to do about it ("...; time it on a quieter box", some 430
# characters): cut at NOTE_WIDTH it lost that advice. It is kept whole up to SKIP_NOTE_WIDTH, and beyond
# that loses its middle, never its end (skips sharing a reason are one row, so a long one is shown once).
WIDTH = 120
NOTE_WIDTH = 200
SKIP_NOTE_WIDTH = 600
# The narrowest note column worth wrapping into; below it the long layout (two lines a case) is used.
MIN_NOTE = 24


def clip(text: str, width: int) -> str:
    """text cut to at most width characters, ending in '...' when cut."""
    return text if len(text) <= width else text[:width - 3] + "..."


def clip_middle(text: str, width: int) -> str:
    """text cut to at most width characters by leaving out its middle (' ... ' in its place), so that
    both its start and its end are kept."""
    if len(text) <= width:
        return text
    head = (width - 5) // 2
    return text[:head] + " ... " + text[len(text) - (width - 5 - head):]


def failure_note(rep) -> str:
    """A failed pytest report's note: the first line of its exception's message (the pytest.fail text,
    "AssertionError: <msg>", "ModuleNotFoundError: ..."), clipped to NOTE_WIDTH. Not the traceback
    text's last line: in pytest's default style that is only `file:line: AssertionError`."""
    crash = getattr(rep.longrepr, "reprcrash", None)
    text = (crash.message if crash is not None else rep.longreprtext).strip()
    first = text.removeprefix("Failed: ").splitlines()[0] if text else "failed"
    return clip(first, NOTE_WIDTH)


def _cells(r: Row) -> list[str]:
    return [r.verdict, r.key or r.nodeid, r.metric or "-", fmt_value(r.value, r.unit), fmt_value(r.baseline, r.unit),
            fmt_pct(r.delta_pct, signed=True), r.note]


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


def _wrapped(line: str, note: str, indent: int, width: int) -> list[str]:
    """`line` with `note` after it, wrapped at `width`, continuation lines indented to `indent`."""
    room = max(width - indent, MIN_NOTE)
    parts = textwrap.wrap(note, room, break_long_words=True, break_on_hyphens=False) or [""]
    return [(line + parts[0]).rstrip()] + [" " * indent + p for p in parts[1:]]


def _table_note(r: Row) -> str:
    """A row's note as the terminal table shows it: a skip's up to SKIP_NOTE_WIDTH with its end kept,
    any other clipped to NOTE_WIDTH."""
    if r.verdict == Outcome.SKIP:
        return clip_middle(r.note, SKIP_NOTE_WIDTH)
    return clip(r.note, NOTE_WIDTH)


def text_table(rows: Iterable[Row], width: int = WIDTH) -> str:
    """The verdict table for a terminal of `width` columns (notes clipped, see _table_note, and wrapped)."""
    cells = [_cells(r)[:-1] + [_table_note(r)] for r in display_rows(rows)]
    widths = [max(len(c[i]) for c in [HEADER, *cells]) for i in range(len(HEADER) - 1)]
    if sum(widths) + 2 * len(widths) + MIN_NOTE <= width:  # one line per case
        indent = sum(widths) + 2 * len(widths)
        pad = lambda c: "".join(x.ljust(w + 2) for x, w in zip(c, widths))
        out = [pad(HEADER[:-1]) + HEADER[-1], "  ".join("-" * w for w in widths) + "  " + "-" * len(HEADER[-1])]
        for c in cells:
            out += _wrapped(pad(c[:-1]), c[-1], indent, width)
        return "\n".join(out)
    # Two lines per case: the verdict and the whole case id, then the figures and the note under the id.
    lead = widths[0] + 2
    figures = widths[2:]
    pad = lambda c: " " * lead + "".join(x.ljust(w + 2) for x, w in zip(c, figures))
    indent = lead + sum(figures) + 2 * len(figures)
    out = [HEADER[0].ljust(lead) + HEADER[1], pad(HEADER[2:-1]) + HEADER[-1],
           "-" * widths[0] + "  " + "-" * (width - lead)]
    for c in cells:
        out.append(c[0].ljust(lead) + c[1])
        out += _wrapped(pad(c[2:-1]), c[-1], indent, width)
    return "\n".join(out)


def markdown_table(rows: Iterable[Row], title: str = "moebench") -> str:
    """The same table as GitHub-flavoured markdown, for job summaries."""
    rows = list(rows)
    out = [f"### {title}", "", tally(r.verdict for r in rows), ""]
    out += markdown_grid(HEADER, [_cells(r) for r in display_rows(rows)])
    return "\n".join(out) + "\n"


@dataclass(frozen=True)
class Table:
    """A table a family adds under the verdict table (decode: a case's step breakdown): its title, its
    header and its rows of formatted cells. The families' renderers are listed in moebench.outputs.family_tables."""

    title: str
    header: list[str]
    rows: list[list[str]]


def tables_text(tables: Iterable[Table]) -> list[str]:
    """Each table for the terminal, under its title."""
    return [f"{t.title}\n{table(t.header, t.rows)}" for t in tables]


def tables_markdown(tables: Iterable[Table], level: str = "####") -> str:
    """The same as markdown sections under `level` headings ("" when there are none)."""
    return "\n".join(f"{level} {t.title}\n\n" + "\n".join(markdown_grid(t.header, t.rows)) + "\n" for t in tables)


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


# --- change points over a history (moebench changes, the report's table) ----------------------------

CHANGE_HEADER = ["case", "metric", "run before", "run after", "change", "level", "noise", "reported above"]


def change_cells(cp: ChangePoint) -> list[str]:
    """A change point's cells in CHANGE_HEADER's order."""
    way = ("worse" if cp.worse else "better") + (", recent" if cp.recent else "")
    return [cp.key, cp.metric, cp.before.label, cp.after.label, f"{fmt_pct(100 * cp.change, signed=True)} {way}",
            f"{fmt_value(cp.level_before)} -> {fmt_value(cp.level_after, cp.unit)}", fmt_pct(100 * cp.noise),
            fmt_pct(100 * cp.threshold)]


def change_line(cp: ChangePoint) -> str:
    """One printed line per change point, beginning with the case id: 'gemm[...] graph_us: 2026-12-01 02:17
    abc1234 -> 2026-12-02 02:17 def5678: +4.1% worse (24.3 -> 25.3 us); noise 0.3%, reported above 2.5%
    (nvidia-h200-x1)'."""
    key, metric, before, after, change, level, noise, above = change_cells(cp)
    return (f"{key} {metric}: {before} -> {after}: {change} ({level}); noise {noise}, reported above {above} "
            f"({cp.hardware_key})")


def changes_tally(cps: Sequence[ChangePoint]) -> str:
    """'3 change points (1 towards worse in the last 3 runs)', or 'no change point'."""
    if not cps:
        return "no change point"
    failing = sum(cp.failing for cp in cps)
    return (f"{len(cps)} change point{'s' if len(cps) != 1 else ''}"
            + (f" ({failing} towards worse in the last {RECENT} runs)" if failing else ""))


def changes_markdown(cps: Sequence[ChangePoint], level: str = "###") -> str:
    """The change points as a markdown section (the failing ones first, then newest first), for summary.md and the report's index."""
    out = [f"{level} Change points over the history", "", changes_tally(cps), ""]
    if cps:
        ordered = sorted(sorted(cps, key=lambda c: c.after.started, reverse=True), key=lambda c: not c.failing)
        out += markdown_grid(CHANGE_HEADER, [change_cells(c) for c in ordered])
    return "\n".join(out) + "\n"
