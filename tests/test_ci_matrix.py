"""ci/matrix.toml and its reader ci/matrix.py: valid jobs, registered markers, the matrix per event."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from moebench.plugin import marker_names_in

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("ci_matrix", REPO / "ci" / "matrix.py")
matrix = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(matrix)


def registered_markers() -> set[str]:
    ini = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    return {m.split(":")[0].split("(")[0].strip() for m in ini["markers"]}


def test_every_job_is_valid_and_uses_registered_markers():
    jobs = matrix.load()
    known = registered_markers()
    for j in jobs:
        assert marker_names_in(j["markers"]) <= known, (j["name"], marker_names_in(j["markers"]) - known)
    names = [j["name"] for j in jobs]
    assert len(names) == len(set(names)) and "cpu" in names and "smoke" in names


def test_events_pick_their_jobs():
    jobs = matrix.load()
    smoke = matrix.for_event(jobs, "pull_request")
    assert [j["name"] for j in smoke] == ["smoke"] and smoke[0]["gpus"] == 1
    nightly = {j["name"] for j in matrix.for_event(jobs, "schedule")}
    assert {"selfcheck", "gemm", "allreduce", "decode"} <= nightly and "cpu" not in nightly
    (adhoc,) = matrix.for_event(jobs, "workflow_dispatch", "gemm and (triton or vllm_triton)")
    assert adhoc["name"] == "dispatch" and adhoc["markers"] == "gemm and (triton or vllm_triton)"


def test_cli_prints_one_json_line_for_the_workflow():
    r = subprocess.run([sys.executable, "ci/matrix.py", "--event", "schedule"], cwd=REPO, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0 and len(r.stdout.strip().splitlines()) == 1
    include = json.loads(r.stdout)["include"]
    assert all(isinstance(j["runs_on"], list) and j["timeout_minutes"] >= 1 for j in include)
    r = subprocess.run([sys.executable, "ci/matrix.py", "--job", "cpu", "--field", "markers"], cwd=REPO,
                       capture_output=True, text=True, timeout=30)
    assert r.stdout.strip() == matrix.job(matrix.load(), "cpu")["markers"]


def test_matrix_output_script_writes_github_output(tmp_path):
    out = tmp_path / "github_output"
    r = subprocess.run(["ci/matrix-output.sh", "workflow_dispatch", "selfcheck"], cwd=REPO, capture_output=True,
                       text=True, timeout=30, env={"PATH": "/usr/bin:/bin:" + str(Path(sys.executable).parent),
                                                   "GITHUB_OUTPUT": str(out)})
    assert r.returncode == 0, r.stderr
    assert "dispatch: -m 'selfcheck'" in r.stdout
    key, value = out.read_text().strip().split("=", 1)
    assert key == "matrix" and json.loads(value)["include"][0]["markers"] == "selfcheck"


@pytest.mark.parametrize("text, expect", [
    ("[[job]]\nname = 'x'\n", "job[0] (x).markers: missing (and no default)"),
    ("[defaults]\nruns_on=['a']\ntimeout_minutes=5\ngpus=1\nevents=['nightly']\n[[job]]\nname='x'\nmarkers='gemm'\n",
     "job[0] (x).events: must be a list of schedule, workflow_dispatch, pull_request"),
    ("[[job]]\nname='x'\nmarkers='gemm'\nrun_on=['a']\n", "unknown field(s) run_on"),
    ("[[job\n", "invalid TOML"),
])
def test_a_malformed_matrix_is_one_line_exit_2(tmp_path, text, expect):
    f = tmp_path / "matrix.toml"
    f.write_text(text)
    r = subprocess.run([sys.executable, "ci/matrix.py", "--file", str(f), "--list"], cwd=REPO, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2 and expect in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
