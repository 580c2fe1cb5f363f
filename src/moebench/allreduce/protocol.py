"""What the parent hands its ranks (a group spec, as a JSON file) and what they send back (JSON lines).

Each rank appends one JSON object per line to its own message file and flushes after every line; the
parent reads complete lines only. Files rather than pipes: a rank never blocks on a parent that is
busy, and what a killed rank had said is still there to read.

Message types, in order: hello (imports done), join (entering the rendezvous), ready (rendezvous and
a warm-up collective done),
then per job: start, beat (a heartbeat at most every BEAT_S while it works), result; finally bye
(every result sent; teardown follows). error: the rank failed and is about to exit non-zero.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moebench.allreduce.cases import AllreduceCase

BEAT_S = 0.5
FAULT_WHERE = ("rendezvous", "job", "crash", "teardown")


@dataclass(frozen=True)
class Fault:
    """A test hook: make one rank misbehave at one point, to prove the deadlines and the teardown.

    where: 'rendezvous' (the rank says hello, then never joins the process group), 'job' (it hangs
    at the start of job `job`, so the others block in that job's collectives), 'crash' (it raises at
    the start of job `job`), 'teardown' (it sends bye, then never exits, like the ranks that did not
    exit after destroy_process_group in our first measurement).
    """

    rank: int
    where: str
    job: int = 0

    def __post_init__(self) -> None:
        if self.where not in FAULT_WHERE:
            raise ValueError(f"fault.where must be one of {FAULT_WHERE}, got {self.where!r}")


@dataclass(frozen=True)
class GroupSpec:
    """One launch: the ranks of (backend, world, variant) and the cases they measure, in order."""

    backend: str
    world: int
    variant: str
    cases: tuple[AllreduceCase, ...]
    port: int = 0
    collective_timeout_s: float = 60.0
    fault: Fault | None = None
    parent_pid: int = field(default_factory=os.getpid)

    def __post_init__(self) -> None:
        for c in self.cases:
            if (c.backend, c.world, c.variant) != (self.backend, self.world, self.variant) or c.group != self.cases[0].group:
                raise ValueError(f"case {c.id} does not belong to group {self.cases[0].group}")

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "world": self.world, "variant": self.variant,
                "cases": [c.to_json() for c in self.cases], "port": self.port,
                "collective_timeout_s": self.collective_timeout_s,
                "fault": vars(self.fault) if self.fault else None, "parent_pid": self.parent_pid}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "GroupSpec":
        return cls(d["backend"], d["world"], d["variant"], tuple(AllreduceCase.from_json(c) for c in d["cases"]),
                   d["port"], d["collective_timeout_s"], Fault(**d["fault"]) if d["fault"] else None, d["parent_pid"])

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1), encoding="utf-8")

    @classmethod
    def read(cls, path: Path) -> "GroupSpec":
        return cls.from_json(json.loads(Path(path).read_text(encoding="utf-8")))


def messages_path(workdir: Path, rank: int) -> Path:
    return Path(workdir) / f"rank{rank}.jsonl"


def stdout_path(workdir: Path, rank: int) -> Path:
    return Path(workdir) / f"rank{rank}.out"


def stderr_path(workdir: Path, rank: int) -> Path:
    return Path(workdir) / f"rank{rank}.err"


class Sender:
    """The rank's side: one line per message, flushed at once."""

    def __init__(self, path: Path, rank: int) -> None:
        self._f = open(path, "a", encoding="utf-8")
        self.rank = rank

    def send(self, kind: str, **fields: Any) -> None:
        self._f.write(json.dumps({"t": kind, "rank": self.rank, **fields}) + "\n")
        self._f.flush()


class Reader:
    """The parent's side: new complete lines of one rank's message file since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._offset = 0
        self._partial = b""

    def poll(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()  # the last piece has no newline yet (or is empty)
        out = []
        for line in lines:
            if line.strip():
                out.append(json.loads(line))
        return out


def tail(path: Path, lines: int = 8, max_chars: int = 2000) -> list[str]:
    """The last lines of a text file (a rank's stderr), empty when there is none."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    kept = [ln.rstrip() for ln in text.splitlines() if ln.strip()][-lines:]
    return [ln[-max_chars:] for ln in kept]
