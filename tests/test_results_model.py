"""The results document's one model (moebench.results.document): what the session writes reads back as the same
document; every committed results file (all written before results_version existed) still loads; a
malformed file is one line naming the file and the field."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

from moebench.baselines.store import BaselineSet, merge_entries
from moebench.cli.main import main
from moebench.core.metrics import Metric
from moebench.core.provenance import definition_hash
from moebench.results.document import ResultsDoc, ResultsError, Row
from moebench.suite.session import RunState

DATA = Path(__file__).parent / "data"
RESULTS_FILES = sorted(p for p in DATA.glob("*.json") if "cases" in json.loads(p.read_text()))
CPU = DATA / "selfcheck-cpu-1.json"  # a real CPU run: two cases and an ERROR row in not_measured
KEY = "selfcheck[copy-64MiB-cpu]"


def test_every_committed_results_file_loads_and_reads_back_the_same():
    assert len(RESULTS_FILES) >= 7
    for path in RESULTS_FILES:
        raw = json.loads(path.read_text())
        assert "results_version" not in raw  # all from before the field: they read as version 1
        doc = ResultsDoc.from_json(raw, str(path))
        assert [c.key for c in doc.cases.values()] == [c["key"] for c in raw["cases"]]
        assert ResultsDoc.from_json(doc.to_json(), str(path)) == doc
    cpu = ResultsDoc.from_json(json.loads(CPU.read_text()), str(CPU))
    assert [(r.verdict, r.nodeid.split("::")[1]) for r in cpu.not_measured] == [
        ("ERROR", "test_sensitivity_5pct_larger_is_slower"), ("SKIP", "test_graph_timer_agrees_with_do_bench")]
    m = cpu.cases[KEY].metrics["copy_GBps"]
    assert m.verdict == "NEW" and m.gated and len(m.metric.samples) == m.metric.n  # the primary's samples


def _session() -> RunState:
    """A run with a re-measured regression (what moved, what ran), a doubted case, one without metrics,
    a skip and a figure of other hardware."""
    entry = {"definition_hash": definition_hash({"m": 1}), "recorded": {"moe": "A"},
             "metrics": {"lat": Metric(100.0, "us", "lower", 0.01, 3, 0.05).to_json()},
             "provenance": {"kind": "external", "source": "a test", "date": "2026-01-01"}}
    doc, _ = merge_entries(None, "h", "gemm", {}, "2026-01-01T00:00:00Z", {"k[1]": entry})
    state = RunState(baseline_dir=Path("/nonexistent"), hardware_key="h", fingerprint={"cpu": {}}, strict=False,
                     update=False, baselines=BaselineSet(Path("/nonexistent"), "h", {"gemm": doc}), key_forced=False)
    times = iter([150.0, 160.0])

    def measure(value: float | None = None):
        v = next(times) if value is None else value
        return {"lat": Metric.from_samples([v, v * 1.001, v * 0.999], "us", "lower"),
                "pct": Metric(math.nan, "%", "higher", gated=False)}  # the % of an unknown floor

    state.record(nodeid="t::a", key="k[1]", family="gemm", definition={"m": 1}, measure=measure, group="g",
                 explain=lambda c, m: "moved", recorded=lambda: {"moe": "B"})
    state.record(nodeid="t::b", key="k[2]", family="gemm", definition={"m": 2}, measure=lambda: measure(5.0),
                 doubt="noisy box")
    state.record(nodeid="t::c", key="k[3]", family="selfcheck", definition={}, measure=lambda: {})
    state.add_row(Row("t::d", "", "SKIP", note="needs 1 CUDA GPU"))
    state.add_row(Row("t::e", "k[9]", "ENV_MISMATCH", "lat", None, "us", 5.0, None, "baseline for other-hw"))
    return state


def test_what_the_session_writes_reads_back_as_the_same_document():
    written = json.dumps(_session().results_doc().to_json(), sort_keys=True)
    doc = ResultsDoc.from_json(json.loads(written), "written.json")
    # Compared as JSON text: the NaN of the informational metric is not equal to itself as a float.
    assert json.dumps(doc.to_json(), sort_keys=True) == written
    k1 = doc.cases["k[1]"]
    assert (k1.verdict, k1.metrics["lat"].verdict, k1.metrics["lat"].baseline, k1.recorded) == (
        "REGRESSION", "REGRESSION", 100.0, {"moe": "B"})
    assert k1.first_measurement["lat"].value == 150.0 and k1.metrics["lat"].metric.value == 160.0
    assert k1.explanation == "moved; moe: A -> B" and k1.group == "g" and math.isnan(k1.metrics["pct"].metric.value)
    assert doc.cases["k[2]"].verdict == "AMBIGUOUS" and doc.cases["k[2]"].note == "noisy box"
    assert [(r.nodeid, r.verdict) for r in doc.not_measured] == [("t::c", "PASS"), ("t::d", "SKIP"),
                                                                  ("t::e", "ENV_MISMATCH")]


def _write(tmp_path: Path, doc: dict) -> str:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return str(path)


def _case(doc: dict) -> dict:
    return next(c for c in doc["cases"] if c["key"] == KEY)


def test_an_informational_nan_loads_and_a_gated_one_is_named(tmp_path, capsys):
    doc = json.loads(CPU.read_text())
    _case(doc)["metrics"]["pct_of_session_ceiling"]["value"] = math.nan
    assert main(["compare", str(CPU), _write(tmp_path, doc)]) == 0  # used to be a ValueError traceback
    _case(doc)["metrics"]["copy_GBps"]["value"] = math.nan
    path = _write(tmp_path, doc)
    assert main(["compare", str(CPU), path]) == 2
    assert capsys.readouterr().err.strip().endswith(
        f"error: {path}: cases['{KEY}'].metrics.copy_GBps.value: a gated metric must be a finite number, got nan")


def _set(path: str, value):
    def change(doc: dict) -> None:
        *parents, last = path.split(".")
        node = doc
        for p in parents:
            node = _case(node) if p == "case" else node[int(p)] if isinstance(node, list) else node[p]
        node[int(last) if isinstance(node, list) else last] = value
    return change


@pytest.mark.parametrize("change, field, what", [
    (_set("case.verdict", "SLOWER"), f"cases['{KEY}'].verdict", "must be one of REGRESSION, STALE, ENV_MISMATCH"),
    (_set("case.metrics.copy_GBps.verdict", "FAIL"), f"cases['{KEY}'].metrics.copy_GBps.verdict", "got 'FAIL'"),
    (_set("case.metrics.copy_GBps.baseline", "12"), f"cases['{KEY}'].metrics.copy_GBps.baseline",
     "must be a number, got '12'"),
    (_set("case.metrics.copy_GBps.noise", -0.1), f"cases['{KEY}'].metrics.copy_GBps.noise", "must be a number >= 0"),
    (_set("case.metrics.copy_GBps.gated", "yes"), f"cases['{KEY}'].metrics.copy_GBps.gated", "must be true or false"),
    (_set("case.samples", [1.0, "fast"]), f"cases['{KEY}'].samples", "must be finite numbers"),
    (_set("case.info", []), f"cases['{KEY}'].info", "must be an object, got []"),
    (_set("case.first_measurement", {"copy_GBps": {"value": 1}}), f"cases['{KEY}'].first_measurement.copy_GBps.unit",
     "missing"),
    (_set("not_measured.0.verdict", "BROKEN"), "not_measured[0].verdict", "must be one of REGRESSION, FAIL, ERROR"),
    (_set("not_measured.0", "skipped"), "not_measured[0]", "must be an object"),
    (_set("not_measured.0.value", "n/a"), "not_measured[0].value", "must be a number"),
    (_set("fingerprint", "h200"), "fingerprint", "must be an object"),
])
def test_a_malformed_file_is_one_line_naming_the_file_and_the_field(tmp_path, capsys, change, field, what):
    doc = copy.deepcopy(json.loads(CPU.read_text()))
    change(doc)
    path = _write(tmp_path, doc)
    with pytest.raises(ResultsError, match=r"^" + __import__("re").escape(f"{path}: {field}: ")) as e:
        ResultsDoc.from_json(json.loads(Path(path).read_text()), path)
    assert what in str(e.value) and "\n" not in str(e.value)
    assert main(["compare", str(CPU), path]) == 2
    assert capsys.readouterr().err.strip() == f"moebench compare: error: {e.value}"


def test_promote_from_a_results_file_keeps_what_ran(tmp_path):
    # --baseline-update stored `recorded` (the engine's backends) with an entry; promoting the same case
    # from its results file dropped it, so the next run could not say what ran differently.
    state = _session()
    results = _write(tmp_path, state.results_doc().to_json())
    assert main(["baselines", "promote", results, "--case", "k[1]", "--baseline-dir", str(tmp_path / "b")]) == 0
    stored = json.loads((tmp_path / "b" / "h" / "gemm.json").read_text())["entries"]["k[1]"]
    assert stored["recorded"] == {"moe": "B"} == state.entries_by_family()["gemm"]["k[1]"]["recorded"]
