"""The counters' gate, on fake numbers (no clock, no ncu): a counter that should not move fails at 1%, or
outside twice its stored A/A noise where that is wider; and the line that names the kernel and counter."""

from __future__ import annotations

import pytest

from moebench.baselines.compare import Comparison, Verdict, compare_case, compare_metric
from moebench.baselines.rules import rule_of
from moebench.core.kinds import COUNTER_REL_TOL, DEVICE_COUNTER
from moebench.core.metrics import Metric
from moebench.core.ncu_kernels import BY_KEY, counter_metric, metric_name
from moebench.outputs.counter_lines import counter_moved_most, scaled_pair

READ = BY_KEY["dram_read_bytes"]
BASE = 24.8e6


def measured(change: float) -> Metric:
    """A freshly counted read-bytes metric, as ncu_kernels makes it (one ncu pass: noise 0)."""
    return counter_metric(READ, BASE * (1 + change))


def stored(noise: float = 0.0) -> Metric:
    """The stored entry of that counter: what a baseline update would write from an A/A of runs."""
    m = measured(0.0)
    return Metric(m.value, m.unit, m.direction, noise=noise, n=3, rel_tol=m.rel_tol, kind=m.kind)


@pytest.mark.parametrize("change, noise, verdict", [
    (+0.015, 0.0, Verdict.REGRESSION),   # +1.5% with no noise: over 1%
    (+0.005, 0.0, Verdict.PASS),         # +0.5%: inside 1%
    (+0.015, 0.01, Verdict.AMBIGUOUS),   # an A/A that read 1% noise widens it to 2%: +1.5% no longer fails
    (+0.025, 0.01, Verdict.REGRESSION),  # ... and +2.5% still does
    (-0.015, 0.0, Verdict.IMPROVEMENT),
])
def test_a_counter_gates_at_one_percent_or_twice_its_stored_noise(change, noise, verdict):
    c = compare_metric(measured(change), stored(noise))
    assert c.verdict is verdict, c.reason


def test_the_counter_metric_declares_the_rule_and_the_kind():
    m = measured(0.0)
    assert (m.rel_tol, m.kind, m.direction, m.gated) == (COUNTER_REL_TOL, DEVICE_COUNTER, "lower", True)
    assert COUNTER_REL_TOL == 0.01


def test_a_small_kernels_dram_read_is_recorded_not_gated_and_its_instructions_still_gate():
    """Under 1 MiB a call a kernel's DRAM read is noise (session 18: 3,248 then 2,800 B in two processes); from
    1 MiB it gates, and a kernel that grows into that range is gated on its new value."""
    read, inst = BY_KEY["dram_read_bytes"], BY_KEY["inst_executed"]
    assert counter_metric(read, 3248.0).gated is False
    assert counter_metric(read, (1 << 20) - 1).gated is False
    assert counter_metric(read, float(1 << 20)).gated is True
    assert counter_metric(read, 24.8e6).gated is True
    assert counter_metric(inst, 1536.0).gated is True  # instructions are exact at any size


@pytest.mark.parametrize("noise, lets", [(0.0, 0.01), (0.002, 0.01), (0.01, 0.02), (0.03, 0.06)])
def test_the_stored_rule_reads_as_the_wider_of_one_percent_and_twice_the_noise(noise, lets):
    rule = rule_of(stored(noise).to_json())
    assert rule.lets_through(other_machine=False) == pytest.approx(lets)


def test_on_another_machine_the_counter_kind_assumes_one_percent_between_machines():
    c = compare_metric(measured(+0.015), stored(0.0), other_machine=True)
    assert c.assumed_spread == 0.01 and c.verdict is Verdict.AMBIGUOUS  # 2 x 1% band: +1.5% not proven


def cmp(name: str, before: float, after: float) -> tuple[str, Comparison]:
    m = Metric(after, "B", "lower", rel_tol=0.01, kind=DEVICE_COUNTER)
    return name, compare_metric(m, Metric(before, "B", "lower", rel_tol=0.01, kind=DEVICE_COUNTER))


def test_the_regression_line_names_the_kernel_and_counter_that_moved_most():
    comps = dict([
        cmp(metric_name("dram_read_bytes", "fused_moe_w4_mma"), 24.8e6, 26.3376e6),   # +6.2%
        cmp(metric_name("dram_read_bytes", "moe_align_block_size_kernel"), 4096, 4116),  # +0.5%: PASS
        cmp(metric_name("dram_write_bytes", "fused_moe_w4_mma"), 80e3, 81.6e3),  # +2%
        cmp(metric_name("dram_read_bytes"), 24.8e6, 27.0e6),  # the case total moved more, but names no kernel
    ])
    units = {n: "B" for n in comps}
    assert counter_moved_most(comps, units) == "dram read bytes +6.2% in fused_moe_w4_mma (24.8 -> 26.3 MB)"


def test_a_regression_outranks_a_larger_move_that_did_not_fail():
    a = Metric(1.0e6, "inst", "lower", noise=0.2, rel_tol=0.01, kind=DEVICE_COUNTER)
    noisy = ("ncu_inst_executed@tiny_kernel", compare_metric(Metric(1.3e6, "inst", "lower", kind=DEVICE_COUNTER), a))
    assert noisy[1].verdict is Verdict.AMBIGUOUS
    comps = dict([noisy, cmp(metric_name("dram_read_bytes", "big"), 10e6, 10.3e6)])
    assert counter_moved_most(comps, {}) == "dram read bytes +3.0% in big (10 -> 10.3 MB)"


def test_no_kernel_counter_no_phrase():
    comps = compare_case({"graph_us": Metric(10.0, "us", "lower")}, {"graph_us": Metric(9.0, "us", "lower")})
    assert counter_moved_most(comps, {}) == ""


@pytest.mark.parametrize("a, b, unit, text", [
    (24.8e6, 26.3e6, "B", "24.8 -> 26.3 MB"), (4096, 4116, "B", "4.1 -> 4.12 KB"), (512, 600, "B", "512 -> 600 B"),
    (1.48e6, 1.52e6, "inst", "1.48 -> 1.52 M inst"), (3.0e9, 3.2e9, "B", "3 -> 3.2 GB"),
])
def test_scaled_pair(a, b, unit, text):
    assert scaled_pair(a, b, unit) == text
