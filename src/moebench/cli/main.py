"""The `moebench` command: what is not a test run.

    moebench compare A.json B.json            two runs side by side; exit 1 on a regression
    moebench backends RESULTS.json            MoE backends side by side per shape
    moebench baselines show|diff|promote|holdout   read, compare, (reviewed) update and hold-out-check baselines
    moebench aa --runs N --out DIR -- ARGS    a selection in N processes: spread between them, false alarms
    moebench report RESULTS... --out DIR      trend plots per case and an index page
    moebench changes DIR...                   change points over a nightly history
    moebench predict DECODE.json ALLREDUCE    TP-N ms/token from a rank's decode and a box's allreduce

Exit codes: 0 fine, 1 the comparison found what --fail-on names (a regression by default), 2 bad input
(a malformed file, an unknown case, an unknown option value), reported in one line without a traceback.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import textwrap
from pathlib import Path
from typing import Sequence

from moebench.cli import aa as cli_aa, baselines as cli_baselines, holdout as cli_holdout
from moebench.baselines.compare import Outcome, Verdict, display_rank
from moebench.baselines.schema import BaselineError
from moebench.baselines.store import BaselineSet
from moebench.cli.changes import read_changes, register as register_changes
from moebench.cli.common import EXIT_FOUND, EXIT_OK, EXIT_USAGE, CliError, check_patterns, matcher
from moebench.history.nightly import load_history
from moebench.results.document import ResultsError
from moebench.decode.engines_report import engines_tables
from moebench.outputs.report import fmt_fixed, fmt_pct, fmt_value, table, tables_text, tally
from moebench.history.runs import backend_matrix, compare_runs, load_run, merge_runs, resolve_reference

# What a comparison of two runs can say of a case: the gate's verdicts and MISSING.
VERDICT_NAMES = [v.value for v in Verdict] + [Outcome.MISSING.value]


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors on one line (and a pointer to --help) instead of usage + error."""

    def error(self, message: str):  # noqa: D102 (argparse API)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# --- small output helpers -----------------------------------------------------------------------

def _natural(s: str) -> list:
    """Sort key that puts m4 before m16."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


# --- compare ------------------------------------------------------------------------------------

def cmd_compare(args: argparse.Namespace) -> int:
    """Two runs side by side with the gate's verdict per case."""
    a, b = load_run(args.a), load_run(args.b)
    deltas = compare_runs(a, b, ignore_hardware=args.ignore_hardware)
    keep = matcher(args.case)
    check_patterns(args.case, [d.key for d in deltas], f"{args.a} or {args.b}")
    deltas = [d for d in deltas if keep is None or keep(d.key)]
    deltas.sort(key=lambda d: (display_rank(d.verdict), d.key))
    print(f"reference  {a.path}: {a.hardware_key}, {a.label}")
    print(f"candidate  {b.path}: {b.hardware_key}, {b.label}")
    if a.hardware_key != b.hardware_key and not args.ignore_hardware:
        print("(different hardware keys: not compared, ENV_MISMATCH; --ignore-hardware compares anyway)")
    print()
    rows = []
    for d in deltas:
        c = d.comparison
        note = c.reason if c and c.verdict is not Verdict.PASS else ""
        if d.verdict == Outcome.MISSING:
            note = "in the reference run only"
        elif c is None:
            note = "no gated metric: not compared"
        rows.append([d.verdict, d.key, d.metric or "-", fmt_value(d.before, d.unit), fmt_value(d.after, d.unit),
                     fmt_pct(d.delta_pct, signed=True), fmt_pct(100 * c.rel_tol if c and c.rel_tol is not None else None),
                     fmt_pct(100 * c.noise if c and c.noise is not None else None), note])
    print(table(["verdict", "case", "metric", "reference", "candidate", "delta", "tolerance", "noise band", "note"],
                rows, right=(3, 4, 5, 6, 7)))
    print()
    failing = [d for d in deltas if d.verdict in args.fail_on]
    # The last line is the tally (ci/nightly.sh shows it in the log): and why the exit code is 1.
    why = f" -> exit 1 ({len(failing)} {'/'.join(args.fail_on)})" if failing else ""
    print(tally(d.verdict for d in deltas) + why)
    return EXIT_FOUND if failing else EXIT_OK


# --- backends -----------------------------------------------------------------------------------

def cmd_backends(args: argparse.Namespace) -> int:
    """Backends side by side per shape: value, speedup against the reference backend, % of the floor;
    one table per --metric (decode: engines side by side, ms/token, TTFT and the routed experts' ms/step)."""
    decode = args.family == "decode"
    metrics = args.metric or ([None, "ttft_ms", "step_routed_experts_ms"] if decode else [None])
    run = merge_runs([load_run(p) for p in args.results])
    for i, metric in enumerate(metrics):
        if i:
            print()
        _backends_table(args, run, metric, by_engine=(args.by or ("engine" if decode else "backend")) == "engine",
                        required=bool(args.metric))
    if decode and not args.metric:  # where each engine's step goes, and what it chose to run
        for text in tables_text(engines_tables(run)):
            print()
            print(text)
    return EXIT_OK


def _backends_table(args: argparse.Namespace, run, metric: str | None, *, by_engine: bool, required: bool) -> None:
    reference = args.reference
    if reference is None:
        present = {c.backend for c in run.cases.values() if c.backend}
        reference = "vllm_triton" if "vllm_triton" in present else None
    floor = args.floor_metric
    if args.family == "decode" and metric not in (None, "ms_per_token") and floor == "pct_of_floor":
        # a step category against its own floor (pct_of_floor_routed_experts); TTFT has none
        floor = metric.replace("step_", "pct_of_floor_", 1).removesuffix("_ms") if metric.startswith("step_") else ""
    opts = dict(floor_metric=floor, family=args.family, by_engine=by_engine, required=required)
    backends, groups, metric = backend_matrix(run, reference=reference, metric=metric, **opts)
    reference = resolve_reference(reference, backends, run.path) if reference else backends[0]
    backends, groups, metric = backend_matrix(run, reference=reference, metric=metric, **opts)
    print(f"{run.path}: {run.hardware_key}, {run.label}")
    print(f"metric {metric}; speedup = times faster than {reference} on the same shape; "
          + (f"% = {floor} (100% = at the memory floor)" if floor else "no memory floor for this metric"))
    print()
    # Each cell is "value  speedup  % of floor [verdict]", its parts padded per column so they line up.
    parts: dict[tuple[str, str], list[str]] = {}
    for g, row in groups.items():
        for b, c in row.items():
            parts[g, b] = [fmt_value(c.value, c.unit), f"{fmt_fixed(c.speedup, 2)}x" if c.speedup is not None else "-",
                           fmt_pct(c.pct_of_floor, digits=0) if c.pct_of_floor is not None else "",
                           c.verdict if c.verdict not in (Verdict.PASS, Verdict.NEW) else ""]
    widths = {b: [max((len(v[i]) for (g, bb), v in parts.items() if bb == b), default=0) for i in range(4)]
              for b in backends}
    rows = []
    for g in sorted(groups, key=_natural):
        cells = [g]
        for b in backends:
            p = parts.get((g, b))
            cells.append("-" if p is None else "  ".join(x.rjust(w) for x, w in zip(p, widths[b]) if w).rstrip())
        rows.append(cells)
    print(table(["shape"] + [b + (" (ref)" if b == reference else "") for b in backends], rows,
                right=tuple(range(1, len(backends) + 1))))


# --- report -------------------------------------------------------------------------------------

def cmd_report(args: argparse.Namespace) -> int:
    """Trend plots per case over the runs, and index.html + index.md listing the latest verdicts."""
    from moebench.outputs import plots, report_page

    try:
        plots.require_matplotlib()
    except plots.PlotsUnavailable as e:
        raise CliError(str(e)) from None
    history = load_history(args.results)  # a file that does not load is named and skipped
    for line in history.skipped:
        print(f"moebench report: skipped {line}", file=sys.stderr)
    runs = history.runs
    check_patterns(args.case, sorted({k for r in runs for k in r.cases}), " or ".join(args.results))
    if args.metric and not any(args.metric in c.metrics for r in runs for c in r.cases.values()):
        raise CliError(f"--metric {args.metric!r}: no case in the given runs has this metric")
    baselines = None
    if args.baseline_dir:
        root = Path(args.baseline_dir)
        if not root.is_dir():
            raise CliError(f"--baseline-dir {args.baseline_dir}: no such folder")
        baselines = {hw: BaselineSet.load(root, hw) for hw in {r.hardware_key for r in runs}}
    changes = read_changes(args.changes) if args.changes else None
    try:
        notes = tuple(Path(args.note).read_text(encoding="utf-8").splitlines()) if args.note else ()
    except (OSError, UnicodeDecodeError) as e:
        raise CliError(f"--note {args.note}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    rows, written = report_page.write_report(runs, Path(args.out), metric=args.metric, baselines=baselines,
                                             case_filter=matcher(args.case), changes=changes, notes=notes)
    pngs = [p for p in written if p.suffix == ".png" and p.parent.name == "plots"]  # the trends, not the charts
    print(report_page.index_text(rows))
    print()
    print(f"{len(pngs)} plot{'s' if len(pngs) != 1 else ''} from {len(runs)} run{'s' if len(runs) != 1 else ''} "
          f"in {Path(args.out) / 'plots'}; index: {Path(args.out) / 'index.html'}, {Path(args.out) / 'index.md'}")
    return EXIT_OK


def cmd_predict(args: argparse.Namespace) -> int:
    """A TP-N ms/token from a rank's decode result and a box's allreduce latency, every term shown."""
    from moebench.decode import predict

    try:
        p = predict.predict(Path(args.decode), Path(args.allreduce), world=args.world, transport=args.transport,
                            scale=args.allreduce_scale, case_pattern=args.case, layers=args.layers, hidden=args.hidden,
                            backend=args.backend)
    except predict.PredictError as e:
        raise CliError(str(e)) from None
    if args.json:
        print(predict.as_json(p))
        return EXIT_OK
    print(table(["term", "ms/step", "share"], p.rows()))
    print("\n".join(["", *p.sources()]))
    print(f"allreduce share of the predicted TP{p.world} step: {fmt_pct(100 * p.allreduce_share)}")
    print("assumed: " + "; ".join(predict.ASSUMPTIONS))
    return EXIT_OK


# --- the parser ---------------------------------------------------------------------------------

def _wrap(text: str) -> str:
    """Descriptions are wrapped here (the raw formatter keeps the examples' line breaks as written)."""
    return "\n".join(textwrap.fill(par, 96) for par in text.split("\n"))


def _sources_and_cases(p: argparse.ArgumentParser, verb: str) -> None:
    """The arguments promote and holdout share: SOURCE runs, --case or --all, --baseline-dir."""
    p.add_argument("source", metavar="SOURCE", nargs="+",
                   help="results JSON, proposed baseline file, or proposal folder (several: independent runs)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--case", action="append", metavar="PATTERN", help=f"cases to {verb} (glob; repeatable)")
    which.add_argument("--all", action="store_true", help="every case of SOURCE")
    p.add_argument("--baseline-dir", default="baselines", metavar="DIR", help="baseline root (default: baselines)")


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree of `moebench` (exposed for tests and docs)."""
    def fmt(prog: str) -> argparse.HelpFormatter:
        return argparse.RawDescriptionHelpFormatter(prog, max_help_position=32)

    p = _Parser(prog="moebench", formatter_class=fmt,
                description="Look at moebench results and baselines (the measuring is `pytest benchmarks/`).",
                epilog="exit codes: 0 fine, 1 what --fail-on names was found (compare), a change that loosens "
                       "the gate (baselines diff --exit-code), a false alarm (aa) or a recent change point "
                       "towards worse (changes), 2 bad input.\nSee `moebench COMMAND --help`.")
    sub = p.add_subparsers(dest="command", title="commands",
                          metavar="{compare,backends,baselines,aa,report,changes,predict}",
                          required=True)

    c = sub.add_parser("compare", formatter_class=fmt, help="two runs side by side; exit 1 on a regression",
                       description=_wrap("Compare a candidate run with a reference run, case by case, with the gate's own "
                                   "verdict (the reference's rel_tol and the larger noise of the two). Exit 1 when a case's "
                                   "verdict is one --fail-on names (REGRESSION by default), 2 on bad input."),
                       epilog="example: moebench compare out/last-night/results.json out/tonight/results.json")
    c.add_argument("a", metavar="REFERENCE.json", help="results file of the reference run (--results-json; .json.gz too)")
    c.add_argument("b", metavar="CANDIDATE.json", help="results file of the run under test")
    c.add_argument("--case", action="append", metavar="PATTERN", help="only these cases (glob; repeatable)")
    c.add_argument("--fail-on", nargs="+", default=[Verdict.REGRESSION.value], choices=VERDICT_NAMES, metavar="VERDICT",
                   help=f"verdicts that make the exit code 1 (default: REGRESSION; choices: {', '.join(VERDICT_NAMES)})")
    c.add_argument("--ignore-hardware", action="store_true",
                   help="compare runs of different hardware keys (otherwise ENV_MISMATCH, not compared)")
    c.set_defaults(func=cmd_compare)

    b = sub.add_parser("backends", formatter_class=fmt, help="MoE backends (decode: engines) side by side per shape",
                       description=_wrap("One row per shape group, one column per backend: the metric's value, the "
                                   "speedup against the reference backend and the % of the memory floor.\n"
                                   "Reads info.backend of each case, and groups by the case's group, info.group, "
                                   "info.shape, or the key without its backend token."),
                       epilog="example: moebench backends out/results.json --reference vllm_triton --metric graph_us\n"
                              "         moebench backends vllm.json sglang.json --family decode   # engines per rank")
    b.add_argument("results", metavar="RESULTS.json", nargs="+",
                   help="results file(s) of one hardware key with several backends (or engines: runs of each)")
    b.add_argument("--by", choices=("backend", "engine"),
                   help="columns: the MoE backend, or engine/kernel with one row per scenario's rank (default: "
                        "engine for --family decode, else backend)")
    b.add_argument("--reference", metavar="BACKEND",
                   help="backend the speedups are against (default: vllm_triton when present, else the first)")
    b.add_argument("--metric", metavar="NAME", action="append",
                   help="metric to put side by side, one table each (repeatable; default: each case's primary, and "
                        "for --family decode also ttft_ms and step_routed_experts_ms, blank where a case has none)")
    b.add_argument("--floor-metric", default="pct_of_floor", metavar="NAME",
                   help="metric giving the %% of the floor (default: pct_of_floor)")
    b.add_argument("--family", metavar="NAME", help="only cases of this family (e.g. gemm)")
    b.set_defaults(func=cmd_backends)

    bl = sub.add_parser("baselines", formatter_class=fmt, help="show, diff, promote or hold out baseline files",
                        description="Baseline files: baselines/<hardware-key>/<family>.json.")
    bsub = bl.add_subparsers(dest="baselines_command", title="actions", metavar="{show,diff,promote,holdout}", required=True)
    s = bsub.add_parser("show", formatter_class=fmt, help="a table of a baseline file or folder, with provenance")
    s.add_argument("path", metavar="PATH", help="a <family>.json, a <hardware-key>/ folder, or the baselines/ root")
    s.add_argument("--case", action="append", metavar="PATTERN", help="only these cases (glob; repeatable)")
    s.add_argument("--short", action="store_true",
                   help="only the metrics short of 3 independent runs on 2 machines (what the next lease should run)")
    s.set_defaults(func=cli_baselines.cmd_baselines_show)
    d = bsub.add_parser("diff", formatter_class=fmt, help="what changed between two baseline files or folders",
                        epilog="example (a reviewer's check of a pull request): "
                               "moebench baselines diff origin/main:baselines baselines --exit-code")
    d.add_argument("a", metavar="OLD", help="baseline file or folder, or REV:PATH in git (origin/main:baselines)")
    d.add_argument("b", metavar="NEW", help="baseline file or folder, or REV:PATH in git")
    d.add_argument("--exit-code", action="store_true",
                   help="exit 1 when a change loosens the gate (marked [LOOSER]: an entry or metric removed, "
                        "rel_tol or noise up, a direction flipped)")
    d.set_defaults(func=cli_baselines.cmd_baselines_diff)
    pr = bsub.add_parser("promote", formatter_class=fmt, help="write reviewed values into the baseline folder",
                         description=_wrap("Take the selected cases of a reviewed results file (--results-json) or of "
                                     "proposed baselines (--baseline-propose DIR) into the baseline folder. Several "
                                     "SOURCEs are independent runs (separate processes or machines): a case in "
                                     "more than one is stored as the median of its runs, with the spread between "
                                     "them as its noise and, over two or more machines, the spread between machines "
                                     "(moebench.baselines.combine). A SOURCE may be a stored baseline file "
                                     "(the committed one, to keep its machines): a metric it predates is kept over "
                                     "the sources that measured it, naming its own machines; a metric a results "
                                     "file lacks is dropped, and said. Entries not selected keep their bytes; a stored "
                                     "rel_tol is kept; every file is validated before any is written, and each "
                                     "write is atomic."),
                         epilog="example: moebench baselines promote run1.json run2.json run3.json --case 'gemm[kimi-*-triton]'")
    _sources_and_cases(pr, "promote")
    pr.add_argument("--dry-run", action="store_true", help="print what would change, write nothing")
    pr.set_defaults(func=cli_baselines.cmd_baselines_promote)
    ho = bsub.add_parser("holdout", formatter_class=fmt, help="each machine held out, gated against the others' entries",
                         description=_wrap("Before a promotion of runs from several machines: each machine in turn "
                                     "plays a fresh one. Its runs of the selected cases are gated (as on a machine "
                                     "that recorded none of the entries) against what promote would store from the "
                                     "other machines' runs, over the entries in --baseline-dir. On unchanged code a "
                                     "REGRESSION or IMPROVEMENT is a false verdict: exit 1, with each one listed. "
                                     "Cases measured on fewer than 3 machines are left out. Writes nothing."),
                         epilog="example: moebench baselines holdout A/run-1.json B/run-1.json C/run-1.json --case 'gemm[*-triton]'")
    _sources_and_cases(ho, "hold out")
    ho.set_defaults(func=cli_holdout.cmd_baselines_holdout)

    aa = sub.add_parser("aa", formatter_class=fmt, help="a selection N times in separate processes: spread and false alarms",
                        description=_wrap("Run `python -m pytest PYTEST_ARGS` RUNS times, each a separate process writing "
                                    "OUT/run-<i>.json and gated as usual, then print per case its primary metric in "
                                    "every run, the spread between the runs and their verdicts. Exit 1 when any run "
                                    "read REGRESSION or IMPROVEMENT (a false alarm on unchanged code). --promote DIR "
                                    "stores the runs' medians as baselines (moebench baselines promote of every run)."),
                        epilog='example: moebench aa --runs 3 --out aa/ -- benchmarks/ -m "gemm and triton"')
    aa.add_argument("--runs", type=int, default=3, help="separate pytest processes (default 3)")
    aa.add_argument("--out", required=True, metavar="DIR", help="where the runs' results files go")
    aa.add_argument("--promote", metavar="DIR", help="store the combined runs into this baseline root")
    aa.add_argument("--budget-s", type=float, metavar="S", help="start no run that would end past S seconds")
    aa.add_argument("--per-gpu", action="store_true",
                    help="one run on each GPU of the box instead of --runs (each process sees one GPU, keeps the box's "
                         "hardware key): the spread between GPUs, 'is GPU 5 slower than GPU 0?'")
    aa.add_argument("pytest_args", nargs=argparse.REMAINDER, metavar="-- PYTEST_ARGS",
                    help="what each run passes to pytest (default: benchmarks/)")
    aa.set_defaults(func=cli_aa.cmd_aa)

    r = sub.add_parser("report", formatter_class=fmt, help="trend plots per case and an index page",
                       description=_wrap("Plot each case's metric over the given runs (dates on the x axis, the baseline "
                                   "and its tolerance band, points coloured by verdict) into OUT/plots/, and write "
                                   "OUT/index.html and OUT/index.md with every case's latest verdict (MISSING: not in the latest "
                                   "run of its family on its hardware). Results files may be .json.gz. Needs "
                                   "matplotlib (pip install 'moebench[plots]')."),
                       epilog="example: moebench report ~/.moebench/history/*.json --out out/report")
    r.add_argument("results", nargs="+", metavar="RESULTS.json",
                   help="results files or folders of them, in any order (sorted by date; unreadable ones skipped)")
    r.add_argument("--out", required=True, metavar="DIR", help="folder for plots/, index.html and index.md")
    r.add_argument("--metric", metavar="NAME", help="metric to plot (default: each case's primary)")
    r.add_argument("--baseline-dir", metavar="DIR",
                   help="draw the baselines stored here (default: the baseline each run recorded)")
    r.add_argument("--case", action="append", metavar="PATTERN", help="only these cases (glob; repeatable)")
    r.add_argument("--changes", metavar="CHANGES.json", help="change points to mark and list (moebench changes --json)")
    r.add_argument("--note", metavar="FILE", help="lines to show under the tally (ci/nightly.sh: baselines not written)")
    r.set_defaults(func=cmd_report)
    register_changes(sub, fmt)

    pd = sub.add_parser("predict", formatter_class=fmt, help="TP-N ms/token from a rank's decode and a box's allreduce",
                        description=_wrap("Predict a TP-N decode step from a decode result of one TP rank's share of a "
                                    "model (kimi-k2.5-int4-rank: one of Kimi-K2.5's TP8 ranks) and the allreduce latency "
                                    "of a box (a results file or its baselines): the rank's steady ms/token plus two "
                                    "allreduces of one token's hidden state per layer, in graph mode. Every term and "
                                    "assumption is printed; a missing input is named."),
                        epilog="example: moebench predict out/decode.json baselines/nvidia-h200-x2 --world 2\n"
                               "         moebench predict out/decode.json baselines/nvidia-h200-x2 --world 2 "
                               "--allreduce-scale 0.5   # what if allreduce were 2x faster")
    pd.add_argument("decode", metavar="DECODE.json", help="results file of a decode run (--results-json; .json.gz too)")
    pd.add_argument("allreduce", metavar="ALLREDUCE",
                    help="allreduce results file, baseline file, or a baselines/<hardware-key>/ folder")
    pd.add_argument("--world", type=int, required=True, metavar="N", help="tensor-parallel size to predict")
    pd.add_argument("--transport", default="auto", choices=("auto", "pcie", "pcie-p2p"),
                    help="the allreduce cases' transport (default: auto, NCCL's own choice)")
    pd.add_argument("--backend", default="nccl", choices=("nccl", "vllm_custom_ar"),
                    help="the allreduce the engine uses (default: nccl; vLLM takes vllm_custom_ar for decode sizes "
                         "on NVLink and on two PCIe GPUs)")
    pd.add_argument("--allreduce-scale", type=float, default=1.0, metavar="X",
                    help="multiply the allreduce latency by X (0.5: twice as fast)")
    pd.add_argument("--case", metavar="TEXT", help="the decode case whose key contains TEXT (default: the profiled one)")
    pd.add_argument("--layers", type=int, metavar="N", help="layers of the model (default: from the shipped config)")
    pd.add_argument("--hidden", type=int, metavar="N", help="hidden size (default: from the shipped config)")
    pd.add_argument("--json", action="store_true", help="the terms as JSON instead of a table")
    pd.set_defaults(func=cmd_predict)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `moebench` console script; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        code = args.func(args)
        # Flushed here, inside the try: a reader that left early (`| head`) otherwise surfaces as an
        # "Exception ignored" message from the interpreter's own flush at exit.
        sys.stdout.flush()
        return code
    except (CliError, ResultsError, BaselineError) as e:
        print(f"moebench {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    # Before OSError, of which it is a subclass: caught after it, a closed pipe read "error: : Broken pipe".
    except BrokenPipeError:  # `moebench ... | head`: the reader has what it wanted
        _silence_stdout()
        return EXIT_OK
    except OSError as e:  # an output folder that cannot be written, say
        print(f"moebench {args.command}: error: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return EXIT_USAGE


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's flush at exit does not hit the closed pipe again
    (the recipe of Python's signal docs, "Note on SIGPIPE")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
