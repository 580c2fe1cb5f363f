"""Allreduce family with real ranks on CPU: `python -m moebench.allreduce.rank` over gloo, 2 ranks.

What is asserted is never a timing threshold: correctness counts, sample counts, which deadline a
failure names, what pytest reports for each case, and that no rank process is left afterwards.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from moebench.allreduce.cases import CPU_RULE, AllreduceCase
from moebench.allreduce.processes import group_members, pid_alive
from moebench.allreduce.launcher import run_group
from moebench.allreduce.runner import AllreduceRunner

REPO = Path(__file__).resolve().parents[1]


def test_gloo_ranks_check_then_time_every_case_of_a_group_in_one_launch(tmp_path):
    cases = [AllreduceCase("gloo", 2, "", "bf16", 7168, 1, "eager"),
             AllreduceCase("gloo", 2, "", "fp32", 6144, 2, "eager")]
    runner = AllreduceRunner(cases, launch=lambda spec, d: run_group(spec, d, workdir_root=tmp_path))
    for c in cases:
        o = runner.outcome(c)
        assert o.error is None and o.unsupported is None
        assert o.wrong == 0 and o.checked == c.world * c.ops_per_sample * c.numel
        assert len(o.rank_samples_us) == 2
        # Every rank takes the same number of samples (the stop vote), within the rule's bounds.
        assert len({len(s) for s in o.rank_samples_us}) == 1
        assert CPU_RULE.min_samples <= len(o.rank_samples_us[0]) <= CPU_RULE.max_samples
        m = o.metrics()
        assert m["latency_us"].value > 0 and m["busbw_GBps"].value == m["algbw_GBps"].value
        assert o.info["ranks"][0]["backend"] == "gloo" and o.info["env"]["NCCL_NVLS_ENABLE"] == "0"
    assert len(runner.runs) == 1, "one launch for the whole group"
    run = runner.runs[0]
    assert run.error is None and run.notes == []
    assert not [p for p in run.pids if pid_alive(p)] and group_members(run.pids) == {}


INNER = '''
"""A rank that never arrives fails its case; the next case still runs (see tests/test_allreduce_gloo.py)."""
import pathlib

import pytest

from moebench.allreduce.bench import run_case
from moebench.allreduce.cases import AllreduceCase
from moebench.allreduce.launcher import Deadlines, run_group
from moebench.allreduce.protocol import Fault
from moebench.allreduce.runner import AllreduceRunner

CASE = AllreduceCase("gloo", 2, "", "bf16", 7168, 1, "eager")
HERE = pathlib.Path(__file__).parent


def launch(spec, deadlines):
    return run_group(spec, deadlines, workdir_root=HERE)  # logs of a failed launch stay in pytester's folder


RUNNERS = {
    # rank 1 says hello, then never joins the process group: rank 0 waits in the rendezvous
    "absent": AllreduceRunner([CASE], deadlines=Deadlines(rendezvous_s=3, grace_s=0.5), launch=launch,
                              faults={"gloo-w2": Fault(rank=1, where="rendezvous")}),
    "healthy": AllreduceRunner([CASE], launch=launch),
}


@pytest.mark.allreduce
@pytest.mark.gloo
@pytest.mark.parametrize("which", ["absent", "healthy"])
def test_case(which, moebench):
    try:
        run_case(CASE, RUNNERS[which], moebench)
    finally:
        with open("pids.txt", "a") as f:
            for run in RUNNERS[which].runs:
                f.write(which + " " + " ".join(map(str, run.pids)) + "\\n")
'''


def test_rank_that_never_arrives_fails_its_case_and_the_run_goes_on(pytester: pytest.Pytester,
                                                                   monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO / "src"))
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    markers = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    pytester.makeini("[pytest]\naddopts = --strict-markers -p no:cacheprovider\nmarkers =\n"
                     + "".join(f"    {m}\n" for m in markers))
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_subprocess("-p", "no:hypothesispytest", "-p", "no:anyio", "-p", "moebench.plugin",
                                           "--hardware-key", "test-hw-x1", "--baseline-dir",
                                           str(pytester.path / "baselines"), "-v", timeout=300)
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(["*test_case?absent? FAILED*", "*test_case?healthy? PASSED*"])
    out = result.stdout.str()
    assert "rank(s) 1 did not reach the rendezvous" in out and "(rank(s) 0 waited in it)" in out
    assert "within the deadline of 3 s" in out
    assert "process groups were killed" in out
    pids = {}
    for line in (pytester.path / "pids.txt").read_text().splitlines():
        which, *ps = line.split()
        pids[which] = [int(p) for p in ps]
    assert set(pids) == {"absent", "healthy"} and all(len(p) == 2 for p in pids.values())
    everyone = pids["absent"] + pids["healthy"]
    assert not [p for p in everyone if pid_alive(p)]
    assert group_members(everyone) == {}
