"""An engine's start, watched: the phase its log last named and the compilers it runs, in progress
lines and in a missed start deadline (SGLang's first start compiles its JIT kernels inside the decode
CUDA-graph capture and prints nothing meanwhile)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from moebench.decode import startup
from moebench.decode.procs import EngineError
from moebench.decode.server import ServerEngine
from moebench.core.ports import free_port

SGLANG_LINES = [
    "[2026-12-02 10:00:09 TP0] Load weight begin. avail mem=139.12 GB",
    "[2026-12-02 10:00:26 TP0] Load weight end. elapsed=16.60 s, type=DeepseekV3ForCausalLM",
    "[2026-12-02 10:00:27 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 4096",
    "[2026-12-02 10:00:28 TP0] Capture target decode CUDA graph begin. backend=full, num_tokens_per_bs=1, bs=[1]",
]


def test_the_last_matching_line_names_the_phase():
    assert startup.phase_of(SGLANG_LINES[:1]) == "loading weights"
    assert startup.phase_of(SGLANG_LINES) == "decode CUDA-graph capture"
    done = SGLANG_LINES + ["[..] Capture target decode CUDA graph end. elapsed=412.3 s, mem usage=0.10 GB",
                           "[..] some line no pattern knows"]
    assert startup.phase_of(done) == "decode CUDA graphs captured"
    assert startup.phase_of(["nothing here"]) is None
    vllm = ["INFO Starting to load model /m...", "INFO Model loading took 79.7 GiB memory and 16.6 seconds",
            "Capturing CUDA graphs (decode, FULL):  40%|████      | 2/5"]
    assert startup.phase_of(vllm) == "decode CUDA-graph capture"


def test_a_log_read_from_its_tail_splits_tqdm_carriage_returns(tmp_path):
    log = tmp_path / "engine.log"
    log.write_text("x" * 5000 + "\n" + "\n".join(SGLANG_LINES[:3]) + "\nCapturing batches (bs=1 avail_mem=50 GB)\r"
                   "[..] Capture target prefill CUDA graph begin. num_tokens=[4, 8]\r")
    assert startup.read_phase(log, max_bytes=600) == "prefill CUDA-graph capture"
    assert startup.read_phase(tmp_path / "missing.log") is None and startup.read_phase(None) is None


def _fake_proc(root: Path, uptime: float, procs: dict[int, tuple[str, float]]) -> Path:
    """A /proc with `uptime` and a stat file per pid: (command name, start time in s after boot)."""
    root.mkdir()
    (root / "uptime").write_text(f"{uptime} 1.0\n")
    tick = os.sysconf("SC_CLK_TCK")
    for pid, (name, started) in procs.items():
        (root / str(pid)).mkdir()
        fields = ["S", "1", str(pid)] + ["0"] * 16 + [str(int(started * tick))] + ["0"] * 10
        (root / str(pid) / "stat").write_text(f"{pid} ({name}) " + " ".join(fields) + "\n")
    return root


def test_compilers_are_found_by_name_with_how_long_they_run(tmp_path):
    proc = _fake_proc(tmp_path / "proc", 1000.0, {10: ("python3", 100.0), 11: ("nvcc", 700.0), 12: ("cicc", 905.0),
                                                 13: ("ptxas (x)", 990.0)})
    found = startup.compilers([10, 11, 12, 13, 99], proc)
    assert [(c.name, c.pid, round(c.running_s)) for c in found] == [("nvcc", 11, 300), ("cicc", 12, 95)]
    said = startup.describe("decode CUDA-graph capture", found, since_s=412.4)
    assert said == "in decode CUDA-graph capture (for 412 s); compiling: nvcc 300 s, cicc 95 s"
    assert startup.describe(None, []) == "before its log named a phase; no compiler running"


def test_a_missed_start_deadline_names_the_phase_and_the_running_compiler(tmp_path):
    # A server whose log reaches the decode graph capture and then runs "nvcc" (sleep under that name)
    # without ever listening: the failure must say both, not only "did not become healthy".
    nvcc = tmp_path / "nvcc"
    nvcc.symlink_to("/bin/sleep")
    script = f"echo '{SGLANG_LINES[0]}'; echo '{SGLANG_LINES[3]}'; exec {nvcc} 600"
    notes: list[str] = []
    eng = ServerEngine(f"http://127.0.0.1:{free_port()}", ["bash", "-c", script], tmp_path / "engine.log",
                       start_timeout=17.0, trial_timeout=5.0, grace_s=2.0)
    t0 = time.monotonic()
    try:
        with pytest.raises(EngineError) as e:
            eng.start(notes.append)
    finally:
        assert eng.stop() == []
    assert time.monotonic() - t0 >= 17.0
    assert "did not become healthy within 17 s (in decode CUDA-graph capture (for " in e.value.summary
    assert "; compiling: nvcc " in e.value.summary
    assert any(n.startswith("server starting (") and "in decode CUDA-graph capture" in n and "nvcc" in n
               for n in notes), notes
    assert eng.start_phases == {}  # a start that failed records no phases as a success


def test_a_server_that_exits_says_where_its_start_got_to(tmp_path):
    script = f"echo '{SGLANG_LINES[0]}'; echo '{SGLANG_LINES[1]}'; sleep 1; exit 3"
    eng = ServerEngine(f"http://127.0.0.1:{free_port()}", ["bash", "-c", script], tmp_path / "engine.log",
                       start_timeout=60.0, trial_timeout=5.0, grace_s=2.0)
    try:
        with pytest.raises(EngineError) as e:
            eng.start()
    finally:
        eng.stop()
    assert "exited with code 3 before it became healthy" in e.value.summary
    assert "in weights loaded" in e.value.summary
