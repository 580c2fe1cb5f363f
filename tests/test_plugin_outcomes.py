"""The closing verdict table for tests that fail or error: a failure in the test reads FAIL, one in its
setup or teardown ERROR, each with the first line of its exception's message. pytest-benchmark's own
tables stay out of the terminal unless asked for, and its JSON, storage and compare-fail keep working. A
family's own table (decode's step breakdown) follows the verdict table in the terminal and the markdown."""

from __future__ import annotations

import json
import re

HW = "test-hw-x1"  # the --hardware-key FakeBench forces (tests/conftest.py)
TABLE = f"*moebench verdicts on {HW}*"

OUTCOME_TESTS = '''
import pytest

from moebench.core.metrics import Metric


@pytest.fixture
def no_device():
    raise RuntimeError("no device here\\nsecond line")


@pytest.fixture
def breaks_on_teardown():
    yield
    raise OSError("teardown broke")


def test_assert_message():
    assert 1 == 2, "the copy disagreed: 3 bytes wrong\\nsecond line"


def test_fail_text():
    pytest.fail("kernel output wrong: relative error 0.3")


def test_missing_module():
    import moebench_no_such_module  # noqa: F401


def test_long_message():
    assert False, "x" * 300


def test_after_measuring(moebench):
    moebench.record("fake[measured]", "gemm", {}, lambda: {"latency_us": Metric(5.0, "us", "lower")})
    assert False, "checked after measuring"


def test_setup_error(no_device):
    pass


def test_teardown_error(breaks_on_teardown):
    pass
'''


def test_failures_read_fail_and_errors_error_each_with_its_message(fakebench):
    fakebench.pytester.makepyfile(test_outcomes=OUTCOME_TESTS)
    r = fakebench.run("test_outcomes.py")
    r.assert_outcomes(passed=1, failed=5, errors=2)
    r.stdout.fnmatch_lines([TABLE, "verdict*case*note", "-*"])
    table = r.stdout.str().split("moebench verdicts on")[1].split("5 FAIL, 2 ERROR, 1 NEW")[0]
    # a note wraps under its row in a narrow terminal: read the table with its line breaks as spaces
    flat = re.sub(r"\s+", " ", table)
    for outcome, test, message in [
        ("FAIL", "test_after_measuring", "AssertionError: checked after measuring"),
        ("FAIL", "test_assert_message", "AssertionError: the copy disagreed: 3 bytes wrong"),
        ("FAIL", "test_fail_text", "kernel output wrong: relative error 0.3"),
        ("FAIL", "test_missing_module", "ModuleNotFoundError: No module named 'moebench_no_such_module'"),
        ("ERROR", "test_setup_error", "RuntimeError: no device here"),
        ("ERROR", "test_teardown_error", "OSError: teardown broke"),
    ]:
        assert re.search(rf"{outcome} test_outcomes\.py::{test} (- )+{re.escape(message)}", flat), (test, flat)
    assert re.search(r"FAIL test_outcomes\.py::test_long_message (- )+AssertionError: [x ]{100,}", flat)
    # The measured case keeps its own row beside the test's failure.
    assert re.search(r"NEW fake\[measured\] latency_us 5 us", flat)
    assert "5 FAIL, 2 ERROR, 1 NEW" in r.stdout.str()
    assert not re.search(r"test_outcomes\.py:\d+", table), "a note is the message, not file:line"
    assert "second line" not in table


def test_benchmark_tables_are_off_by_default_and_back_with_an_option(fakebench, tmp_path):
    out = tmp_path / "bench.json"
    quiet = fakebench.run("--benchmark-json", str(out))
    quiet.assert_outcomes(passed=2, skipped=2, deselected=1)
    quiet.stdout.fnmatch_lines([TABLE, "2 NEW, 2 SKIP"])
    assert "benchmark: 2 tests" not in quiet.stdout.str() and "Legend:" not in quiet.stdout.str()
    # The JSON is written all the same, with the gate's samples.
    assert sorted(b["name"] for b in json.loads(out.read_text())["benchmarks"]) == ["test_fake[a]", "test_fake[b]"]

    shown = fakebench.run("--benchmark-tables")
    shown.assert_outcomes(passed=2, skipped=2, deselected=1)
    shown.stdout.fnmatch_lines([TABLE, "2 NEW, 2 SKIP", "*benchmark: 2 tests*", "Name (time in us)*", "Legend:"])


def test_benchmark_compare_fail_still_applies_with_the_tables_off(fakebench, tmp_path):
    storage = f"file://{tmp_path / 'storage'}"
    first = fakebench.run("--benchmark-storage", storage, "--benchmark-save", "before")
    first.assert_outcomes(passed=2, skipped=2, deselected=1)
    # fake[a] twice as slow: no moebench baseline is stored (NEW), but pytest-benchmark's compare-fail
    # against the saved run catches it.
    fakebench.control["samples"]["fake[a]"] = [2 * x for x in fakebench.control["samples"]["fake[a]"]]
    second = fakebench.run("--benchmark-storage", storage, "--benchmark-compare",
                           "--benchmark-compare-fail", "median:5%")
    assert second.ret != 0
    assert "Performance has regressed" in second.stderr.str()
    assert "test_fake[a]" in second.stderr.str() and "benchmark: 2 tests" not in second.stdout.str()


FAMILY_TABLE_TEST = '''
import pytest

from moebench.decode.breakdown import Breakdown, breakdown_metrics
from moebench.decode.categories import CATEGORIES
from moebench.core.metrics import Metric


@pytest.mark.decode
def test_profiled(moebench):
    b = Breakdown(4, "annotations", {c: [0.25] * 4 for c in CATEGORIES}, [2.0] * 4)

    def measure():
        return {"ms_per_token": Metric(2.5, "ms", "lower")} | breakdown_metrics(b, 2.5, ("attention",), 0.05)

    moebench.record("decode[profiled]", "decode", {"x": 1}, measure, info={"breakdown": b.to_json()},
                    primary="ms_per_token")
'''


def test_a_familys_table_closes_the_terminal_summary_and_the_markdown(fakebench):
    # decode's step breakdown reaches both through family_tables' registered renderer (the report
    # layer imports no family)
    fakebench.pytester.makepyfile(test_family_table=FAMILY_TABLE_TEST)
    md = fakebench.path / "summary.md"
    r = fakebench.run("test_family_table.py", "--summary-md", str(md))
    r.stdout.fnmatch_lines(["decode step breakdown: decode[[]profiled[]] (4 profiled steps, annotations*",
                            "attention (gated)*0.250*"])
    assert "#### decode step breakdown: decode[profiled] (4 profiled steps" in md.read_text()
