"""ci/nightly.sh's history, for real but with pytest stubbed (the script is what is under test): two runs
started in the same second both keep their results, a corrupt history file is named once and skipped,
the closing line names only what was written, `--timeout-minutes 0` is refused, and the change points
reach summary.md and the report.

The stub is the PYTHON the script runs: `-m pytest` writes a recorded run's results.json, summary.md and
junit.xml (re-dated now, after a pause so that concurrent runs overlap); anything else is the real
interpreter. A `date` on PATH pins the start second."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from history_fixtures import HW, STEP_CASE, step, write_history
from test_ci_nightly import REPO, env

FEW = "fused-m4"  # three GEMM cases: a report of three trend plots
STUB = f'''#!{sys.executable}
import json, os, sys, time
if sys.argv[1:3] != ["-m", "pytest"]:
    os.execv({sys.executable!r}, [{sys.executable!r}, *sys.argv[1:]])
sys.path.insert(0, {str(REPO / "src")!r})
from moebench.outputs.report import write_markdown
from moebench.results.document import ResultsDoc
arg = lambda name: sys.argv[sys.argv.index(name) + 1]
doc = json.load(open(os.environ["STUB_RESULTS"]))
doc["started"] = doc["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
doc["commit"] = os.environ.get("STUB_COMMIT", "stub000")
time.sleep(float(os.environ.get("STUB_SECONDS", "0")))
run = ResultsDoc.from_json(doc, "stub")
write_markdown([c.row() for c in run.cases.values()] + run.not_measured, arg("--summary-md"), "moebench on stub")
json.dump(doc, open(arg("--results-json"), "w"))
open(arg("--junitxml"), "w").write("<testsuites/>")
print("stub pytest: wrote", arg("--results-json"))
'''


@pytest.fixture
def stubbed(tmp_path):
    """env for nightly.sh with the stub as PYTHON and a `date` that always says the same second."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(STUB)
    (bin_dir / "date").write_text('#!/bin/sh\nif [ "$*" = "-u +%Y%m%dT%H%M%SZ" ]; then echo 20261202T021700Z; '
                                  'else exec /bin/date "$@"; fi\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    e = env(tmp_path)
    results = write_history(tmp_path / "template", 1, only=FEW)[0]
    e.update(PYTHON=str(bin_dir / "python"), PATH=f"{bin_dir}:{e['PATH']}", MOEBENCH_OUT=str(tmp_path / "out"),
             STUB_RESULTS=str(results))
    return e


def _nightly(e: dict, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(["ci/nightly.sh", "--cpu", "--no-strict", *args], cwd=REPO, env={**e, **kw},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _history(tmp_path: Path) -> Path:
    return tmp_path / "home" / "history" / HW / "cpu"


def test_two_runs_started_in_the_same_second_both_keep_their_results(tmp_path, stubbed):
    """733d5c3 gave both runs out/cpu-<second>/ and history/<second>.json: one run's results were lost."""
    runs = [_nightly(stubbed, "--no-plots", STUB_SECONDS="3", STUB_COMMIT=c) for c in ("aaaaaaa", "bbbbbbb")]
    logs = [p.communicate(timeout=300)[0] for p in runs]
    assert [p.returncode for p in runs] == [0, 0], logs
    outs = sorted((tmp_path / "out").iterdir())
    assert len(outs) == 2 and all(o.name.startswith("cpu-20261202T021700Z-") for o in outs)
    assert sorted(json.loads((o / "results.json").read_text())["commit"] for o in outs) == ["aaaaaaa", "bbbbbbb"]
    kept = sorted(_history(tmp_path).glob("*.json"))
    assert len(kept) == 2 and sorted(json.loads(k.read_text())["commit"] for k in kept) == ["aaaaaaa", "bbbbbbb"]
    assert not [f for f in _history(tmp_path).iterdir() if f.name.startswith(".")]  # no temporary file left


def test_a_corrupt_history_file_is_named_once_and_skipped(tmp_path, stubbed):
    """733d5c3: one corrupt file broke compare and the report of every later nightly (exit 2), while the
    closing line still said report/index.html was written."""
    write_history(_history(tmp_path), 3, only=FEW)
    (_history(tmp_path) / "20261130T021700Z-zzzzzz.json").write_text('{"hardware_key": "cpu-amd-epyc-2c", "sta')
    p = _nightly(stubbed)
    log = p.communicate(timeout=300)[0]
    assert p.returncode == 0, log
    named = [line for line in log.splitlines() if "20261130T021700Z-zzzzzz.json" in line]
    assert len(named) == 1 and "skipped" in named[0], log
    assert "against the previous cpu run (20261103T021700Z-000002.json)" in log
    out = next((tmp_path / "out").iterdir())
    assert (out / "report" / "index.html").exists()
    assert log.splitlines()[-1].startswith(f"== wrote {out}: results.json summary.md junit.xml pytest.log machine/ "
                                           "compare-previous.txt changes.txt report/index.html; history "), log


def test_the_closing_line_names_only_what_was_written(tmp_path, stubbed):
    p = _nightly(stubbed, STUB_RESULTS=str(tmp_path / "none.json"))  # the stub fails before writing anything
    log = p.communicate(timeout=300)[0]
    out = next((tmp_path / "out").iterdir())
    assert p.returncode != 0 and log.splitlines()[-1] == f"== wrote {out}: pytest.log machine/", log


def test_change_points_reach_summary_md_and_the_report_and_fail_the_job(tmp_path, stubbed):
    write_history(_history(tmp_path), 11, moves=step(STEP_CASE, 9, 0.10), only=FEW)
    slower = write_history(tmp_path / "slower", 1, moves=step(STEP_CASE, 0, 0.10), only=FEW)[0]
    p = _nightly(stubbed, STUB_RESULTS=str(slower))
    log = p.communicate(timeout=300)[0]
    assert p.returncode == 1, log
    assert "-> exit 1" in log and f"\n{STEP_CASE} wall_us: " in log
    out = next((tmp_path / "out").iterdir())
    summary = (out / "summary.md").read_text()
    assert "### Change points over the history" in summary and f"| {STEP_CASE} | wall_us |" in summary
    assert "Change points over the history" in (out / "report" / "index.html").read_text()
    assert "### Change points over the history" in (tmp_path / "step-summary.md").read_text()


@pytest.mark.parametrize("minutes", ["0", "00"])
def test_a_zero_minute_limit_is_refused(tmp_path, minutes):
    # An expression that selects nothing: were the limit accepted, the run would end at once, not in 30 minutes.
    r = subprocess.run(["ci/nightly.sh", "--cpu", "--no-plots", "--markers", "selfcheck and not selfcheck",
                        "--timeout-minutes", minutes], cwd=REPO, env={**env(tmp_path), "MOEBENCH_OUT": str(tmp_path)},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "must be at least 1" in r.stderr, r.stderr

