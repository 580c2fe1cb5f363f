"""Process plumbing for spawned ranks: a free port, a new session per rank, exit checks that do not
reap, killing whole process groups, and finding anything left behind.

Every rank starts in its own session (so its own process group, pgid == pid): whatever it starts
(NCCL proxy threads are threads, but vLLM's P2P check or a compile worker are processes) shares the
group, and os.killpg takes all of it. The parent never reaps a rank before killing its group, so the
group id cannot have been reused by an unrelated process when the kill is sent.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterable, Sequence

# Groups started and not yet torn down; killed at interpreter exit if a run is interrupted.
_LIVE: dict[int, subprocess.Popen] = {}


def spawn(argv: Sequence[str], *, env: dict[str, str], stdout: Path, stderr: Path, cwd: Path | None = None) -> subprocess.Popen:
    """Start argv in a new session (its own process group), output to files, stdin closed."""
    with open(stdout, "ab") as out, open(stderr, "ab") as err:
        p = subprocess.Popen(list(argv), env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                             cwd=cwd, start_new_session=True, close_fds=True)
    _LIVE[p.pid] = p
    return p


def exit_status(p: subprocess.Popen) -> int | None:
    """The exit status if the process has ended, else None, without reaping it (WNOWAIT): a zombie
    keeps its pid, so its group id stays ours until kill_groups has run."""
    if p.returncode is not None:
        return p.returncode
    try:
        info = os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return p.poll()
    if info is None:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_groups(procs: Iterable[subprocess.Popen], grace_s: float = 2.0, reap_s: float = 5.0) -> list[str]:
    """Tear down ranks regardless of their state: SIGTERM to each group, up to grace_s for them to go,
    SIGKILL to every group (members a rank started included), then reap each rank with a deadline.
    Returns notes on anything that did not go (empty when all is gone)."""
    procs = list(procs)
    for p in procs:
        _signal_group(p.pid, signal.SIGTERM)
    end = time.monotonic() + grace_s
    while time.monotonic() < end and any(exit_status(p) is None for p in procs):
        time.sleep(0.02)
    for p in procs:
        _signal_group(p.pid, signal.SIGKILL)
    notes = []
    for p in procs:
        try:
            p.wait(timeout=reap_s)
        except subprocess.TimeoutExpired:
            notes.append(f"pid {p.pid} did not die within {reap_s:.0f} s of SIGKILL")
        _LIVE.pop(p.pid, None)
    left = group_members(p.pid for p in procs)
    if left:
        notes.append(f"processes left in the ranks' groups: {sorted(left)}")
    return notes


def group_members(pgids: Iterable[int]) -> dict[int, int]:
    """pid -> pgid of every live (non-zombie) process in the given process groups, from /proc."""
    wanted = set(pgids)
    found: dict[int, int] = {}
    if not wanted:
        return found
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        # Fields after the command name (which may hold spaces and parens): state, ppid, pgrp, ...
        rest = stat[stat.rfind(")") + 2:].split()
        state, pgrp = rest[0], int(rest[2])
        if pgrp in wanted and state not in ("Z", "X"):
            found[int(entry.name)] = pgrp
    return found


def pid_alive(pid: int) -> bool:
    """True while a process with this pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].split()[0] not in ("Z", "X")


@atexit.register
def _kill_leftovers() -> None:
    # An interrupted run (Ctrl-C inside a wait) has already torn down in a finally block; this is the
    # last line of defence should anything slip through.
    if _LIVE:
        kill_groups(list(_LIVE.values()), grace_s=0.5, reap_s=2.0)
