"""A case whose entry lacks some of its gated metrics (counters counted on an entry recorded without them) reads
NEW; its note says which metrics are new and how the others compared, so a time that passed reads as passed
(moebench.outputs.report.new_metrics_phrase). Fake numbers only."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from moebench.baselines.store import BaselineSet, merge_entries
from moebench.history.runs import baseline_entries
from moebench.results.document import ResultsDoc
from moebench.suite.session import Measurement, RunState
from moebench.baselines.compare import Verdict, case_verdict, compare_case
from moebench.core.metrics import Metric
from moebench.outputs.report import new_metrics_phrase


REFERENCE = Path(__file__).parent / "data" / "results-decode-kimi-int4-rank-h200.json"


def metric(value, unit="us", kind="device_kernel"):
    return Metric(value, unit, "lower", noise=0.002, n=10, kind=kind)


def counted(graph_us):
    return {"graph_us": metric(graph_us),
            "ncu_dram_read_bytes": metric(24.84e6, "B", "device_counter"),
            "ncu_inst_executed": metric(4_753_312, "inst", "device_counter"),
            "ncu_inst_executed@moebench_w4_mma#1": metric(3_197_184, "inst", "device_counter")}


def test_a_case_that_gained_counters_is_new_and_says_its_time_passed():
    comps = compare_case(counted(14.0), {"graph_us": metric(14.1)})
    assert case_verdict(comps) is Verdict.NEW
    assert new_metrics_phrase(comps) == ("no entry for 3 of 4 gated metrics (ncu_dram_read_bytes, ncu_inst_executed, "
                                         "...); graph_us PASS")


def test_a_time_that_moved_is_named_with_its_verdict():
    comps = compare_case(counted(16.0), {"graph_us": metric(14.1)})
    assert case_verdict(comps) is Verdict.REGRESSION  # the case is no longer NEW: the REGRESSION line says it
    assert new_metrics_phrase(comps).endswith("graph_us REGRESSION")


def test_nothing_to_say_when_every_metric_is_new_or_none_is():
    assert new_metrics_phrase(compare_case(counted(14.0), None)) == ""
    assert new_metrics_phrase(compare_case({"graph_us": metric(14.0)}, {"graph_us": metric(14.1)})) == ""


def test_the_in_run_gate_notes_it_on_the_case():
    # a committed H200 decode results file as the entry; the same run with one more gated metric as the case
    ref = ResultsDoc.from_json(json.loads(REFERENCE.read_text()), "ref")
    doc, _ = merge_entries(None, ref.hardware_key, "decode", ref.fingerprint, ref.finished,
                           baseline_entries(ref)["decode"])
    state = RunState(baseline_dir=Path("/nonexistent"), hardware_key=ref.hardware_key, fingerprint=ref.fingerprint,
                     strict=False, update=False, key_forced=False,
                     baselines=BaselineSet(Path("/nonexistent"), ref.hardware_key, {"decode": doc}))
    key, case = next(iter(ref.cases.items()))
    metrics = {n: replace(sm.metric, gated=sm.gated) for n, sm in case.metrics.items()}
    metrics["ncu_inst_executed"] = replace(metric(4_753_312, "inst", "device_counter"), gated=True)
    _, verdict, note = state.compare("decode", key, case.definition_hash, Measurement(metrics))
    assert verdict is Verdict.NEW
    assert note.startswith("no entry for 1 of ") and "(ncu_inst_executed); " in note and "ms_per_token PASS" in note
