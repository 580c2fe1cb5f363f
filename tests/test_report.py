"""The closing table folds skips that share a reason; measured rows and lone skips stay as they are."""

from moebench.report import counts, display_rows, markdown_table, text_table
from moebench.results import Row


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
    assert counts(_rows()) == "1 REGRESSION, 1 PASS, 3 SKIP"
    assert "2 cases" in text_table(_rows()) and "2 cases" in markdown_table(_rows())
