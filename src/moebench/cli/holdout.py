"""`moebench baselines holdout`: each machine of a promotion's sources held out and gated against the
entries the others would make (moebench.baselines.holdout); exit 1 on a false verdict."""

from __future__ import annotations

import argparse
from pathlib import Path

from moebench.baselines.holdout import false_verdicts, hold_out, machine_group
from moebench.baselines.store import family_path, load_file
from moebench.cli.baselines import promotion_source
from moebench.cli.common import EXIT_FOUND, EXIT_OK, CliError, check_patterns, matcher
from moebench.outputs.report import fmt_pct, fmt_value, table, tally


def cmd_baselines_holdout(args: argparse.Namespace) -> int:
    """Gate each machine group's runs of the selected cases against the other groups' combined entries,
    prepared over the entries in --baseline-dir as promote would; print a tally per machine and every
    false verdict; exit 1 when there is one."""
    where = " ".join(args.source)
    parts = [src for p in args.source for src in promotion_source(Path(p))]
    check_patterns(args.case, [k for src in parts for k in src.entries], where)
    keep = matcher(args.case) if not args.all else (lambda k: True)
    runs: dict[str, list[dict]] = {}
    from_stored: dict[str, list[bool]] = {}  # as promote combines them: a stored source may predate a metric,
    uncounted: dict[str, list[bool]] = {}    # and a run that did not count the case lacks its counters
    stored: dict[str, dict] = {}
    for src in parts:
        target = family_path(Path(args.baseline_dir), src.hardware_key, src.family)
        now = load_file(target)["entries"] if target.is_file() else {}
        for k, e in src.entries.items():
            if keep(k):
                runs.setdefault(k, []).append({f: v for f, v in e.items() if f not in ("_verdict", "_counted")})
                from_stored.setdefault(k, []).append(src.stored)
                uncounted.setdefault(k, []).append(not src.stored and not e.get("_counted"))
                if k in now:
                    stored[k] = now[k]
    rows = hold_out(runs, stored, from_stored, uncounted)
    if not rows:
        groups = {machine_group(e) for es in runs.values() for e in es}
        raise CliError(f"{where}: no selected case was measured on 3 or more machines (machines: "
                       f"{', '.join(sorted(groups)) or 'none'}): nothing to hold out")
    for machine in sorted({r.machine for r in rows}):
        mine = [r for r in rows if r.machine == machine]
        print(f"held out {machine}: {len(mine)} case-runs against entries of {max(r.others for r in mine)} other "
              f"machines at most: {tally(r.verdict.value for r in mine)}")
    wrong = false_verdicts(rows)
    if wrong:
        print(table(["held out", "case", "metric", "verdict", "value", "entry", "delta", "tolerance"],
                    [[r.machine, r.key, n, c.verdict.value, fmt_value(c.value), fmt_value(c.baseline),
                      fmt_pct(c.delta_pct, signed=True), fmt_pct(100 * (c.rel_tol or 0))] for r, n, c in wrong],
                    right=(4, 5, 6, 7)))
        print(f"moebench baselines holdout: {len(wrong)} false verdict{'s' if len(wrong) != 1 else ''} on unchanged "
              "code: the entries would not gate a fresh machine as they should (more machines, or a wider rel_tol)")
    return EXIT_FOUND if wrong else EXIT_OK
