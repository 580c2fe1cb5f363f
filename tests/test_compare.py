"""The verdict gate (baselines/compare.py) with fake numbers: every verdict, both directions, precedence,
the case verdict, which verdicts fail a test (the failure line made of them: tests/test_report.py).

Pure functions, so the tables below are the specification: no clocks, no files.
"""

from __future__ import annotations

import pytest

from moebench.baselines.compare import (
    NOISE_FACTOR,
    Comparison,
    Verdict,
    case_verdict,
    compare_metric,
    failing,
)
from moebench.core.metrics import Metric

V = Verdict


def m(value: float, direction: str = "lower", noise: float = 0.0, rel_tol: float = 0.05) -> Metric:
    return Metric(value, "us", direction, noise=noise, n=20, rel_tol=rel_tol)


# (name, measured, baseline, keyword flags, expected verdict)
CASES = [
    # --- lower is better (latency) ---
    ("lower: identical", m(100), m(100), {}, V.PASS),
    ("lower: 4% slower is inside the 5% tolerance", m(104), m(100), {}, V.PASS),
    # 105 vs 100 is exactly the tolerance: a regression must be *worse than* it.
    ("lower: exactly at tolerance", m(105), m(100), {}, V.PASS),
    ("lower: 10% slower, quiet", m(110, noise=0.01), m(100, noise=0.01), {}, V.REGRESSION),
    ("lower: 10% slower but the measurement is noisy", m(110, noise=0.06), m(100), {}, V.AMBIGUOUS),
    ("lower: 10% slower but the baseline was noisy", m(110), m(100, noise=0.06), {}, V.AMBIGUOUS),
    ("lower: 10% faster, quiet", m(90), m(100), {}, V.IMPROVEMENT),
    # Better than tolerance but inside the noise is not claimed as an improvement; nothing fails.
    ("lower: 10% faster, noisy", m(90, noise=0.06), m(100), {}, V.PASS),
    ("lower: throttled and 10% slower", m(110), m(100), {"throttled": True}, V.AMBIGUOUS),
    ("lower: throttled and identical", m(100), m(100), {"throttled": True}, V.AMBIGUOUS),
    # --- higher is better (throughput) ---
    ("higher: identical", m(50, "higher"), m(50, "higher"), {}, V.PASS),
    ("higher: 4% lower is inside tolerance", m(48, "higher"), m(50, "higher"), {}, V.PASS),
    ("higher: 10% lower, quiet", m(45, "higher"), m(50, "higher"), {}, V.REGRESSION),
    ("higher: 10% lower, noisy", m(45, "higher", noise=0.06), m(50, "higher"), {}, V.AMBIGUOUS),
    ("higher: 10% higher, quiet", m(55, "higher"), m(50, "higher"), {}, V.IMPROVEMENT),
    ("higher: throttled and 10% lower", m(45, "higher"), m(50, "higher"), {"throttled": True}, V.AMBIGUOUS),
    # --- no comparison possible ---
    ("no baseline entry", m(100), None, {}, V.NEW),
    ("case definition changed", m(100), m(100), {"stale": True}, V.STALE),
    ("direction changed since recording", m(100, "higher"), m(100, "lower"), {}, V.STALE),
    ("baseline value 0 cannot be a ratio", m(100), m(0), {}, V.STALE),
    ("other hardware", m(100), m(50), {"env_mismatch": True}, V.ENV_MISMATCH),
    # --- precedence: never compare across hardware; nothing to compare beats stale; stale beats throttle ---
    ("other hardware and no entry", m(100), None, {"env_mismatch": True}, V.ENV_MISMATCH),
    ("other hardware and stale", m(100), m(100), {"env_mismatch": True, "stale": True}, V.ENV_MISMATCH),
    ("no entry and throttled", m(100), None, {"throttled": True}, V.NEW),
    ("stale and throttled", m(200), m(100), {"stale": True, "throttled": True}, V.STALE),
]


@pytest.mark.parametrize("name, measured, baseline, flags, expected", CASES, ids=[c[0] for c in CASES])
def test_compare_metric_verdicts(name, measured, baseline, flags, expected):
    c = compare_metric(measured, baseline, **flags)
    assert c.verdict is expected, f"{name}: {c}"
    assert c.value == measured.value


def test_tolerance_is_the_baselines_not_the_measurements():
    # A reviewer sets rel_tol in the stored file; a benchmark changing its default must not loosen it.
    c = compare_metric(m(110, rel_tol=0.5), m(100, rel_tol=0.05))
    assert c.verdict is V.REGRESSION and c.rel_tol == 0.05


# A rate's worse is the time ratio less one (compare.slowdown): 100 -> 90 GB/s is 100/90 - 1 = 11.1% slower.
@pytest.mark.parametrize("direction, value, worse", [("lower", 110, 0.10), ("lower", 90, -0.10),
                                                    ("higher", 90, 10 / 90), ("higher", 110, -10 / 110)])
def test_worse_is_positive_when_worse_in_either_direction(direction, value, worse):
    c = compare_metric(m(value, direction), m(100, direction))
    assert c.worse == pytest.approx(worse)
    # delta_pct is the plain change as measured, whatever the direction.
    assert c.delta_pct == pytest.approx(value - 100)


def test_noise_band_is_noise_factor_times_the_larger_spread():
    c = compare_metric(m(100, noise=0.01), m(100, noise=0.03))
    assert c.noise == pytest.approx(NOISE_FACTOR * 0.03)
    c = compare_metric(m(100, noise=0.04), m(100, noise=0.02))
    assert c.noise == pytest.approx(NOISE_FACTOR * 0.04)


def test_noise_band_edge_is_inside():
    # worse 10% against a band of exactly 2 x 5% = 10%: not outside the noise, so not a regression.
    assert compare_metric(m(110, noise=0.05), m(100)).verdict is V.AMBIGUOUS
    assert compare_metric(m(110, noise=0.049), m(100)).verdict is V.REGRESSION


def _c(v: Verdict) -> Comparison:
    return Comparison(v, 1.0)


@pytest.mark.parametrize("verdicts, expected", [
    ([], V.PASS),
    ([V.PASS, V.PASS], V.PASS),
    ([V.PASS, V.IMPROVEMENT], V.IMPROVEMENT),
    ([V.IMPROVEMENT, V.NEW], V.NEW),
    ([V.NEW, V.AMBIGUOUS], V.AMBIGUOUS),
    ([V.AMBIGUOUS, V.ENV_MISMATCH], V.ENV_MISMATCH),
    ([V.ENV_MISMATCH, V.STALE], V.STALE),
    ([V.PASS, V.REGRESSION, V.STALE, V.NEW], V.REGRESSION),
])
def test_case_verdict_is_the_most_severe(verdicts, expected):
    assert case_verdict({f"m{i}": _c(v) for i, v in enumerate(verdicts)}) is expected


FAILS = {  # verdict -> (fails without --baseline-strict, fails with it)
    V.PASS: (False, False),
    V.IMPROVEMENT: (False, False),
    V.AMBIGUOUS: (False, False),
    V.ENV_MISMATCH: (False, False),
    V.NEW: (False, True),
    V.STALE: (False, True),
    V.REGRESSION: (True, True),
}


@pytest.mark.parametrize("verdict", list(Verdict))
def test_failing(verdict):
    assert set(FAILS) == set(Verdict), "a verdict was added: say here whether it fails"
    assert (failing(verdict, strict=False), failing(verdict, strict=True)) == FAILS[verdict]


def test_one_display_order_for_every_table_follows_the_gates_severity():
    from moebench.baselines.compare import DISPLAY_ORDER, display_rank
    from moebench.outputs.report import sorted_rows, tally
    from moebench.results.document import Row

    # The order itself, spelled out: it is the specification (SEVERITY and DISPLAY_ORDER are both read
    # from Outcome's declaration, so comparing one with the other could never fail).
    worst_first = ["REGRESSION", "FAIL", "ERROR", "MISSING", "STALE", "ENV_MISMATCH", "AMBIGUOUS", "NEW",
                   "IMPROVEMENT", "PASS", "SKIP"]
    assert [o.value for o in DISPLAY_ORDER] == worst_first
    # The gate's severity: of any two verdicts a case's is the one listed first.
    gate = [v for v in worst_first if v in {x.value for x in Verdict}]
    for i, worse in enumerate(gate):
        for better in gate[i + 1:]:
            assert case_verdict({"a": Comparison(V(better), 1.0), "b": Comparison(V(worse), 1.0)}) is V(worse)
    # Every table and tally shows outcomes in that order.
    rows = [Row(f"t::{o}", f"k[{o}]", o) for o in reversed(worst_first)]
    assert [r.verdict for r in sorted_rows(rows)] == worst_first
    assert tally(reversed(worst_first)) == ", ".join(f"1 {o}" for o in worst_first)
    assert display_rank("SOMETHING NEW") == -1  # an outcome nobody ranked sorts first


def test_the_gates_verdicts_are_outcomes_and_outcomes_are_spelled_once():
    import re
    from pathlib import Path

    from moebench.baselines.compare import DISPLAY_ORDER, Outcome

    # Every verdict is the Outcome of the same name and value (JSON stores the value: "PASS").
    assert all(Outcome[v.name] == v == v.value for v in Verdict)
    assert DISPLAY_ORDER == tuple(Outcome)
    # No other src file spells an outcome as a bare string literal: a table, tally or plot that sorts or
    # counts by its own strings drifts from the one order (plugin.py wrote "SKIP", plots.py "MISSING").
    src = Path(__file__).resolve().parents[1] / "src" / "moebench"
    # (an argparse metavar="NEW" names a file, not an outcome)
    literal = re.compile(r"(?<!metavar=)[\"'](" + "|".join(o.value for o in Outcome) + r")[\"']")
    spelled = [f"{p.relative_to(src)}:{i}" for p in sorted(src.rglob("*.py")) if p.name != "compare.py"
               for i, line in enumerate(p.read_text().splitlines(), 1) if literal.search(line)]
    assert spelled == []


@pytest.mark.parametrize("direction", ["lower", "higher"])
@pytest.mark.parametrize("tol", [0.03, 0.05, 0.6])
def test_the_pass_band_is_where_the_gate_passes(direction, tol):
    # The band a trend plot shades must be the gate's own: just inside either edge PASS, just outside
    # REGRESSION on the worse side and IMPROVEMENT on the better one (a rate's edges are not b (1 +- t)).
    from moebench.baselines.compare import pass_band

    base = m(100.0, direction, rel_tol=tol)
    lo, hi = pass_band(100.0, tol, direction)
    worse_edge, better_edge = (hi, lo) if direction == "lower" else (lo, hi)
    step = 1e-6 * 100
    towards_worse = 1 if direction == "lower" else -1
    assert compare_metric(m(worse_edge - towards_worse * step, direction), base).verdict is V.PASS
    assert compare_metric(m(worse_edge + towards_worse * step, direction), base).verdict is V.REGRESSION
    assert compare_metric(m(better_edge + towards_worse * step, direction), base).verdict is V.PASS
    assert compare_metric(m(better_edge - towards_worse * step, direction), base).verdict is V.IMPROVEMENT
