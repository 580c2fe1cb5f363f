"""Run one group of ranks under deadlines, and always tear it down.

The parent (the pytest process) never imports torch here. It spawns one `python -m
moebench.allreduce.rank` per rank, each in its own session, then waits, phase by phase, each wait
with its own deadline:

  start       spawn -> every rank said hello (Python, torch, vllm imported)
  rendezvous  all hellos -> every rank ready (process group, communicator, a warm-up allreduce)
  jobs        per job: all results in; fails on job_s for the job, or stall_s without any message from
              any rank (a hung collective blocks every rank, so nobody writes: that is the deadline on
              every collective)
  teardown    every rank said bye -> every rank exited; past teardown_s they are killed anyway

A rank that exits early or reports an error fails the group at once. Whatever happened, the finally
block kills every rank's process group (SIGTERM, then SIGKILL) and reaps the ranks with a deadline:
ranks that hang after destroy_process_group (we saw it) cannot outlive the group's run.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from moebench.allreduce import processes
from moebench.allreduce.protocol import GroupSpec, Reader, messages_path, stderr_path, stdout_path, tail
from moebench.allreduce.transport import LOG_ENV
from moebench.core.ports import free_port

RankArgv = Callable[[Path, int], Sequence[str]]


@dataclass(frozen=True)
class Deadlines:
    """Seconds each wait may take (see the module docstring for the phases)."""

    start_s: float = 240.0
    rendezvous_s: float = 180.0
    stall_s: float = 60.0
    job_s: float = 300.0
    teardown_s: float = 20.0
    grace_s: float = 2.0


@dataclass
class GroupRun:
    """What a launch produced. results: job index -> one result message per rank, for the jobs every
    rank finished; error: why the run stopped early (None when every job finished)."""

    spec: GroupSpec
    results: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    ready: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    failed_job: int | None = None
    phase: str = "start"
    notes: list[str] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    elapsed_s: float = 0.0
    workdir: Path | None = None
    rank0_log: str = ""  # the start of rank 0's output: NCCL's INFO lines say which transport it chose


class GroupFailure(Exception):
    """The group cannot go on: a deadline passed, a rank exited early, or a rank reported an error."""

    def __init__(self, message: str, ranks: Sequence[int] = (), job: int | None = None) -> None:
        super().__init__(message)
        self.ranks = tuple(ranks)
        self.job = job  # the job the failing rank was in, when it said (its error or its last start)


def default_rank_argv(spec_path: Path, rank: int) -> list[str]:
    """The real rank: `python -m moebench.allreduce.rank SPEC RANK`."""
    return [sys.executable, "-m", "moebench.allreduce.rank", str(spec_path), str(rank)]


def rank_env(spec: GroupSpec) -> dict[str, str]:
    """The ranks' environment: ours, plus the cases' env (NVLink multicast off, the NCCL variant), the
    moebench sources on PYTHONPATH, and one OpenMP thread per rank (as torchrun does)."""
    env = dict(os.environ)
    for c in spec.cases[:1]:
        env.update(c.env)
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    # All ranks are on this host: gloo's interface guess from the hostname can pick an unreachable one.
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if spec.backend == "nccl":  # NCCL says which transport it chose (unless the caller set logging)
        for k, v in LOG_ENV.items():
            env.setdefault(k, v)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class _Monitor:
    """Reads every rank's messages and watches their processes."""

    def __init__(self, spec: GroupSpec, procs: list, workdir: Path) -> None:
        self.spec = spec
        self.procs = procs
        self.workdir = workdir
        self.readers = [Reader(messages_path(workdir, r)) for r in range(spec.world)]
        self.seen: list[dict[str, dict]] = [{} for _ in range(spec.world)]  # rank -> type -> last message
        self.results: dict[int, dict[int, dict]] = {}  # job -> rank -> result
        self.last_message = time.monotonic()

    def pump(self) -> None:
        """Take in new messages; raise GroupFailure on an error message or an early exit."""
        for r, reader in enumerate(self.readers):
            for m in reader.poll():
                self.last_message = time.monotonic()
                self.seen[r][m["t"]] = m
                if m["t"] == "result":
                    self.results.setdefault(m["job"], {})[r] = m
                elif m["t"] == "error":
                    raise GroupFailure(f"rank {r} failed: {m.get('error', '?')}", [r], m.get("job"))
        for r, p in enumerate(self.procs):
            status = processes.exit_status(p)
            if status is not None and "bye" not in self.seen[r]:
                self.pump_once_more(r)
                raise GroupFailure(f"rank {r} exited with status {status} before it was done", [r],
                                   self.seen[r].get("start", {}).get("job"))

    def drain(self) -> None:
        """Read what every rank has written so far, keeping results and ignoring failures (used once a
        failure is known, so results a rank wrote just before it are not lost)."""
        for r, reader in enumerate(self.readers):
            for m in reader.poll():
                self.seen[r][m["t"]] = m
                if m["t"] == "result":
                    self.results.setdefault(m["job"], {})[r] = m

    def pump_once_more(self, r: int) -> None:
        # A rank that wrote its error line and exited: read the line before reporting the exit.
        for m in self.readers[r].poll():
            if m["t"] == "error":
                raise GroupFailure(f"rank {r} failed: {m.get('error', '?')}", [r], m.get("job"))

    def complete_jobs(self) -> dict[int, list[dict]]:
        """Results of the jobs every rank finished, in job order, up to the first unfinished one."""
        out: dict[int, list[dict]] = {}
        n = self.spec.world
        for j in range(len(self.spec.cases)):
            got = self.results.get(j, {})
            if len(got) < n:
                break
            out[j] = [got[r] for r in range(n)]
        return out

    def have(self, kind: str) -> list[int]:
        return [r for r in range(self.spec.world) if kind in self.seen[r]]

    def wait(self, done: Callable[[], bool], limit_s: float, what: Callable[[], str], stall_s: float | None = None) -> None:
        """Pump until done(); GroupFailure(what()) once limit_s has passed or, with stall_s, once no
        rank has written anything for stall_s."""
        start = time.monotonic()
        while True:
            self.pump()
            if done():
                return
            now = time.monotonic()
            if now - start > limit_s:
                raise GroupFailure(f"{what()} within the deadline of {limit_s:g} s")
            if stall_s is not None and now - max(self.last_message, start) > stall_s:
                raise GroupFailure(f"{what()}: no rank reported anything for {stall_s:g} s (a collective hung)")
            time.sleep(0.02)


def _missing(mon: _Monitor, kind: str) -> str:
    missing = [r for r in range(mon.spec.world) if kind not in mon.seen[r]]
    return ", ".join(map(str, missing)) or "none"


def _rendezvous_failure(mon: _Monitor) -> str:
    absent = [r for r in range(mon.spec.world) if "join" not in mon.seen[r]]
    if absent:
        waiting = [r for r in range(mon.spec.world) if r not in absent]
        return (f"rank(s) {', '.join(map(str, absent))} did not reach the rendezvous on port {mon.spec.port} "
                f"(rank(s) {', '.join(map(str, waiting)) or 'none'} waited in it)")
    return (f"rank(s) {_missing(mon, 'ready')} did not get through the rendezvous and the first collective "
            f"on port {mon.spec.port}")


def _run_phases(spec: GroupSpec, mon: _Monitor, d: Deadlines, run: GroupRun) -> None:
    n = spec.world
    run.phase = "start"
    mon.wait(lambda: len(mon.have("hello")) == n, d.start_s,
             lambda: f"rank(s) {_missing(mon, 'hello')} did not start (Python, torch and backend imports)")
    run.phase = "rendezvous"
    mon.wait(lambda: len(mon.have("ready")) == n, d.rendezvous_s, lambda: _rendezvous_failure(mon))
    run.ready = [mon.seen[r]["ready"] for r in range(n)]
    for j, case in enumerate(spec.cases):
        run.failed_job = j
        run.phase = f"job {j} ({case.id})"

        def missing_ranks(j: int = j) -> str:
            done = mon.results.get(j, {})
            return ", ".join(str(r) for r in range(n) if r not in done)

        mon.wait(lambda j=j: len(mon.results.get(j, {})) == n, d.job_s,
                 lambda j=j, c=case: f"job {j} ({c.id}): rank(s) {missing_ranks(j)} did not finish",
                 stall_s=d.stall_s)
        run.results[j] = [mon.results[j][r] for r in range(n)]
    run.failed_job = None
    run.phase = "teardown"
    mon.wait(lambda: len(mon.have("bye")) == n, d.stall_s, lambda: f"rank(s) {_missing(mon, 'bye')} did not say bye")
    start = time.monotonic()
    while time.monotonic() - start < d.teardown_s:
        if all(processes.exit_status(p) is not None for p in mon.procs):
            return
        time.sleep(0.02)
    stuck = [r for r, p in enumerate(mon.procs) if processes.exit_status(p) is None]
    run.notes.append(f"rank(s) {', '.join(map(str, stuck))} had not exited {d.teardown_s:g} s after sending "
                     f"every result: killed with their process groups (results kept)")


def _failure_text(spec: GroupSpec, e: GroupFailure, workdir: Path, run: GroupRun) -> str:
    lines = [f"allreduce group {spec.backend}-w{spec.world}{'-' + spec.variant if spec.variant else ''} "
             f"failed at {run.phase}: {e}; its ranks' process groups were killed (logs: {workdir})"]
    ranks = e.ranks or tuple(range(spec.world))
    for r in ranks:
        t = tail(stderr_path(workdir, r))
        if t:
            lines.append(f"rank {r} stderr, last lines:")
            lines.extend("    " + ln for ln in t)
    return "\n".join(lines)


def run_group(spec: GroupSpec, deadlines: Deadlines = Deadlines(), *, rank_argv: RankArgv = default_rank_argv,
              keep_workdir: bool = False, workdir_root: Path | None = None) -> GroupRun:
    """Launch spec.world ranks for one group, collect every job's results, tear everything down.

    Never raises for a rank's misbehaviour: the returned GroupRun carries the error, the jobs that did
    finish, and the ranks' pids (all gone by the time this returns, or named in notes). The ranks'
    spec, messages and logs live in a fresh folder under workdir_root (default: the temp folder),
    removed after a clean launch and kept after a failure (the error names it)."""
    if spec.port == 0:
        spec = GroupSpec(spec.backend, spec.world, spec.variant, spec.cases, free_port(),
                         spec.collective_timeout_s, spec.fault, spec.parent_pid)
    workdir = Path(tempfile.mkdtemp(prefix=f"moebench-allreduce-{spec.backend}-w{spec.world}-", dir=workdir_root))
    spec_path = workdir / "spec.json"
    spec.write(spec_path)
    run = GroupRun(spec, workdir=workdir)
    t0 = time.monotonic()
    env = rank_env(spec)
    procs: list = []
    mon = _Monitor(spec, procs, workdir)
    try:
        for r in range(spec.world):
            procs.append(processes.spawn(rank_argv(spec_path, r), env=env, stdout=stdout_path(workdir, r),
                                         stderr=stderr_path(workdir, r)))
        run.pids = [p.pid for p in procs]
        _run_phases(spec, mon, deadlines, run)
    except GroupFailure as e:
        # Messages are read in batches, so a rank can have finished jobs (or failed in one) that the
        # phase loop had not reached yet: the monitor's record is the truth. The ranks that did not fail
        # get a moment to flush the results of jobs they finished together with the failing rank.
        time.sleep(min(deadlines.grace_s, 0.5))
        mon.drain()
        run.results = mon.complete_jobs()
        if e.job is not None:
            run.failed_job, run.phase = e.job, f"job {e.job} ({spec.cases[e.job].id})"
        err = e
    else:
        err = None
    finally:
        run.notes.extend(processes.kill_groups(procs, grace_s=deadlines.grace_s))
        run.elapsed_s = time.monotonic() - t0
        run.rank0_log = _head(stdout_path(workdir, 0))
    if err is not None:
        run.error = _failure_text(spec, err, workdir, run)
    elif not keep_workdir:
        shutil.rmtree(workdir, ignore_errors=True)
        run.workdir = None
    return run


def _head(path: Path, limit: int = 1 << 18) -> str:
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            return f.read(limit)
    except OSError:
        return ""


def port_taken(run: GroupRun) -> bool:
    """Whether a failed run lost its rendezvous port to another process (worth one more try)."""
    if run.error is None or run.workdir is None or run.results:
        return False
    text = "\n".join(tail(stderr_path(run.workdir, 0), lines=40))
    return "Address already in use" in text or "EADDRINUSE" in text
