"""Edits that loosen the gate, as a reviewer found them: each let a -90% regression through while
`baselines diff --exit-code` said "0 changes loosen the gate". Each is now refused by the schema or
marked [LOOSER] (exit 1), and the gate itself bounds the worst slowdown it lets through for a rate too.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from moebench.baselines.compare import Verdict, compare_metric
from moebench.baselines.store import dumps
from moebench.cli.main import main
from moebench.core.metrics import Metric

REPO = Path(__file__).resolve().parents[1]
SELFCHECK = REPO / "baselines" / "nvidia-h200-x1" / "selfcheck.json"  # committed, small
AA = "selfcheck[aa-copy-1024MiB-cuda]"


@pytest.fixture
def copy(tmp_path) -> Path:
    """A copy of the committed selfcheck file under tmp_path/<key>/ to edit."""
    out = tmp_path / "nvidia-h200-x1" / "selfcheck.json"
    out.parent.mkdir()
    shutil.copy(SELFCHECK, out)
    return out


def _edit(path: Path, mutate) -> None:
    doc = json.loads(path.read_text())
    mutate(doc)
    path.write_text(dumps(doc))


def _metric(d: dict) -> dict:
    return d["entries"][AA]["metrics"]["copy_us"]


@pytest.mark.parametrize("what, mutate, looser", [
    ("gate cliff", lambda d: _metric(d).update(gate="cliff"), "gated on a cliff only: fails at 2x"),
    ("gate none", lambda d: _metric(d).update(gate="none"), "not gated: always AMBIGUOUS"),
    ("noise_machines raised", lambda d: _metric(d).update(noise_machines=0.45), "wider spread between machines"),
    ("noise_machines removed", lambda d: _metric(d).pop("noise_machines"), "spread between machines removed: 2.0% assumed"),
    ("machines deleted", lambda d: d["entries"][AA].pop("machines"), "no longer named as recording"),
    ("one machine dropped", lambda d: d["entries"][AA]["machines"].pop(), "no longer named as recording"),
])
def test_each_edit_that_loosens_the_gate_is_marked_and_fails_the_exit_code(copy, capsys, what, mutate, looser):
    _edit(copy, mutate)
    assert main(["baselines", "diff", str(SELFCHECK), str(copy), "--exit-code"]) == 1, what
    out = capsys.readouterr().out
    assert "[LOOSER: " in out and looser in out.split("[LOOSER: ", 1)[1], out
    assert "0 changes loosen" not in out


def test_a_spread_between_machines_that_hides_a_doubling_is_refused(copy, capsys):
    # noise_machines 50 and machines deleted made a -90% regression AMBIGUOUS on every machine.
    _edit(copy, lambda d: (_metric(d).update(noise_machines=50.0), d["entries"][AA].pop("machines")))
    assert main(["baselines", "diff", str(SELFCHECK), str(copy), "--exit-code"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{copy}: entries['{AA}'].metrics.copy_us.noise_machines: must be a relative " \
        "spread in [0, 0.5]" in err, err


def test_tightening_the_spread_or_naming_a_machine_more_needs_no_reason(copy, capsys):
    _edit(copy, lambda d: (_metric(d).update(noise_machines=0.0001, kind="device_kernel"),
                           d["entries"][AA]["machines"].append("gpu-000000000000")))
    assert main(["baselines", "diff", str(SELFCHECK), str(copy), "--exit-code"]) == 0
    out = capsys.readouterr().out
    assert "LOOSER" not in out and "-> rel 5% + 2x noise(0.0%; machines 0.0%)" in out, out


def _rate(value: float, **kw) -> Metric:
    return Metric(value, "GB/s", "higher", **{"noise": 0.0, "n": 20, **kw})


@pytest.mark.parametrize("stored", [dict(rel_tol=1.0), dict(rel_tol=0.05, noise=0.5), dict(rel_tol=0.05, cliff=True)])
def test_the_widest_stored_tolerance_still_fails_a_rate_at_a_tenth(stored):
    # rel_tol 1.0 or noise 0.5 (the schema's maxima) let a -90% copy_GBps pass: a plain change cannot
    # pass -100% for a rate. As a ratio, 1.0 fails a rate at half its baseline, as a time at twice.
    c = compare_metric(_rate(415.6), _rate(4156.0, **stored))
    assert c.verdict is Verdict.REGRESSION and c.worse == pytest.approx(9.0), c
    assert compare_metric(_rate(2100.0), _rate(4156.0, **stored)).verdict is not Verdict.REGRESSION, \
        "just under half the rate is inside a doubling"
