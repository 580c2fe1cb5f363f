"""`moebench backends` on a recorded gemm run (tests/data/gemm-tiny-cpu.json: `-m "gemm and tiny"` on CPU)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from moebench.cli.main import main
from moebench.outputs.report import fmt_value
from moebench.results.document import CaseDoc, ResultsDoc
from moebench.history.runs import backend_matrix, key_without, load_run, shape_group

GEMM = Path(__file__).resolve().parents[1] / "tests" / "data" / "gemm-tiny-cpu.json"
SHAPE = "tiny-tp8-gemm1-m4-bf16-decode"


def test_speedups_against_the_reference(capsys):
    run = load_run(GEMM)
    backends, groups, metric = backend_matrix(run, reference="torch_loop")
    assert backends == ["torch_loop", "torch_bmm", "torch_grouped_mm"] and metric == "wall_us"
    row = groups[SHAPE]
    assert row["torch_loop"].speedup == 1.0
    assert row["torch_bmm"].speedup == row["torch_loop"].value / row["torch_bmm"].value
    assert row["torch_bmm"].pct_of_floor == run.cases[f"gemm[{SHAPE}-torch_bmm]"].metrics["pct_of_floor"].metric.value

    assert main(["backends", str(GEMM), "--reference", "torch_bmm"]) == 0
    out = capsys.readouterr().out
    assert "torch_bmm (ref)" in out and "times faster than torch_bmm" in out
    line = next(line for line in out.splitlines() if line.startswith(SHAPE + " "))
    assert f"{fmt_value(row['torch_bmm'].value, 'us')}  1.00x" in line
    shapes = [line.split()[0] for line in out.splitlines() if line.startswith("tiny-tp8-gemm1-")]
    assert shapes == ["tiny-tp8-gemm1-m1-bf16-decode", "tiny-tp8-gemm1-m4-bf16-decode", "tiny-tp8-gemm1-m16-bf16-decode"]


def test_higher_is_better_metric_speedup_is_a_ratio_of_values():
    run = load_run(GEMM)
    _, groups, metric = backend_matrix(run, reference="torch_loop", metric="GBps")
    row = groups[SHAPE]
    assert metric == "GBps" and row["torch_bmm"].speedup == row["torch_bmm"].value / row["torch_loop"].value


def test_group_falls_back_to_the_key_without_its_backend():
    assert key_without("gemm[kimi-k2.5-tp8-gemm1-m1-bf16-triton]", "triton") == "gemm[kimi-k2.5-tp8-gemm1-m1-bf16]"
    assert key_without("gemm[a-vllm_triton-b]", "triton") == "gemm[a-vllm_triton-b]"  # whole tokens only
    c = CaseDoc("gemm[x-m1-torch_bmm]", "gemm", "PASS", None, {}, info={"backend": "torch_bmm"})
    assert shape_group(c) == "gemm[x-m1]"
    doc = json.loads(GEMM.read_text())
    for case in doc["cases"]:
        case["info"].pop("group"), case["info"].pop("shape")
    _, groups, _ = backend_matrix(ResultsDoc.from_json(doc, "no-groups.json"), reference="torch_loop")
    assert f"gemm[{SHAPE}]" in groups and len(groups[f"gemm[{SHAPE}]"]) == 3


def test_bad_reference_metric_or_file_is_exit_2(tmp_path, capsys):
    assert main(["backends", str(GEMM), "--reference", "vllm_triton"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"moebench backends: error: --reference 'vllm_triton': no such backend in {GEMM} "
                   "(it has: torch_loop, torch_bmm, torch_grouped_mm)")
    assert main(["backends", str(GEMM), "--metric", "graph_us"]) == 2
    assert "metrics.graph_us: missing" in capsys.readouterr().err
    selfcheck = GEMM.parent / "selfcheck-cpu-1.json"
    assert main(["backends", str(selfcheck)]) == 2
    assert "info.backend: no backend recorded" in capsys.readouterr().err


def test_default_reference_is_vllm_triton_when_present(capsys):
    doc = json.loads(GEMM.read_text())
    extra = []
    for case in doc["cases"]:
        if case["info"]["backend"] == "torch_bmm":
            c = copy.deepcopy(case)
            c["key"] = c["key"].replace("torch_bmm", "vllm_triton")
            c["info"]["backend"] = "vllm_triton"
            extra.append(c)
    doc["cases"] += extra
    run = ResultsDoc.from_json(doc, "with-vllm.json")
    assert backend_matrix(run, reference="vllm_triton")[1][SHAPE]["vllm_triton"].speedup == 1.0


def test_decode_backends_side_by_side_show_ms_per_token_and_the_experts_ms_per_step(tmp_path, capsys):
    from moebench.cli.main import main

    def case(backend: str, ms: float, experts: float) -> dict:
        group = "decode[kimi-k2.5-shard-vllm-tp1-bf16-attn_auto-graph-p64-o128]"
        return {"key": group.replace("-attn", f"-moe_{backend}-attn"), "family": "decode", "verdict": "PASS",
                "primary": "ms_per_token", "group": group, "info": {"backend": backend},
                "metrics": {"ms_per_token": {"value": ms, "unit": "ms", "direction": "lower", "gated": True},
                            "step_routed_experts_ms": {"value": experts, "unit": "ms", "direction": "lower",
                                                       "gated": True}}}

    doc = {"hardware_key": "h", "started": "2026-12-01T00:00:00Z", "commit": "c",
           "cases": [case("triton", 2.0, 0.8), case("cutlass", 1.6, 0.4)]}
    path = tmp_path / "r.json"
    path.write_text(__import__("json").dumps(doc))
    assert main(["backends", str(path), "--family", "decode", "--reference", "triton"]) == 0
    out = capsys.readouterr().out
    assert "metric ms_per_token" in out and "metric step_routed_experts_ms" in out
    assert "1.25x" in out and "2.00x" in out  # 2.0/1.6 ms/token, 0.8/0.4 ms/step
