"""What an engine is doing while it starts: the phase its log last named, and the compilers it is running.

A start can take minutes for reasons that are not a hang: SGLang compiles its JIT kernels (Marlin MoE,
activations, norms: nvcc through tvm-ffi's ninja) on their first call, which falls inside the decode
CUDA-graph capture and prints nothing for as long as nvcc runs; vLLM runs torch.compile before its
capture. A progress line and a start-deadline failure both say which phase the log reached and which
compiler processes run under the engine, so "stalled in graph capture" reads as "nvcc has run for
7 min" or as "no compiler: stuck".

The phase patterns are lines SGLang 0.5.15 and vLLM 0.21 log (model_runner.py and friends); a line
nothing matches leaves the phase as it was. Stdlib only.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

# (phase, pattern): the phase is that of the LAST line in the log that matches one of these
PHASES: tuple[tuple[str, re.Pattern[str]], ...] = tuple((name, re.compile(pat)) for name, pat in (
    ("loading weights", r"Load weight begin|Starting to load model"),
    ("weights loaded", r"Load weight end|Model loading took|Loading weights took"),
    ("KV cache allocated", r"KV Cache is allocated|Memory pool end|Available KV cache memory"),
    ("torch.compile", r"Compiling a graph for|torch\.compile takes|Dynamo bytecode transform"),
    ("decode CUDA-graph capture", r"Capture \w+ decode CUDA graph begin|Capturing CUDA graphs"),
    ("decode CUDA graphs captured", r"Capture \w+ decode CUDA graph end|Graph capturing finished"),
    ("prefill CUDA-graph capture", r"Capture \w+ prefill CUDA graph begin"),
    ("prefill CUDA graphs captured", r"Capture \w+ prefill CUDA graph end"),
    ("serving, warm-up request", r"Uvicorn running on|Application startup complete|init engine .* took"),
    ("ready", r"The server is fired up"),
))
# processes that mean "compiling", by their executable's name
COMPILERS = ("nvcc", "cicc", "ptxas", "nvlink", "fatbinary", "cc1plus", "ninja", "ld")
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Compiler:
    """One compiler process under the engine: its name, pid and seconds it has run."""

    name: str
    pid: int
    running_s: float


def phase_of(lines: Iterable[str]) -> str | None:
    """The phase named by the last log line that matches a phase pattern (None: none matched yet)."""
    found = None
    for line in lines:
        for name, pat in PHASES:
            if pat.search(line):
                found = name
    return found


def read_phase(log: Path | None, max_bytes: int = 1 << 20) -> str | None:
    """The phase of a log file, read from its last `max_bytes` (tqdm's carriage returns split lines too)."""
    if log is None:
        return None
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - max_bytes))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    return phase_of(re.split(r"[\r\n]", text))


def _uptime_s(proc: Path) -> float:
    return float((proc / "uptime").read_text().split()[0])


def compilers(pids: Iterable[int], proc: Path = Path("/proc")) -> list[Compiler]:
    """The compiler processes among `pids`, longest-running first."""
    out = []
    try:
        now = _uptime_s(proc)
    except (OSError, ValueError, IndexError):
        return []
    for pid in pids:
        try:
            stat = (proc / str(pid) / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.find("(") + 1:stat.rfind(")")]
        fields = stat[stat.rfind(")") + 2:].split()
        if name in COMPILERS and len(fields) > 19:
            out.append(Compiler(name, pid, max(0.0, now - int(fields[19]) / _TICK)))  # field 22: starttime
    return sorted(out, key=lambda c: -c.running_s)


def describe(phase: str | None, running: list[Compiler], since_s: float | None = None) -> str:
    """One phrase for a progress line or a deadline failure: 'in decode CUDA-graph capture (for 212 s);
    compiling: nvcc 95 s, cicc 94 s' or 'in ...; no compiler running'."""
    where = f"in {phase}" if phase else "before its log named a phase"
    if phase and since_s is not None:
        where += f" (for {since_s:.0f} s)"
    if not running:
        return f"{where}; no compiler running"
    names = ", ".join(f"{c.name} {c.running_s:.0f} s" for c in running[:3])
    return f"{where}; compiling: {names}" + (f" (+{len(running) - 3} more)" if len(running) > 3 else "")


class StartWatch:
    """Follows one engine's start: call `note(now)` at each poll; `phrase()` says where it is."""

    def __init__(self, log: Path | None, pids):
        self.log = log
        self.pids = pids  # a callable returning the engine's live pids now
        self.phase: str | None = None
        self.phase_since: float | None = None
        self.phases: dict[str, float] = {}  # phase -> seconds after start when first seen
        self._t0: float | None = None

    def note(self, now: float) -> None:
        """Read the log's phase at time `now` (monotonic seconds)."""
        if self._t0 is None:
            self._t0 = now
        phase = read_phase(self.log)
        if phase != self.phase:
            self.phase, self.phase_since = phase, now
            if phase is not None:
                self.phases.setdefault(phase, round(now - self._t0, 1))

    def phrase(self, now: float) -> str:
        """Where the start is now (see describe)."""
        since = now - self.phase_since if self.phase_since is not None and self.phase else None
        return describe(self.phase, compilers(self.pids()), since)
