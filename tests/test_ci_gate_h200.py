"""ci/gate_h200.sh: issue 36's lent-H200 job. A misspelt step costs no device time (refused before any step
runs), a failing step does not stop the next, and the job never exits 0 when one failed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "ci" / "gate_h200.sh"

# stands in for python3: says what it was asked and with which PYTHONPATH; moebench aa fails with 3
FAKE_PYTHON = """#!/usr/bin/env bash
echo "fake python3 $* PYTHONPATH=$PYTHONPATH CYCLES=${MOEBENCH_PLANT_MARLIN_CYCLES:-}"
case "$*" in *"moebench aa"*) exit 3 ;; esac
exit 0
"""


def gate_job(tmp_path: Path, *steps: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "python3"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", JOB_OUT=str(tmp_path / "out"),
               MOEBENCH_LENT_SCRATCH=str(tmp_path / "scratch"), PYTHONPATH="")
    return subprocess.run(["bash", str(SCRIPT), *steps], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60)


def test_an_unknown_step_is_refused_before_any_step_runs(tmp_path):
    r = gate_job(tmp_path, "gemm-aa", "gemm-a")
    assert r.returncode == 2
    assert "unknown step 'gemm-a'" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "gemm-aa.log").exists()  # the known step before it did not run either


def test_a_failing_step_does_not_stop_the_next_and_the_job_fails_with_its_code(tmp_path):
    r = gate_job(tmp_path, "gemm-aa", "plant-marlin")
    assert r.returncode == 3, r.stdout + r.stderr
    out = tmp_path / "out"
    aa_log = (out / "gemm-aa.log").read_text()
    assert "moebench aa --runs 3" in aa_log and '(gemm and not full) or selfcheck' in aa_log
    plant_log = (out / "plant-marlin.log").read_text()  # ran after the failure, with ci/planted first
    assert "-p moebench_planted_gemm" in plant_log and f"PYTHONPATH={REPO}/ci/planted:{REPO}/src" in plant_log
    assert "CYCLES=700" in plant_log
    assert "gemm-aa: exit 3" in r.stdout and "plant-marlin: exit 0" in r.stdout
    assert "all steps done: exit 3" in r.stdout
