"""The lines that say what a baseline update did: each file's changes, the notes, the refused entries.

The gate's side (moebench.baselines: merge_entries, prepare_entry, merge_files) returns numbers
(EntryChange records); this module words them with the report's formats.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from moebench.baselines.entry_change import EntryChange
from moebench.baselines.update import Merge, merge_files
from moebench.outputs.report import fmt_pct, fmt_value

# What a refused entry's line tells the reader to do.
ADVICE_REFUSED = ("fix what the line names, or measure again (more runs: `moebench aa --runs 3`; a quieter "
                  "machine), then update again")
# What a metric stored as not gating tells the reader to do.
ADVICE_WIDE = ("to gate it, record again with more independent runs (`moebench aa --runs 3 --promote DIR -- ...`) "
               "on a quieter machine")


def change_line(c: EntryChange | str) -> str:
    """One indented line for a change an update made ("  ~ key metric: 100 -> 110 us (+10.0%)"); a note
    that is already text (a killed writer's leftovers removed) as it is."""
    if isinstance(c, str):
        return c
    k, m = c.key, c.metric
    if c.what == "entry added":
        return f"  + {k} ({', '.join(f'{n} {fmt_value(v, u)}' for n, v, u in c.metrics)})"
    if c.what == "metric added":
        return f"  + {k} {m}: {fmt_value(c.after, c.unit)}"
    if c.what == "metric changed":
        pct = 100.0 * (c.after - c.before) / c.before if c.before else float("nan")
        return f"  ~ {k} {m}: {fmt_value(c.before)} -> {fmt_value(c.after, c.unit)} ({fmt_pct(pct, signed=True)})"
    if c.what == "metric dropped":
        return f"  - {k} {m}: not measured by this run, dropped from the entry"
    if c.what == "definition changed":
        return f"  ~ {k}: case definition changed (was STALE)"
    if c.what == "machine changed":
        return f"  ~ {k}: recorded on {c.after} now (was {c.before})"
    if c.what == "looser tolerance kept":
        return (f"  ! {k} {m}: keeps the stored rel_tol {fmt_pct(100 * c.before)}, looser than the "
                f"case's own {fmt_pct(100 * c.after)}")
    if c.what == "stored as not gating":
        return (f"  ! {k} {m}: noise {fmt_pct(100 * c.before)} is wider than {fmt_pct(100 * c.after)} (a doubling "
                f"would hide in it): stored as not gating, it always compares AMBIGUOUS; {ADVICE_WIDE}")
    if c.what == "tolerance ruled":
        return (f"  ~ {k} {m}: rel_tol {fmt_pct(100 * c.before)} -> {fmt_pct(100 * c.after)} (spread between "
                f"machines {fmt_pct(100 * c.spread)}: a kernel time whose 3 or more machines agree within 1% gates at 3%)")
    raise ValueError(f"{k}: an entry change of no known kind: {c.what!r}")


def left_out_line(metric: str, cases: Sequence[str], runs: Sequence[str]) -> str:
    """The line `baselines promote` prints for a metric it did not store for some cases: measured runs
    among its sources (`runs`, their paths) did not measure it."""
    shown = ", ".join(cases[:3]) + (f" and {len(cases) - 3} more" if len(cases) > 3 else "")
    return (f"  ! {metric} dropped from {len(cases)} case{'s' if len(cases) != 1 else ''} ({shown}): not measured "
            f"in {', '.join(runs)}, {'a measured run' if len(runs) == 1 else 'measured runs'} (a metric is kept "
            "when every measured run among the sources measured it; only a stored baseline file or proposal, or a "
            "run that did not count the case, may lack it)")


def write_updates(state, *, propose_dir: str | None = None) -> tuple[list[str], list[str]]:
    """Merge the run's measured cases into this hardware's baseline files (or into copies under
    propose_dir); returns (the lines to print, the case keys refused). Entries the run did not measure
    keep their bytes (see merge_files); a refused entry leaves the others written, and its lines say so."""
    updates = [(state.hardware_key, family, state.fingerprint, entries)
               for family, entries in state.entries_by_family().items()]
    merges = merge_files(updates, root=Path(propose_dir) if propose_dir else state.baseline_dir,
                         source_root=state.baseline_dir, proposal=bool(propose_dir))
    return merge_lines(merges, "proposed" if propose_dir else "updated")


def merge_lines(merges: list[Merge], verb: str) -> tuple[list[str], list[str]]:
    """(the lines that report merges, the case keys refused): per file what changed and its notes, then
    the refused entries (refusal_lines)."""
    lines: list[str] = []
    for m in merges:
        if not m.written:
            lines.append(f"moebench: {m.target}: {'no change' if not m.refused else 'NOT written (nothing to write)'}")
        else:
            lines.append(f"moebench: {verb} {m.target} ({len(m.changes)} change{'s' if len(m.changes) != 1 else ''})")
            lines.extend(change_line(c) for c in m.changes)
        lines.extend(change_line(n) for n in m.notes)
    refused, keys = refusal_lines(merges)
    return lines + refused, keys


def refusal_lines(merges: list[Merge]) -> tuple[list[str], list[str]]:
    """(a line per refused entry naming its case key and first problem, its other problems indented, and a
    closing line saying what to do; the refused case keys). No lines when none was refused."""
    lines: list[str] = []
    refused: list[str] = []
    for m in merges:
        for key, problems in sorted(m.refused.items()):
            refused.append(key)
            lines.append(f"moebench: {key}: baseline NOT written: {problems[0]}"
                         + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
            lines.extend(f"  {p}" for p in problems[1:])
    if refused:
        lines.append(f"moebench: {len(refused)} entr{'y' if len(refused) == 1 else 'ies'} NOT written "
                     f"({', '.join(refused)}): {ADVICE_REFUSED}")
    return lines, refused
