"""vLLM in-process: the `LLM` class driven step by step, hosted in a worker process the harness owns.

"In-process" is the engine API (no HTTP server between the benchmark and the engine); the host
process (moebench.decode.inproc_worker) keeps vLLM and CUDA out of the pytest process, and lets a hung
engine be stopped with its whole process group within the case's deadline. One engine serves every
trial of a case: started once, trials sent one by one, stopped at the end.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from moebench.decode.procs import EngineError, EngineProcess
from moebench.decode.startup import StartWatch
from moebench.decode.stats import Trial, trial_name

# The worker command (tests put a fake one that speaks the same protocol in its place).
WORKER = (sys.executable, "-m", "moebench.decode.inproc_worker")


class InProcessEngine:
    """The vLLM LLM-class engine of one case. start(), then trial() per trial, then stop() (always)."""

    kind = "vllm"

    def __init__(self, spec: dict, log: Path, env: dict[str, str], *, start_timeout: float, trial_timeout: float,
                 grace_s: float = 10.0, worker: Sequence[str] = WORKER):
        self.spec = spec
        self.worker = list(worker)
        self.log = Path(log)
        self.env = env
        self.start_timeout = start_timeout
        self.trial_timeout = trial_timeout
        self.grace_s = grace_s
        self.proc: EngineProcess | None = None
        self.ready: dict = {}
        self._r: int | None = None
        self._buf = b""

    def start(self, progress: Callable[[str], None] = lambda s: None) -> float:
        """Start the worker and its engine; returns seconds until the engine was ready."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        spec_path = self.log.with_suffix(".spec.json")
        spec_path.write_text(json.dumps(self.spec, indent=2), encoding="utf-8")
        r, w = os.pipe()
        try:
            self.proc = EngineProcess(self.worker + ["--spec", str(spec_path), "--events-fd", str(w)], self.log,
                                      env=self.env, pass_fds=[w], stdin=subprocess.PIPE)
        finally:
            os.close(w)  # the worker holds the write end; EOF here then means it is gone
        self._r = r
        self.ready = self._next_event("ready", time.monotonic() + self.start_timeout, progress)
        self.proc.remember_descendants()
        return self.proc.elapsed()

    def trial(self, index: int, prompt: list[int], max_tokens: int, warmup: bool) -> Trial:
        """Run one request through the engine and return its per-step timeline."""
        name = trial_name(index, warmup)
        self._send({"cmd": "trial", "index": index, "prompt": prompt, "max_tokens": max_tokens}, name)
        ev = self._next_event("trial", time.monotonic() + self.trial_timeout, lambda s: None, trial=name)
        return Trial(warmup, [(float(t), int(n)) for t, n in ev["chunks"]], [int(i) for i in ev["token_ids"]])

    def profile(self, index: int, prompt: list[int], steps: int, timeout: float) -> dict:
        """Run one trial with `steps` decode steps under the engine's profiler (its trace lands in the
        profiler_config's folder); returns the worker's event (tokens, steps, wall_s)."""
        self._send({"cmd": "profile", "index": index, "prompt": prompt, "steps": steps}, "the profiled trial")
        return self._next_event("profile", time.monotonic() + timeout, lambda s: None, trial="the profiled trial")

    def stop(self) -> list[int]:
        """Stop the worker and every engine process it started; returns pids that survived (none)."""
        if self._r is not None:
            os.close(self._r)
            self._r = None
        if self.proc is None:
            return []
        return self.proc.stop(self.grace_s)

    def _send(self, cmd: dict, trial: str) -> None:
        """Send one command line to the worker; `trial` (stats.trial_name) names the trial in the error."""
        assert self.proc is not None and self.proc.proc.stdin is not None
        try:
            self.proc.proc.stdin.write((json.dumps(cmd) + "\n").encode())
            self.proc.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise EngineError(f"{trial}: the engine process is gone (exit code {self.proc.exit_code()})",
                              self.log) from None

    def _pids(self) -> list[int]:
        return self.proc.pids() if self.proc else []

    def _next_event(self, want: str, deadline: float, progress: Callable[[str], None], trial: str | None = None) -> dict:
        # trial: the trial's name (stats.trial_name) for the messages; None while starting
        what = "become ready" if trial is None else f"finish {trial}"
        next_note = time.monotonic() + 15
        watch = StartWatch(self.log, self._pids)  # a start's phase and compilers (startup.py)
        while True:
            line = self._read_line(min(0.5, max(0.0, deadline - time.monotonic())))
            if line is not None:
                ev = json.loads(line)
                if ev.get("event") == "error":
                    raise EngineError(f"the engine failed to {what}: {ev.get('message')}", self.log)
                if ev.get("event") == want:
                    return ev
                continue
            code = self.proc.exit_code() if self.proc else None
            if code is None and self._r is None and self.proc is not None:
                try:  # the event pipe closed: the worker is exiting; give it a moment to report its code
                    code = self.proc.proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    pass
            if code is not None or self._r is None:
                raise EngineError(f"the engine process exited with code {code} before it could {what} "
                                  f"({self.proc.elapsed():.1f} s after start)", self.log)
            if time.monotonic() >= deadline:
                limit = self.start_timeout if trial is None else self.trial_timeout
                where = ""
                if trial is None:
                    watch.note(time.monotonic())
                    where = f" ({watch.phrase(time.monotonic())})"
                raise EngineError(f"the engine did not {what} within {limit:.0f} s{where}", self.log)
            if trial is None and time.monotonic() >= next_note:
                watch.note(time.monotonic())
                progress(f"engine starting ({self.proc.elapsed():.0f} s): {watch.phrase(time.monotonic())}")
                next_note += 15

    def _read_line(self, timeout: float) -> bytes | None:
        """One event line from the worker, or None after `timeout` s without one (or at EOF)."""
        if b"\n" not in self._buf and self._r is not None:
            ready, _, _ = select.select([self._r], [], [], timeout)
            if ready:
                data = os.read(self._r, 1 << 20)
                if not data:  # EOF: the worker closed its end (it exited)
                    os.close(self._r)
                    self._r = None
                self._buf += data
        if b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            return line
        return None
