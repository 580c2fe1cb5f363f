"""One compare path: the in-run gate (RunState.record against a baseline file) and `moebench compare`
(two results files) give the same verdict per case, on a committed results file recorded before the
paths were joined (tests/data/results-decode-kimi-int4-rank-h200.json, an H200 run) and a candidate
made from it with known changes."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path


from moebench.baselines.store import BaselineSet, merge_entries
from moebench.results.document import ResultsDoc
from moebench.history.runs import baseline_entries, compare_runs
from moebench.suite.session import Measurement, RunState

REFERENCE = Path(__file__).parent / "data" / "results-decode-kimi-int4-rank-h200.json"
INPROC = "decode[kimi-k2.5-int4-rank-vllm-tp1-int4-g32-moe_auto-attn_auto-graph-p64-o128]"
SERVER = "decode[kimi-k2.5-int4-rank-vllm-server-tp1-int4-g32-moe_auto-attn_auto-graph-p64-o128]"


def _candidate(doc: dict) -> dict:
    """The same run with the in-process case's routed experts 12% slower and the server 30% slower."""
    cand = copy.deepcopy(doc)
    for case in cand["cases"]:
        scale = {INPROC: {"step_routed_experts_ms": 1.12}, SERVER: {"ms_per_token": 1.30}}.get(case["key"], {})
        for name, factor in scale.items():
            case["metrics"][name]["value"] *= factor
    return cand


def _both_paths(ref_doc: dict, cand_doc: dict) -> tuple[dict, dict]:
    ref, cand = ResultsDoc.from_json(ref_doc, "ref"), ResultsDoc.from_json(cand_doc, "cand")
    offline = {d.key: d.verdict for d in compare_runs(ref, cand)}
    entries = baseline_entries(ref)["decode"]
    doc, _ = merge_entries(None, ref.hardware_key, "decode", ref.fingerprint, ref.finished, entries)
    state = RunState(baseline_dir=Path("/nonexistent"), hardware_key=ref.hardware_key, fingerprint=ref.fingerprint,
                     strict=False, update=False, key_forced=False,
                     baselines=BaselineSet(Path("/nonexistent"), ref.hardware_key, {"decode": doc}))
    in_run = {}
    for key, case in cand.cases.items():
        metrics = {n: replace(sm.metric, gated=sm.gated) for n, sm in case.metrics.items()}
        _, verdict, _ = state.compare("decode", key, case.definition_hash, Measurement(metrics))
        in_run[key] = verdict.value
    return offline, in_run


def test_the_in_run_gate_and_moebench_compare_agree_case_by_case():
    ref_doc = json.loads(REFERENCE.read_text())
    offline, in_run = _both_paths(ref_doc, _candidate(ref_doc))
    assert offline == in_run == {INPROC: "REGRESSION", SERVER: "REGRESSION"}
    offline, in_run = _both_paths(ref_doc, ref_doc)
    assert offline == in_run == {INPROC: "PASS", SERVER: "PASS"}
