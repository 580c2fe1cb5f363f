"""Rows for the tests that end without a measurement (skips, failures, errors), and each test's wall time.

Registered by moebench.plugin in the process that owns the closing table: the only process of a plain
run, or the controller of an `-n` run, which sees every worker's reports (moebench.suite.xdist_glue.Merge puts a
worker's measured cases into the run's state first, so a gate failure is not also counted as a FAIL).
"""

from __future__ import annotations

import pytest

from moebench.baselines.compare import Outcome
from moebench.outputs.report import failure_note
from moebench.results.document import Row
from moebench.suite.session import RunState


class TestOutcomes:
    """Rows for tests that end without a measurement, so nothing is dropped from the table silently."""

    __test__ = False  # not a test class, whatever its name

    def __init__(self, state: RunState) -> None:
        self.state = state

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        state = self.state
        # setup + call + teardown: what a case costs a night (results' wall_s; README's estimate for -n)
        state.durations[report.nodeid] = state.durations.get(report.nodeid, 0.0) + (report.duration or 0.0)
        if report.skipped and report.when in ("setup", "call"):
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            if not any(r.nodeid == report.nodeid for r in state.rows):
                state.add_row(Row(report.nodeid, "", Outcome.SKIP.value, note=reason.removeprefix("Skipped: ")))
        elif report.failed and not (report.when == "call" and state.gate_failed(report.nodeid)):
            # As pytest counts them: a failure in the test itself is FAIL, one in its setup or teardown
            # (a fixture, the environment) is ERROR.
            state.add_row(Row(report.nodeid, "", (Outcome.FAIL if report.when == "call" else Outcome.ERROR).value,
                              note=failure_note(report)))
