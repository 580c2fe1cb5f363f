"""benchmarks/test_selfcheck.py itself, run through the plugin with CopyWork.time replaced by fake samples:
on a machine too noisy to tell, the A/A and sensitivity cases pass with an AMBIGUOUS row that gives the
spread; on a quiet machine a wrong harness fails them with a FAIL row that says what was seen."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import table_rows

REPO = Path(__file__).resolve().parents[1]

MS = 1e-3
NOISY = "this machine's timing spread is 38.0% (>= 5%): too noisy to prove the harness; rerun on an idle machine"

# Call k of the session gets median medians[k % 2] (A/A: a, b, a, ...; sensitivity: base, bigger, ...),
# 20 samples half at median x (1 - d), half at median x (1 + d): robust spread exactly `spread`.
FAKE_TIMING = '''
import json
import pathlib

from moebench.selfcheck import CopyWork

CONTROL = json.loads((pathlib.Path(__file__).parent / "timing.json").read_text())
CALLS = []


def fake_time(self, rule, mode="graph"):
    median = CONTROL["medians"][len(CALLS) % 2]
    CALLS.append(self.nbytes)
    d = CONTROL["spread"] / 1.4826
    return [median * (1 + (d if i % 2 else -d)) for i in range(20)]


CopyWork.time = fake_time
'''


@pytest.mark.parametrize("test, medians, spread, outcome, row", [
    ("test_aa_same_work_agrees", [10 * MS, 32.8 * MS], 0.38, "passed",
     f"AMBIGUOUS *selfcheck[[]aa-copy-64MiB-cpu[]]*{NOISY} (A/A: *+228.0%*"),
    ("test_sensitivity_5pct_larger_is_slower", [10 * MS, 10.03 * MS], 0.38, "passed",
     f"AMBIGUOUS *selfcheck[[]sensitivity-copy-64MiB-cpu[]]*{NOISY} (sensitivity: 5% more bytes measured +0.3%*"),
    ("test_aa_same_work_agrees", [10 * MS, 11 * MS], 0.01, "failed",
     "FAIL *test_aa_same_work_agrees*A/A: the same copy measured 10000.0 us then 11000.0 us (+10.0%*"
     "the harness is wrong*"),
    ("test_sensitivity_5pct_larger_is_slower", [10 * MS, 10.03 * MS], 0.01, "failed",
     "FAIL *test_sensitivity_5pct_larger_is_slower*sensitivity: 5% more bytes measured +0.3%*the harness is wrong*"),
    ("test_sensitivity_5pct_larger_is_slower", [10 * MS, 10.5 * MS], 0.01, "passed",
     "PASS *selfcheck[[]sensitivity-copy-64MiB-cpu[]]*seen_slowdown_pct*5 %*"),
], ids=["aa-noisy", "sensitivity-noisy", "aa-quiet-wrong", "sensitivity-quiet-wrong", "sensitivity-quiet-right"])
def test_selfcheck_cases_end_to_end(fakebench, test, medians, spread, outcome, row):
    fakebench.pytester.makepyfile(test_selfcheck=(REPO / "benchmarks" / "test_selfcheck.py").read_text(),
                                  conftest=FAKE_TIMING)
    (fakebench.path / "timing.json").write_text(json.dumps({"medians": medians, "spread": spread}))
    r = fakebench.run("test_selfcheck.py", "-k", test)
    r.assert_outcomes(**{outcome: 1}, deselected=3)
    table_rows(r).fnmatch_lines(["*moebench verdicts on*", row])
