"""Results files as `moebench` reads them: gzip-compressed ones (`.json.gz`, how lent-machine runs keep
them) wherever plain ones are accepted, and runs of several families in one report."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from moebench.outputs import plots
from moebench.cli.main import main
from moebench.results.document import ResultsError
from moebench.history.runs import load_run, load_runs

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
SELFCHECK = [DATA / "selfcheck-cpu-1.json", DATA / "selfcheck-cpu-2.json"]
GEMM = DATA / "gemm-tiny-cpu.json"  # recorded after both selfcheck runs, on the same box


def gz(path: Path, tmp_path: Path) -> Path:
    out = tmp_path / (path.name + ".gz")
    out.write_bytes(gzip.compress(path.read_bytes()))
    return out


def test_a_gzipped_results_file_reads_as_the_plain_one(tmp_path):
    plain, packed = load_run(GEMM), load_run(gz(GEMM, tmp_path))
    assert packed.cases == plain.cases and packed.hardware_key == plain.hardware_key


def test_compare_backends_and_promote_accept_json_gz(tmp_path, capsys):
    a, b = gz(SELFCHECK[0], tmp_path), gz(SELFCHECK[1], tmp_path)
    assert main(["compare", str(a), str(b)]) == 0
    assert main(["backends", str(gz(GEMM, tmp_path))]) == 0
    assert main(["baselines", "promote", str(a), "--all", "--baseline-dir", str(tmp_path / "b")]) == 0
    assert (tmp_path / "b" / "cpu-amd-epyc-2c" / "selfcheck.json").is_file()
    assert "error" not in capsys.readouterr().err


def test_a_broken_gzip_file_is_one_line_naming_it(tmp_path):
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(gzip.compress(GEMM.read_bytes())[:200])
    with pytest.raises(ResultsError, match=rf"^{re.escape(str(cut))}: cannot read: "):
        load_run(cut)


def test_an_unterminated_string_is_one_complete_line(tmp_path):
    # json's e.msg alone ("Unterminated string starting at") used to end the line, as if cut off
    cut = tmp_path / "cut.json"
    cut.write_text('{"hardware_key": "cpu-amd-epyc-2c", "sta')
    with pytest.raises(ResultsError) as e:
        load_run(cut)
    assert str(e.value) == f"{cut}: line 1 column 37: invalid JSON: Unterminated string starting at line 1 column 37"


def test_the_latest_run_is_taken_per_family(tmp_path):
    # A gemm run after the selfcheck runs does not make the selfcheck cases MISSING.
    trends = plots.trends(load_runs([GEMM, *SELFCHECK]))
    assert {t.family for t in trends} == {"gemm", "selfcheck"} and all(t.in_latest for t in trends)
    # Nor does a later selfcheck run on other hardware, which measures other cases (1024MiB-cuda).
    trends = plots.trends(load_runs([*SELFCHECK, DATA / "selfcheck-h200-1.json"]))
    assert len(trends) == 6 and all(t.in_latest for t in trends)
    # A selfcheck run after the gemm run, without the sensitivity case: that case alone is MISSING.
    later = json.loads(SELFCHECK[0].read_text())
    later["started"] = later["finished"] = "2027-01-01T00:00:00Z"
    (tmp_path / "later.json").write_text(json.dumps(later))
    trends = plots.trends(load_runs([GEMM, *SELFCHECK, tmp_path / "later.json"]))
    assert [t.key for t in trends if not t.in_latest] == ["selfcheck[sensitivity-copy-64MiB-cpu]"]


def test_report_over_gzipped_runs_of_two_families_has_no_missing(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="matplotlib (the plots extra) is not installed")
    files = [str(gz(p, tmp_path)) for p in (*SELFCHECK, GEMM)]
    assert main(["report", *files, "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "MISSING" not in out and "from 3 runs" in out


def test_the_results_version_is_written_and_checked(tmp_path):
    from moebench.results.document import RESULTS_VERSION, ResultsDoc

    doc = {"hardware_key": "h", "started": "2026-12-01T00:00:00Z", "cases": []}
    assert ResultsDoc.from_json(doc, "old.json").cases == {}  # before the field existed: version 1
    assert ResultsDoc.from_json(doc | {"results_version": RESULTS_VERSION}, "now.json").cases == {}
    with pytest.raises(ResultsError, match=r"^new.json: results_version: this moebench reads versions 1..1, got 2"):
        ResultsDoc.from_json(doc | {"results_version": RESULTS_VERSION + 1}, "new.json")
    for bad in (True, 1.0, "1", 0):  # true == 1 in Python, but it is no version
        with pytest.raises(ResultsError, match=r"^bad.json: results_version: this moebench reads versions 1..1, got"):
            ResultsDoc.from_json(doc | {"results_version": bad}, "bad.json")
    from moebench.baselines.store import BaselineSet
    from moebench.suite.session import RunState

    state = RunState(baseline_dir=Path("/nonexistent"), hardware_key="h", fingerprint={}, strict=False, update=False,
                     baselines=BaselineSet(Path("/nonexistent"), "h"), key_forced=False)
    written = state.results_doc().to_json()
    assert written["results_version"] == RESULTS_VERSION
    assert ResultsDoc.from_json(written, "written.json").hardware_key == "h"
