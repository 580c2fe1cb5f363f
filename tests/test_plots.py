"""`moebench report` and moebench.outputs.plots on recorded runs: trend PNGs, index.html and index.md."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

from moebench.outputs import plots, report_page
from moebench.cli.main import main
from moebench.history.runs import load_runs

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
RUNS = [DATA / "selfcheck-h200-1.json", DATA / "selfcheck-h200-2.json"]
COPY = "selfcheck[copy-1024MiB-cuda]"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

pytest.importorskip("matplotlib", reason="matplotlib (the plots extra) is not installed")


def test_report_writes_a_png_per_case_and_the_index(tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["report", *map(str, RUNS), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    pngs = sorted((out / "plots").glob("*.png"))
    assert len(pngs) == 3 and all(p.read_bytes()[:8] == PNG_MAGIC for p in pngs)
    assert f"3 plots from 2 runs in {out / 'plots'}" in printed
    md = (out / "index.md").read_text()
    html = (out / "index.html").read_text()
    name = plots.png_name(COPY, "copy_GBps")
    assert f"[png](plots/{name})" in md and f'src="plots/{name}"' in html
    # The latest run's not-measured tests are listed too (the do_bench selfcheck failed there).
    assert "| ERROR | `benchmarks/test_selfcheck.py::test_graph_timer_agrees_with_do_bench` |" in md
    assert md.index("| ERROR |") < md.index("| NEW |")  # worst first


def test_report_folds_its_skips_into_one_line_naming_their_reasons(tmp_path, capsys):
    # A CPU nightly ended with a table of dozens of SKIP rows and not one reason.
    out = tmp_path / "r"
    assert main(["report", str(DATA / "gemm-tiny-cpu.json"), "--out", str(out)]) == 0  # 36 NEW, 18 SKIP
    printed = capsys.readouterr().out.splitlines()
    assert not [line for line in printed if line.startswith("SKIP")]
    assert sum(line.startswith("NEW ") for line in printed) == 36
    assert "18 SKIP, not listed: needs 1 CUDA GPU, NVML sees 0 visible here (18)" in printed
    assert (out / "index.md").read_text().count("| SKIP |") == 18  # the page lists each, with its reason


def test_trend_uses_the_stored_baseline_and_its_tolerance(tmp_path):
    root = tmp_path / "baselines"
    assert main(["baselines", "promote", str(RUNS[0]), "--all", "--baseline-dir", str(root)]) == 0
    doc = json.loads((root / "nvidia-h200-x1" / "selfcheck.json").read_text())
    doc["entries"][COPY]["metrics"]["copy_GBps"]["rel_tol"] = 0.07
    (root / "nvidia-h200-x1" / "selfcheck.json").write_text(json.dumps(doc))
    from moebench.baselines.store import BaselineSet

    runs = load_runs(RUNS)
    t = next(t for t in plots.trends(runs, baselines={"nvidia-h200-x1": BaselineSet.load(root, "nvidia-h200-x1")})
             if t.key == COPY)
    base = doc["entries"][COPY]["metrics"]["copy_GBps"]["value"]
    assert [p.baseline for p in t.points] == [base, base] and t.latest.rel_tol == 0.07
    assert t.unit == "GB/s" and t.direction == "higher" and t.points[0].when < t.points[1].when
    rows, written = report_page.write_report(runs, tmp_path / "r", baselines={"nvidia-h200-x1": BaselineSet.load(root, "nvidia-h200-x1")})
    row = next(r for r in rows if r.key == COPY)
    assert row.baseline.endswith("GB/s") and row.delta.endswith("%") and row.runs == 2


def test_runs_are_sorted_by_date_and_a_case_gone_from_the_latest_is_missing(tmp_path):
    later = json.loads(RUNS[1].read_text())
    later = copy.deepcopy(later)
    later["started"] = "2027-01-01T00:00:00Z"
    later["cases"] = [c for c in later["cases"] if c["key"] != COPY]
    p = tmp_path / "later.json"
    p.write_text(json.dumps(later))
    runs = load_runs([p, *RUNS])
    assert runs[-1].path == str(p)
    rows = report_page.index_rows(plots.trends(runs), runs)
    row = next(r for r in rows if r.key == COPY)
    assert row.verdict == "MISSING" and "not in the latest selfcheck run on nvidia-h200-x1" in row.note


def test_missing_matplotlib_is_one_clear_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ImportError
    assert main(["report", str(RUNS[0]), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("moebench report: error: matplotlib is not installed: pip install 'moebench[plots]' "
                   "(or pip install matplotlib)")
    assert not (tmp_path / "r").exists()


def test_report_bad_inputs_are_exit_2(tmp_path, capsys):
    assert main(["report", str(RUNS[0]), "--out", str(tmp_path / "r"), "--case", "gemm[*]"]) == 2
    assert "--case 'gemm[*]': no such case" in capsys.readouterr().err
    assert main(["report", str(RUNS[0]), "--out", str(tmp_path / "r"), "--metric", "graph_ms"]) == 2
    assert "--metric 'graph_ms'" in capsys.readouterr().err
    assert main(["report", str(RUNS[0]), "--out", str(tmp_path / "r"), "--baseline-dir", str(tmp_path / "no")]) == 2
    assert "--baseline-dir" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["report", str(RUNS[0])])
    assert e.value.code == 2 and "--out" in capsys.readouterr().err


def test_png_names_are_plain_files():
    assert plots.png_name("gemm[kimi-k2.5-tp8-gemm1-m1-bf16-triton]", "graph_us") == \
        "gemm_kimi-k2.5-tp8-gemm1-m1-bf16-triton___graph_us.png"


def test_the_report_carries_the_decode_step_breakdown_of_the_latest_run(tmp_path):
    from moebench.cli.main import main

    src = Path(__file__).parent / "data" / "results-decode-kimi-int4-rank-h200.json"
    assert main(["report", str(src), "--out", str(tmp_path)]) == 0
    md = (tmp_path / "index.md").read_text()
    assert "## decode step breakdown: decode[kimi-k2.5-int4-rank-vllm-tp1" in md
    assert "| routed experts (gated) | 1.430 |" in md
    assert "decode step breakdown" in (tmp_path / "index.html").read_text()


def test_trend_without_stored_baselines_shades_the_tolerance_the_gate_applied(tmp_path):
    # A case the tight rule gates at 3% was drawn with the measurement's default 5% band: the run's own
    # comparison says what the gate used.
    doc = json.loads(RUNS[1].read_text())
    case = next(c for c in doc["cases"] if c["key"] == COPY)
    metric = case["metrics"]["copy_GBps"]
    assert metric["rel_tol"] == 0.05
    # as a gate against a ruled entry writes it (results/document.py)
    metric.update(verdict="PASS", baseline=2750.0, noise_band=0.01, reason="", baseline_rel_tol=0.03)
    p = tmp_path / "run.json"
    p.write_text(json.dumps(doc))
    t = next(t for t in plots.trends(load_runs([p])) if t.key == COPY)
    assert t.latest.rel_tol == 0.03
