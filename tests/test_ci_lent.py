"""ci/lent.sh, the lent-machine entry point: its options, the commands each phase runs (--dry-run), the
provenance guard, and one phase end to end in CPU mode (record one selfcheck case into a scratch copy of
the baselines through ci/nightly.sh --record, then gate against it)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PHASES = ("selfcheck", "gemm", "gemm-torch", "gemm-triton", "gemm-vllm", "decode", "decode-engines", "allreduce",
          "allreduce-vllm-custom-ar", "triton-sweep", "triton-profile")


def env(tmp_path: Path, **extra: str) -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "MOEBENCH_", "PYTEST_"))}
    e.pop("OUT", None)
    e.update(PYTHON=sys.executable, PATH=f"{Path(sys.executable).parent}:{e.get('PATH', '/usr/bin:/bin')}", **extra)
    return e


def lent(tmp_path: Path, *args: str, timeout: int = 60, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ci/lent.sh", *args], cwd=REPO, env=env(tmp_path, **extra), capture_output=True,
                          text=True, timeout=timeout)


def test_help_names_every_phase(tmp_path):
    r = lent(tmp_path, "--help")
    assert r.returncode == 0 and r.stdout.startswith("One phase of the suite on a lent GPU machine")
    for phase in PHASES:
        assert re.search(rf"^ +{phase} ", r.stdout, re.M), phase


@pytest.mark.parametrize("args, expect", [
    ([], "no phase given"),
    (["bogus"], "unknown phase 'bogus'"),
    (["selfcheck", "gemm"], "one phase at a time"),
    (["selfcheck", "--pass", "twice"], "--pass 'twice': not both, record or gate"),
    (["selfcheck", "--gpu", "first"], "--gpu 'first': not a GPU index"),
    (["selfcheck", "--bogus"], "unknown option '--bogus'"),
])
def test_bad_options_exit_2(tmp_path, args, expect):
    r = lent(tmp_path, *args, "--dry-run")
    assert r.returncode == 2 and expect in r.stderr, r.stderr


def _commands(stdout: str) -> list[str]:
    return [line[3:] for line in stdout.splitlines() if line.startswith("== ")]


def test_record_then_gate_are_nightly_runs_on_the_scratch_baselines(tmp_path):
    """The record pass is ci/nightly.sh --record into the scratch copy; the gate pass is ci/nightly.sh on
    the same copy, with the phase's own (here wider) expression; pytest arguments reach both."""
    scratch = tmp_path / "scratch"
    r = lent(tmp_path, "allreduce-vllm-custom-ar", "--dry-run", "--scratch", str(scratch), "--", "-k", "t1")
    assert r.returncode == 0, r.stderr
    copy, record, gate = _commands(r.stdout)
    assert copy == f"cp -r baselines {scratch}/baselines "
    for cmd, expr in ((record, r"allreduce\ and\ vllm_custom_ar"), (gate, "allreduce")):
        assert cmd.startswith(f"ci/nightly.sh --job allreduce --markers {expr} --baseline-dir {scratch}/baselines ")
        assert cmd.endswith("-- -k t1 ")
    assert "--record" in record.split() and "--record" not in gate.split()
    assert not lent(tmp_path, "gemm", "--dry-run", "--pass", "gate").stdout.count("--record")


def test_a_record_without_a_commit_is_refused(tmp_path):
    """A copied tree has no .git: a record must be told its commit (MOEBENCH_COMMIT), or its baselines'
    provenance would say "unknown". A gate records nothing and needs none."""
    no_git = {"GIT_DIR": str(tmp_path / "no-git")}
    r = lent(tmp_path, "selfcheck", "--dry-run", **no_git)
    assert r.returncode == 2 and "MOEBENCH_COMMIT is not set" in r.stderr
    assert lent(tmp_path, "selfcheck", "--dry-run", "--pass", "gate", **no_git).returncode == 0
    assert lent(tmp_path, "selfcheck", "--dry-run", MOEBENCH_COMMIT="abc1234", **no_git).returncode == 0


def test_selfcheck_phase_records_then_gates_against_the_record(tmp_path):
    """End to end on CPU: the record pass writes the case into the scratch baselines (NEW), the gate pass
    compares with that entry (not NEW), and the committed baselines are left alone."""
    scratch, out = tmp_path / "scratch", tmp_path / "out"
    committed = {p: p.read_bytes() for p in (REPO / "baselines").rglob("*.json")}
    r = lent(tmp_path, "selfcheck", "--cpu", "--scratch", str(scratch), "--out", str(out), "--", "-k", "copy_bandwidth",
             timeout=300)
    # A CPU copy can move by more than its tolerance between the two passes: exit 1 is a verdict, not a fault.
    assert r.returncode in (0, 1), r.stdout[-3000:] + r.stderr[-2000:]
    verdicts = {p: [c["verdict"] for c in json.loads((scratch / f"selfcheck-{p}" / "results.json").read_text())["cases"]]
                for p in ("record", "gate")}
    assert verdicts["record"] == ["NEW"] and verdicts["gate"][0] in ("PASS", "IMPROVEMENT", "REGRESSION", "AMBIGUOUS")
    [recorded] = list((scratch / "baselines").glob("cpu-*/selfcheck.json"))  # beside the committed copies
    assert "selfcheck[copy-64MiB-cpu]" in json.loads(recorded.read_text())["entries"]
    assert (out / "summary.md").exists() and (out / "selfcheck-both.tgz").exists()
    assert {p: p.read_bytes() for p in (REPO / "baselines").rglob("*.json")} == committed


def test_the_folders_a_staged_sites_pth_files_add_go_on_pythonpath(tmp_path):
    site = tmp_path / "site"
    (site / "nvidia_cutlass_dsl" / "python_packages").mkdir(parents=True)
    (site / "nvidia_cutlass_dsl.pth").write_text("# CuTe DSL\nnvidia_cutlass_dsl/python_packages\nimport os\nmissing/dir\n")
    r = lent(tmp_path, "decode-engines", "--dry-run", "--site", str(site), "--scratch", str(tmp_path / "s"),
             MOEBENCH_COMMIT="abc1234")
    [line] = [ln for ln in r.stdout.splitlines() if ln.startswith("PYTHONPATH=")]
    assert line.split("=", 1)[1].split(":")[1:3] == [str(site), str(site / "nvidia_cutlass_dsl" / "python_packages")]
    assert r"--markers decode\ and\ \(vllm\ or\ sglang\)" in r.stdout
