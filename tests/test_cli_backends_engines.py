"""`moebench backends --family decode`: engines side by side per scenario's rank, from the results files of
separate runs (synthetic fixtures: a vLLM run and an SGLang run of the Kimi-K2.5 INT4 rank)."""

from __future__ import annotations

import json
from pathlib import Path

from moebench.cli.main import main
from moebench.history.runs import backend_matrix, load_run, merge_runs

DATA = Path(__file__).resolve().parent / "data"
VLLM = DATA / "results-decode-engines-synthetic-vllm.json"
SGLANG = DATA / "results-decode-engines-synthetic-sglang.json"
RANK = "decode[kimi-k2.5-int4-rank-tp1-int4-g32-attn_auto-graph-p64-o128]"


def _row(out: str, table: int) -> str:
    """The rank's row of the table-th table (0: ms/token, 1: TTFT, 2: routed experts)."""
    return next(ln for ln in out.split("metric ")[table + 1].splitlines() if ln.startswith(RANK))


def test_engines_of_one_rank_sit_in_one_row_with_ms_per_token_ttft_and_expert_time(capsys):
    assert main(["backends", str(VLLM), str(SGLANG), "--family", "decode"]) == 0
    out = capsys.readouterr().out
    assert out.count("metric ") == 3
    assert "metric ms_per_token" in out and "metric ttft_ms" in out and "metric step_routed_experts_ms" in out
    header = next(ln for ln in out.splitlines() if ln.startswith("shape"))
    assert header.split()[1:] == ["vllm/marlin", "(ref)", "vllm-server/marlin", "sglang-server/marlin"]
    ms, ttft, experts = (_row(out, i) for i in range(3))
    assert ms.split()[1:] == ["6.9", "ms", "1.00x", "59%", "6.83", "ms", "1.01x", "60%", "7.4", "ms", "0.93x", "55%"]
    assert ttft.split()[1:] == ["97", "ms", "1.00x", "131", "ms", "0.74x", "120", "ms", "0.81x"]  # no floor for TTFT
    assert experts.split()[1:] == ["1.8", "ms", "1.00x", "-", "1.6", "ms", "1.12x"]  # the server case has no breakdown
    assert "no memory floor for this metric" in out and "% = pct_of_floor_routed_experts" in out


def test_the_reference_can_be_named_by_its_engine_and_must_be_unique(capsys):
    assert main(["backends", str(VLLM), str(SGLANG), "--family", "decode", "--reference", "sglang-server"]) == 0
    assert "sglang-server/marlin (ref)" in capsys.readouterr().out
    assert main(["backends", str(VLLM), str(SGLANG), "--family", "decode", "--reference", "marlin"]) == 2
    assert "--reference 'marlin': no such backend" in capsys.readouterr().err


def test_by_backend_keeps_each_engine_in_its_own_row():
    run = merge_runs([load_run(VLLM), load_run(SGLANG)])
    backends, groups, _ = backend_matrix(run, reference=None, family="decode")
    assert backends == ["marlin"] and len(groups) == 3
    backends, groups, _ = backend_matrix(run, reference=None, family="decode", by_engine=True)
    assert list(groups) == [RANK] and len(backends) == 3


def test_a_case_in_two_files_or_two_hardware_keys_is_one_line_exit_2(tmp_path, capsys):
    assert main(["backends", str(VLLM), str(VLLM), "--family", "decode"]) == 2
    err = capsys.readouterr().err.strip()
    assert "also in" in err and "give one of the two" in err and "\n" not in err
    other = json.loads(SGLANG.read_text())
    other["hardware_key"] = "nvidia-h100-x1"
    (tmp_path / "h100.json").write_text(json.dumps(other))
    assert main(["backends", str(VLLM), str(tmp_path / "h100.json"), "--family", "decode"]) == 2
    assert "runs of different hardware are not put side by side" in capsys.readouterr().err


def test_a_metric_asked_for_by_name_must_be_in_every_case(capsys):
    assert main(["backends", str(VLLM), str(SGLANG), "--family", "decode", "--metric", "step_routed_experts_ms"]) == 2
    assert "metrics.step_routed_experts_ms: missing" in capsys.readouterr().err


def test_the_engines_table_shows_what_each_engine_chose_and_where_its_step_goes(tmp_path, capsys):
    """Below the metric tables: each engine's MoE kernel and attention backend from its log, its categories
    as shares of the GPU busy time, and the last engine minus the first, so the faster one and where it
    gains read off one table."""
    def with_breakdown(src: Path, engine: str, moe: str, attention: str, shares: dict[str, float]) -> Path:
        doc = json.loads(src.read_text())
        for c in doc["cases"]:
            if c["info"]["engine"] == engine:
                c["info"]["engine_choices"] = {"moe": [moe], "attention": [attention]}
                c["info"]["breakdown"] = {"categories": {k: {"busy_share_ms_per_step": v} for k, v in shares.items()}}
        out = tmp_path / src.name
        out.write_text(json.dumps(doc))
        return out

    vllm = with_breakdown(VLLM, "vllm", "marlin (vLLM)", "FLASH_ATTN_MLA", {"routed_experts": 1.786, "attention": 0.853})
    sglang = with_breakdown(SGLANG, "sglang-server", "marlin (SGLang)", "fa3", {"routed_experts": 1.520, "attention": 0.9})
    assert main(["backends", str(vllm), str(sglang), "--family", "decode"]) == 0
    out = capsys.readouterr().out.split("engines side by side: ")[1]
    assert out.startswith(RANK) and "last column: sglang-server/marlin - vllm/marlin" in out
    rows = {ln.split("  ")[0]: ln.split() for ln in out.splitlines()[3:]}
    assert rows["MoE kernel (engine log)"][-4:] == ["(vLLM)", "-", "marlin", "(SGLang)"]
    assert rows["attention (engine log)"][-3:] == ["FLASH_ATTN_MLA", "-", "fa3"]
    assert rows["routed experts (ms/step of GPU busy)"][-4:] == ["1.786", "-", "1.520", "-0.266"]
    assert rows["attention (ms/step of GPU busy)"][-4:] == ["0.853", "-", "0.900", "+0.047"]
    assert rows["steady ms/token"][-4:] == ["6.900", "6.830", "7.400", "+0.500"]
