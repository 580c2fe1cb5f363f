"""moebench.baselines.holdout and `moebench baselines holdout`: each machine of a promotion's sources
gated against the entry the other machines would make, on fake entries."""

from __future__ import annotations

import json

import pytest

from moebench.baselines.compare import Verdict
from moebench.baselines.combine import half_range
from moebench.baselines.holdout import false_verdicts, hold_out
from moebench.baselines.store import dumps, family_path, merge_entries
from moebench.cli.main import main

KEY = "gemm[x]"
HW = "nvidia-h200-x1"


def run(value, machine, noise=0.002):
    return {"definition_hash": "d1", "machines": [machine], "independent_runs": 1,
            "metrics": {"graph_us": {"value": value, "unit": "us", "direction": "lower", "rel_tol": 0.05,
                                     "noise": noise, "n": 20, "kind": "device_kernel"}},
            "provenance": {"kind": "measured", "commit": "abc", "date": "2026-12-03T00:00:00Z", "versions": {}}}


def test_a_machine_the_others_agree_without_is_a_false_verdict_at_the_3pct_they_give():
    # three machines within 0.2% (so 3%, the tight rule) and a fourth 4% faster: session 14's machine A
    runs = {KEY: [run(100.0, "a"), run(100.2, "b"), run(99.9, "c"), run(96.0, "d")]}
    rows = {r.machine: r for r in hold_out(runs, {})}
    assert rows["d"].verdict == Verdict.IMPROVEMENT and rows["d"].others == 3
    assert {m: r.verdict for m, r in rows.items() if m != "d"} == {"a": Verdict.PASS, "b": Verdict.PASS,
                                                                    "c": Verdict.PASS}  # d in: 5%, wider band
    ((row, metric, c),) = false_verdicts(list(rows.values()))
    assert (row.machine, metric, c.rel_tol) == ("d", "graph_us", 0.03)


def test_machines_that_agree_give_no_false_verdict_and_two_machines_none_to_test():
    assert false_verdicts(hold_out({KEY: [run(100.0, "a"), run(100.3, "b"), run(99.8, "c")]}, {})) == []
    assert hold_out({KEY: [run(100.0, "a"), run(110.0, "b")]}, {}) == []


def test_the_stored_entry_s_reviewed_tolerance_applies_as_promote_would_keep_it():
    runs = {KEY: [run(100.0, "a"), run(100.2, "b"), run(99.9, "c"), run(92.0, "d")]}
    reviewed = {KEY: {"metrics": {"graph_us": {**run(100.0, "a")["metrics"]["graph_us"], "rel_tol": 0.25}}}}
    assert false_verdicts(hold_out(runs, reviewed)) == []
    assert [r.machine for r, *_ in false_verdicts(hold_out(runs, {}))] == ["d"]


def _source(tmp_path, name, entry):
    doc, _ = merge_entries(None, HW, "gemm", {"cpu": {"model": name}}, "2026-12-03T00:00:00Z", {KEY: entry})
    path = family_path(tmp_path / name, HW, "gemm")
    path.parent.mkdir(parents=True)
    path.write_text(dumps(doc))
    return str(path)


def test_the_command_lists_the_false_verdict_and_exits_1(tmp_path, capsys):
    paths = [_source(tmp_path, m, run(v, m)) for m, v in (("a", 100.0), ("b", 100.2), ("c", 99.9), ("d", 96.0))]
    assert main(["baselines", "holdout", *paths, "--all", "--baseline-dir", str(tmp_path / "none")]) == 1
    out = capsys.readouterr().out
    assert "held out d: 1 case-runs against entries of 3 other machines at most: 1 IMPROVEMENT" in out
    assert "gemm[x]" in out and "-4.0%" in out and "3.0%" in out and "1 false verdict on unchanged code" in out
    assert main(["baselines", "holdout", *paths[:3], "--all", "--baseline-dir", str(tmp_path / "none")]) == 0


def test_fewer_than_three_machines_is_a_one_line_error(tmp_path, capsys):
    paths = [_source(tmp_path, m, run(100.0, m)) for m in ("a", "b")]
    assert main(["baselines", "holdout", *paths, "--all"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("no selected case was measured on 3 or more machines (machines: a, b): nothing to hold out")
    assert "\n" not in err


def test_the_held_out_machine_is_gated_as_another_machine_with_the_others_spread():
    # the others spread 3% (band 6%): 5.5% slower is past the 5% tolerance but inside that band on a machine
    # that did not record the entry (AMBIGUOUS, not a false REGRESSION)
    rows = hold_out({KEY: [run(100.0, "a"), run(100.0, "b"), run(106.0, "c"), run(105.5, "d")]}, {})
    d = next(r for r in rows if r.machine == "d")
    assert d.verdict == Verdict.AMBIGUOUS and d.comparisons["graph_us"].other_machine


def test_a_held_out_machine_is_gated_with_the_spread_the_others_predict_for_one_more():
    # three machines within +-2% (5%, no tight rule) and a fourth 5.5% faster: past the tolerance and twice
    # their half range (4%), inside twice what three machines predict for a fourth (1.88 x 2%: 7.5%)
    runs = {KEY: [run(98.0, "a"), run(100.0, "b"), run(102.0, "c"), run(94.5, "d")]}
    rows = {r.machine: r for r in hold_out(runs, {})}
    c = rows["d"].comparisons["graph_us"]
    assert (c.machines, c.measured_machine_spread) == (3, pytest.approx(0.02))
    assert rows["d"].verdict == Verdict.PASS


def counted(value, machine, count):
    """A run of `machine` that also counted the DRAM bytes (`count`)."""
    r = run(value, machine)
    r["metrics"]["ncu_dram_read_bytes"] = {"value": count, "unit": "B", "direction": "lower", "rel_tol": 0.01,
                                           "noise": 0.0, "n": 1, "kind": "device_counter"}
    return r


def test_a_counter_the_stored_source_predates_is_held_out_with_the_spread_of_its_own_machines():
    # a stored entry of three machines (time only) and counted runs of d, e and f: f held out, its counter is
    # gated against d and e's (as promote would combine them), widened for a third of two machines (x3.05:
    # +2.0% inside 2 x 1.5%), not of the entry's five (x1.27, +2.0% a false REGRESSION)
    committed = {**run(100.0, "a"), "machines": ["a", "b", "c"], "independent_runs": 3}
    runs = {KEY: [committed, counted(100.0, "d", 100.0), counted(100.0, "e", 101.0), counted(100.0, "f", 102.5)]}
    rows = {r.machine: r for r in hold_out(runs, {}, {KEY: [True, False, False, False]})}
    c = rows["f"].comparisons["ncu_dram_read_bytes"]
    assert (c.machines, c.measured_machine_spread) == (2, pytest.approx(half_range([100.0, 101.0]), abs=1e-6))
    assert c.verdict is Verdict.AMBIGUOUS
    assert rows["f"].comparisons["graph_us"].machines == 5


def test_the_counters_of_counted_runs_are_held_out_beside_timed_runs_that_did_not_count():
    # each machine: one timed run, one counted one; d's kernel reads 5% more bytes
    runs = {KEY: [r for m, b in (("a", 1000.0), ("b", 1000.0), ("c", 1000.0), ("d", 1050.0))
                  for r in (run(100.0, m), counted(100.0, m, b))]}
    uncounted = {KEY: [i % 2 == 0 for i in range(8)]}
    wrong = false_verdicts(hold_out(runs, {}, None, uncounted))
    assert {(r.machine, metric) for r, metric, _ in wrong} == {("d", "ncu_dram_read_bytes")}
    # told nothing of which runs counted, the timed runs drop the counter from every entry: none is gated
    assert false_verdicts(hold_out(runs, {})) == []
