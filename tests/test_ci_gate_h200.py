"""ci/gate_h200.sh: the lent-H200 job of issues 36 and 34. A misspelt step costs no device time (refused before
any step runs), a failing step does not stop the next, the job never exits 0 when one failed, and the counter
steps gate the plant against the entries their own runs made."""

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


def gate_job(tmp_path: Path, *steps: str, python: str = FAKE_PYTHON, **extra_env: str) -> subprocess.CompletedProcess:
    """ci/gate_h200.sh STEPS with `python` standing in for python3, its out and scratch folders in tmp_path,
    and extra_env's variables set."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "python3"
    fake.write_text(python)
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", JOB_OUT=str(tmp_path / "out"),
               MOEBENCH_LENT_SCRATCH=str(tmp_path / "scratch"), PYTHONPATH="", **extra_env)
    for name in ("MOEBENCH_NCU", "MOEBENCH_GEMM_M", "MOEBENCH_GEMM_K", "MOEBENCH_AA_RUNS", "MOEBENCH_COUNTERS_RUNS"):
        if name not in extra_env:
            env.pop(name, None)
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
    assert " -k " not in aa_log  # no MOEBENCH_GEMM_K: the whole selection
    plant_log = (out / "plant-marlin.log").read_text()  # ran after the failure, with ci/planted first
    assert "-p moebench_planted_gemm" in plant_log and f"PYTHONPATH={REPO}/ci/planted:{REPO}/src" in plant_log
    assert "CYCLES=700" in plant_log
    assert "gemm-aa: exit 3" in r.stdout and "plant-marlin: exit 0" in r.stdout
    assert "all steps done: exit 3" in r.stdout


# stands in for python3 in the counter steps: a counted aa writes one run file into its --out folder
FAKE_COUNTING_PYTHON = """#!/usr/bin/env bash
echo "fake python3 $* PYTHONPATH=$PYTHONPATH NARROW=${MOEBENCH_PLANT_NARROW_LOADS:-} NCU=${MOEBENCH_NCU:-}"
case "$*" in *"moebench aa"*"--counters"*)
  while [ $# -gt 0 ]; do [ "$1" = --out ] && { echo '{}' >"$2/run-1.json"; }; shift; done ;;
esac
exit 0
"""


def test_the_counter_steps_count_promote_into_scratch_and_gate_the_plant_against_it(tmp_path):
    r = gate_job(tmp_path, "counters-aa", "counters-promote", "plant-narrow", python=FAKE_COUNTING_PYTHON)
    assert r.returncode == 0, r.stdout + r.stderr
    out, scratch = tmp_path / "out", tmp_path / "scratch"
    aa = (out / "counters-aa.log").read_text()
    assert "--counters" in aa and "gemm and not full and (triton or vllm_marlin)" in aa
    assert "NCU=/usr/local/cuda/bin/ncu" in aa  # the image's ncu when MOEBENCH_NCU names none
    assert (out / "counters-aa.tgz").exists()  # the runs come back packed
    assert (out / "counters-run-1.json").read_text() == "{}\n"  # and each one on its own, once it finished
    promote = (out / "counters-promote.log").read_text()
    assert f"baselines promote {scratch}/counters-done/run-1.json --all --baseline-dir {scratch}/baselines" in promote
    assert (scratch / "baselines").is_dir()  # a copy of the committed entries, which the promote then changes
    plant = (out / "plant-narrow.log").read_text()
    assert f"PYTHONPATH={REPO}/ci/planted:{REPO}/src" in plant and "NARROW=1" in plant
    assert f"--baseline-dir {scratch}/baselines" in plant and "--counters" in plant
    assert "int4 and m1- and (kimi or deepseek)" in plant


def test_promoting_without_counted_runs_fails_and_the_plant_gates_against_the_committed_entries(tmp_path):
    r = gate_job(tmp_path, "counters-promote", "plant-narrow", python=FAKE_COUNTING_PYTHON)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "no run-*.json" in (tmp_path / "out" / "counters-promote.log").read_text()
    assert "--baseline-dir baselines " in (tmp_path / "out" / "plant-narrow.log").read_text()


def test_one_job_times_a_narrowed_selection_more_often_than_it_counts_it(tmp_path):
    """A lease too short for three counted runs: three timed runs of the counted selection (gemm-aa narrowed
    by MOEBENCH_GEMM_M), and one counted run (MOEBENCH_COUNTERS_RUNS)."""
    sel = "gemm and not full and (triton or vllm_marlin)"
    r = gate_job(tmp_path, "gemm-aa", "counters-aa", python=FAKE_COUNTING_PYTHON, MOEBENCH_GEMM_M=sel,
                 MOEBENCH_AA_RUNS="3", MOEBENCH_COUNTERS_RUNS="1")
    assert r.returncode == 0, r.stdout + r.stderr
    timed = (tmp_path / "out" / "gemm-aa.log").read_text()
    assert "moebench aa --runs 3 " in timed and f"-m {sel} PYTHONPATH" in timed and "selfcheck" not in timed
    counted = (tmp_path / "out" / "counters-aa.log").read_text()
    assert "moebench aa --runs 1 " in counted and "--counters" in counted


def test_gemm_aa_narrows_by_moebench_gemm_k(tmp_path):
    """The next H200 lease records only the int4 cases that lack runs: -m picks the default, -k the cases."""
    gate_job(tmp_path, "gemm-aa", MOEBENCH_GEMM_M="gemm and not full", MOEBENCH_GEMM_K="int4 and (m32- or m64-)")
    aa_log = (tmp_path / "out" / "gemm-aa.log").read_text()
    assert "-m gemm and not full -k int4 and (m32- or m64-)" in aa_log
