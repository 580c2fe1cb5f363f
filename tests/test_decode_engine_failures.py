"""Engines that misbehave on purpose: each failure fails its own case within its deadline, with the
engine's last log lines, and leaves no process behind.

This file is also the fake engine: run as a script it is a tiny OpenAI-compatible HTTP server (or a
fake in-process worker) that crashes at start, never becomes healthy, is killed mid-stream, stalls,
or works. The misbehaving ones start helper processes of their own (one inside the process group,
one that calls setsid and leaves it), so the tests see that teardown reaches them too.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from moebench.decode.inproc import InProcessEngine
from moebench.decode.procs import EngineError, alive
from moebench.decode.server import ServerEngine
from moebench.core.ports import free_port

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]
# How far past its deadline a failure may come: a deadline is checked between polls and probes of up
# to 2 s, which a loaded 2-core box stretches; a deadline that is not kept at all overshoots by minutes.
OVERSHOOT_S = 15.0


# ---------------------------------------------------------------------------------------------------
# The fake engine (script side)
# ---------------------------------------------------------------------------------------------------
def _log(msg: str) -> None:
    print(f"(FakeEngine pid={os.getpid()}) INFO {msg}", flush=True)


def _spawn_helpers(pidfile: str | None) -> None:
    """Two sleeping helpers, like an engine's ranks: one in our group, one that escapes it (setsid)."""
    inside = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    escaped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    if pidfile:
        Path(pidfile).write_text(json.dumps([os.getpid(), inside.pid, escaped.pid]))


def _serve(mode: str, port: int, itl_s: float) -> None:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt, *args):  # access log into the engine log, like a real server
            _log("http " + fmt % args)

        def _json(self, status: int, obj) -> None:
            body = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/health":
                self._json(503 if mode == "never-healthy" else 200, {})
            elif self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": "fake", "object": "model"}]})
            else:
                self._json(404, {"error": "not found"})

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            n = int(req["max_tokens"])
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()  # HTTP/1.0: the body ends when the connection closes

            def event(obj) -> None:
                self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
                self.wfile.flush()

            for i in range(n):
                if mode == "midstream" and i == 3:
                    _log("fatal: the engine died (killing itself with SIGKILL)")
                    os.kill(os.getpid(), signal.SIGKILL)
                if mode == "stall" and i == 2:
                    _log("stalling forever mid-stream")
                    time.sleep(600)
                time.sleep(itl_s)
                last = "length" if i == n - 1 else None
                if mode == "text-only":  # like SGLang: text deltas, no token ids; the last one can be empty
                    event({"choices": [{"index": 0, "text": "" if i == n - 1 else "t", "finish_reason": last}]})
                else:
                    event({"choices": [{"index": 0, "text": "", "token_ids": [100 + i], "finish_reason": last}]})
            if mode == "text-only":
                event({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})  # a bare closing chunk
            event({"choices": [], "usage": {"completion_tokens": n}})
            self.wfile.write(b"data: [DONE]\n\n")

    _log(f"serving in mode {mode} on port {port}")
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


def _fake_worker(mode: str, events_fd: int) -> None:
    """Speaks moebench.decode.inproc_worker's protocol: 'ready', then one 'trial' per command."""
    events = os.fdopen(events_fd, "w", buffering=1)
    if mode == "worker-crash":
        _log("loading model")
        _log("RuntimeError: fake engine failed to allocate the KV cache")
        sys.exit(7)
    if mode == "worker-hang":
        _log("compiling forever")
        time.sleep(600)
    events.write(json.dumps({"event": "ready", "start_s": 0.1}) + "\n")
    for line in sys.stdin:
        cmd = json.loads(line)
        if mode == "worker-die-in-trial":
            _log("segfault in the fake engine")
            os.kill(os.getpid(), signal.SIGKILL)
        n = cmd["max_tokens"]
        events.write(json.dumps({"event": "trial", "index": cmd["index"],
                                 "chunks": [[0.01 * (i + 1), 1] for i in range(n)],
                                 "token_ids": [5] * n}) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--pidfile")
    ap.add_argument("--itl", type=float, default=0.002)
    ap.add_argument("--ignore-sigterm", action="store_true")
    ap.add_argument("--spec")
    ap.add_argument("--events-fd", type=int)
    a = ap.parse_args()
    if a.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _spawn_helpers(a.pidfile)
    if a.mode.startswith("worker"):
        _fake_worker(a.mode, a.events_fd)
    elif a.mode == "crash":
        _log("loading weights")
        _log("RuntimeError: fake CUDA error: out of memory")
        sys.exit(3)
    else:
        if a.mode == "never-healthy":
            _log("waiting for weights that never come")
        _serve(a.mode, a.port, a.itl)


# ---------------------------------------------------------------------------------------------------
# The tests (pytest side)
# ---------------------------------------------------------------------------------------------------
def _env() -> dict[str, str]:
    # The fake engine is this file, which imports moebench (from src/, as pytest's pythonpath does).
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}


def _server(tmp_path: Path, mode: str, *, start_timeout: float = 20, trial_timeout: float = 5,
            extra: tuple[str, ...] = ()) -> tuple[ServerEngine, Path]:
    port, pidfile = free_port(), tmp_path / "pids.json"
    cmd = [sys.executable, str(HERE), "--mode", mode, "--port", str(port), "--pidfile", str(pidfile), *extra]
    return ServerEngine(f"http://127.0.0.1:{port}", cmd, tmp_path / "engine.log", _env(),
                        start_timeout=start_timeout, trial_timeout=trial_timeout, grace_s=1.0), pidfile


def _assert_all_gone(pidfile: Path) -> None:
    pids = json.loads(pidfile.read_text())
    left = [p for p in pids if alive(p)]
    assert not left, f"processes left behind: {left}"


def test_server_that_crashes_at_start_fails_at_once_with_its_log(tmp_path):
    eng, pidfile = _server(tmp_path, "crash", start_timeout=60)
    t0 = time.monotonic()
    with pytest.raises(EngineError) as e:
        eng.start()
    assert time.monotonic() - t0 < eng.start_timeout, "a crash must not wait for the start deadline"
    assert eng.stop() == []
    msg = str(e.value)
    assert "exited with code 3 before it became healthy" in msg
    assert "fake CUDA error: out of memory" in msg and "last" in msg
    _assert_all_gone(pidfile)


def test_server_that_never_becomes_healthy_fails_at_the_deadline(tmp_path):
    # It ignores SIGTERM too: teardown has to escalate to SIGKILL.
    eng, pidfile = _server(tmp_path, "never-healthy", start_timeout=2.0, extra=("--ignore-sigterm",))
    t0 = time.monotonic()
    with pytest.raises(EngineError) as e:
        eng.start()
    took = time.monotonic() - t0
    assert 2.0 <= took < 2.0 + OVERSHOOT_S, f"start deadline 2 s, failed after {took:.1f} s"
    assert eng.stop() == []
    assert "did not become healthy within 2 s" in str(e.value)
    assert "waiting for weights that never come" in str(e.value)
    _assert_all_gone(pidfile)


def test_server_killed_mid_stream_fails_the_trial_with_its_log(tmp_path):
    eng, pidfile = _server(tmp_path, "midstream")
    eng.start()
    with pytest.raises(EngineError) as e:
        eng.trial(0, [11, 12, 13], 8, warmup=True)
    assert eng.stop() == []
    msg = str(e.value)
    assert "closed the stream after 3 tokens" in msg
    assert "exited with code -9" in msg and "the engine died" in msg
    _assert_all_gone(pidfile)


def test_server_that_stalls_mid_stream_hits_the_trial_timeout(tmp_path):
    eng, pidfile = _server(tmp_path, "stall", trial_timeout=1.0)
    eng.start()
    t0 = time.monotonic()
    with pytest.raises(EngineError) as e:
        eng.trial(0, [11, 12, 13], 8, warmup=False)
    assert 1.0 <= time.monotonic() - t0 < 1.0 + OVERSHOOT_S
    assert eng.stop() == []
    assert "no data for 1 s after 2 tokens" in str(e.value) and "stalling forever" in str(e.value)
    _assert_all_gone(pidfile)


def test_working_server_gives_a_timed_token_per_chunk(tmp_path):
    eng, pidfile = _server(tmp_path, "good", extra=("--itl", "0.005"))
    eng.start()
    try:
        t = eng.trial(0, [11, 12, 13], 6, warmup=False)
    finally:
        assert eng.stop() == []
    assert t.tokens == 6 and t.token_ids == [100, 101, 102, 103, 104, 105]
    assert all(b[0] > a[0] for a, b in zip(t.chunks, t.chunks[1:]))
    # The server sleeps 5 ms before each chunk, so chunk i cannot arrive before (i + 1) x 5 ms after the
    # request (the client's clock starts before it sends). That bound holds on any box. The gap between
    # two arrivals does not: a client that is not scheduled when a chunk arrives reads it together with
    # the next one from its buffer, 0 ms apart (that made this test fail on a loaded box).
    assert all(at >= (i + 1) * 0.005 for i, (at, _) in enumerate(t.chunks)), t.chunks
    assert eng.usage_tokens == [6]
    _assert_all_gone(pidfile)


def test_server_without_token_ids_counts_one_token_per_chunk(tmp_path):
    eng, pidfile = _server(tmp_path, "text-only")
    eng.start()
    try:
        t = eng.trial(0, [11, 12, 13], 5, warmup=False)
    finally:
        assert eng.stop() == []
    assert t.tokens == 5 and t.token_ids == []  # the bare closing chunk is not a token (usage says 5)
    _assert_all_gone(pidfile)


def test_external_url_is_streamed_without_being_started_or_stopped(tmp_path):
    owner, pidfile = _server(tmp_path, "good")
    owner.start()
    try:
        ext = ServerEngine(owner.url, start_timeout=5, trial_timeout=5)
        ext.start()
        assert ext.trial(0, [1, 2], 3, warmup=False).tokens == 3
        assert ext.stop() == []
        assert owner.proc.exit_code() is None, "stopping an external URL must not touch the server"
    finally:
        owner.stop()
    _assert_all_gone(pidfile)


def _worker(tmp_path: Path, mode: str, **kw) -> tuple[InProcessEngine, Path]:
    pidfile = tmp_path / "pids.json"
    worker = [sys.executable, str(HERE), "--mode", mode, "--pidfile", str(pidfile)]
    return InProcessEngine({"llm_kwargs": {}}, tmp_path / "engine.log", _env(), worker=worker,
                           grace_s=1.0, **{"start_timeout": 20, "trial_timeout": 5, **kw}), pidfile


def test_inprocess_engine_that_crashes_at_start_fails_with_its_log(tmp_path):
    eng, pidfile = _worker(tmp_path, "worker-crash")
    with pytest.raises(EngineError) as e:
        eng.start()
    assert eng.stop() == []
    assert "exited with code 7 before it could become ready" in str(e.value)
    assert "failed to allocate the KV cache" in str(e.value)
    _assert_all_gone(pidfile)


def test_inprocess_engine_that_never_gets_ready_fails_at_the_deadline(tmp_path):
    eng, pidfile = _worker(tmp_path, "worker-hang", start_timeout=1.5)
    t0 = time.monotonic()
    with pytest.raises(EngineError) as e:
        eng.start()
    assert 1.5 <= time.monotonic() - t0 < 1.5 + OVERSHOOT_S
    assert eng.stop() == []
    assert "did not become ready within 2 s" in str(e.value) and "compiling forever" in str(e.value)
    _assert_all_gone(pidfile)


def test_inprocess_engine_killed_in_a_trial_fails_it(tmp_path):
    eng, pidfile = _worker(tmp_path, "worker-die-in-trial")
    eng.start()
    with pytest.raises(EngineError) as e:
        eng.trial(0, [1, 2, 3], 4, warmup=False)
    assert eng.stop() == []
    assert "exited with code -9 before it could finish trial 1" in str(e.value)
    assert "segfault in the fake engine" in str(e.value)
    _assert_all_gone(pidfile)


def test_inprocess_engine_protocol_round_trip(tmp_path):
    eng, pidfile = _worker(tmp_path, "worker-good")
    eng.start()
    try:
        t = eng.trial(0, [1, 2, 3], 4, warmup=True)
    finally:
        assert eng.stop() == []
    assert t.warmup and t.tokens == 4 and t.chunks[0] == (0.01, 1)
    _assert_all_gone(pidfile)


# ---------------------------------------------------------------------------------------------------
# A whole pytest session over misbehaving engines: each fails its own case and the run goes on
# ---------------------------------------------------------------------------------------------------
_FAKE_SCENARIO = """
[[scenario]]
name = "{name}"
engine = "vllm-server"
model = "tiny"
model_label = "fake-{name}"
device = "cpu"
moe_backend = "auto"
cuda_graphs = false
prompt_tokens = 8
output_tokens = 6
trials = 2
warmup_trials = 1
start_timeout_s = {start_timeout_s}
trial_timeout_s = 60
server_command = ["{{python}}", "{script}", "--mode", "{mode}", "--port", "{{port}}", "--pidfile", "{pidfile}",
                  "--itl", "0.05"]
"""


def test_session_over_misbehaving_engines_fails_each_case_and_goes_on(tmp_path):
    modes = {"crashes": "crash", "hangs": "never-healthy", "dies": "midstream", "works": "good"}
    # Only "hangs" may reach its start deadline: the others get one that no start-up reaches, even on a
    # loaded box where starting the fake server takes a second or more. The works server's 50 ms per token
    # is far above the tiny model's memory floor (0.6 ms/token here, 3 ms with the box loaded) and keeps
    # its chunks apart when the client is not scheduled at once: at 2 ms, a loaded box read them in
    # bursts and the case was refused (steady state below the floor, or bursts).
    toml = "".join(_FAKE_SCENARIO.format(name=n, mode=m, script=HERE, pidfile=tmp_path / f"{n}.pids",
                                         start_timeout_s=3 if n == "hangs" else 60)
                   for n, m in modes.items())
    (tmp_path / "fake.toml").write_text(toml)
    r = subprocess.run([sys.executable, "-m", "pytest", str(REPO / "benchmarks" / "test_decode.py"), "-p", "no:randomly",
                        "--decode-scenarios", str(tmp_path / "fake.toml"), "--baseline-dir", str(tmp_path / "b"),
                        "--results-json", str(tmp_path / "r.json"), "-q", "-rf"],
                       cwd=REPO, capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "3 failed, 1 passed" in out, out
    for name, needle in (("crashes", "fake CUDA error: out of memory"), ("hangs", "did not become healthy within 3 s"),
                         ("dies", "closed the stream after 3 tokens")):
        assert f"fake-{name}" in out and needle in out, out
    assert "exited with code 3 before it became healthy" in out, out  # the crash, not a start deadline
    # No elapsed-time bound: each message above says which deadline or failure ended its case.
    doc = json.loads((tmp_path / "r.json").read_text())
    [case] = doc["cases"]
    assert case["key"].startswith("decode[fake-works-vllm-server") and case["verdict"] == "NEW"
    assert [t["warmup"] for t in case["info"]["per_trial"]] == [True, False, False]
    for name in modes:
        _assert_all_gone(tmp_path / f"{name}.pids")


if __name__ == "__main__":
    main()
