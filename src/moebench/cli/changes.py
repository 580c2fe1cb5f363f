"""`moebench changes DIR...`: change points over a nightly history, one line each.

Reads every results file under the folders (any mix of families and jobs), orders the runs by their
`started` date, and prints one line per reported change point of each case's gated metrics (see
moebench.history.changes for what is reported), beginning with the case id. Unreadable files are named on
stderr, one line each, and skipped. Change points acknowledged by a newer baseline (`--baseline-dir`) or
a note (`--acknowledged FILE`, moebench.history.acknowledge) are counted, not printed.

Exit codes: 0 no change towards worse in any series' last 3 runs, 1 one or more, 2 bad input (one line).
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

from moebench.history.acknowledge import AcknowledgeError, Note, acknowledged_by_baseline, load_notes
from moebench.baselines.schema import BaselineError
from moebench.baselines.store import BaselineSet
from moebench.history.changes import RECENT, ChangePoint, ChangesUnavailable, find_changes, require_ruptures
from moebench.core.files import atomic_write_text
from moebench.history.nightly import HistoryError, case_series, load_history
from moebench.outputs.report import change_line, changes_markdown, changes_tally

EXIT_OK, EXIT_FOUND, EXIT_USAGE = 0, 1, 2


def register(sub: argparse._SubParsersAction, formatter) -> None:
    """Add `changes` to the `moebench` command's subparsers."""
    about = ("Find change points in each case's gated metrics over the runs in the folders (results files, any "
             "families, ordered by their start date): one line per change, beginning with the case id, with the runs "
             "before and after it, its size and direction, and the noise it was judged against. A change smaller "
             "than the noise band or half the case's tolerance is not reported. Exit 1 when a change towards worse "
             f"lies in a series' last {RECENT} runs, 2 on bad input.")
    c = sub.add_parser("changes", formatter_class=formatter, description=textwrap.fill(about, 96),
                       help="change points over a nightly history; exit 1 on a recent worse one",
                       epilog="example: moebench changes ~/.moebench/history/nvidia-h200-x1 --baseline-dir baselines "
                              "--acknowledged ci/acknowledged-changes.toml")
    c.add_argument("folders", nargs="+", metavar="DIR", help="folders of results files (searched recursively), or files")
    c.add_argument("--baseline-dir", metavar="DIR",
                   help="a change is acknowledged when its case's baseline here was recorded after it")
    c.add_argument("--acknowledged", metavar="FILE", help="TOML notes of accepted change points ([[acknowledged]])")
    c.add_argument("--json", metavar="PATH", help="also write the change points as JSON (moebench report --changes)")
    c.add_argument("--markdown", metavar="PATH", help="also write them as a markdown section (for summary.md)")
    c.set_defaults(func=cmd_changes)


def cmd_changes(args: argparse.Namespace) -> int:
    """Print the change points; see the module docstring for the exit codes."""
    try:
        return _changes(args)
    except (HistoryError, AcknowledgeError, BaselineError, ChangesUnavailable) as e:
        print(f"moebench changes: error: {e}", file=sys.stderr)
        return EXIT_USAGE


def _changes(args: argparse.Namespace) -> int:
    require_ruptures()
    notes = load_notes(args.acknowledged) if args.acknowledged else []
    if args.baseline_dir and not Path(args.baseline_dir).is_dir():
        raise HistoryError(f"--baseline-dir {args.baseline_dir}: no such folder")
    history = load_history(args.folders)
    for line in history.skipped:
        print(f"moebench changes: skipped {line}", file=sys.stderr)
    series = case_series(history.runs)
    baselines = {hw: BaselineSet.load(Path(args.baseline_dir), hw) for hw in {s.hardware_key for s in series}} \
        if args.baseline_dir else {}
    found = [cp for s in series for cp in find_changes(s)]
    shown = [cp for cp in found if not _acknowledged(cp, notes, baselines)]
    for cp in shown:
        print(change_line(cp))
    if args.json:
        doc = {"runs": len(history.runs), "series": len(series), "acknowledged": len(found) - len(shown),
               "skipped": history.skipped, "changes": [cp.to_json() for cp in shown]}
        atomic_write_text(Path(args.json), json.dumps(doc, indent=2, sort_keys=True) + "\n")
    if args.markdown:
        atomic_write_text(Path(args.markdown), changes_markdown(shown))
    failing = sum(cp.failing for cp in shown)
    extra = [f"{len(found) - len(shown)} acknowledged"] * (len(found) != len(shown))
    extra += [f"{len(history.skipped)} file{'s' if len(history.skipped) != 1 else ''} skipped"] * bool(history.skipped)
    print(f"{changes_tally(shown)} in {len(series)} series over {len(history.runs)} runs"
          + "".join(f"; {x}" for x in extra) + (" -> exit 1" if failing else ""))
    return EXIT_FOUND if failing else EXIT_OK


def _acknowledged(cp: ChangePoint, notes: list[Note], baselines: dict[str, BaselineSet]) -> bool:
    stored = baselines.get(cp.hardware_key)
    return any(n.matches(cp) for n in notes) or (stored is not None and acknowledged_by_baseline(cp, stored))


def read_changes(path: str | Path) -> list[ChangePoint]:
    """The change points a `--json` file holds; HistoryError in one line when it is not one."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
        return [ChangePoint.from_json(d) for d in doc["changes"]]
    except FileNotFoundError:
        raise HistoryError(f"{path}: no such file") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise HistoryError(f"{path}: not a `moebench changes --json` file ({type(e).__name__}: {e})") from None
