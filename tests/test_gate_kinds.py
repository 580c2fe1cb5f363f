"""The spread between machines the gate assumes where none was measured, per metric kind
(moebench.core.kinds): a kernel time gates tight on any machine of the kind, a host-bound number only on a
cliff, and the verdict line and the results file say which kind and spread were used."""

from __future__ import annotations

import pytest

from moebench.baselines.compare import Verdict, compare_metric
from moebench.core.kinds import DEVICE_KERNEL, GPU_DECODE, HOST_BOUND, KINDS, UNKNOWN
from moebench.core.metrics import Metric
from moebench.outputs.report import one_line
from moebench.results.document import MetricDoc


def us(value: float, **kw) -> Metric:
    return Metric(value, "us", "lower", **{"noise": 0.003, "n": 30, **kw})


@pytest.mark.parametrize("kind, measured, verdict, assumed", [
    (DEVICE_KERNEL, 106.0, Verdict.REGRESSION, 0.02),  # a third H200 read gemm within 2%: +6% is caught there
    (DEVICE_KERNEL, 104.0, Verdict.PASS, 0.02),
    (GPU_DECODE, 108.0, Verdict.REGRESSION, 0.03),     # ms/token: within 3%, band 6%
    (UNKNOWN, 108.0, Verdict.AMBIGUOUS, 0.05),         # an old entry no measurement declares: 5%, as before
    (HOST_BOUND, 180.0, Verdict.AMBIGUOUS, 0.50),      # TTFT 84-171 ms: only a doubling shows
    (HOST_BOUND, 201.0, Verdict.REGRESSION, 0.50),
])
def test_another_machine_assumes_the_spread_of_the_metrics_kind(kind, measured, verdict, assumed):
    c = compare_metric(us(measured, kind=kind), us(100.0), other_machine=True)
    assert (c.verdict, c.kind, c.assumed_spread) == (verdict, kind, assumed)
    assert c.noise == pytest.approx(2 * assumed)


def test_the_declared_kind_outranks_a_stored_one_and_a_measured_spread_outranks_both():
    # a stored kind edited to host-bound cannot widen the band of a measurement that says kernel time
    c = compare_metric(us(106.0, kind=DEVICE_KERNEL), us(100.0, kind=HOST_BOUND), other_machine=True)
    assert c.verdict is Verdict.REGRESSION and c.kind == DEVICE_KERNEL
    # an old results file declares none: the stored kind is used
    assert compare_metric(us(106.0), us(100.0, kind=DEVICE_KERNEL), other_machine=True).assumed_spread == 0.02
    c = compare_metric(us(106.0, kind=HOST_BOUND), us(100.0, noise_machines=0.004), other_machine=True)
    assert c.verdict is Verdict.REGRESSION and c.machine_spread == 0.004 and c.assumed_spread is None


def test_the_verdict_line_and_the_results_file_name_the_kind_and_the_assumed_spread():
    c = compare_metric(us(106.0, kind=DEVICE_KERNEL), us(100.0), other_machine=True)
    line = one_line("gemm[x]", "graph_us", c, "us")
    assert line.endswith("noise 4.0%, baseline from another machine of this kind (spread between machines not "
                         "recorded: 2% assumed for device kernel time)"), line
    d = MetricDoc(us(106.0, kind=DEVICE_KERNEL), c).to_json()
    assert (d["kind"], d["compared_kind"], d["assumed_machine_spread"], d["machine_spread"]) == \
        (DEVICE_KERNEL, DEVICE_KERNEL, 0.02, None)
    back = MetricDoc.from_json(d, "r.json", "cases.x.metrics.graph_us").comparison
    assert (back.kind, back.assumed_spread, back.other_machine) == (DEVICE_KERNEL, 0.02, True)


def test_a_baseline_stored_as_not_gating_is_ambiguous_whatever_the_change():
    for value in (10.0, 100.0, 1000.0):
        c = compare_metric(us(value), us(100.0, gate_off=True, noise=1.2))
        assert c.verdict is Verdict.AMBIGUOUS and "too wide to gate" in c.reason


def test_the_kinds_are_ordered_as_the_measurements_say():
    # kernel time < GPU-bound decode < host-bound; the host-bound band (2x) is a doubling, the cliff
    spread = {k: KINDS[k].machine_spread for k in KINDS}
    assert spread[DEVICE_KERNEL] < spread[GPU_DECODE] < spread[HOST_BOUND] == 0.5
    from moebench.baselines.schema import NOISE_MAX
    assert spread[HOST_BOUND] <= NOISE_MAX


def test_families_declare_the_kind_from_what_they_measured():
    from moebench.allreduce.cases import latency_kind
    from moebench.decode.runner import metric_kind
    from moebench.decode.scenarios import Scenario
    from moebench.core.kinds import DEVICE_COLLECTIVE, timed_on

    assert (timed_on("cuda"), timed_on("cpu")) == (DEVICE_KERNEL, HOST_BOUND)
    rank = Scenario.__new__(Scenario)
    object.__setattr__(rank, "device", "cuda")
    object.__setattr__(rank, "cliff_metrics", ("ttft_ms",))
    assert [metric_kind(rank, n) for n in ("ms_per_token", "ttft_ms", "step_routed_experts_ms")] == \
        [GPU_DECODE, HOST_BOUND, DEVICE_KERNEL]
    object.__setattr__(rank, "cliff_metrics", ("ms_per_token", "ttft_ms"))
    assert metric_kind(rank, "ms_per_token") == HOST_BOUND, "a host-overhead detector"

    class Case:
        backend, nbytes = "nccl", 1 << 24
    assert latency_kind(Case()) == DEVICE_COLLECTIVE
    Case.nbytes = 14336
    assert latency_kind(Case()) == HOST_BOUND
