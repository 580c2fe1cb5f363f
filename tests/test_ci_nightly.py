"""ci/nightly.sh in CPU mode, end to end: one real selfcheck case (about 10 s), with a recorded earlier
run seeded into the history so the comparison and the two-run trend plots are exercised too."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from moebench.baselines.store import load_file

REPO = Path(__file__).resolve().parents[1]
RECORDED = REPO / "tests" / "data" / "selfcheck-cpu-1.json"


def env(tmp_path: Path) -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "MOEBENCH_", "PYTEST_"))}
    e.update(PYTHON=sys.executable, PATH=f"{Path(sys.executable).parent}:{e.get('PATH', '/usr/bin:/bin')}",
             MOEBENCH_HOME=str(tmp_path / "home"), GITHUB_STEP_SUMMARY=str(tmp_path / "step-summary.md"))
    return e


def cpu_hardware_key(e: dict) -> str:
    r = subprocess.run([sys.executable, "-c", "from moebench.core.hardware import hardware_key; print(hardware_key())"],
                       env={**e, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO / "src")}, capture_output=True,
                       text=True, timeout=60, check=True)
    return r.stdout.strip()


@pytest.fixture(scope="module")
def nightly(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nightly")
    e = env(tmp)
    hw = cpu_hardware_key(e)
    # The earlier run: a recorded CPU run, filed under this machine's key (the key is not a measurement).
    earlier = json.loads(RECORDED.read_text())
    earlier["hardware_key"] = hw
    history = tmp / "home" / "history" / hw / "cpu"
    history.mkdir(parents=True)
    (history / "20000101T000000Z.json").write_text(json.dumps(earlier))
    out = tmp / "out"
    r = subprocess.run(["ci/nightly.sh", "--cpu", "--markers", "selfcheck", "--out", str(out), "--", "-k", "copy_bandwidth"],
                       cwd=REPO, env=e, capture_output=True, text=True, timeout=300)
    return r, out, tmp, hw


def test_cpu_mode_writes_results_summary_junit_and_plots(nightly):
    r, out, tmp, hw = nightly
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    results = json.loads((out / "results.json").read_text())
    assert results["hardware_key"] == hw and [c["key"] for c in results["cases"]] == ["selfcheck[copy-64MiB-cpu]"]
    assert "selfcheck[copy-64MiB-cpu]" in (out / "summary.md").read_text()
    assert "<testcase" in (out / "junit.xml").read_text()
    assert json.loads((out / "machine" / "fingerprint.json").read_text())["hardware_key"] == hw
    assert list((out / "report" / "plots").glob("*.png"))
    index = (out / "report" / "index.md").read_text()
    assert "2 runs" in index
    # One tally: the report's top line is summary.md's (733d5c3's report recounted by the plotted metric).
    assert f"latest run: {(out / 'summary.md').read_text().splitlines()[2]}" in index
    assert (out / "report" / "index.html").exists()
    load_file(out / "proposed-baselines" / hw / "selfcheck.json", hardware_key=hw, family="selfcheck")


def test_progress_and_comparison_are_visible(nightly):
    r, out, tmp, hw = nightly
    assert "test_copy_bandwidth PASSED" in r.stdout  # per-case lines (-v) are not hidden
    assert "[moebench] measuring the memory ceiling on cpu" in r.stdout
    assert "against the previous cpu run (20000101T000000Z.json)" in r.stdout
    line = next(x for x in r.stdout.splitlines() if "against the previous cpu run" in x)
    assert "(shown, not gated" in line and "-> exit" not in line  # not the job's verdict
    assert "selfcheck[copy-64MiB-cpu]" in (out / "compare-previous.txt").read_text()
    summary = (tmp / "step-summary.md").read_text()
    assert f"moebench on {hw}" in summary and "this run against the previous one" in summary
    # The run joins the history and pytest-benchmark's storage (files by default).
    assert len(list((tmp / "home" / "history" / hw / "cpu").glob("*.json"))) == 2
    assert (tmp / "home" / "benchmark-storage").is_dir()


@pytest.mark.parametrize("args, expect", [
    (["--bogus"], "unknown option '--bogus'"),
    (["--cpu", "--timeout-minutes", "soon"], "--timeout-minutes 'soon': not a whole number"),
    (["--cpu", "--job", "nope"], "cannot read job 'nope'"),
])
def test_bad_options_exit_2(tmp_path, args, expect):
    r = subprocess.run(["ci/nightly.sh", *args], cwd=REPO, env=env(tmp_path), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and expect in r.stderr, r.stderr


def test_no_plots_skips_the_report_but_keeps_the_results(tmp_path):
    """--no-plots (a lent machine without matplotlib): no report folder, exit 0 when the cases passed."""
    out = tmp_path / "out"
    r = subprocess.run(["ci/nightly.sh", "--cpu", "--no-plots", "--markers", "selfcheck", "--out", str(out), "--",
                        "-k", "copy_bandwidth"], cwd=REPO, env=env(tmp_path), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert (out / "results.json").exists() and not (out / "report").exists()


# A PYTHON whose `-m pytest` prints the arguments it was given and selects nothing (exit 5); anything
# else is the real interpreter.
ARGV_STUB = f'''#!{sys.executable}
import json, os, sys
if sys.argv[1:3] != ["-m", "pytest"]:
    os.execv({sys.executable!r}, [{sys.executable!r}, *sys.argv[1:]])
print("stub argv: " + json.dumps(sys.argv[1:]))
sys.exit(5)
'''


def test_the_pytest_command_shown_can_be_pasted_back(tmp_path):
    # It was echoed unquoted: `-m "selfcheck and not gpu"` showed as -m selfcheck and not gpu.
    stub = tmp_path / "python"
    stub.write_text(ARGV_STUB)
    stub.chmod(0o755)
    r = subprocess.run(["ci/nightly.sh", "--cpu", "--no-plots", "--markers", "selfcheck and not gpu", "--out",
                        str(tmp_path / "out"), "--", "-k", "copy or it's", "--tb=short"],
                       cwd=REPO, env={**env(tmp_path), "PYTHON": str(stub)}, capture_output=True, text=True, timeout=120)
    given = json.loads(next(x for x in r.stdout.splitlines() if x.startswith("stub argv: "))[len("stub argv: "):])
    shown = next(x for x in r.stdout.splitlines() if x.startswith(f"== {stub} -m pytest "))
    assert shlex.split(shown.removeprefix("== ")) == [str(stub), *given], shown
    assert " -m 'selfcheck and not gpu' " in shown and " -k 'copy or it'\\''s' --tb=short" in shown
