"""The pytest plugin: options, marker checks, the `moebench` fixture, and the closing report.

Hooks and options only; the logic lives in session.py (run state), baselines/ (schema, store, verdict)
and report.py (tables, JSON).
"""

from __future__ import annotations

import contextlib
import re
import sys
from pathlib import Path
from typing import Callable, Mapping

import pytest

from moebench.suite import compat, interrupts, selection, xdist_glue

from moebench.core import hardware

from moebench.outputs import report
from moebench.suite.selection import marker_names_in  # noqa: F401 (benchmarks and tests import it from here)
from moebench.suite.benchmark_tables import hide_benchmark_tables
from moebench.outputs.baseline_lines import write_updates
from moebench.baselines.compare import Verdict
from moebench.baselines.schema import BaselineError
from moebench.baselines.store import BaselineSet, check_writable, other_hardware_problems
from moebench.suite.case_gpus import case_gpu, gpus_needed
from moebench.suite.family_options import add_family_options
from moebench.outputs.family_tables import family_tables
from moebench.core.metrics import Metric
from moebench.suite.outcomes import TestOutcomes
from moebench.results.document import Row
from moebench.suite.session import CaseResult, RunState
from moebench.suite.unmeasured import StrictCoverage

STATE = pytest.StashKey[RunState]()
_UPDATE_LINES = pytest.StashKey[list]()
_WARNINGS = pytest.StashKey[list]()  # shown at the start and again in the closing lines
_FULL_DESELECTED = pytest.StashKey[int]()  # `full` cases left out of the default selection
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    g = parser.getgroup("moebench", "moebench: baselines and verdicts")
    # Now, not in pytest_configure: xdist asks `-n auto` of its hook before configuring (its options with it).
    pluginmanager.register(xdist_glue, "moebench-xdist")
    g.addoption("--baseline-dir", default="baselines", metavar="DIR",
                help="root of the baseline files, <DIR>/<hardware-key>/<family>.json (default: baselines)")
    g.addoption("--baseline-update", action="store_true",
                help="write the measured values of the selected cases into this hardware's baseline files; "
                     "every other entry keeps its bytes")
    g.addoption("--baseline-propose", metavar="DIR", default=None,
                help="write the would-be updated baseline files under DIR instead of touching --baseline-dir")
    g.addoption("--baseline-strict", action="store_true", help="NEW and STALE cases fail (for CI)")
    g.addoption("--results-json", metavar="PATH", default=None,
                help="write every case (key, metrics, verdict, baseline, delta, noise, fingerprint) here")
    g.addoption("--summary-md", metavar="PATH", default=None,
                help="write the closing verdict table as markdown here (also appended to $GITHUB_STEP_SUMMARY)")
    g.addoption("--hardware-key", metavar="KEY", default=None,
                help="use this hardware key instead of the one detected through NVML (a slug: lowercase "
                     "letters and digits joined by single '-', like nvidia-h200-x1)")
    g.addoption("--baseline-other-hardware", action="store_true",
                help="let --baseline-update / --baseline-propose write under a --hardware-key that is not this "
                     "machine's; without it they write only the detected hardware's files")
    g.addoption("--benchmark-tables", action="store_true",
                help="also print pytest-benchmark's own result tables (off by default; its --benchmark-json, "
                     "-save, -compare and -histogram work either way)")
    add_family_options(g)  # the families' own (decode's --decode-*), from their registry


def _registered_markers(config: pytest.Config) -> set[str]:
    return {re.split(r"[:(]", line, maxsplit=1)[0].strip() for line in config.getini("markers")}


@pytest.hookimpl(wrapper=True)
def pytest_sessionstart(session: pytest.Session):
    # Checked here, not in pytest_configure: pytest's own markers (skip, xfail, parametrize, ...) and
    # plugins' (pytest-benchmark's `benchmark`) are registered by their pytest_configure hooks, which ran
    # after this plugin's, so `-m "not xfail"` used to be refused as an unknown marker.
    config = session.config
    markexpr = config.getoption("markexpr", default="") or ""
    if hint := selection.positional_argument_hint(markexpr):
        raise pytest.UsageError(hint)
    unknown = sorted(marker_names_in(markexpr) - _registered_markers(config))
    if unknown:
        raise pytest.UsageError(f"-m {markexpr!r}: unknown marker {', '.join(map(repr, unknown))} "
                                f"(known: {', '.join(sorted(_registered_markers(config)))})")
    yield
    # After the yield: below the terminal reporter's header, where a reader starts.
    tr = config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        for line in config.stash.get(_WARNINGS, []):
            tr.write_line(line, yellow=True, bold=True)


def pytest_configure(config: pytest.Config) -> None:
    config.add_cleanup(interrupts.sigterm_as_interrupt())  # first: a SIGTERM while starting ends as Ctrl-C does
    if problem := compat.installed_problem():  # before every case errors at setup over it
        raise pytest.UsageError(problem)
    try:
        _configure(config)
    except KeyboardInterrupt:
        # pytest prints nothing for an interrupt this early (its terminal reporter is not set up yet).
        sys.stderr.write("moebench: interrupted while starting: nothing was measured or written\n")
        raise


def _configure(config: pytest.Config) -> None:
    root = Path(config.getoption("baseline_dir"))
    if not root.is_absolute():
        root = Path(config.rootpath) / root
    update, propose = config.getoption("baseline_update"), config.getoption("baseline_propose")
    strict = config.getoption("baseline_strict")
    if update and propose:
        raise pytest.UsageError("moebench: --baseline-update and --baseline-propose DIR: choose one (update rewrites "
                                "the files under --baseline-dir, propose writes copies under DIR)")
    forced = config.getoption("hardware_key")
    if forced is not None and not hardware.is_key(forced):
        raise pytest.UsageError(f"moebench: --hardware-key {forced!r}: not a hardware key ({hardware.KEY_RULE})")
    fp = hardware.fingerprint()
    detected = hardware.hardware_key(fp)
    key = forced or detected
    warnings = []
    if (update or propose) and key != detected:
        # Numbers measured here, filed under another machine's key, were the committed H200 baselines
        # overwritten with CPU numbers. Allowed only when asked for, and then said at start and end.
        what = "--baseline-update" if update else "--baseline-propose"
        if not config.getoption("baseline_other_hardware"):
            raise pytest.UsageError(f"moebench: --hardware-key {key}: {what} writes only this machine's baselines "
                                    f"({detected}); add --baseline-other-hardware to write under {key}")
        warnings.append(f"moebench: WARNING: --baseline-other-hardware: {what} files numbers measured on {detected} "
                        f"under {key}")
    if not root.is_dir():
        # A typo (--baseline-dir baseline) used to make every case NEW without a word.
        problem = f"--baseline-dir {root}: {'not a folder' if root.exists() else 'no such folder'}"
        if strict:
            raise pytest.UsageError(f"moebench: {problem} (--baseline-strict: every case would be NEW)")
        warnings.append(f"moebench: WARNING: {problem}: every case is NEW"
                        + (" (--baseline-update creates it)" if update else ""))
    try:
        baselines = BaselineSet.load(root, key)
        # Other hardware's files are not this run's to validate (a broken one is skipped and the run goes
        # on), but each is named: skipped in silence, its entries' ENV_MISMATCH rows just went missing.
        warnings += [f"moebench: WARNING: {problem} (another hardware's baseline file: skipped, its entries not shown)"
                     for problem in other_hardware_problems(root, key)]
        if update:
            check_writable(root / key)
        if propose:
            check_writable(Path(propose))
        # Checked now, not after an hour of measuring: an unwritable report path used to surface only
        # at session end, as an INTERNALERROR traceback after every measurement was taken.
        for opt in ("results_json", "summary_md"):
            out = config.getoption(opt)
            if out:
                check_writable(Path(out).parent, f"folder of --{opt.replace('_', '-')} {out}")
                if Path(out).is_dir():
                    raise BaselineError(f"--{opt.replace('_', '-')} {out}: is a folder, not a file")
    except BaselineError as e:
        raise pytest.UsageError(f"moebench: {e}") from None
    config.stash[STATE] = RunState(baseline_dir=root, hardware_key=key, fingerprint=fp, strict=strict,
                                   update=update, baselines=baselines, key_forced=forced is not None)
    config.stash[_UPDATE_LINES] = []
    config.stash[_WARNINGS] = warnings
    config.pluginmanager.register(TestOutcomes(config.stash[STATE]), "moebench-outcomes")
    xdist_glue.register_merge(config, config.stash[STATE])  # an -n controller: the workers' cases come here
    if strict and not update:  # stored entries the run selected but did not measure fail it
        config.pluginmanager.register(StrictCoverage(config.stash[STATE]), "moebench-strict-coverage")


def pytest_report_header(config: pytest.Config) -> list[str]:
    s = config.stash.get(STATE, None)
    if s is None:
        return []
    gpus = s.fingerprint.get("gpus") or []
    what = f"{len(gpus)} x {gpus[0]['name']}" if gpus else f"CPU {s.fingerprint['cpu']['model']}"
    return [f"moebench: hardware key {s.hardware_key} ({what}); baselines {s.baseline_dir}"
            + (" [update]" if s.update else "") + (" [strict]" if s.strict else "")]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    selection.raise_deferred(config)  # a selected family whose cases could not be built (decode scenarios)
    # `full` cases are outside the default selection: they run only when -m names `full`.
    if "full" in marker_names_in(config.getoption("markexpr", default="") or ""):
        return
    keep, drop = [], []
    for item in items:
        (drop if item.get_closest_marker("full") else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    config.stash[_FULL_DESELECTED] = len(drop)


def pytest_report_collectionfinish(config: pytest.Config) -> list[str]:
    """Under pytest's "collected N items / M deselected" line: how many of those are the `full` cases."""
    n = config.stash.get(_FULL_DESELECTED, 0)
    if not n:
        return []
    return [f"moebench: {n} of the deselected are outside the default selection (the full product of the axes, "
            f"marker `full`: -m full runs them); any others, by your -m/-k"]


def pytest_runtest_setup(item: pytest.Item) -> None:
    need = gpus_needed(item)
    if need:
        have = hardware.visible_gpu_count()
        if have < need:
            pytest.skip(f"needs {need} CUDA GPU{'s' if need > 1 else ''}, NVML sees {have} visible here")


class CaseRecorder:
    """The `moebench` fixture: measure a case, gate it against its baseline, feed pytest-benchmark."""

    def __init__(self, request: pytest.FixtureRequest, benchmark) -> None:
        self._request = request
        self._benchmark = benchmark
        self._state: RunState = request.config.stash[STATE]

    @property
    def hardware_key(self) -> str:
        return self._state.hardware_key

    def progress(self, message: str) -> None:
        """A progress line on the terminal, shown even while output is captured."""
        pm = self._request.config.pluginmanager
        tr = pm.get_plugin("terminalreporter")
        if tr is None:
            return
        # The terminal reporter writes to sys.stdout, which pytest captures during a test: without
        # suspending capture the line only showed up later under "Captured stdout call".
        capman = pm.get_plugin("capturemanager")
        with capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext():
            tr.write_line(f"  [moebench] {message}", flush=True)

    def ceiling(self, device: str = "cuda", kind: str = "copy") -> float:
        """This session's memory ceiling in bytes/s, measured once per device and kind by
        moebench.core.bandwidth: "copy" (a large device copy, read + write) or "read" (a large read-only
        reduction: the floor of read-dominated work)."""
        from moebench.core import bandwidth

        def measure() -> float:
            self.progress(f"measuring the memory ceiling on {device} ({bandwidth.KINDS.get(kind, kind)})")
            return bandwidth.measure_ceiling(device, kind)

        return self._state.ceiling(bandwidth.session_key(device, kind), measure)

    def record(self, key: str, family: str, definition: dict, measure: Callable[[], Mapping[str, Metric]], *,
               info: dict | None = None, primary: str | None = None, group: str | None = None,
               doubt: str = "", explain: Callable | None = None,
               recorded: Callable[[], dict] | None = None, independent_runs: int = 1) -> CaseResult:
        """Measure (measure() returns name -> Metric), compare with the stored baseline, re-measure once
        on a suspected regression, and fail this test with one line if it regressed. With a `doubt` (why
        this machine cannot vouch for the numbers) a case that would read PASS or NEW reads AMBIGUOUS;
        `explain` (comparisons, metrics) -> str adds what moved to the line; `recorded()` says what ran,
        stored with a baseline and compared with the stored one; independent_runs: how many engine
        instances or processes measure() combined (see RunState.record)."""
        state = self._state
        result = state.record(nodeid=self._request.node.nodeid, key=key, family=family, definition=definition,
                              measure=measure, info=info, primary=primary, group=group, doubt=doubt,
                              progress=self.progress, explain=explain, recorded=recorded,
                              independent_runs=independent_runs, gpu=case_gpu(self._request.node))
        xdist_glue.ship(self._request.config, self._request.node, case=result.doc(), ceilings=state.ceilings)
        self._feed_benchmark(result, group)
        line = state.failure_line(result)
        if line is not None:
            pytest.fail(line, pytrace=False)
        return result

    def skip_other_hardware(self, key: str, family: str, reason: str) -> None:
        """Skip a case that cannot run here; when a baseline for it exists on other hardware (an
        external figure, say), its row reads ENV_MISMATCH with that figure, never compared."""
        from moebench.baselines.store import other_hardware_entries

        others = other_hardware_entries(self._state.baseline_dir, self._state.hardware_key, family, key)
        for hw, entry in sorted(others.items()):
            name, m = next(iter(sorted(entry.metrics.items())))
            row = Row(self._request.node.nodeid, key, Verdict.ENV_MISMATCH.value, name, None, m.unit, m.value, None,
                      f"baseline for {hw}: {reason}")
            self._state.add_row(row)
            xdist_glue.ship(self._request.config, self._request.node, row=row)
        pytest.skip(reason)

    def _feed_benchmark(self, result: CaseResult, group: str | None) -> None:
        # pytest-benchmark times wall clock itself; we hand it our device-timed samples instead so that
        # --benchmark-json/-save/-compare/-histogram show the same numbers as the gate (private API:
        # Metadata via _make_stats, pinned in pyproject and checked in tests/test_benchmark_integration.py).
        bm = self._benchmark
        if bm is None or getattr(bm, "disabled", False):
            return
        m = result.measurement.metrics.get(result.primary) if result.primary else None
        bm.extra_info.update({"moebench_key": result.key, "verdict": result.verdict.value,
                              "metrics": {n: mm.value for n, mm in result.measurement.metrics.items()},
                              "units": {n: mm.unit for n, mm in result.measurement.metrics.items()}})
        if group:
            bm.group = group
        if m is None or m.unit not in _TIME_UNITS or not m.samples:
            return
        stats = bm._make_stats(1)
        for s in m.samples:
            stats.update(s * _TIME_UNITS[m.unit])


@pytest.fixture
def moebench(request: pytest.FixtureRequest, benchmark) -> CaseRecorder:
    """Measure-and-gate helper for benchmark cases (see CaseRecorder.record)."""
    # Marks pytest-benchmark's fixture used from the start: a case that skips or fails before it
    # records (an unavailable backend, a wrong kernel) otherwise earns a "fixture was not used" warning.
    if benchmark is not None:
        benchmark._mode = "moebench"
    return CaseRecorder(request, benchmark)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    state = config.stash.get(STATE, None)
    if state is None or xdist_glue.is_worker(config):  # an -n worker: the controller writes the run's files
        return
    lines = config.stash[_UPDATE_LINES]
    # Ctrl-C is held while files are written (a few small files, under locks held for moments), so that
    # an interrupt here leaves every baseline and report file whole and the set of them complete, and
    # says so in one line instead of a traceback.
    ctrl_c = interrupts.CtrlC()
    with ctrl_c.held():
        if config.getoption("baseline_update") or config.getoption("baseline_propose"):
            _write_baselines(session, state, lines, interrupted=exitstatus == pytest.ExitCode.INTERRUPTED)
        _write_reports(session, state, lines)
    if ctrl_c.received:
        lines.append(ctrl_c.interrupted_line("the files above were written in full"))
        session.exitstatus = pytest.ExitCode.INTERRUPTED


def _write_baselines(session: pytest.Session, state: RunState, lines: list[str], *, interrupted: bool) -> None:
    if interrupted:
        # An interrupted update (Ctrl-C, a KeyboardInterrupt from a measurement) used to write the
        # cases measured so far; the files stayed valid, but a half-finished selection landed in the
        # committed baselines. An update is all of the selected cases or nothing.
        lines.append("moebench: run interrupted: baselines NOT written")
        return
    try:
        written, refused = write_updates(state, propose_dir=session.config.getoption("baseline_propose"))
    except (OSError, BaselineError) as e:
        lines.append(f"moebench: baselines NOT written: {e}")
        session.exitstatus = pytest.ExitCode.INTERNAL_ERROR
        return
    lines.extend(written)
    if refused and session.exitstatus == pytest.ExitCode.OK:
        # An update that left entries out fails: it exited 0 under "1 passed" with nothing written.
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _write_reports(session: pytest.Session, state: RunState, lines: list[str]) -> None:
    config = session.config
    try:
        if config.getoption("results_json"):
            report.write_json(config.getoption("results_json"), state.results_doc().to_json())
            lines.append(f"moebench: results written to {config.getoption('results_json')}")
        # Written even with no rows ("no cases"): a CI step that publishes the file must find it.
        if state.rows or config.getoption("summary_md"):
            extra = report.tables_markdown(family_tables(state.docs()))
            for path in report.write_markdown(state.rows, config.getoption("summary_md"), f"moebench on {state.hardware_key}",
                                              extra):
                lines.append(f"moebench: summary written to {path}")
    except OSError as e:
        # e.g. $GITHUB_STEP_SUMMARY pointing somewhere unwritable: one line, not an INTERNALERROR.
        lines.append(f"moebench: report NOT written: {e}")
        session.exitstatus = pytest.ExitCode.INTERNAL_ERROR


@pytest.hookimpl(tryfirst=True)  # before pytest-benchmark's, which prints its tables
def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    hide_benchmark_tables(config)
    state = config.stash.get(STATE, None)
    if state is None:
        return
    if state.rows:
        terminalreporter.section(f"moebench verdicts on {state.hardware_key}")
        terminalreporter.write_line(report.text_table(state.rows))
        terminalreporter.write_line(report.tally(r.verdict for r in state.rows))
    for text in report.tables_text(family_tables(state.docs())):
        terminalreporter.write_line("\n" + text)
    for line in config.stash.get(_UPDATE_LINES, []):
        terminalreporter.write_line(line)
    for line in config.stash.get(_WARNINGS, []):
        terminalreporter.write_line(line, yellow=True, bold=True)
