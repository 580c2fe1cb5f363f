"""ci/rederive_breakdown.py: a results file's breakdowns computed again from the traces it came with,
refused where the trace is not the one the stored breakdown came from."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

from moebench.decode.breakdown import breakdown
from moebench.decode.trace import load_events, split_steps

TOOL = Path(__file__).resolve().parents[1] / "ci" / "rederive_breakdown.py"
_spec = importlib.util.spec_from_file_location("rederive_breakdown", TOOL)
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)

FIXTURE = Path(__file__).parent / "data" / "decode-trace-small.json"
CASE_ID = "kimi-k2.5-int4-rank-vllm-tp1-int4-g32-moe_auto-attn_auto-graph-p64-o128"  # a shipped scenario's case


def _results(tmp_path: Path, tamper=None) -> tuple[Path, Path]:
    bd = breakdown(split_steps(load_events(FIXTURE))).to_json()
    bd["categories"]["routed_experts"]["busy_share_ms_per_step"] = 9.0  # what an older rule wrote
    if tamper:
        tamper(bd)
    doc = {"cases": [{"key": f"decode[{CASE_ID}]", "metrics": {}, "info": {"engine": "vllm", "breakdown": bd}},
                     {"key": "gemm[x]", "metrics": {}, "info": {}}]}  # no breakdown: left alone
    results = tmp_path / "results.json"
    results.write_text(json.dumps(doc))
    profile = tmp_path / "traces" / CASE_ID / "engine-1-0-profile"
    profile.mkdir(parents=True)
    shutil.copy(FIXTURE, profile / "rank0.pt.trace.json")
    return results, tmp_path / "traces"


def test_the_busy_shares_are_computed_again_and_the_rederivation_is_recorded(tmp_path):
    results, traces = _results(tmp_path)
    out = tmp_path / "new.json"
    assert tool.main([str(results), str(traces), "--out", str(out), "--commit", "abc1234"]) == 0
    case = json.loads(out.read_text())["cases"][0]
    assert case["info"]["breakdown"]["categories"]["routed_experts"]["busy_share_ms_per_step"] == 0.025
    assert case["info"]["breakdown_rederived"]["commit"] == "abc1234"
    assert case["info"]["breakdown_rederived"]["trace"].endswith("rank0.pt.trace.json")


def test_a_trace_whose_kernel_times_differ_from_the_stored_breakdown_is_refused(tmp_path, capsys):
    def other_run(bd):
        bd["categories"]["attention"]["ms_per_step"] += 0.001
    results, traces = _results(tmp_path, other_run)
    out = tmp_path / "new.json"
    assert tool.main([str(results), str(traces), "--out", str(out), "--commit", "abc1234"]) == 1
    assert "attention reads 0.014000 ms/step, the results say 0.015000" in capsys.readouterr().err
    assert "breakdown_rederived" not in json.loads(out.read_text())["cases"][0]["info"]


def test_a_case_without_its_trace_folder_fails_naming_it(tmp_path, capsys):
    results, traces = _results(tmp_path)
    shutil.rmtree(traces / CASE_ID / "engine-1-0-profile")
    assert tool.main([str(results), str(traces), "--out", str(tmp_path / "new.json"), "--commit", "x"]) == 1
    assert f"decode[{CASE_ID}]" in capsys.readouterr().err
