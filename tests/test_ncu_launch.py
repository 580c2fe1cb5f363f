"""Finding ncu and running a child under it, with a FAKE ncu (an executable script in tmp_path, selected
through MOEBENCH_NCU) that prints a fixture, the ERR_NVGPUCTRPERM message, fails, or hangs."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from moebench.core import hardware, ncu_launch
from moebench.core.ncu_kernels import NCU_METRICS
from moebench.core.ncu_launch import NcuFailed, NcuUnavailable, find_ncu, run_under_ncu, why_unavailable

DATA = Path(__file__).parent / "data" / "ncu"


def fake_ncu(tmp_path: Path, *, prints: str = "", exit: int = 0, sleep: float = 0.0) -> str:
    """An `ncu` that answers --version like ncu, records its argv, prints `prints` and exits `exit`."""
    path = tmp_path / "ncu"
    path.write_text(f"""#!{sys.executable}
import json, sys, time
if sys.argv[1:] == ["--version"]:
    print("NVIDIA (R) Nsight Compute Command Line Profiler")
    print("Copyright (c) 2018-2024 NVIDIA Corporation")
    print("Version 2024.3.2.0 (build 34861637) (public-release)")
    sys.exit(0)
open({str(tmp_path / "argv.json")!r}, "w").write(json.dumps(sys.argv[1:]))
time.sleep({sleep})
sys.stdout.write(open({str(tmp_path / "prints.txt")!r}).read())
sys.exit({exit})
""")
    (tmp_path / "prints.txt").write_text(prints)
    path.chmod(0o755)
    return str(path)


def test_the_launch_runs_the_child_under_ncu_and_parses_its_table(tmp_path):
    ncu = fake_ncu(tmp_path, prints=(DATA / "raw_base_units.csv").read_text())
    got = run_under_ncu(ncu, NCU_METRICS, "moebench.gemm.counter_child", ["--case", "x"], timeout_s=60)
    assert len(got) == 6 and got[1].values["dram__bytes_read.sum"] == 16_515_072
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv[:4] == ["--csv", "--page", "raw", "--print-units"]
    for flag, value in (("--clock-control", "none"), ("--target-processes", "all"), ("--profile-from-start", "off"),
                        ("--cache-control", "all"), ("--metrics", ",".join(NCU_METRICS))):
        assert argv[argv.index(flag) + 1] == value
    assert argv[-5:] == [sys.executable, "-m", "moebench.gemm.counter_child", "--case", "x"]


def test_no_permission_to_read_counters_is_a_skip_reason_not_a_failure(tmp_path):
    ncu = fake_ncu(tmp_path, prints=(DATA / "err_nvgpuctrperm.txt").read_text(), exit=1)
    want = r"may not read the GPU performance counters here \(ERR_NVGPUCTRPERM - The user does not have permission"
    with pytest.raises(NcuUnavailable, match=want):
        run_under_ncu(ncu, NCU_METRICS, "m", timeout_s=60)


def test_a_failing_ncu_says_its_status_and_last_line(tmp_path):
    oom = "RuntimeError: CUDA error: out of memory"
    ncu = fake_ncu(tmp_path, prints=f"==PROF== Connected\nTraceback...\n{oom}\n", exit=3)
    with pytest.raises(NcuFailed, match=f"^ncu exited with status 3 running m: {oom}$"):
        run_under_ncu(ncu, NCU_METRICS, "m", timeout_s=60)


def test_a_hanging_ncu_times_out_with_a_clear_error(tmp_path):
    ncu = fake_ncu(tmp_path, prints="", sleep=30)
    with pytest.raises(NcuFailed, match=r"ncu did not finish within 1 s"):
        run_under_ncu(ncu, NCU_METRICS, "m", timeout_s=1)


def test_a_hanging_ncu_is_killed_with_the_child_it_started(tmp_path):
    # ncu profiles a Python child; killing ncu alone left the child holding the GPU (its pid in child.pid)
    path = tmp_path / "ncu"
    path.write_text(f"""#!{sys.executable}
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
open({str(tmp_path / "child.pid")!r}, "w").write(str(child.pid))
time.sleep(60)
""")
    path.chmod(0o755)
    with pytest.raises(NcuFailed, match=r"within 2 s running m \(it and its child were killed\)"):
        run_under_ncu(str(path), NCU_METRICS, "m", timeout_s=2)
    pid = int((tmp_path / "child.pid").read_text())
    assert _dies(pid), f"ncu's child {pid} outlived the timeout"


def _dies(pid: int, within_s: float = 10.0) -> bool:
    """Whether the process ends (gone, or a zombie its reaper has not collected) within a few seconds of a
    SIGKILL already sent: the signal is delivered asynchronously."""
    import time

    stat = Path(f"/proc/{pid}/stat")
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            if stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.05)
    return False


def test_ncu_is_found_through_moebench_ncu_with_its_version(tmp_path, monkeypatch):
    monkeypatch.setenv(ncu_launch.ENV, fake_ncu(tmp_path))
    tool = find_ncu()
    assert tool.path == str(tmp_path / "ncu") and tool.version == "2024.3.2.0" and why_unavailable(tool) is None


def test_no_ncu_says_why(tmp_path, monkeypatch):
    monkeypatch.delenv(ncu_launch.ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert "no ncu: not on PATH" in why_unavailable(find_ncu())
    monkeypatch.setenv(ncu_launch.ENV, str(tmp_path / "missing"))
    assert why_unavailable(find_ncu()) == f"{ncu_launch.ENV}={tmp_path / 'missing'} is not an executable file"


def test_the_fingerprint_names_ncu_and_its_version_only_where_there_is_one(tmp_path, monkeypatch):
    monkeypatch.setattr(hardware, "_nvml", lambda: None)
    monkeypatch.setenv(ncu_launch.ENV, fake_ncu(tmp_path))
    hardware.fingerprint.cache_clear()
    try:
        assert hardware.fingerprint()["ncu"] == {"path": str(tmp_path / "ncu"), "version": "2024.3.2.0"}
        monkeypatch.setenv(ncu_launch.ENV, str(tmp_path / "missing"))
        hardware.fingerprint.cache_clear()
        assert "ncu" not in hardware.fingerprint()
    finally:
        hardware.fingerprint.cache_clear()


def test_an_ncu_whose_version_cannot_be_read_is_still_found(tmp_path, monkeypatch):
    broken = tmp_path / "ncu"
    broken.write_text("#!/bin/sh\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv(ncu_launch.ENV, str(broken))
    assert find_ncu() == ncu_launch.NcuTool(str(broken), None)
    assert os.access(broken, os.X_OK)


def test_the_raw_output_is_kept_where_asked_also_when_it_cannot_be_read(tmp_path, monkeypatch):
    table = (DATA / "raw_base_units.csv").read_text()
    ncu = fake_ncu(tmp_path, prints=table)
    monkeypatch.setenv(ncu_launch.KEEP_ENV, str(tmp_path / "kept"))
    keep = ncu_launch.keep_path("kimi-k2.5-tp8-fused-m1-int4-g32-decode-triton")
    assert keep == str(tmp_path / "kept" / "kimi-k2.5-tp8-fused-m1-int4-g32-decode-triton.csv")
    run_under_ncu(ncu, NCU_METRICS, "m", timeout_s=60, keep=keep)
    assert Path(keep).read_text() == table and not Path(keep).with_suffix(".err").exists()
    broken = fake_ncu(tmp_path, prints="not a table\n")
    with pytest.raises(ValueError):
        run_under_ncu(broken, NCU_METRICS, "m", timeout_s=60, keep=keep)
    assert Path(keep).read_text() == "not a table\n"  # the output a parse failed on is the one to read
    monkeypatch.delenv(ncu_launch.KEEP_ENV)
    assert ncu_launch.keep_path("x") is None
