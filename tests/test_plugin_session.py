"""The run state behind the plugin (session.RunState), in process with in-memory baselines: the
re-measurement of a suspected regression, clocks throttled while measuring (a fake NVML), hardware
mismatch, metrics missing from the stored entry, which metric a table row shows, the failure line, what
an update would store, and the results JSON.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from moebench.core import provenance
from moebench.baselines.compare import Verdict
from moebench.baselines.store import BaselineSet, merge_entries
from moebench.core.metrics import Metric
from moebench.suite.session import RunState

HW = "test-hw-x1"
DEFINITION = {"shape": [1, 7168, 256], "dtype": "bf16"}
HERE = {"cpu": {"model": "Fake CPU"}, "gpus": [], "versions": {"torch": "2.13.0"}, "machine_id": "cpu-000000000001"}


def baseline_set(values: dict[str, float], *, fingerprint=HERE, definition=DEFINITION, extra=None,
                 machines=("cpu-000000000001",)) -> BaselineSet:
    """One gemm file whose entry 'k[1]' stores the given metric values (lower is better, 5% tolerance),
    recorded on `machines` (default: this test's machine, HERE)."""
    metrics = {n: {"value": v, "unit": "us", "direction": "lower", "rel_tol": 0.05, "noise": 0.0, "n": 10}
               for n, v in values.items()}
    entry = {"definition_hash": provenance.definition_hash(definition), "metrics": metrics,
             "provenance": {"kind": "measured", "commit": "c", "date": "d", "versions": {}},
             **({"machines": list(machines)} if machines else {})}
    doc, _ = merge_entries(None, HW, "gemm", fingerprint, "2026-01-01T00:00:00Z", {"k[1]": entry, **(extra or {})})
    return BaselineSet(root=Path("/nonexistent"), hardware_key=HW, docs={"gemm": doc})


def state(baselines: BaselineSet, *, strict=False, key_forced=True, fingerprint=HERE) -> RunState:
    return RunState(baseline_dir=baselines.root, hardware_key=HW, fingerprint=fingerprint, strict=strict,
                    update=False, baselines=baselines, key_forced=key_forced)


class Source:
    """measure() that returns the next prepared latency, and counts its calls."""

    def __init__(self, *values: float) -> None:
        self.values = itertools.cycle(values)
        self.calls = 0

    def __call__(self) -> dict[str, Metric]:
        self.calls += 1
        v = next(self.values)
        lat = Metric.from_samples([v, v, v], "us", "lower")
        return {"lat": lat, "gbps": lat.derived(1e3 / v, "GB/s", "higher")}


def record(s: RunState, source, key="k[1]", definition=DEFINITION, **kw):
    return s.record(nodeid=f"bench.py::test[{key}]", key=key, family="gemm", definition=definition,
                    measure=source, **kw)


def test_pass_measures_once():
    src = Source(100.0)
    r = record(state(baseline_set({"lat": 100.0})), src)
    assert (r.verdict, src.calls, r.remeasured_from) == (Verdict.PASS, 1, None)


def test_suspected_regression_is_measured_once_more_and_can_clear():
    # First measurement 20% slow, second back to normal: a transient, not a regression.
    src = Source(120.0, 101.0)
    said = []
    r = record(state(baseline_set({"lat": 100.0})), src, progress=said.append)
    assert src.calls == 2
    assert r.verdict is Verdict.PASS
    assert r.measurement.metrics["lat"].value == 101.0
    assert r.remeasured_from.metrics["lat"].value == 120.0
    assert said == ["k[1]: suspected regression, measuring once more"]


def test_confirmed_regression_is_measured_exactly_twice_and_fails():
    src = Source(120.0)
    s = state(baseline_set({"lat": 100.0}))
    r = record(s, src)
    assert (r.verdict, src.calls) == (Verdict.REGRESSION, 2)
    assert s.failure_line(r) == ("REGRESSION k[1] lat: 120 us, baseline 100 us, delta +20.0%, "
                                 "tolerance 5.0%, noise 0.0%")


@pytest.mark.parametrize("mask, verdict", [(0x0, Verdict.PASS), (0x4, Verdict.PASS), (0x40, Verdict.AMBIGUOUS)],
                         ids=["clean", "power-cap", "hw-thermal"])
def test_clocks_throttled_while_measuring_make_the_verdict_ambiguous(fake_nvml, mask, verdict):
    # What the clock monitor saw during measure() reaches the gate: a thermal throttle is AMBIGUOUS, not PASS.
    fake_nvml(mask)
    r = record(state(baseline_set({"lat": 100.0})), Source(100.0))
    assert r.verdict is verdict and r.comparisons["lat"].verdict is verdict
    throttled = verdict is Verdict.AMBIGUOUS
    assert r.measurement.throttled is throttled and r.doc().to_json()["throttled"] is throttled


def test_stale_and_new_fail_only_when_strict():
    changed = {**DEFINITION, "dtype": "fp8"}
    for strict in (False, True):
        s = state(baseline_set({"lat": 100.0}), strict=strict)
        stale = record(s, Source(100.0), definition=changed)
        new = record(s, Source(100.0), key="k[2]")
        assert (stale.verdict, new.verdict) == (Verdict.STALE, Verdict.NEW)
        assert (s.failure_line(stale) is not None, s.failure_line(new) is not None) == (strict, strict)


def test_metric_missing_from_the_stored_entry_is_new():
    r = record(state(baseline_set({"other": 5.0})), Source(100.0))
    assert r.comparisons["lat"].verdict is Verdict.NEW
    assert r.comparisons["lat"].reason == "metric not in the stored entry"
    assert "gbps" not in r.comparisons, "informational metrics are never compared"


def test_other_hardware_under_a_forced_key_is_never_compared():
    h200 = {"cpu": {"model": "x"}, "gpus": [{"name": "NVIDIA H200"}] * 2}
    s = state(baseline_set({"lat": 50.0}, fingerprint=h200))
    src = Source(100.0)  # would be a +100% regression if compared
    r = record(s, src)
    assert r.verdict is Verdict.ENV_MISMATCH and src.calls == 1
    assert s.failure_line(r) is None
    assert "recorded on GPUs" in r.note
    # Without --hardware-key the folder itself is this hardware's: the header is not second-guessed.
    assert record(state(baseline_set({"lat": 100.0}, fingerprint=h200), key_forced=False),
                  Source(100.0)).verdict is Verdict.PASS


def test_row_shows_the_metric_that_decided():
    s = state(baseline_set({"lat": 100.0, "lat2": 100.0}))

    def measure():
        return {"lat": Metric(100.0, "us", "lower"), "lat2": Metric(150.0, "us", "lower")}

    r = record(s, measure, primary="lat")
    row = s.rows[-1]
    assert (r.verdict, row.verdict, row.metric, row.value, row.baseline) == (
        Verdict.REGRESSION, "REGRESSION", "lat2", 150.0, 100.0)
    assert row.delta_pct == pytest.approx(50.0)


def test_unknown_family_is_refused_before_measuring():
    src = Source(1.0)
    with pytest.raises(ValueError, match="family must be one of"):
        state(baseline_set({})).record(nodeid="n", key="k", family="gemms", definition={}, measure=src)
    assert src.calls == 0


def test_update_entries_hold_gated_metrics_and_measured_provenance():
    s = state(baseline_set({"lat": 100.0}))
    record(s, Source(100.0))
    entries = s.entries_by_family()
    assert list(entries) == ["gemm"]
    e = entries["gemm"]["k[1]"]
    assert list(e["metrics"]) == ["lat"]
    assert e["definition_hash"] == provenance.definition_hash(DEFINITION)
    assert e["provenance"]["kind"] == "measured" and e["provenance"]["commit"]
    assert e["provenance"]["versions"] == {"torch": "2.13.0"}


def test_results_doc_has_every_case_with_its_numbers():
    s = state(baseline_set({"lat": 100.0}))
    record(s, Source(100.0))
    record(s, Source(7.0), key="k[2]")
    doc = s.results_doc().to_json()
    assert doc["hardware_key"] == HW and doc["fingerprint"] == HERE
    cases = {c["key"]: c for c in doc["cases"]}
    lat = cases["k[1]"]["metrics"]["lat"]
    assert (cases["k[1]"]["verdict"], lat["value"], lat["baseline"], lat["delta_pct"], lat["noise_band"]) == (
        "PASS", 100.0, 100.0, 0.0, 0.0)
    assert lat["unit"] == "us" and lat["direction"] == "lower" and lat["n"] == 3 and lat["gated"] is True
    assert cases["k[1]"]["metrics"]["gbps"]["gated"] is False and "verdict" not in cases["k[1]"]["metrics"]["gbps"]
    assert cases["k[2]"]["verdict"] == "NEW" and cases["k[2]"]["metrics"]["lat"]["baseline"] is None
    assert cases["k[1]"]["samples"] == [100.0, 100.0, 100.0]


def test_another_machine_of_the_kind_is_gated_with_the_spread_between_machines():
    # +8% on the recording machine (noise inside the runs 0%) is a regression; on another machine of the
    # kind, with no measured spread between machines, it is inside the assumed +-5% and reads AMBIGUOUS,
    # naming where the baseline came from; a legacy entry that names no machine counts as another one
    for machines, verdict in [(("cpu-000000000001",), Verdict.REGRESSION), (("gpu-aaaaaaaaaaaa",), Verdict.AMBIGUOUS),
                              ((), Verdict.AMBIGUOUS)]:
        s = state(baseline_set({"lat": 100.0}, machines=machines))
        r = record(s, Source(108.0))
        assert r.verdict is verdict, machines
        assert r.comparisons["lat"].other_machine is (machines != ("cpu-000000000001",))
    assert s.rows[-1].note.endswith("baseline from another machine of this kind (spread between machines not "
                                    "recorded: 5% assumed for a metric of no recorded kind)")
    # past twice the assumed spread it is a regression on any machine, and the line says where the baseline is from
    s = state(baseline_set({"lat": 100.0}, machines=("gpu-aaaaaaaaaaaa",)))
    r = record(s, Source(111.0))
    assert r.verdict is Verdict.REGRESSION
    assert s.failure_line(r).endswith("noise 10.0%, baseline from another machine of this kind (spread between "
                                      "machines not recorded: 5% assumed for a metric of no recorded kind)")


def test_a_cpu_other_than_the_recording_one_is_named_on_the_row():
    # key_forced=False: the detected key, as on a GPU box (where a CPU model alone is no hardware mismatch)
    s = state(baseline_set({"lat": 100.0}, fingerprint={**HERE, "cpu": {"model": "Other CPU"}}), key_forced=False)
    record(s, Source(100.0))
    assert s.rows[-1].note == "CPU 'Other CPU' at recording, 'Fake CPU' here"


def test_the_entry_names_its_machine_and_independent_runs():
    s = state(baseline_set({"lat": 100.0}))
    record(s, Source(100.0), independent_runs=3)
    e = s.entries_by_family()["gemm"]["k[1]"]
    assert (e["machines"], e["independent_runs"]) == (["cpu-000000000001"], 3)


def test_definition_hash_is_order_independent_and_sensitive():
    a = provenance.definition_hash({"m": 1, "k": 7168})
    assert a == provenance.definition_hash({"k": 7168, "m": 1})
    assert a != provenance.definition_hash({"m": 2, "k": 7168})
    assert len(a) == 16


def test_what_moved_and_what_ran_differently_reach_the_failure_line_the_row_and_the_stored_entry():
    ran = {"moe": ["Marlin (WNA16 MoE)"], "attention": ["TRITON_MLA"]}
    stored = {"k[1]": None}
    bs = baseline_set({"lat": 100.0})
    bs.docs["gemm"]["entries"]["k[1]"]["recorded"] = {"moe": ["Marlin (WNA16 MoE)"], "attention": ["FLASH_ATTN_MLA"]}
    s = state(bs)
    r = record(s, Source(120.0), explain=lambda comps, metrics: f"moved most: lat {comps['lat'].baseline:.0f} -> "
                                                                   f"{metrics['lat'].value:.0f}", recorded=lambda: ran)
    assert r.explanation == "moved most: lat 100 -> 120; attention: FLASH_ATTN_MLA -> TRITON_MLA"
    assert s.failure_line(r).endswith("; moved most: lat 100 -> 120; attention: FLASH_ATTN_MLA -> TRITON_MLA")
    assert s.rows[-1].note.startswith("moved most: lat 100 -> 120; attention:")
    stored = s.entries_by_family()["gemm"]["k[1]"]
    assert stored["recorded"] == ran and r.doc().to_json()["recorded"] == ran
    # a passing case says nothing of what moved, but still what ran differently
    ok = record(state(bs), Source(100.0), explain=lambda c, m: "never shown", recorded=lambda: ran)
    assert ok.verdict is Verdict.PASS and ok.explanation == "attention: FLASH_ATTN_MLA -> TRITON_MLA"


def test_every_regressed_metric_is_named_in_the_failure_line():
    class Two:
        def __call__(self):
            return {"lat": Metric.from_samples([130.0] * 3, "us", "lower"),
                    "other": Metric.from_samples([150.0] * 3, "us", "lower")}

    s = state(baseline_set({"lat": 100.0, "other": 100.0}))
    r = record(s, Two())
    line = s.failure_line(r)
    assert line.startswith("REGRESSION k[1] lat: 130 us, baseline 100 us, delta +30.0%")
    assert line.endswith("; also REGRESSION: other +50.0%")


def test_the_entrys_machine_count_widens_the_spread_a_further_machine_is_gated_with():
    # 4 recorders within +-1.9%: a fifth machine reading +5.4% is inside twice what four predict for a fifth
    # (moebench.core.kinds.further_machine_factor) and reads AMBIGUOUS, naming the half range and the count;
    # judged by the bare half range (twice 1.9%) it would be a REGRESSION
    four = ("gpu-aaaaaaaaaaaa", "gpu-bbbbbbbbbbbb", "gpu-cccccccccccc", "gpu-dddddddddddd")
    base = baseline_set({"lat": 100.0}, machines=four)
    base.docs["gemm"]["entries"]["k[1]"]["metrics"]["lat"]["noise_machines"] = 0.019
    s = state(base)
    r = record(s, Source(105.4))
    assert r.verdict is Verdict.AMBIGUOUS
    assert r.comparisons["lat"].machines == 4
    assert s.rows[-1].note.endswith("(spread between machines 2.8% (1.9% over 4))")


class Counted:
    """measure(): the time `lat` and a counter `cnt`, each at its prepared value (noise 0)."""

    def __init__(self, lat: float, cnt: float) -> None:
        self.lat, self.cnt = lat, cnt

    def __call__(self) -> dict[str, Metric]:
        return {"lat": Metric.from_samples([self.lat] * 3, "us", "lower"),
                "cnt": Metric.from_samples([self.cnt] * 3, "B", "lower")}


COUNTER_MACHINE = "gpu-eeeeeeeeeeee"


def counted_entry(cnt_machines=(COUNTER_MACHINE,)) -> BaselineSet:
    """k[1]: `lat` recorded on this test's machine and three others, `cnt` on `cnt_machines` alone (the
    counters of one new machine promoted beside a time of four)."""
    four = ("cpu-000000000001", "gpu-bbbbbbbbbbbb", "gpu-cccccccccccc", "gpu-dddddddddddd")
    base = baseline_set({"lat": 100.0, "cnt": 100.0}, machines=four + (COUNTER_MACHINE,))
    base.docs["gemm"]["entries"]["k[1]"]["metrics"]["cnt"]["machines"] = list(cnt_machines)
    return base


def test_a_machine_that_recorded_the_time_but_not_the_counter_gates_the_counter_as_another_machine_s():
    # +8% on both: the time on its recording machine is a REGRESSION; the counter, recorded elsewhere, gets
    # the assumed 5% between machines (its kind not said) and reads AMBIGUOUS
    r = record(state(counted_entry()), Counted(108.0, 108.0))
    lat, cnt = r.comparisons["lat"], r.comparisons["cnt"]
    assert (lat.other_machine, cnt.other_machine) == (False, True)
    assert (lat.verdict, cnt.verdict) == (Verdict.REGRESSION, Verdict.AMBIGUOUS)


def test_the_machine_that_recorded_the_counter_gates_it_as_its_own():
    r = record(state(counted_entry(), fingerprint={**HERE, "machine_id": COUNTER_MACHINE}), Counted(100.0, 108.0))
    assert r.comparisons["cnt"].other_machine is False and r.comparisons["cnt"].verdict is Verdict.REGRESSION
    assert r.comparisons["lat"].other_machine is False


def test_a_counter_of_two_machines_is_widened_for_a_further_one_by_its_own_count():
    # the counter's two machines within +-1%: on a machine outside them the band is 3.05 x 1% (two machines),
    # not 1.14 x 1% (the entry's six), so +6% reads AMBIGUOUS (a REGRESSION by the entry's count)
    base = counted_entry((COUNTER_MACHINE, "gpu-ffffffffffff"))
    base.docs["gemm"]["entries"]["k[1]"]["machines"].append("gpu-ffffffffffff")
    base.docs["gemm"]["entries"]["k[1]"]["metrics"]["cnt"]["noise_machines"] = 0.01
    r = record(state(base), Counted(100.0, 106.0))
    assert r.comparisons["cnt"].machines == 2 and r.comparisons["cnt"].verdict is Verdict.AMBIGUOUS
