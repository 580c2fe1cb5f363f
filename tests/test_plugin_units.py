"""Small pieces of the plugin and the report, in process: which names an -m expression mentions, the GPU
skip rule, and the closing table's order, counts and markdown escaping."""

from __future__ import annotations

import re

import pytest

from moebench.core import hardware

from moebench import plugin

from moebench.outputs import report
from moebench.results.document import Row


@pytest.mark.parametrize("expr, names", [
    ("", set()),
    ("gemm", {"gemm"}),
    ("gemm and (triton or vllm_triton)", {"gemm", "triton", "vllm_triton"}),
    ("not full", {"full"}),
    ("gpus(n=2) and not gpu", {"gpus", "gpu"}),            # keyword arguments are not markers
    ("decode(model='glm-5') or tiny", {"decode", "tiny"}),  # nor are strings
    ("gemm and True", {"gemm"}),
])
def test_marker_names_in(expr, names):
    assert plugin.marker_names_in(expr) == names


class FakeItem:
    def __init__(self, **marks) -> None:
        self.marks = {name: getattr(pytest.mark, name)(*args, **kwargs).mark for name, (args, kwargs) in marks.items()}

    def get_closest_marker(self, name):
        return self.marks.get(name)


@pytest.mark.parametrize("marks, have, reason", [
    ({"gpu": ((), {})}, 0, "needs 1 CUDA GPU, NVML sees 0 visible here"),
    ({"gpus": ((2,), {})}, 1, "needs 2 CUDA GPUs, NVML sees 1 visible here"),
    ({"gpus": ((), {"n": 4})}, 2, "needs 4 CUDA GPUs, NVML sees 2 visible here"),
    ({"gpu": ((), {}), "gpus": ((8,), {})}, 0, "needs 8 CUDA GPUs, NVML sees 0 visible here"),
    ({"gpus": ((2,), {})}, 2, None),
    ({}, 0, None),
])
def test_gpu_markers_skip_with_the_count(monkeypatch, marks, have, reason):
    monkeypatch.setattr(hardware, "visible_gpu_count", lambda: have)
    if reason is None:
        plugin.pytest_runtest_setup(FakeItem(**marks))
        return
    with pytest.raises(pytest.skip.Exception) as e:
        plugin.pytest_runtest_setup(FakeItem(**marks))
    assert e.value.msg == reason


ROWS = [
    Row("t::1", "c[pass]", "PASS", "lat", 1.0, "us", 1.0, 0.0),
    Row("t::2", "", "SKIP", note="needs 1 CUDA GPU"),
    Row("t::3", "c[reg]", "REGRESSION", "lat", 2.0, "us", 1.0, 100.0, "worse | slower"),
    Row("t::4", "c[new]", "NEW", "lat", 3.0, "us"),
    Row("t::5", "", "ERROR", note="boom"),
]


def test_table_is_worst_first_with_counts():
    lines = report.text_table(ROWS).splitlines()
    assert lines[0].split() == report.HEADER
    assert [l.split()[0] for l in lines[2:]] == ["REGRESSION", "ERROR", "NEW", "PASS", "SKIP"]
    assert lines[2].split()[:6] == ["REGRESSION", "c[reg]", "lat", "2", "us", "1"]
    assert report.tally(r.verdict for r in ROWS) == "1 REGRESSION, 1 ERROR, 1 NEW, 1 PASS, 1 SKIP"


def test_markdown_escapes_pipes_and_has_one_row_per_case():
    md = report.markdown_table(ROWS, "moebench on hw")
    lines = md.splitlines()
    assert lines[:3] == ["### moebench on hw", "", report.tally(r.verdict for r in ROWS)]
    table = [l for l in lines if l.startswith("|")]
    assert len(table) == 2 + len(ROWS)
    assert "| REGRESSION | c[reg] | lat | 2 us | 1 us | +100.0% | worse \\| slower |" in table
    # Every row has exactly the header's cells: escaped pipes inside a note do not split it.
    assert all(len(re.findall(r"(?<!\\)\|", l)) == len(report.HEADER) + 1 for l in table)
    assert md.endswith("\n")


def test_markdown_with_no_rows():
    assert "no cases" in report.markdown_table([], "x")
