"""The net (issue 35): rules of `moebench aa`, of change points over the kept history and of the SIGTERM
handler that a hand-made round of bugs got past the other test files. Each test here failed with its rule
broken by hand in src/ and passes on the code as it is.

Covered elsewhere (and not repeated here): a baseline promoted after a change acknowledges it,
tests/test_changes_cli.py::test_a_baseline_recorded_after_the_change_acknowledges_it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading

import pytest

from conftest import HW, UNRELATED_PLUGINS
from history_fixtures import STEP_CASE, step, write_history
from moebench.history import aa
from moebench.suite import interrupts
from moebench.history.changes import RunPoint, Series, find_changes, threshold
from moebench.cli.main import main
from moebench.history.nightly import case_series, load_history


# --- moebench aa ---------------------------------------------------------------------------------------

def test_an_improvement_on_unchanged_code_is_a_false_alarm(fakebench, monkeypatch, capsys, tmp_path):
    """A run that reads IMPROVEMENT on unchanged code is a false alarm, exactly as a REGRESSION is: flagged, exit 1."""
    fakebench.write_baseline({"a": 125.0, "b": 200.0})  # 'a' measures 100: -20% (lower is better) in every run
    (fakebench.path / "control.json").write_text(json.dumps(fakebench.control))
    monkeypatch.chdir(fakebench.path)
    pytest_args = [*UNRELATED_PLUGINS, "-p", "moebench.plugin", "--hardware-key", HW,
                   "--baseline-dir", str(fakebench.baselines), "-q", "test_fake.py"]
    assert main(["aa", "--runs", "2", "--out", str(tmp_path / "aa"), "--", *pytest_args]) == 1
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("fake[a]"))
    assert "IMPROVEMENT IMPROVEMENT" in line and line.rstrip().endswith("FLAGGED")
    assert "; 1 case read REGRESSION or IMPROVEMENT in some run" in out


@pytest.mark.parametrize("after, handed", [
    (["benchmarks/", "-k", "x", "--", "something"], ["benchmarks/", "-k", "x", "--", "something"]),
    (["--", "something"], ["--", "something"]),
    ([], ["benchmarks/"]),
])
def test_pytest_s_own_double_dash_after_moebench_s_reaches_pytest(monkeypatch, tmp_path, after, handed):
    """Everything after moebench's `--` is pytest's, a second `--` (pytest's own) included."""
    seen = []
    monkeypatch.setattr(aa, "repeat", lambda pytest_args, out, runs, **kw: seen.append(list(pytest_args)) or [])
    assert main(["aa", "--runs", "2", "--out", str(tmp_path), "--", *after]) == 2  # no run wrote results
    assert seen == [handed]
    assert aa.run_command(handed, tmp_path / "run-1.json")[3:-2] == handed


# --- change points over the kept history ---------------------------------------------------------------

def _series(values, *, noise, rel_tol) -> Series:
    points = tuple(RunPoint(f"2026-11-{1 + i:02d}T02:17:00Z", f"c{i:06d}", v, noise) for i, v in enumerate(values))
    return Series("hw", "gemm[x]", "graph_us", "us", "lower", rel_tol, points, "gemm")


def _edit_case(paths, key, edit) -> None:
    """Apply `edit` to case `key` of each results file."""
    for p in paths:
        doc = json.loads(p.read_text())
        edit(next(c for c in doc["cases"] if c["key"] == key))
        p.write_text(json.dumps(doc))


def test_the_noise_band_of_a_change_is_twice_the_series_noise():
    """A move of a series' level is a change only outside 2 x the series' noise (the gate's band)."""
    # Tolerance 1%: half of it (0.5%) is below the band, so the band alone sets the threshold.
    assert threshold(_series([100.0] * 13, noise=0.03, rel_tol=0.01), 0.03) == pytest.approx(0.06)
    pytest.importorskip("ruptures", reason="ruptures (the history extra) is not installed")
    assert find_changes(_series([100.0] * 10 + [105.8] * 3, noise=0.03, rel_tol=0.01)) == []  # inside 2 x 3%
    (cp,) = find_changes(_series([100.0] * 10 + [106.2] * 3, noise=0.03, rel_tol=0.01))  # just outside it
    assert cp.threshold == pytest.approx(0.06)


def test_throttled_runs_are_kept_out_of_a_series(tmp_path):
    """A run whose clocks were throttled while measuring a case is not a point of that case's series."""
    runs = write_history(tmp_path / "h", 12)
    _edit_case(runs[4:7], STEP_CASE, lambda c: c.update(throttled=True))
    series = {(s.key, s.metric): s for s in case_series(load_history([tmp_path / "h"]).runs)}
    kept = [int(p.commit, 16) - 0xabc0000 for p in series[STEP_CASE, "wall_us"].points]
    assert kept == [0, 1, 2, 3, 7, 8, 9, 10, 11]
    other = next(s for (key, _), s in series.items() if key != STEP_CASE)
    assert len(other.points) == 12  # the flag is the case's: other cases of those runs still count


def test_a_note_acknowledges_only_its_own_metric(tmp_path, capsys):
    """A note naming metric A of a case acknowledges A's change, not metric B's change of the same case."""
    pytest.importorskip("ruptures", reason="ruptures (the history extra) is not installed")
    runs = write_history(tmp_path / "h", 12, moves=step(STEP_CASE, 9, 0.10))
    _edit_case(runs, STEP_CASE, lambda c: c["metrics"]["floor_us"].update(gated=True))  # the step moves it too
    (tmp_path / "ack.toml").write_text(f'[[acknowledged]]\ncase = "{STEP_CASE}"\nmetric = "floor_us"\n'
                                       'after = "abc0009"\nreason = "the floor moved; accepted"\n')
    code = main(["changes", str(tmp_path / "h"), "--acknowledged", str(tmp_path / "ack.toml")])
    out = capsys.readouterr().out.splitlines()
    assert code == 1
    assert [x.split(":")[0] for x in out[:-1]] == [f"{STEP_CASE} wall_us"]
    assert out[-1].endswith("; 1 acknowledged -> exit 1")


# --- signals -------------------------------------------------------------------------------------------

def test_a_sigterm_handler_installed_before_moebench_s_is_chained_not_replaced():
    """A SIGTERM handler someone else installed before moebench's is called, and then the run still ends as
    Ctrl-C ends it (Terminated); moebench's restore puts theirs back. A SIGTERM held while files are
    written reaches their handler too, once the files are written."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers can only be installed from the main thread")
    original = signal.getsignal(signal.SIGTERM)
    theirs = []

    def handler(signum, frame):
        theirs.append(signum)

    try:
        signal.signal(signal.SIGTERM, handler)
        restore = interrupts.sigterm_as_interrupt()
        with pytest.raises(interrupts.Terminated):  # moebench's own, chained after theirs
            os.kill(os.getpid(), signal.SIGTERM)
        assert theirs == [signal.SIGTERM]
        hold = interrupts.CtrlC()
        with hold.held():
            os.kill(os.getpid(), signal.SIGTERM)
            assert theirs == [signal.SIGTERM]  # held: nothing acted yet
        assert hold.received == "SIGTERM" and theirs == [signal.SIGTERM] * 2
        restore()
        assert signal.getsignal(signal.SIGTERM) is handler  # and moebench's restore leaves theirs in place
    finally:
        signal.signal(signal.SIGTERM, original)
