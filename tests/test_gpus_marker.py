"""The `gpus` marker is selectable the way README.md says: `-m "gpus(n=2)"` (pytest's -m matches keyword
arguments only, so a case marked gpus(2) positionally was never selected)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def collect(expr: str) -> tuple[int, list[str]]:
    """(exit code, selected node ids) of collecting benchmarks/ with -m expr: collection needs no GPU."""
    r = subprocess.run([sys.executable, "-m", "pytest", "benchmarks/", "--collect-only", "-q", "-m", expr],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    return r.returncode, [line for line in r.stdout.splitlines() if "::" in line]


def test_readme_gpus_example_selects_the_two_gpu_cases():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    expr = re.search(r'pytest benchmarks/ -m "([^"]*gpus\(n=2\)[^"]*)"', readme).group(1)
    rc, ids = collect(expr)
    assert rc == 0 and ids, f'-m "{expr}" selected nothing'
    assert all("-w2-" in i for i in ids), [i for i in ids if "-w2-" not in i]


def test_every_gpus_mark_names_n_by_keyword():
    # Selects the cases whose gpus mark has no n=1..8 keyword (`full` named: the whole product counts).
    exact = " or ".join(f"gpus(n={n})" for n in range(1, 9))
    rc, ids = collect(f"(full or not full) and gpus and not ({exact})")
    assert rc == 5 and ids == [], ids[:5]
