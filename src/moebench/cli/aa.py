"""`moebench aa`: a selection repeated in separate processes, the spread between them and any false
alarm, in one table (the runs and their statistics: moebench.history.aa)."""

from __future__ import annotations

import argparse
from pathlib import Path

from moebench.history import aa

from moebench.cli import baselines as cli_baselines

from moebench.core import hardware
from moebench.cli.common import EXIT_FOUND, EXIT_OK, CliError
from moebench.outputs.report import fmt_pct, fmt_value, table


def cmd_aa(args: argparse.Namespace) -> int:
    """Run the selection args.runs times, print the spread table; promote the runs when asked."""
    # argparse keeps the "--" that separates them; a later "--" is pytest's own
    pytest_args = (args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args) or ["benchmarks/"]
    if args.runs < 1:
        raise CliError(f"--runs {args.runs}: must be at least 1")
    if args.budget_s is not None and args.budget_s <= 0:
        raise CliError(f"--budget-s {args.budget_s}: must be a number of seconds > 0")
    per_gpu = getattr(args, "per_gpu", False)
    if per_gpu:
        if not hardware.fingerprint().get("gpus"):
            raise CliError("--per-gpu: NVML sees no GPU on this machine")
        files = aa.per_gpu(pytest_args, Path(args.out))
    else:
        files = aa.repeat(pytest_args, Path(args.out), args.runs, budget_s=args.budget_s)
    if not files:
        raise CliError(f"{args.out}: no run wrote results")
    rows = aa.spreads(aa.load_runs(files))
    body = [[r.key, r.metric, *(fmt_value(v, r.unit) if v is not None else "-" for v in r.values),
             fmt_pct(100 * r.spread), " ".join(v or "-" for v in r.verdicts), "FLAGGED" if r.flagged else ""]
            for r in rows]
    columns = [f"GPU {f.stem.removeprefix('gpu-')}" for f in files] if per_gpu else [f"run {i}" for i in range(1, len(files) + 1)]
    heads = ["case", "metric", *columns, "spread", "verdicts", ""]
    print(table(heads, body, right=tuple(range(2, 3 + len(files)))))
    flagged, median = aa.summary(rows)
    between = "GPUs" if per_gpu else "runs"
    print(f"moebench aa: {len(rows)} cases over {len(files)} {between}; median spread between {between} {fmt_pct(median)}; "
          f"{flagged} case{'s' if flagged != 1 else ''} read REGRESSION or IMPROVEMENT in some run")
    if args.promote:
        cli_baselines.cmd_baselines_promote(argparse.Namespace(source=[str(f) for f in files], case=None, all=True,
                                                               baseline_dir=args.promote, dry_run=False))
    return EXIT_FOUND if flagged else EXIT_OK
