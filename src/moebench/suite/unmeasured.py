"""Under --baseline-strict, a stored entry whose case the run selected but did not measure fails the run,
naming it: one `only_on` line in the scenario file used to turn the gated decode cases into SKIPs, and a
case dropped from its family read MISSING in `moebench compare`, both with exit 0.

What counts, for an entry of this hardware key:
- its case was selected and skipped (an `only_on` that leaves this machine out, a missing package, too
  few GPUs): that test fails instead of skipping, with one line naming the entry (unless the entry was
  recorded on other hardware, which a forced --hardware-key never compares);
- its family was collected but has no case of that key any more (a scenario removed, an axis renamed):
  a MISSING row, a line naming it, and a failed run. A family says which keys it has (declare_cases),
  all of them, whatever -m, -k or node ids select, so a narrower selection does not make them "gone";
- its case was not selected (-m, -k, `full`, a family not collected at all): nothing. A strict run of a
  narrower selection gates what it selects.

A test's case key is the `key` of its parameter (GemmCase, AllreduceCase, DecodeCase); a test without one
(the selfcheck family) is not looked at.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import pytest

from moebench.baselines.compare import Outcome
from moebench.baselines.store import family_path
from moebench.results.document import Row
from moebench.suite.session import RunState

_FAMILY_KEYS = pytest.StashKey[dict]()


def declare_cases(config: pytest.Config, family: str, keys: Iterable[str]) -> None:
    """Tell the run every case key `family` has (not only those selected): called by a family's test
    module while it generates its tests. A stored entry of a declared family whose key is not among them
    is a case that no longer exists."""
    config.stash.setdefault(_FAMILY_KEYS, {}).setdefault(family, set()).update(keys)


def declared(config: pytest.Config) -> dict[str, set[str]]:
    """Every family's declared case keys so far (an -n worker sends them to the controller, which has
    collected nothing)."""
    return config.stash.get(_FAMILY_KEYS, {})


def case_key(item: pytest.Item) -> str | None:
    """The baseline key of a test's case: the `key` of the first parameter that has one."""
    for value in getattr(getattr(item, "callspec", None), "params", {}).values():
        key = getattr(value, "key", None)
        if isinstance(key, str):
            return key
    return None


def gone(stored: Mapping[str, Iterable[str]], declared: Mapping[str, set[str]]) -> list[tuple[str, str]]:
    """(family, key) of every stored entry whose family declared its keys and does not have this one."""
    return [(family, key) for family in sorted(declared) for key in sorted(stored.get(family, ()))
            if key not in declared[family]]


class StrictCoverage:
    """The hooks that fail a strict run over stored entries it did not measure (registered by the plugin
    under --baseline-strict, not with --baseline-update)."""

    def __init__(self, state: RunState) -> None:
        self.state = state
        self.lines: list[str] = []

    def _stored_in(self, key: str | None) -> str:
        """The file holding this hardware's entry for `key`, or "". An entry recorded on other hardware than
        this (a forced --hardware-key) would not have been compared here: its skip is no failure."""
        for family, doc in self.state.baselines.docs.items():
            if key is not None and key in doc["entries"] and self.state.env_mismatch(family, key)[0]:
                return str(family_path(self.state.baseline_dir, self.state.hardware_key, family))
        return ""

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call):
        report = yield
        if report.skipped and report.when in ("setup", "call") and not hasattr(report, "wasxfail"):
            key = case_key(item)
            where = self._stored_in(key)
            if where:
                reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
                report.outcome = "failed"
                report.longrepr = (f"--baseline-strict: {key} has a baseline in {where} but did not run "
                                   f"({reason.removeprefix('Skipped: ')}); remove the entry to stop gating it")
        return report

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if (session.config.option.collectonly or session.exitstatus == pytest.ExitCode.INTERRUPTED
                or hasattr(session.config, "workerinput")):  # an -n worker: the controller holds the table
            return
        stored = {f: d["entries"] for f, d in self.state.baselines.docs.items()}
        for family, key in gone(stored, session.config.stash.get(_FAMILY_KEYS, {})):
            where = family_path(self.state.baseline_dir, self.state.hardware_key, family)
            note = f"--baseline-strict: stored in {where}, but {family} has no such case any more"
            self.state.add_row(Row("", key, Outcome.MISSING.value, note=note))
            self.lines.append(f"moebench: MISSING {key}: {note} (remove the entry, or restore the case)")
        if self.lines and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        for line in self.lines:
            terminalreporter.write_line(line, red=True)
