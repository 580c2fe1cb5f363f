"""Bad input ends a run with one clear line, and an interrupted update never damages a baseline file.

Each run is a real pytest subprocess over the fake project (tests/conftest.py), because what matters is
what a user sees: the exit code, the one line, and no traceback.
"""

from __future__ import annotations

import json
import os

import pytest

from moebench.baselines.store import load_file
from moebench.core.metrics import Metric

HW = "test-hw-x1"  # the --hardware-key FakeBench forces (tests/conftest.py)


def _assert_one_clear_line(result, *needles: str) -> str:
    """Exit code 4 (usage error), exactly one output line with every needle, no traceback, nothing run."""
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    text = result.stdout.str() + result.stderr.str()
    assert "Traceback" not in text and "INTERNALERROR" not in text, text
    hits = [l for l in result.outlines + result.errlines if all(n in l for n in needles)]
    assert len(hits) == 1, f"expected one line with {needles}, got {hits}\n{text}"
    return hits[0]


@pytest.mark.parametrize("content, field", [
    (b'{"schema_version": 1,\n  "hardware_key": "test-hw-x1",\n  oops\n}\n', "line 3 column 3: invalid JSON"),
    (None, "entries['fake[a]'].metrics.latency_us.direction"),
    (b'{"schema_version": 1, "family": "\xff"}', "not UTF-8"),
], ids=["bad JSON", "wrong direction", "not UTF-8"])
def test_malformed_baseline_is_a_usage_error(fakebench, content, field):
    path = fakebench.write_baseline({"a": 100.0})
    if content is None:
        doc = json.loads(path.read_text())
        doc["entries"]["fake[a]"]["metrics"]["latency_us"]["direction"] = "faster"
        content = json.dumps(doc).encode()
    path.write_bytes(content)
    result = fakebench.run()
    _assert_one_clear_line(result, str(path), field)
    assert fakebench.calls() == {}, "nothing is measured against a broken baseline"


def test_unknown_marker_in_m_is_one_clear_line(fakebench):
    result = fakebench.run("-m", "gemm and not trition")
    line = _assert_one_clear_line(result, "unknown marker 'trition'")
    assert "(known: " in line and "triton" in line


def test_builtin_and_plugin_markers_and_keyword_arguments_are_known(fakebench):
    # pytest's -m accepts keyword matching (gpus(n=2)): "n" is an argument, not an unknown marker. xfail is
    # pytest's own marker and benchmark pytest-benchmark's; both register after moebench's configure hook.
    result = fakebench.run("-m", "(gpus(n=2) or gemm) and not xfail and not benchmark")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    result.assert_outcomes(passed=2, skipped=2, deselected=1)


def test_unwritable_baseline_dir_with_update_is_one_clear_line(fakebench, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    target = blocker / "baselines"
    result = fakebench.run("--baseline-dir", str(target), "--baseline-update")
    _assert_one_clear_line(result, f"{target / HW}: baseline folder is not writable")
    assert fakebench.calls() == {}, "the folder is checked before anything is measured"


def test_unwritable_results_json_is_one_clear_line_before_measuring(fakebench, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = fakebench.run("--results-json", str(blocker / "results.json"))
    _assert_one_clear_line(result, f"folder of --results-json {blocker / 'results.json'} is not writable")
    assert fakebench.calls() == {}


def test_interrupt_during_update_leaves_the_baseline_file_as_it_was(fakebench):
    # fake[a] would change (98 -> 100); fake[b]'s measurement is interrupted (Ctrl-C).
    path = fakebench.write_baseline({"a": 98.0, "b": 200.0})
    before = path.read_bytes()
    fakebench.control["interrupt"] = ["fake[b]"]
    result = fakebench.run("--baseline-update")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert fakebench.calls() == {"fake[a]": 1, "fake[b]": 1}
    result.stdout.fnmatch_lines(["moebench: run interrupted: baselines NOT written"])
    assert path.read_bytes() == before
    assert os.listdir(path.parent) == ["gemm.json"], "no temporary file is left behind"


def test_interrupt_before_any_file_exists_creates_none(fakebench):
    fakebench.control["interrupt"] = ["fake[b]"]
    result = fakebench.run("--baseline-update")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert not fakebench.family_file().exists()
    assert not fakebench.baselines.exists() or not any(p.is_file() for p in fakebench.baselines.rglob("*"))


def test_update_accepts_a_regressed_value_and_writes_a_valid_file(fakebench):
    # Under --baseline-update a regression does not fail the run (it is being accepted, and the change
    # lines say so); with -x the session still measures every case, and the file written is complete.
    path = fakebench.write_baseline({"a": 70.0, "b": 123.0})
    result = fakebench.run("--baseline-update", "-x")
    assert result.ret == pytest.ExitCode.OK
    assert fakebench.calls()["fake[a]"] == 2  # the suspected regression was still measured once more
    doc = load_file(path, hardware_key=HW, family="gemm")
    assert doc["entries"]["fake[a]"]["metrics"]["latency_us"]["value"] == 100.0
    assert "fake[b]" in doc["entries"]
    assert os.listdir(path.parent) == ["gemm.json"]
    result.stdout.fnmatch_lines(["*~ fake[[]a[]] latency_us: 70 -> 100 us*"])


def test_nan_measurement_is_an_error_not_a_pass():
    # A NaN compares False with everything, so without this guard the gate called it PASS.
    with pytest.raises(ValueError, match="not finite"):
        Metric.from_samples([100.0, float("nan"), 101.0], "us", "lower")
    with pytest.raises(ValueError, match="finite"):
        Metric(float("inf"), "us", "lower")
    assert Metric(float("nan"), "%", "higher", gated=False).gated is False  # informational may be unknown
