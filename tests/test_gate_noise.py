"""The gate's spread rules (moebench.baselines.compare): the spread on the recording machine, the spread
between machines of the kind on any other machine, and host-bound metrics gated only on a cliff."""

from __future__ import annotations

import pytest

from moebench.baselines.compare import CLIFF, UNKNOWN_MACHINE_SPREAD, Verdict, compare_metric
from moebench.core.metrics import Metric


def ms(value, noise=0.003, **kw):
    return Metric(value, "us", "lower", noise=noise, n=30, **kw)


@pytest.mark.parametrize("measured, other, between, verdict", [
    (108.0, False, None, Verdict.REGRESSION),   # the recording machine: +8% against 0.3% spreads
    (103.0, False, None, Verdict.PASS),         # +3% is inside the 5% tolerance anywhere
    (108.0, True, None, Verdict.AMBIGUOUS),     # another machine, spread between machines unknown (5% assumed)
    (111.0, True, None, Verdict.REGRESSION),    # ... but over twice that is a regression there too
    (108.0, True, 0.01, Verdict.REGRESSION),    # measured spread between machines 1%: +8% is caught
    (90.6, True, None, Verdict.PASS),           # -9.4% on another machine (the kimi M = 128 case): no IMPROVEMENT
    (90.6, True, 0.049, Verdict.PASS),          # nor with its measured spread between machines
    (90.6, False, None, Verdict.IMPROVEMENT),   # on the recording machine it is one
])
def test_the_spread_that_applies_depends_on_the_machine(measured, other, between, verdict):
    c = compare_metric(ms(measured), ms(100.0, noise_machines=between), other_machine=other)
    assert c.verdict is verdict
    assert c.other_machine is other and c.machine_spread == (between if other else None)
    assert c.noise == pytest.approx(2 * max(0.003, (between if between is not None else UNKNOWN_MACHINE_SPREAD)
                                            if other else 0.003))


def test_an_entry_of_several_machines_gives_its_recording_machines_their_spread_too():
    # its value is the median of its machines' medians: session 9's machine read the decode norms +7.5% from
    # the entry it helped record (machines 5.4% apart), on unchanged code
    c = compare_metric(ms(107.5), ms(100.0, noise_machines=0.054), other_machine=False)
    assert c.verdict is Verdict.AMBIGUOUS and c.noise == pytest.approx(0.108) and c.machine_spread is None
    assert compare_metric(ms(111.0), ms(100.0, noise_machines=0.054), other_machine=False).verdict is Verdict.REGRESSION
    # one machine's entry (no noise_machines) stays as tight as its own runs
    assert compare_metric(ms(107.5), ms(100.0), other_machine=False).verdict is Verdict.REGRESSION
    # a spread within 1% (the 3% entries) changes nothing there: twice it is inside the tolerance
    assert compare_metric(ms(103.5), ms(100.0, rel_tol=0.03, noise_machines=0.008)).verdict is Verdict.REGRESSION


@pytest.mark.parametrize("measured, verdict", [(168.4, Verdict.PASS), (199.0, Verdict.PASS), (201.0, Verdict.REGRESSION)])
def test_a_cliff_metric_fails_only_when_it_doubles(measured, verdict):
    # TTFT read +68.4% on another H200 with nothing changed; a doubling is a real cliff
    base = Metric(100.0, "ms", "lower", noise=0.02, n=3, rel_tol=0.20)
    c = compare_metric(Metric(measured, "ms", "lower", noise=0.02, n=3, cliff=True), base)
    assert c.verdict is verdict and c.rel_tol == CLIFF
    if verdict is Verdict.REGRESSION:
        assert "cliff" in c.reason


def test_a_cliff_stored_with_the_baseline_holds_even_if_the_measurement_does_not_say_so():
    base = Metric(100.0, "ms", "lower", noise=0.02, n=3, rel_tol=0.20, cliff=True)
    assert compare_metric(Metric(150.0, "ms", "lower", noise=0.02, n=3), base).verdict is Verdict.PASS


def test_cliff_and_noise_machines_round_trip_through_json_only_where_set():
    plain = Metric(1.0, "ms", "lower")
    assert set(plain.to_json()) == {"value", "unit", "direction", "noise", "n", "rel_tol"}
    rich = Metric(1.0, "ms", "lower", noise_machines=0.0412345678, cliff=True).to_json()
    assert rich["gate"] == "cliff" and rich["noise_machines"] == 0.041235
