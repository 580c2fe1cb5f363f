"""`pytest benchmarks/ --collect-only -q` works on a CPU box: benchmark modules import nothing GPU-only at
import time, the plugin's configure step (fingerprint, baselines, marker check) passes here, and every
family's cases and the self-checks are collected (an empty collection is a failure, not a pass).

Run exactly as a user would, from the repository root, in a subprocess. The duration is printed for the
record (design target: under 10 s) but not asserted: this box is shared and its speed is not the code's.
"""

from __future__ import annotations

import collections
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_collect_only_on_cpu():
    # Exactly the user's command (all auto-loaded plugins included). The -m expression form is covered by
    # tests/test_plugin_units.py (parsing) and tests/test_plugin.py (selection) without a second collection.
    cmd = [sys.executable, "-m", "pytest", "benchmarks/", "--collect-only", "-q"]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    print(f"{' '.join(cmd[2:])}: exit {out.returncode} in {time.perf_counter() - t0:.1f} s")
    # 0 only: 5 (nothing collected) would mean the benchmarks vanished, not that they collect cleanly.
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "Traceback" not in out.stdout + out.stderr
    items = [line for line in out.stdout.splitlines() if "::" in line]
    assert re.search(rf"^{len(items)}(/\d+)? tests collected", out.stdout, re.M), out.stdout[-500:]
    # Without -m, everything deselected is a `full` case, and the run says so (733d5c3 printed a bare count).
    deselected = re.search(r"\((\d+) deselected\)", out.stdout)
    assert deselected and (f"moebench: {deselected[1]} of the deselected are outside the default selection "
                           "(the full product of the axes, marker `full`: -m full runs them)") in out.stdout
    # What is collected: cases of every family's test, and the four self-checks.
    per_test = collections.Counter(item.split("[")[0] for item in items)
    assert set(per_test) == {f"benchmarks/test_{f}.py::test_{f}" for f in ("allreduce", "decode", "gemm")} | {
        f"benchmarks/test_selfcheck.py::{t}" for t in ("test_copy_bandwidth", "test_aa_same_work_agrees",
                                                     "test_sensitivity_5pct_larger_is_slower",
                                                     "test_graph_timer_agrees_with_do_bench")}
    assert all(n == 1 for t, n in per_test.items() if "selfcheck" in t)
