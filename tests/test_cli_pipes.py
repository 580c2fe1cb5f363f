"""`moebench ... | head -1`: a reader that leaves early ends the command quietly, exit 0."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GEMM = REPO / "baselines" / "nvidia-h200-x1" / "gemm.json"


def test_baselines_show_into_a_closed_pipe_exits_0_without_a_message(tmp_path):
    # 40 copies of a 165-entry file print about 1 MB, far more than a pipe holds (64 KiB on Linux), so
    # the command is still writing when the reader closes its end: the broken pipe is certain, not a race.
    for i in range(40):
        (tmp_path / f"hw-{i:02d}").mkdir()
        shutil.copy(GEMM, tmp_path / f"hw-{i:02d}" / "gemm.json")
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    proc = subprocess.Popen([sys.executable, "-m", "moebench.cli.main", "baselines", "show", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    first = proc.stdout.readline()  # what `head -1` takes, then it exits
    proc.stdout.close()
    err = proc.stderr.read().decode()
    rc = proc.wait(timeout=120)
    assert first.startswith(str(tmp_path).encode())
    assert (rc, err) == (0, "")
