"""The report layer: the closing table folds skips that share a reason (measured rows and lone skips stay
as they are), one number format everywhere, and the failure line made of the gate's numbers."""

from moebench.baselines.compare import compare_metric
from moebench.core.metrics import Metric
from moebench.outputs.report import (NOTE_WIDTH, SKIP_NOTE_WIDTH, display_rows, markdown_table, one_line, tally,
                                     text_table)
from moebench.results.document import Row


def _rows():
    return [
        Row("t::a", "gemm[a]", "PASS", "graph_us", 10.0, "us", 10.1, -1.0),
        Row("t::b", "", "SKIP", note="needs 1 CUDA GPU"),
        Row("t::c", "", "SKIP", note="needs 1 CUDA GPU"),
        Row("t::d", "", "SKIP", note="flashinfer missing"),
        Row("t::e", "gemm[e]", "REGRESSION", "graph_us", 12.0, "us", 10.0, 20.0),
    ]


def test_skips_with_one_reason_fold_into_one_row_and_counts_stay_exact():
    shown = display_rows(_rows())
    assert [r.verdict for r in shown] == ["REGRESSION", "PASS", "SKIP", "SKIP"]
    folded = [r for r in shown if r.verdict == "SKIP"]
    assert {(r.key or r.nodeid, r.note) for r in folded} == {("2 cases", "needs 1 CUDA GPU"),
                                                             ("t::d", "flashinfer missing")}
    assert tally(r.verdict for r in _rows()) == "1 REGRESSION, 1 PASS, 3 SKIP"
    assert "2 cases" in text_table(_rows()) and "2 cases" in markdown_table(_rows())


def _note_text(table: str) -> str:
    """The closing table's text with its wrapped lines joined by single spaces (a note wraps in its column)."""
    return " ".join(table.split())


def test_a_long_skip_reason_keeps_its_advice_and_a_long_failure_note_is_clipped():
    # decode/runner.py's burst skip, some 430 characters: cut at NOTE_WIDTH, "; time it on a quieter box" was lost
    reason = ("not timed on this host: the stream arrived in bursts (trial 2: 126 of the 127 chunks after the "
              "first came under 0.07 ms after the one before, the last 902.0 ms after the request; load average "
              "3.4 on 2 cores), so steady state 0.01563 ms/token against 7.087 ms/token end to end after the first "
              "token: the tokens arrived in bursts (an overloaded host), so no steady rate can be read from this "
              "run; time it on a quieter box")
    assert NOTE_WIDTH < len(reason) <= SKIP_NOTE_WIDTH
    failure = "AssertionError: " + "word " * 60 + "the end"
    table = _note_text(text_table([Row("t::burst", "", "SKIP", note=reason), Row("t::f", "", "FAIL", note=failure)]))
    assert reason in table  # whole, wrapped inside the note column
    assert failure[:NOTE_WIDTH - 3] + "..." in table and "the end" not in table


def test_an_overlong_skip_reason_loses_its_middle_not_its_end():
    reason = "what happened: " + "detail " * 200 + "; do this about it"
    table = _note_text(text_table([Row("t::s", "", "SKIP", note=reason)]))
    assert "what happened: detail" in table and " ... " in table and table.endswith("detail ; do this about it")
    note = table[table.index("what happened"):]
    assert len(note) <= SKIP_NOTE_WIDTH


def test_the_terminal_index_folds_skips_into_one_line_by_reason():
    from moebench.outputs.report_page import IndexRow, index_text, skip_line

    def row(verdict, key, note=""):
        return IndexRow(verdict, key, "-", "-", "-", "-", 0, None, note)

    long = "vllm is not installed here; " + "x" * 100 + "; pip install 'moebench[vllm]'"
    rows = [row("REGRESSION", "gemm[r]"), row("PASS", "gemm[p]")] + [row("SKIP", f"t::g{i}", "needs 1 CUDA GPU")
                                                                     for i in range(30)]
    rows += [row("SKIP", f"t::v{i}", long) for i in range(5)] + [row("SKIP", "t::n"), row("SKIP", "t::a", "a"),
                                                                  row("SKIP", "t::b", "b")]
    text = index_text(rows)
    assert [line.split()[0] for line in text.splitlines()] == ["verdict", "----------", "REGRESSION", "PASS", "38"]
    assert text.splitlines()[-1] == ("38 SKIP, not listed: needs 1 CUDA GPU (30); vllm is not installed here; "
                                     + "x" * 49 + "... (5); a (1); 2 other reasons (2)")
    assert skip_line(rows[:2]) == "" and index_text(rows[:2]).splitlines()[-1].startswith("PASS")
    assert index_text(rows[2:5]) == "3 SKIP, not listed: needs 1 CUDA GPU (3)"  # no empty table


def test_one_number_format_in_the_closing_table_the_failure_line_the_store_and_moebench_compare(tmp_path, capsys):
    # The closing table and the failure line wrote 4.687e+04 us and `moebench compare` 46870 us; compare
    # wrote 20.00 GB/s where the failure line wrote 20 GB/s. One formatter now: 4 significant digits, no
    # exponent, no trailing zeros.
    import json
    from pathlib import Path

    from moebench.outputs.baseline_lines import change_line
    from moebench.baselines.store import merge_entries
    from moebench.cli.main import main
    from moebench.core.metrics import Metric

    c = compare_metric(Metric(46870.0, "us", "lower"), Metric(40000.0, "us", "lower"))
    assert one_line("gemm[x]", "graph_us", c, "us").startswith(
        "REGRESSION gemm[x] graph_us: 46870 us, baseline 40000 us, delta +17.2%, tolerance 5.0%")
    row = Row("t::x", "gemm[x]", "REGRESSION", "graph_us", 46870.0, "us", 40000.0, c.delta_pct)
    assert "46870 us  40000 us  +17.2%" in text_table([row])
    assert "| 46870 us | 40000 us | +17.2% |" in markdown_table([row])
    entry = {"definition_hash": "h", "provenance": {"kind": "external", "source": "s", "date": "d"}}
    doc, _ = merge_entries(None, "hw", "gemm", {}, "now", {"gemm[x]": entry | {"metrics": {
        "graph_us": Metric(40000.0, "us", "lower").to_json()}}})
    _, changes = merge_entries(doc, "hw", "gemm", {}, "now", {"gemm[x]": entry | {"metrics": {
        "graph_us": Metric(46870.0, "us", "lower").to_json()}}})
    assert [change_line(c) for c in changes] == ["  ~ gemm[x] graph_us: 40000 -> 46870 us (+17.2%)"]

    cpu = Path(__file__).parent / "data" / "selfcheck-cpu-1.json"
    runs = []
    for value in (20.0, 25.0):
        d = json.loads(cpu.read_text())
        d["cases"][0]["metrics"]["copy_GBps"]["value"] = value
        runs.append(tmp_path / f"{value}.json")
        runs[-1].write_text(json.dumps(d))
    main(["compare", *map(str, runs)])
    line = next(line for line in capsys.readouterr().out.splitlines() if "copy-64MiB-cpu]" in line and "aa-" not in line)
    assert "20 GB/s" in line and "25 GB/s" in line and "+25.0%" in line


def test_one_line_regression_message():
    c = compare_metric(Metric(100.0, "us", "lower", noise=0.014826, n=5), Metric(70.0, "us", "lower", rel_tol=0.05))
    line = one_line("fake[a]", "latency_us", c, "us")
    assert line == ("REGRESSION fake[a] latency_us: 100 us, baseline 70 us, delta +42.9%, "
                    "tolerance 5.0%, noise 3.0%")


def test_one_line_higher_is_better_and_without_baseline():
    c = compare_metric(Metric(44, "tok/s", "higher"), Metric(50, "tok/s", "higher", rel_tol=0.1))
    assert one_line("d[x]", "tok_s", c, "tok/s") == (
        "REGRESSION d[x] tok_s: 44 tok/s, baseline 50 tok/s, delta -12.0%, tolerance 10.0%, noise 0.0%")
    new = one_line("d[x]", "tok_s", compare_metric(Metric(45, "tok/s", "higher"), None), "tok/s")
    assert new == "NEW d[x] tok_s: 45 tok/s, no baseline"
    assert "\n" not in new


LONG = "decode[kimi-k2.5-int4-rank-vllm-server-tp1-int4-g32-moe_auto-attn_auto-graph-p64-o128]"


def test_the_closing_table_fits_120_columns_and_never_cuts_a_case_id():
    """733d5c3's table was 350 wide and cut a decode case id with '...'."""
    note = "moved most: routed experts +8.0%: 1.43 -> 1.545 ms/step; attention: FLASH_ATTN_MLA -> TRITON_MLA " * 2
    rows = [Row("t::a", LONG, "REGRESSION", "ms_per_token", 7.5, "ms", 6.83, 9.8, note),
            Row("t::b", "gemm[kimi-k2.5-tp8-fused-m1-bf16-decode-triton]", "PASS", "graph_us", 24.3, "us", 24.2, 0.4)]
    lines = text_table(rows).splitlines()
    assert max(map(len, lines)) <= 120 and f"REGRESSION  {LONG}" in lines
    words = " ".join(line.strip() for line in lines[lines.index(f"REGRESSION  {LONG}") + 1:][:4])
    assert "6.83 ms" in words and note.split()[-1] in words  # the note is wrapped, not cut
    short = text_table(rows[1:]).splitlines()  # short ids keep one line per case
    assert len(short) == 3 and short[2].startswith("PASS     gemm[kimi-k2.5-tp8-fused-m1-bf16-decode-triton]  graph_us")
