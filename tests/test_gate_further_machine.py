"""The spread a machine outside an entry's recorders gets: the half range of the recorders' medians, widened
for one machine more by how few they were (moebench.core.kinds.further_machine_factor). Fake numbers only."""

from __future__ import annotations

import pytest

from moebench.baselines.compare import Recorders, Verdict, compare_case, compare_metric
from moebench.baselines.rules import rule_of
from moebench.core.kinds import further_machine_factor
from moebench.core.metrics import Metric
from moebench.outputs.report import fmt_rule, machine_phrase
from moebench.results.document import MetricDoc


def ms(value, noise=0.003, **kw):
    return Metric(value, "ms", "lower", noise=noise, n=30, kind="device_kernel", **kw)


def test_few_machines_widen_their_half_range_and_many_do_not():
    factors = [further_machine_factor(n) for n in range(2, 11)]
    # two machines' half range is a third of the spread a third machine may show (d2(2) = 1.13 sd)
    assert factors[0] == pytest.approx(3.05, abs=0.01)
    assert factors[1] == pytest.approx(1.88, abs=0.01) and factors[2] == pytest.approx(1.48, abs=0.01)
    assert all(a >= b for a, b in zip(factors, factors[1:])), "more machines never widen the spread more"
    assert all(f >= 1.0 for f in factors) and factors[-1] == 1.0
    # an entry that does not say how many machines recorded it keeps its measured half range
    assert further_machine_factor(0) == further_machine_factor(1) == 1.0


def test_a_fifth_machine_is_judged_by_the_spread_four_predict_not_by_their_half_range():
    # the w4 router category: four machines within +-1.9% of 0.4855 ms/step; a fifth at -5.3%, past the 5%
    # tolerance and twice the half range, inside twice the spread four machines predict for a fifth (5.6%)
    base = ms(0.4855, noise=0.011, noise_machines=0.019)
    fifth = ms(0.4598, noise=0.006)
    assert compare_metric(fifth, base, other_machine=True).verdict is Verdict.IMPROVEMENT  # machines not said
    c = compare_metric(fifth, base, other_machine=True, machines=4)
    assert c.verdict is Verdict.PASS
    assert c.machine_spread == pytest.approx(0.019 * further_machine_factor(4))
    assert (c.measured_machine_spread, c.machines) == (0.019, 4)
    assert c.noise == pytest.approx(2 * 0.019 * further_machine_factor(4))
    # a real slowdown beyond the widened band still fails there
    assert compare_metric(ms(0.52, noise=0.006), base, other_machine=True, machines=4).verdict is Verdict.REGRESSION


def test_the_recording_machines_keep_their_own_half_range():
    # a machine that recorded the entry is one of the medians the half range spans: nothing to predict
    base = ms(100.0, noise_machines=0.019)
    c = compare_metric(ms(106.0), base, other_machine=False, machines=4)
    assert c.noise == pytest.approx(0.038) and c.machine_spread is None and c.verdict is Verdict.REGRESSION
    assert compare_metric(ms(106.0), base, other_machine=True, machines=4).noise == pytest.approx(
        2 * 0.019 * further_machine_factor(4))


def test_a_planted_slowdown_on_a_tight_entry_still_fails_on_another_machine():
    # session 15's Marlin plant: +4.4% against 3 machines within 0.3% at the tight 3%
    base = Metric(34.51, "us", "lower", noise=0.007, n=40, rel_tol=0.03, kind="device_kernel", noise_machines=0.003)
    c = compare_case({"graph_us": Metric(36.04, "us", "lower", noise=0.004, n=40)}, {"graph_us": base},
                     other_machine=True, machines=3)["graph_us"]
    assert c.verdict is Verdict.REGRESSION and c.noise < 0.03


def test_the_verdict_line_the_results_file_and_the_stored_rule_say_what_the_spread_was_widened_from():
    base = ms(100.0, noise_machines=0.019)
    c = compare_metric(ms(107.0), base, other_machine=True, machines=4)
    assert "spread between machines 2.8% (1.9% over 4)" in machine_phrase(c)
    back = MetricDoc.from_json(MetricDoc(ms(107.0), c).to_json(), "run.json", "cases[0].metrics.x").comparison
    assert (back.machine_spread, back.measured_machine_spread, back.machines) == (c.machine_spread, 0.019, 4)
    stored = {"value": 100.0, "unit": "ms", "direction": "lower", "rel_tol": 0.05, "noise": 0.003, "n": 30,
              "noise_machines": 0.019, "kind": "device_kernel"}
    assert "machines 2.8% (1.9% over 4)" in fmt_rule(rule_of(stored, 4))
    assert rule_of(stored, 4).lets_through(other_machine=True) == pytest.approx(2 * 0.019 * further_machine_factor(4))
    assert "machines 1.9%)" in fmt_rule(rule_of(stored))  # no count: the half range as measured


def test_a_metric_with_recorders_of_its_own_is_gated_with_them_and_the_others_with_the_entry_s():
    # a counter counted on two machines beside a time of five: on one of the five that did not count it, the
    # counter is another machine's (its two machines' half range widened x3.05), the time this machine's own
    stored = {"t": ms(100.0, noise_machines=0.01), "cnt": ms(100.0, noise_machines=0.01)}
    measured = {"t": ms(106.0), "cnt": ms(106.0)}
    c = compare_case(measured, stored, other_machine=False, machines=5, recorders={"cnt": Recorders(True, 2)})
    assert (c["t"].other_machine, c["t"].verdict) == (False, Verdict.REGRESSION)
    assert (c["cnt"].other_machine, c["cnt"].machines, c["cnt"].verdict) == (True, 2, Verdict.AMBIGUOUS)
