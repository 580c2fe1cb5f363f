"""The report page: the tally of summary.md at the top, the change points table and trend markers, the
backends and breakdown charts, and a screenshot of the page in a real headless browser."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from history_fixtures import STEP_CASE, step, write_history
from moebench.outputs import report_page
from moebench.cli.main import main
from moebench.outputs.report import markdown_table
from moebench.history.runs import load_run, load_runs

pytest.importorskip("matplotlib", reason="matplotlib (the plots extra) is not installed")
pytest.importorskip("ruptures", reason="ruptures (the history extra) is not installed")

DATA = Path(__file__).parent / "data"
AA = "selfcheck[copy-1024MiB-cuda]"
# The fused GEMMs (one backends chart) and the two decode kernels (one breakdown chart): a page with
# every kind of picture, drawn in a few seconds.
CASES = ["--case", "gemm[tiny-tp8-fused-*]", "--case", "decode[*]"]


def test_the_page_and_summary_md_share_one_tally_and_a_case_keeps_its_verdict_and_note(tmp_path):
    """A case whose verdict is not its primary metric's (AMBIGUOUS: the machine cannot vouch, while the
    metric itself is NEW) read NEW on the page, without its note, and the two tallies disagreed."""
    doc = json.loads((DATA / "selfcheck-h200-2.json").read_text())
    case = next(c for c in doc["cases"] if c["key"] == AA)
    case["verdict"], case["note"] = "AMBIGUOUS", "timing spread 6.1%: this machine cannot vouch"
    assert case["metrics"][case["primary"]]["verdict"] == "NEW"
    (tmp_path / "run.json").write_text(json.dumps(doc))
    run = load_run(tmp_path / "run.json")
    summary_rows = [c.row() for c in run.cases.values()] + run.not_measured  # what the plugin writes
    summary_tally = markdown_table(summary_rows).splitlines()[2]
    rows, _ = report_page.write_report([run], tmp_path / "r")
    page = (tmp_path / "r" / "index.md").read_text()
    assert f"latest run: {summary_tally}" in page and "AMBIGUOUS" in summary_tally
    row = next(r for r in rows if r.key == AA)
    assert (row.verdict, row.note) == ("AMBIGUOUS", "timing spread 6.1%: this machine cannot vouch")


def test_cases_missing_from_the_latest_run_are_counted_apart_from_its_tally(tmp_path):
    later = json.loads((DATA / "selfcheck-h200-2.json").read_text())
    later["started"] = "2027-01-01T00:00:00Z"
    later["cases"] = [c for c in later["cases"] if c["key"] != AA]
    (tmp_path / "later.json").write_text(json.dumps(later))
    runs = load_runs([DATA / "selfcheck-h200-2.json", tmp_path / "later.json"])
    rows, _ = report_page.write_report(runs, tmp_path / "r")
    line = report_page.summary_line(runs, rows, None)
    assert line.startswith("latest run: ") and "MISSING" not in line.split(";")[0]
    assert "; 1 MISSING (measured by earlier runs only)" in line


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """Twelve nights, a 10% step in one fused GEMM on the tenth: changes, then the report."""
    tmp = tmp_path_factory.mktemp("page")
    write_history(tmp / "h", 12, moves=step(STEP_CASE, 9, 0.10))
    assert main(["changes", str(tmp / "h"), "--json", str(tmp / "changes.json")]) == 1
    assert main(["report", str(tmp / "h"), "--out", str(tmp / "report"), "--changes", str(tmp / "changes.json"),
                 *CASES]) == 0
    return tmp / "report"


def test_the_change_points_table_tops_the_page_and_the_trend_marks_it(page, monkeypatch, tmp_path):
    md = (page / "index.md").read_text()
    head = md.split("## Cases")[0]
    assert "1 change point (1 towards worse in the last 3 runs)" in md.splitlines()[2]
    assert f"| {STEP_CASE} | wall_us | 2026-11-09 02:17 abc0008 | 2026-11-10 02:17 abc0009 | +10." in head
    html = (page / "index.html").read_text()
    assert html.index("Change points over the history") < html.index("<h2>Cases</h2>")
    assert '<td class="worse">+10.' in html
    drawn = {}
    monkeypatch.setattr(report_page, "plot_trend", lambda t, path: drawn.setdefault(t.key, t.changes))
    runs = load_runs(sorted((page.parent / "h").glob("*.json")))
    from moebench.cli.changes import read_changes

    report_page.write_report(runs, tmp_path / "r", changes=read_changes(page.parent / "changes.json"))
    assert [c.after.commit for c in drawn[STEP_CASE]] == ["abc0009"]
    assert all(not v for k, v in drawn.items() if k != STEP_CASE)


def test_backends_and_breakdown_charts_are_drawn_and_linked(page):
    charts = sorted(p.name for p in (page / "charts").glob("*.png"))
    assert charts == ["backends_tiny_tp8_fused_bf16_decode__wall_us.png",
                      "breakdown_decode_kimi-k2.5-int4-rank-vllm-tp1-int4-g32-attn_auto-graph-p64-o128___ms_per_step.png"]
    html = (page / "index.html").read_text()
    assert all(f'src="charts/{c}"' in html for c in charts)
    assert "<h2>MoE backends side by side</h2>" in html and "<h2>Decode step breakdown</h2>" in html


def _browser() -> list[str] | None:
    """A headless browser's screenshot command (without the output and URL), or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return [name, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1400,1800"]
    if shutil.which("firefox"):
        return ["firefox", "--headless", "--window-size=1400,1800"]
    return None


def _colour_share(img, rgb: tuple[int, int, int], tol: int = 30) -> float:
    import numpy as np

    px = (np.asarray(img)[..., :3] * 255).astype(int)
    return float((np.abs(px - np.array(rgb)).max(axis=-1) < tol).mean())


def test_the_page_in_a_real_headless_browser(page, tmp_path):
    """Renders index.html in Chromium (or Firefox) and reads the screenshot's pixels: the change point's
    red text in the first screenful and the charts' lines below it. A few seconds: a real browser."""
    cmd = _browser()
    if cmd is None:
        pytest.skip("no headless browser (Debian: apt-get install chromium): the page was not looked at")
    shot = tmp_path / "page.png"
    out = ["--screenshot", str(shot)] if cmd[0] == "firefox" else [f"--screenshot={shot}"]
    subprocess.run([*cmd, *out, (page / "index.html").as_uri()], capture_output=True, timeout=120,
                   env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    from matplotlib.image import imread

    img = imread(shot)
    assert img.shape[:2] == (1800, 1400)
    top, charts = img[:400], img[400:1400]
    assert _colour_share(top, (0xd6, 0x27, 0x28)) > 1e-4  # "+10.2% worse, recent" in the change points table
    assert _colour_share(charts, (0xff, 0x7f, 0x0e)) > 1e-4  # a backend's line (matplotlib's orange)
    assert _colour_share(charts, (0x1f, 0x77, 0xb4)) > 1e-4  # and another (blue): the images loaded


def test_the_charts_read_the_backends_over_m_and_the_breakdown_per_kernel_from_the_results(tmp_path):
    from moebench.outputs.charts import backend_panels, breakdown_groups

    run = load_run(write_history(tmp_path, 1)[0])
    panels = {p.title: p for p in backend_panels(list(run.cases.values()))}
    fused = panels["tiny tp8 fused bf16 decode"]
    assert len(panels) == 4 and sorted(fused.series) == ["torch_bmm", "torch_grouped_mm", "torch_loop"]
    assert [pt.x for pt in fused.series["torch_bmm"]] == [1, 4, 16] and fused.metric == "wall_us"
    value = run.cases["gemm[tiny-tp8-fused-m4-bf16-decode-torch_bmm]"].metrics["wall_us"].metric.value
    assert fused.series["torch_bmm"][1].value == value and fused.series["torch_bmm"][1].pct_of_floor is not None
    assert fused.series["torch_bmm"][1].bytes_per_token is None  # not counted (no --counters)
    ((group, bars),) = breakdown_groups(list(run.cases.values())).items()
    assert [label for label, _ in bars] == ["moe_auto", "moe_moebench_w4"] and "moe_" not in group
    assert bars[1][1]["routed_experts"] == 1.13 and len(bars[0][1]) == 8


def _counted_case(backend: str, m: int, graph_us: float, read_bytes: float | None, tokens=None):
    from moebench.core.metrics import Metric
    from moebench.results.document import CaseDoc, MetricDoc

    metrics = {"graph_us": MetricDoc(Metric(graph_us, "us", "lower"))}
    if read_bytes is not None:
        metrics["ncu_dram_read_bytes"] = MetricDoc(Metric(read_bytes, "B", "lower", kind="device_counter"))
    chart = {"panel": "kimi int4", "x": m, "x_label": "M", "series": backend, "tokens": m if tokens is None else tokens}
    return CaseDoc(f"gemm[kimi-m{m}-{backend}]", "gemm", "PASS", "graph_us", metrics,
                   info={"backend": backend, "chart": chart})


def test_the_backend_panel_reads_the_counted_bytes_per_token_and_draws_them_beside_time(tmp_path):
    from moebench.outputs.charts import backend_panels, plot_backends

    # session 17's H200 reads (MB per call): ours and Marlin at M = 2 and 4; Marlin reads a little more
    cases = [_counted_case("triton", 2, 21.3, 49.05e6), _counted_case("triton", 4, 37.0, 96.70e6),
             _counted_case("vllm_marlin", 2, 44.2, 49.47e6), _counted_case("vllm_marlin", 4, 62.7, None),
             _counted_case("torch_loop", 4, 90.0, 97e6, tokens=0)]
    (panel,) = backend_panels(cases)
    per_token = {s: [pt.bytes_per_token for pt in pts] for s, pts in panel.series.items()}
    assert per_token == {"triton": [49.05e6 / 2, 96.70e6 / 4], "vllm_marlin": [49.47e6 / 2, None],
                         "torch_loop": [None]}  # not counted, or no token count to divide by: not drawn
    plt = pytest.importorskip("matplotlib.pyplot")
    drawn = []
    real = plt.subplots
    plt.subplots = lambda *a, **k: drawn.append(a) or real(*a, **k)
    try:
        plot_backends(panel, tmp_path / "kimi.png")
    finally:
        plt.subplots = real
    assert drawn == [(1, 2)] and (tmp_path / "kimi.png").stat().st_size > 0  # time, and bytes per token beside it
