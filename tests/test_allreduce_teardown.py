"""Allreduce family: the deadline and teardown machinery, with fake ranks.

The fake rank below speaks the real protocol (hello, ready, start/result per job, bye) without
importing torch, so each launch takes a fraction of a second. Each test makes one rank misbehave in
one way and checks three things: which deadline or failure the launch reports, that the results
finished before the failure are kept, and that no rank (nor anything a rank started) is left alive,
by pid and by process group. Deadlines are short; the assertions never compare elapsed times.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from moebench.allreduce import launcher, processes
from moebench.allreduce.cases import AllreduceCase
from moebench.allreduce.launcher import Deadlines, run_group
from moebench.allreduce.processes import group_members, pid_alive
from moebench.allreduce.protocol import GroupSpec

FAKE_RANK = r'''
import json, os, signal, subprocess, sys, time

spec_path, rank, mode, outdir = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
spec = json.load(open(spec_path))
msgs = open(os.path.join(os.path.dirname(spec_path), f"rank{rank}.jsonl"), "a")
kind, _, arg = mode.partition(":")
at = int(arg) if arg else -1


def send(t, **kw):
    msgs.write(json.dumps({"t": t, "rank": rank, **kw}) + "\n")
    msgs.flush()


def hang():
    while True:
        time.sleep(3600)


if kind == "ignoreterm":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if kind == "grandchild":
    child = subprocess.Popen(["sleep", "300"])  # inherits the rank's process group
    with open(os.path.join(outdir, f"grandchild{rank}"), "w") as f:
        f.write(str(child.pid))
if kind == "silent":
    hang()
send("hello", pid=os.getpid(), pgid=os.getpgid(0))
if kind in ("norendezvous", "grandchild", "ignoreterm"):
    hang()
send("join")
send("ready", info={"fake": True})
for j, _ in enumerate(spec["cases"]):
    send("start", job=j)
    if j == at and kind == "hang":
        hang()
    if j == at and kind == "beats":
        while True:
            send("beat", job=j)
            time.sleep(0.05)
    if j == at and kind == "crash":
        print("Traceback (most recent call last):", file=sys.stderr)
        print("RuntimeError: fake crash in a collective", file=sys.stderr)
        sys.stderr.flush()
        send("error", job=j, error="RuntimeError: fake crash in a collective")
        sys.exit(1)
    if j == at and kind == "exit":
        os._exit(3)
    send("result", job=j, wrong=0, checked=1, samples_us=[1.0 + rank, 2.0, 3.0], ops_per_sample=10)
send("bye")
if kind == "noexit":
    hang()
'''

FAST = Deadlines(start_s=60, rendezvous_s=1.0, stall_s=1.0, job_s=3.0, teardown_s=0.5, grace_s=0.3)


@pytest.fixture
def launch(tmp_path: Path):
    """launch(modes, n_jobs, deadlines) -> GroupRun, rank r behaving as modes[r] (see FAKE_RANK)."""
    script = tmp_path / "fake_rank.py"
    script.write_text(FAKE_RANK)

    def go(modes: list[str], n_jobs: int = 3, deadlines: Deadlines = FAST):
        cases = tuple(AllreduceCase("gloo", len(modes), "", "bf16", 7168, t, "eager") for t in (1, 2, 4, 8)[:n_jobs])
        spec = GroupSpec("gloo", len(modes), "", cases)

        def argv(spec_path: Path, r: int) -> list[str]:
            return [sys.executable, str(script), str(spec_path), str(r), modes[r], str(tmp_path)]

        return run_group(spec, deadlines, rank_argv=argv, workdir_root=tmp_path)

    return go


def assert_nothing_left(run, *extra_pids: int) -> None:
    assert run.pids, "the launch started no ranks"
    assert not [p for p in (*run.pids, *extra_pids) if pid_alive(p)]
    assert group_members(run.pids) == {}
    assert not [n for n in run.notes if "left" in n or "did not die" in n]


def test_healthy_group(launch):
    run = launch(["ok", "ok"])
    assert run.error is None and sorted(run.results) == [0, 1, 2]
    assert [m["samples_us"][0] for m in run.results[0]] == [1.0, 2.0]
    assert run.notes == [] and run.workdir is None  # logs of a clean launch are removed
    assert_nothing_left(run)


def test_rank_that_never_starts_hits_the_start_deadline(launch):
    run = launch(["ok", "silent"], deadlines=Deadlines(start_s=1.0, grace_s=0.3))
    assert "rank(s) 1 did not start" in run.error and "deadline of 1 s" in run.error
    assert run.results == {}
    assert_nothing_left(run)


def test_rank_that_never_arrives_hits_the_rendezvous_deadline(launch):
    run = launch(["ok", "norendezvous"])
    assert "failed at rendezvous" in run.error
    assert "rank(s) 1 did not reach the rendezvous" in run.error and "deadline of 1 s" in run.error
    assert "(rank(s) 0 waited in it)" in run.error
    assert_nothing_left(run)


def test_hung_collective_hits_the_stall_deadline_and_keeps_earlier_jobs(launch):
    run = launch(["ok", "hang:1"])
    assert "failed at job 1 (gloo-w2-h7168-t2-bf16-eager)" in run.error
    assert "rank(s) 1 did not finish" in run.error and "no rank reported anything for 1 s" in run.error
    assert sorted(run.results) == [0] and run.failed_job == 1
    assert_nothing_left(run)


def test_job_that_never_ends_hits_the_job_deadline(launch):
    run = launch(["ok", "beats:0"])  # heartbeats keep coming, so this is the job's own deadline
    assert "job 0" in run.error and "deadline of 3 s" in run.error
    assert_nothing_left(run)


def test_crashing_rank_fails_at_once_with_its_error_and_stderr(launch):
    run = launch(["ok", "crash:2"], deadlines=Deadlines(start_s=60, stall_s=600, job_s=600, grace_s=0.3))
    first, *rest = run.error.splitlines()
    assert "failed at job 2" in first and "rank 1 failed: RuntimeError: fake crash in a collective" in first
    assert "rank 1 stderr, last lines:" in rest and "    RuntimeError: fake crash in a collective" in rest
    assert sorted(run.results) == [0, 1]
    assert_nothing_left(run)


def test_rank_exiting_early_fails_the_group(launch):
    run = launch(["exit:0", "ok"], deadlines=Deadlines(start_s=60, stall_s=600, job_s=600, grace_s=0.3))
    assert "rank 0 exited with status 3 before it was done" in run.error
    assert_nothing_left(run)


def test_rank_that_does_not_exit_after_its_results_is_killed_and_results_kept(launch):
    run = launch(["ok", "noexit"])
    assert run.error is None and sorted(run.results) == [0, 1, 2]
    assert any("rank(s) 1 had not exited" in n and "killed" in n for n in run.notes)
    assert_nothing_left(run)


def test_processes_a_rank_started_die_with_its_group(launch, tmp_path):
    run = launch(["grandchild", "ok"])
    assert "did not reach the rendezvous" in run.error
    grandchild = int((tmp_path / "grandchild0").read_text())
    assert_nothing_left(run, grandchild)


def test_rank_ignoring_sigterm_gets_sigkill(launch):
    run = launch(["ignoreterm", "ignoreterm"])
    assert "did not reach the rendezvous" in run.error
    assert_nothing_left(run)


def test_interrupted_launch_still_tears_down(tmp_path, monkeypatch):
    script = tmp_path / "fake_rank.py"
    script.write_text(FAKE_RANK)
    started: list[int] = []
    real_spawn = processes.spawn

    def spawn(*a, **kw):
        p = real_spawn(*a, **kw)
        started.append(p.pid)
        return p

    def interrupted(spec, mon, d, run):
        mon.wait(lambda: len(mon.have("hello")) == spec.world, 60, lambda: "hello")
        raise KeyboardInterrupt

    monkeypatch.setattr(processes, "spawn", spawn)
    monkeypatch.setattr(launcher, "_run_phases", interrupted)
    spec = GroupSpec("gloo", 2, "", (AllreduceCase("gloo", 2, "", "bf16", 7168, 1, "eager"),))
    with pytest.raises(KeyboardInterrupt):
        run_group(spec, FAST, workdir_root=tmp_path,
                  rank_argv=lambda p, r: [sys.executable, str(script), str(p), str(r), "norendezvous", str(tmp_path)])
    assert len(started) == 2 and not [p for p in started if pid_alive(p)]
    assert group_members(started) == {}
