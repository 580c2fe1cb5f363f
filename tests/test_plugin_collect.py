"""`pytest benchmarks/ --collect-only -q` works on a CPU box: benchmark modules import nothing GPU-only at
import time, and the plugin's configure step (fingerprint, baselines, marker check) passes here.

Run exactly as a user would, from the repository root, in a subprocess. The duration is printed for the
record (design target: under 10 s) but not asserted: this box is shared and its speed is not the code's.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("args", [
    [],
    ["-m", "gemm and (triton or vllm_triton)"],
], ids=["all", "backend-expression"])
def test_collect_only_on_cpu(args):
    cmd = [sys.executable, "-m", "pytest", "benchmarks/", "--collect-only", "-q", *args]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    print(f"{' '.join(cmd[2:])}: exit {out.returncode} in {time.perf_counter() - t0:.1f} s")
    # 0: collected; 5: nothing selected (e.g. no case matches the expression yet).
    assert out.returncode in (0, 5), out.stdout[-3000:] + out.stderr[-3000:]
    assert "Traceback" not in out.stdout + out.stderr
