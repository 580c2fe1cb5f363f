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

REPO = Path(__file__).resolve().parents[1]


def test_collect_only_on_cpu():
    # Exactly the user's command (all auto-loaded plugins included). The -m expression form is covered by
    # tests/test_plugin_units.py (parsing) and tests/test_plugin.py (selection) without a second collection.
    cmd = [sys.executable, "-m", "pytest", "benchmarks/", "--collect-only", "-q"]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    print(f"{' '.join(cmd[2:])}: exit {out.returncode} in {time.perf_counter() - t0:.1f} s")
    # 0: collected; 5: nothing collected (no benchmark module yet, or all deselected).
    assert out.returncode in (0, 5), out.stdout[-3000:] + out.stderr[-3000:]
    assert "Traceback" not in out.stdout + out.stderr
