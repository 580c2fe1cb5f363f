"""A nightly history: the results files under some folders, loaded oldest first, and each case's gated
metrics as series over those runs (what `moebench changes` and `moebench report` read).

A file that is not a readable moebench results file (cut off, corrupt, another tool's JSON) is skipped
with one line naming it and why: one bad night must not stop every later report, nor be used silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from moebench.history.changes import RunPoint, Series
from moebench.results.document import ResultsDoc, ResultsError
from moebench.history.runs import load_run

SUFFIXES = (".json", ".json.gz")


class HistoryError(ResultsError):
    """A path given that is neither a folder nor a file, or a history with no usable run; one line."""


@dataclass
class History:
    """The runs that loaded (oldest first, by `started`) and one line for each file skipped."""

    runs: list[ResultsDoc] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def results_files(paths: Iterable[str | Path]) -> list[Path]:
    """The results files named: a file as given, a folder searched recursively for *.json and *.json.gz
    (hidden files and folders left out: a write in progress is a hidden temporary file)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            out += sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(SUFFIXES)
                          and not any(part.startswith(".") for part in f.relative_to(p).parts))
        else:
            raise HistoryError(f"{p}: no such file or folder")
    return out


def load_history(paths: Iterable[str | Path]) -> History:
    """Load every results file under `paths`; the unreadable ones are skipped, each with its one-line
    reason. HistoryError when a path does not exist or no file loads."""
    paths = list(paths)
    h = History()
    for f in results_files(paths):
        try:
            h.runs.append(load_run(f))
        except ResultsError as e:
            h.skipped.append(str(e))
    if not h.runs:
        why = f" ({len(h.skipped)} skipped; the first: {h.skipped[0]})" if h.skipped else ""
        raise HistoryError(f"no moebench results file in {' '.join(map(str, paths))}{why}")
    h.runs.sort(key=lambda r: (r.started, r.path))
    return h


def case_series(runs: list[ResultsDoc]) -> list[Series]:
    """Each gated metric of each case over `runs` (oldest first), per hardware key. Only the runs since
    the case's definition last changed count (a new way of measuring is a new series, not a change
    point), and throttled runs do not (their numbers are not the device's). The tolerance is the latest
    run's: the stored baseline's when it compared, else the metric's own."""
    by_case: dict[tuple[str, str], list[ResultsDoc]] = {}
    for r in runs:
        for key in r.cases:
            by_case.setdefault((r.hardware_key, key), []).append(r)
    out: list[Series] = []
    for (hw, key), case_runs in sorted(by_case.items()):
        latest = case_runs[-1].cases[key]
        since = len(case_runs)
        while since > 0 and case_runs[since - 1].cases[key].definition_hash == latest.definition_hash:
            since -= 1
        same = [r for r in case_runs[since:] if not r.cases[key].throttled]
        for name, last in latest.metrics.items():
            if not last.gated:
                continue
            points = tuple(RunPoint(r.started, r.commit, r.cases[key].metrics[name].metric.value,
                                    r.cases[key].metrics[name].metric.noise, r.path)
                           for r in same if name in r.cases[key].metrics)
            tol = last.comparison.rel_tol if last.comparison and last.comparison.rel_tol is not None else last.metric.rel_tol
            out.append(Series(hw, key, name, last.metric.unit, last.metric.direction, tol, points, latest.family))
    return out
