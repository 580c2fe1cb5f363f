"""Server mode: start an OpenAI-compatible server (vLLM or SGLang), wait for health, stream trials.

The server runs in its own process group with its output in the case's log. Start-up is watched
against a deadline while the process is polled, so a server that crashes fails at once and one that
never becomes healthy fails at the deadline; a stream that breaks off fails its trial. Every failure
carries the server's last log lines, and stop() always takes the whole process group down.
With `url` alone (no command) the server is one already running elsewhere: nothing is started or
stopped, only health and streams.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Sequence

from moebench.decode import openai_stream
from moebench.decode.openai_stream import StreamBroken, StreamResult
from moebench.decode.procs import EngineError, EngineProcess
from moebench.decode.startup import StartWatch
from moebench.decode.stats import Trial, trial_name


class ServerEngine:
    """An OpenAI-compatible server for one case: start(), trial() per trial, stop() (always)."""

    def __init__(self, url: str, cmd: Sequence[str] | None = None, log: Path | None = None,
                 env: dict[str, str] | None = None, *, start_timeout: float, trial_timeout: float,
                 grace_s: float = 10.0, health_path: str = "/health"):
        self.url = url.rstrip("/")
        self.cmd = list(cmd) if cmd else None
        self.log = Path(log) if log else None
        self.env = env
        self.start_timeout = start_timeout
        self.trial_timeout = trial_timeout
        self.grace_s = grace_s
        self.health_path = health_path
        self.proc: EngineProcess | None = None
        self.model = ""
        self.usage_tokens: list[int | None] = []
        self.start_phases: dict[str, float] = {}  # phase -> seconds after start when the log first named it

    def _fail(self, message: str) -> EngineError:
        if self.log is None:
            return EngineError(f"{message} (server at {self.url}, not started by moebench: no log)")
        return EngineError(message, self.log)

    def _pids(self) -> list[int]:
        return self.proc.pids() if self.proc else []

    def start(self, progress: Callable[[str], None] = lambda s: None) -> float:
        """Start the server (unless it is an external URL) and wait until /health answers 200.
        Returns the seconds it took. Progress lines and a missed deadline name the phase the log
        reached and the compilers running under the server (startup.py)."""
        t0 = time.monotonic()
        if self.cmd:
            assert self.log is not None
            self.proc = EngineProcess(self.cmd, self.log, env=self.env)
        watch = StartWatch(self.log if self.cmd else None, self._pids)
        deadline = t0 + self.start_timeout
        next_look, next_note = t0, t0 + 15
        while True:
            now = time.monotonic()
            if now >= next_look:
                watch.note(now)
                next_look += 5
            code = self.proc.exit_code() if self.proc else None
            if code is not None:
                watch.note(now)
                raise self._fail(f"the server exited with code {code} before it became healthy "
                                 f"({now - t0:.1f} s after start, {watch.phrase(now)})")
            try:
                status, _ = openai_stream.get(self.url, self.health_path, timeout=2.0)
                if status == 200:
                    break
            except OSError:
                pass  # not listening yet
            now = time.monotonic()
            if now >= deadline:
                watch.note(now)
                raise self._fail(f"the server did not become healthy within {self.start_timeout:.0f} s "
                                 f"({watch.phrase(now)}; GET {self.url}{self.health_path})")
            if now >= next_note:
                progress(f"server starting ({now - t0:.0f} s): {watch.phrase(now)}")
                next_note += 15
            time.sleep(0.25)
        watch.note(time.monotonic())
        self.start_phases = watch.phases
        try:
            self.model = openai_stream.served_model(self.url)
        except (StreamBroken, OSError) as e:
            raise self._fail(f"the server is healthy but lists no model: {e}") from None
        if self.proc:
            self.proc.remember_descendants()
        return time.monotonic() - t0

    def stream(self, prompt: list[int], max_tokens: int) -> StreamResult:
        """One streamed request through the OpenAI completions API (an engine's native API in subclasses)."""
        payload = openai_stream.completion_payload(self.model, prompt, max_tokens)
        return openai_stream.stream_completion(self.url, payload, read_timeout=self.trial_timeout,
                                               deadline=time.monotonic() + self.trial_timeout)

    def trial(self, index: int, prompt: list[int], max_tokens: int, warmup: bool, name: str = "") -> Trial:
        """Stream one completion and return its per-chunk timeline; `name` names it in an error (default
        stats.trial_name's)."""
        try:
            res = self.stream(prompt, max_tokens)
        except StreamBroken as e:
            code = self.proc.exit_code() if self.proc else None
            if self.proc and code is None:
                time.sleep(0.2)  # a killed server closes its sockets a moment before it is reaped
                code = self.proc.exit_code()
            gone = f"; the server process exited with code {code}" if code is not None else ""
            raise self._fail(f"{name or trial_name(index, warmup)}: {e}{gone}") from None
        self.usage_tokens.append(res.usage_tokens)
        return res.trial(warmup)

    def stop(self) -> list[int]:
        """Stop the server's whole process group; returns pids that survived (none)."""
        return self.proc.stop(self.grace_s) if self.proc else []
