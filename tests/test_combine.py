"""A baseline entry from independent runs (moebench.baselines.combine and `moebench baselines promote`
with several results files): the median, the spread between runs and between machines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moebench.baselines.combine import combine_entries, half_range, metrics_left_out
from moebench.baselines.schema import BaselineError
from moebench.baselines.store import load_file
from moebench.cli.main import main

DATA = Path(__file__).resolve().parent / "data"
RUN = DATA / "selfcheck-h200-1.json"
COPY = "selfcheck[copy-1024MiB-cuda]"


def entry(value, machine="gpu-a", noise=0.003, runs=1, definition="d1", n=20):
    return {"definition_hash": definition, "machines": [machine], "independent_runs": runs,
            "metrics": {"t": {"value": value, "unit": "us", "direction": "lower", "rel_tol": 0.05, "noise": noise, "n": n}},
            "provenance": {"kind": "measured", "commit": "abc", "date": "2026-12-02T00:00:00Z", "versions": {}}}


def test_three_runs_on_one_machine_give_their_median_and_the_spread_between_them():
    e = combine_entries([entry(24.3), entry(24.5), entry(24.2)], "k")
    t = e["metrics"]["t"]
    assert t["value"] == 24.3 and t["n"] == 60
    assert t["noise"] == pytest.approx(round(0.15 / 24.3, 6))  # half the range over the median, > 0.3% inside
    assert "noise_machines" not in t
    assert (e["machines"], e["independent_runs"]) == (["gpu-a"], 3)
    assert e["provenance"]["combined"] == "median of 3 independent runs"


def test_the_spread_inside_a_run_wins_when_the_runs_agree():
    t = combine_entries([entry(10.0, noise=0.02), entry(10.0), entry(10.0)], "k")["metrics"]["t"]
    assert t["noise"] == 0.02


def test_runs_on_two_machines_give_the_spread_between_machines_apart():
    # the kimi M = 128 case: 472 us on one H200, 428 on another; each machine's runs within 0.2%
    e = combine_entries([entry(472.0, "gpu-a", 0.0001), entry(472.5, "gpu-a", 0.0001), entry(428.0, "gpu-b", 0.0001),
                         entry(427.6, "gpu-b", 0.0001)], "k")
    t = e["metrics"]["t"]
    assert t["noise"] == pytest.approx(round(0.25 / 472.25, 6), abs=1e-6)  # the worst machine's runs, not 5%
    assert t["noise_machines"] == pytest.approx(half_range([472.25, 427.8]), abs=1e-6)
    assert e["machines"] == ["gpu-a", "gpu-b"] and e["independent_runs"] == 4


def test_engine_instances_count_as_independent_runs():
    assert combine_entries([entry(6.9, runs=3), entry(6.8, runs=3)], "k")["independent_runs"] == 6


def test_runs_of_different_case_definitions_are_refused_naming_the_case():
    with pytest.raises(BaselineError, match=r"decode\[x\]: the runs disagree on the case definition"):
        combine_entries([entry(1.0), entry(1.0, definition="d2")], "decode[x]")


def test_a_metric_missing_from_one_run_is_left_out():
    a, b = entry(1.0), entry(1.0)
    a["metrics"]["ttft"] = dict(a["metrics"]["t"])
    assert set(combine_entries([a, b], "k")["metrics"]) == {"t"}


def _run_file(tmp_path: Path, name: str, scale: float, machine: str) -> Path:
    doc = json.loads(RUN.read_text())
    doc["fingerprint"]["machine_id"] = machine
    for c in doc["cases"]:
        for m in c["metrics"].values():
            if isinstance(m.get("value"), (int, float)):
                m["value"] *= scale
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


def test_promote_of_three_runs_stores_their_median_with_machine_and_run_count(tmp_path, capsys):
    runs = [_run_file(tmp_path, f"r{i}.json", s, "gpu-aaaaaaaaaaaa") for i, s in enumerate((1.0, 1.01, 0.995))]
    root = tmp_path / "baselines"
    assert main(["baselines", "promote", *map(str, runs), "--case", COPY, "--baseline-dir", str(root)]) == 0
    assert "3 runs:" in capsys.readouterr().out
    e = load_file(root / "nvidia-h200-x1" / "selfcheck.json")["entries"][COPY]
    one = next(c for c in json.loads(RUN.read_text())["cases"] if c["key"] == COPY)["metrics"]["copy_GBps"]
    assert e["metrics"]["copy_GBps"]["value"] == pytest.approx(one["value"])  # the median run
    assert e["metrics"]["copy_GBps"]["noise"] >= 0.0075 - 1e-6  # (1.01 - 0.995) / 2
    assert (e["machines"], e["independent_runs"]) == (["gpu-aaaaaaaaaaaa"], 3)


def test_promote_of_one_run_names_its_machine(tmp_path):
    root = tmp_path / "baselines"
    assert main(["baselines", "promote", str(_run_file(tmp_path, "r.json", 1.0, "gpu-bbbbbbbbbbbb")), "--case", COPY,
                 "--baseline-dir", str(root)]) == 0
    e = load_file(root / "nvidia-h200-x1" / "selfcheck.json")["entries"][COPY]
    assert (e["machines"], e["independent_runs"]) == (["gpu-bbbbbbbbbbbb"], 1)


def test_promote_over_two_machines_writes_their_medians_and_the_file_loads_again(tmp_path):
    runs = [_run_file(tmp_path, "a.json", 1.0, "gpu-aaaaaaaaaaaa"), _run_file(tmp_path, "b.json", 1.02, "gpu-bbbbbbbbbbbb")]
    root = tmp_path / "baselines"
    assert main(["baselines", "promote", *map(str, runs), "--case", COPY, "--baseline-dir", str(root)]) == 0
    m = load_file(root / "nvidia-h200-x1" / "selfcheck.json")["entries"][COPY]["metrics"]["copy_GBps"]
    assert set(m["by_machine"]) == {"gpu-aaaaaaaaaaaa", "gpu-bbbbbbbbbbbb"}
    assert m["by_machine"]["gpu-bbbbbbbbbbbb"]["value"] == pytest.approx(1.02 * m["by_machine"]["gpu-aaaaaaaaaaaa"]["value"])


@pytest.mark.parametrize("bad", [{"gpu-a": {"value": 1.0, "runs": 1}}, {"gpu-a": {"value": 1.0, "runs": 1}, "gpu-b": {"value": 0, "runs": 1}},
                                 {"gpu-a": {"value": 1.0, "runs": 1}, "gpu-b": {"value": 1.0, "runs": 0}},
                                 {"gpu-a": {"value": 1.0, "runs": 1}, "gpu-b": {"value": 1.0}}, [1.0, 2.0]])
def test_a_malformed_by_machine_is_refused_naming_the_field(tmp_path, bad):
    runs = [_run_file(tmp_path, "a.json", 1.0, "gpu-aaaaaaaaaaaa"), _run_file(tmp_path, "b.json", 1.02, "gpu-bbbbbbbbbbbb")]
    root = tmp_path / "baselines"
    assert main(["baselines", "promote", *map(str, runs), "--case", COPY, "--baseline-dir", str(root)]) == 0
    path = root / "nvidia-h200-x1" / "selfcheck.json"
    doc = json.loads(path.read_text())
    doc["entries"][COPY]["metrics"]["copy_GBps"]["by_machine"] = bad
    path.write_text(json.dumps(doc))
    with pytest.raises(BaselineError, match=r"copy_GBps\.by_machine: must map two or more machines"):
        load_file(path)


@pytest.mark.parametrize("runs, ok", [(3, True), (1, True), (0, False), (True, False), ("3", False)])
def test_a_results_file_carries_the_engine_instances_of_a_case(runs, ok):
    from moebench.results.document import ResultsDoc, ResultsError

    doc = json.loads(RUN.read_text())
    doc["cases"][0]["independent_runs"] = runs
    if ok:
        run = ResultsDoc.from_json(doc, "r.json")
        case = run.cases[doc["cases"][0]["key"]]
        assert case.independent_runs == runs and case.to_json().get("independent_runs", 1) == runs
    else:
        with pytest.raises(ResultsError, match=r"r.json: cases\[.*\]\.independent_runs: must be"):
            ResultsDoc.from_json(doc, "r.json")


def test_a_case_left_out_of_the_promotion_cannot_stop_it(tmp_path):
    # two runs whose copy case agrees, while another case's definition differs between them (an older
    # stored entry beside a new run): promoting the copy case alone must work and leave the other out
    runs = [_run_file(tmp_path, f"r{i}.json", s, "gpu-aaaaaaaaaaaa") for i, s in enumerate((1.0, 1.01))]
    doc = json.loads(runs[1].read_text())
    other = next(c for c in doc["cases"] if c["key"] != COPY and c.get("definition_hash"))
    other["definition_hash"] = "0000000000000000"
    runs[1].write_text(json.dumps(doc))
    root = tmp_path / "baselines"
    assert main(["baselines", "promote", *map(str, runs), "--case", COPY, "--baseline-dir", str(root)]) == 0
    entries = load_file(root / "nvidia-h200-x1" / "selfcheck.json")["entries"]
    assert set(entries) == {COPY} and entries[COPY]["independent_runs"] == 2
    # selected, the disagreeing case is still refused, naming it
    assert main(["baselines", "promote", *map(str, runs), "--case", other["key"], "--baseline-dir", str(root)]) == 2


def test_a_source_combined_over_machines_keeps_their_spread_when_a_machine_is_added():
    # session 9's entry spans two machines 1.5% apart; a third machine that lands on its median must not
    # make the entry read as if its machines agreed
    before = combine_entries([entry(100.0, "gpu-a"), entry(103.0, "gpu-b")], "k")
    assert before["metrics"]["t"]["noise_machines"] == pytest.approx(0.0148, abs=1e-3)
    after = combine_entries([before, entry(101.5, "gpu-c"), entry(101.5, "gpu-c")], "k")
    assert after["metrics"]["t"]["noise_machines"] == before["metrics"]["t"]["noise_machines"]
    assert after["machines"] == ["gpu-a", "gpu-b", "gpu-c"] and after["independent_runs"] == 4


def test_a_combined_source_without_machine_medians_is_a_group_of_its_own_not_its_first_machines_run():
    # a run on gpu-a beside an entry of gpu-a and gpu-b stored before by_machine: two groups (the old code
    # filed the entry under gpu-a and read the spread between the runs of "one machine")
    both = combine_entries([entry(100.0, "gpu-a"), entry(100.0, "gpu-b")], "k")
    del both["metrics"]["t"]["by_machine"]
    e = combine_entries([both, entry(104.0, "gpu-a")], "k")
    assert e["metrics"]["t"]["noise_machines"] == pytest.approx(half_range([100.0, 104.0]), abs=1e-6)
    assert set(e["metrics"]["t"]["by_machine"]) == {"gpu-a+gpu-b", "gpu-a"}


def test_a_stored_group_of_four_machines_weighs_as_four_beside_a_fifth():
    # the committed entries predate by_machine: their four machines are one group with one median, and a
    # fifth machine 1.5% slower must not move the value halfway (session 25's H100 N: +0.8% that way)
    four = combine_entries([entry(v, m) for m, v in (("gpu-a", 100.0), ("gpu-b", 100.2), ("gpu-c", 99.8),
                                                     ("gpu-d", 100.1))], "k")
    del four["metrics"]["t"]["by_machine"]
    t = combine_entries([four] + [entry(101.5, "gpu-e")] * 2, "k", stored=[True, False, False])["metrics"]["t"]
    assert t["value"] == pytest.approx(four["metrics"]["t"]["value"])
    assert t["by_machine"]["gpu-a+gpu-b+gpu-c+gpu-d"]["value"] == pytest.approx(four["metrics"]["t"]["value"])
    # ... and the spread between machines now holds the fifth
    assert t["noise_machines"] == pytest.approx(half_range([four["metrics"]["t"]["value"], 101.5]), abs=1e-6)


def test_a_combined_source_stores_each_machine_and_a_new_run_joins_its_own_machine():
    # the same, stored with by_machine: gpu-a's new run joins gpu-a's stored one (median 102), gpu-b stays
    both = combine_entries([entry(100.0, "gpu-a"), entry(100.0, "gpu-b")], "k")
    assert both["metrics"]["t"]["by_machine"] == {"gpu-a": {"value": 100.0, "runs": 1},
                                                  "gpu-b": {"value": 100.0, "runs": 1}}
    t = combine_entries([both, entry(104.0, "gpu-a")], "k")["metrics"]["t"]
    assert t["by_machine"]["gpu-a"] == {"value": 102.0, "runs": 2}
    assert t["noise_machines"] == pytest.approx(half_range([102.0, 100.0]), abs=1e-6)
    assert t["value"] == pytest.approx(101.0)


def test_one_new_machine_beside_a_stored_entry_of_four_weighs_as_one_of_five():
    # session 24: the committed Kimi int4 M = 1 entry (four machines near 14.3) and machine M's runs (14.0)
    # moved the value halfway, 14.31 -> 14.14, since the four stood as one median; stored one by one, the
    # fifth machine is one of five and the value stays on the four's median
    four = combine_entries([entry(v, m) for m, v in (("gpu-a", 14.30), ("gpu-b", 14.31), ("gpu-c", 14.33),
                                                     ("gpu-d", 14.32))], "k")
    t = combine_entries([four] + [entry(13.98, "gpu-e")] * 3, "k", stored=[True, False, False, False])["metrics"]["t"]
    assert t["value"] == pytest.approx(14.31) and len(t["by_machine"]) == 5
    assert t["by_machine"]["gpu-e"] == {"value": 13.98, "runs": 3}
    assert t["noise_machines"] == pytest.approx(half_range([14.30, 14.31, 14.33, 14.32, 13.98]), abs=1e-6)


def test_a_machines_stored_median_counts_as_its_runs_beside_its_new_runs():
    # gpu-a's stored median of three runs and one new run of gpu-a: the median of four runs, not of two values
    two = combine_entries([entry(100.0, "gpu-a")] * 3 + [entry(110.0, "gpu-b")], "k")
    t = combine_entries([two, entry(104.0, "gpu-a")], "k")["metrics"]["t"]
    assert t["by_machine"]["gpu-a"] == {"value": 100.0, "runs": 4}


def test_the_value_weighs_each_machine_once_not_each_run():
    # three runs on gpu-b and one on gpu-a: the entry sits between the machines, not on gpu-b
    e = combine_entries([entry(100.0, "gpu-a"), entry(104.0, "gpu-b"), entry(104.2, "gpu-b"), entry(103.8, "gpu-b")], "k")
    assert e["metrics"]["t"]["value"] == pytest.approx(102.0)


def test_a_source_whose_tolerance_the_rule_set_does_not_pass_it_on_as_the_cases_own():
    ruled = entry(100.0, "gpu-a")
    ruled["metrics"]["t"].update(rel_tol=0.03, tol_rule="tight")
    assert combine_entries([entry(100.2, "gpu-b"), ruled], "k")["metrics"]["t"]["rel_tol"] == 0.05


def test_a_reviewed_note_of_any_source_survives_the_combination():
    stored, run = entry(10.0, "gpu-a"), entry(10.1, "gpu-b")
    stored["provenance"]["commit_note"] = "t rel_tol 0.20 -> 0.05, reviewed"
    assert combine_entries([stored, run], "k")["provenance"]["commit_note"] == "t rel_tol 0.20 -> 0.05, reviewed"
    assert "commit_note" not in combine_entries([entry(10.0), entry(10.1)], "k")["provenance"]


# --- a metric measured by a subset of the sources (issue 34: counters beside a time of four machines) ---------

def kernel_entry(value, machine, counted=None, runs=1):
    """A run's gemm entry on `machine`: graph_us, and the DRAM bytes counter when `counted` is given."""
    e = entry(value, machine, runs=runs)
    e["metrics"] = {"graph_us": {**e["metrics"]["t"], "kind": "device_kernel"}}
    if counted is not None:
        e["metrics"]["ncu_dram_read_bytes"] = {"value": counted, "unit": "B", "direction": "lower", "rel_tol": 0.01,
                                               "noise": 0.0, "n": 1, "kind": "device_counter"}
    return e


def committed_four_machines():
    """The committed entry: graph_us combined over four machines, two runs each, recorded before counters."""
    return combine_entries([kernel_entry(v, m) for m, vs in (("gpu-a", (24.4, 24.5)), ("gpu-b", (24.6, 24.6)),
                                                            ("gpu-c", (24.3, 24.4)), ("gpu-d", (24.5, 24.5)))
                            for v in vs], "k")


def test_a_counter_counted_on_a_new_machine_is_kept_beside_the_stored_time_of_four():
    committed = committed_four_machines()
    counted = [kernel_entry(v, "gpu-e", counted=24.84e6) for v in (24.40, 24.45, 24.42)]
    e = combine_entries([committed] + counted, "k", stored=[True, False, False, False])
    assert e["machines"] == ["gpu-a", "gpu-b", "gpu-c", "gpu-d", "gpu-e"] and e["independent_runs"] == 11
    g, c = e["metrics"]["graph_us"], e["metrics"]["ncu_dram_read_bytes"]
    # the time: over five machines (no field of its own), its four-machine spread carried and never narrowed
    assert "machines" not in g and "independent_runs" not in g
    assert g["noise_machines"] >= committed["metrics"]["graph_us"]["noise_machines"]
    # the counter: over the one machine and three runs that counted it, with no spread between machines
    assert (c["machines"], c["independent_runs"], c["n"]) == (["gpu-e"], 3, 3)
    assert c["value"] == 24.84e6 and "noise_machines" not in c
    assert metrics_left_out([committed] + counted, [True, False, False, False]) == {}


def test_without_the_source_kinds_a_metric_the_stored_source_lacks_is_left_out():
    committed = committed_four_machines()
    counted = [kernel_entry(24.4, "gpu-e", counted=24.84e6) for _ in range(3)]
    assert set(combine_entries([committed] + counted, "k")["metrics"]) == {"graph_us"}
    assert metrics_left_out([committed] + counted) == {"ncu_dram_read_bytes": (0,)}


def test_a_metric_missing_from_one_measured_run_is_left_out_beside_a_stored_source():
    # runs made without --counters mixed with counted ones: the counter is not stored, and said
    committed = committed_four_machines()
    runs = [kernel_entry(24.4, "gpu-e", counted=24.84e6), kernel_entry(24.4, "gpu-e"),
            kernel_entry(24.4, "gpu-e", counted=24.84e6)]
    e = combine_entries([committed] + runs, "k", stored=[True, False, False, False])
    assert set(e["metrics"]) == {"graph_us"}
    assert metrics_left_out([committed] + runs, [True, False, False, False]) == {"ncu_dram_read_bytes": (2,)}


def test_a_counter_stored_on_one_machine_counts_as_that_machine_when_a_second_is_added():
    # the next lease: the committed entry now holds the counter of gpu-e; three runs of gpu-f add a second
    # machine to it, whose spread is between e and f alone (not between f and the time's five machines)
    first = combine_entries([committed_four_machines()] + [kernel_entry(24.4, "gpu-e", counted=100.0)] * 3, "k",
                            stored=[True, False, False, False])
    e = combine_entries([first] + [kernel_entry(24.4, "gpu-f", counted=102.0)] * 3, "k",
                        stored=[True, False, False, False])
    c = e["metrics"]["ncu_dram_read_bytes"]
    assert (c["machines"], c["independent_runs"]) == (["gpu-e", "gpu-f"], 6)
    assert c["noise_machines"] == pytest.approx(half_range([100.0, 102.0]), abs=1e-6)
    assert c["value"] == pytest.approx(101.0)


def test_a_stored_counter_groups_with_new_runs_of_its_own_machine_not_with_the_time_s_machines():
    # the stored counter was counted on gpu-e alone (3 runs of 100.0): gpu-e's new run joins them as one
    # machine (the median of four runs, 100.0), not as a sixth group beside an "a+b+c+d+e" one, so the entry
    # sits between e and f
    first = combine_entries([committed_four_machines()] + [kernel_entry(24.4, "gpu-e", counted=100.0)] * 3, "k",
                            stored=[True, False, False, False])
    e = combine_entries([first, kernel_entry(24.4, "gpu-e", counted=100.4), kernel_entry(24.4, "gpu-f", counted=102.0)],
                        "k", stored=[True, False, False])
    c = e["metrics"]["ncu_dram_read_bytes"]
    assert c["value"] == pytest.approx(101.0) and c["noise"] == pytest.approx(round(0.2 / 100.0, 6))
    # a counter stores no machine medians (a count machines agree on); the time beside it does
    assert "by_machine" not in c and "by_machine" in e["metrics"]["graph_us"]


def test_a_metric_of_the_same_machines_but_fewer_runs_names_its_runs_only():
    proposal = kernel_entry(24.4, "gpu-e")  # a proposal of gpu-e from a run without --counters
    e = combine_entries([proposal, kernel_entry(24.4, "gpu-e", counted=1.0), kernel_entry(24.4, "gpu-e", counted=1.0)],
                        "k", stored=[True, False, False])
    c = e["metrics"]["ncu_dram_read_bytes"]
    assert "machines" not in c and c["independent_runs"] == 2 and e["independent_runs"] == 3


def _counted_run_file(tmp_path: Path, name: str, machine: str, counted: bool, counting: bool | None = None) -> Path:
    """A results file of `machine` whose copy case also measured a gated counter when `counted`; `counting`
    (default: counted): the run counted the case (its info records a counting, as --counters writes it),
    whether or not the counter is among what it counted."""
    p = _run_file(tmp_path, name, 1.0, machine)
    doc = json.loads(p.read_text())
    case = next(c for c in doc["cases"] if c["key"] == COPY)
    if counted:
        case["metrics"]["ncu_dram_read_bytes"] = {"value": 2.147e9, "unit": "B", "direction": "lower", "gated": True,
                                                  "n": 1, "noise": 0.0, "rel_tol": 0.01, "kind": "device_counter"}
    if counted if counting is None else counting:
        case.setdefault("info", {})["counters"] = {"ncu": "/usr/local/cuda/bin/ncu", "counting": {"tool": "ncu"}}
    p.write_text(json.dumps(doc))
    return p


def _committed_file(tmp_path: Path) -> Path:
    """A stored baseline file whose copy entry spans four machines and predates the counter."""
    runs = [_run_file(tmp_path, f"old-{m}.json", s, f"gpu-{m * 12}")
            for m, s in zip("abcd", (1.0, 1.004, 0.998, 1.002))]
    root = tmp_path / "committed"
    assert main(["baselines", "promote", *map(str, runs), "--case", COPY, "--baseline-dir", str(root)]) == 0
    return root / "nvidia-h200-x1" / "selfcheck.json"


def test_promote_with_the_committed_file_first_keeps_its_machines_and_stores_the_counter(tmp_path, capsys):
    committed = _committed_file(tmp_path)
    runs = [_counted_run_file(tmp_path, f"run-{i}.json", "gpu-eeeeeeeeeeee", True) for i in (1, 2, 3)]
    root = tmp_path / "baselines"
    capsys.readouterr()
    assert main(["baselines", "promote", str(committed), *map(str, runs), "--case", COPY,
                 "--baseline-dir", str(root)]) == 0
    assert "dropped" not in capsys.readouterr().out
    e = load_file(root / "nvidia-h200-x1" / "selfcheck.json")["entries"][COPY]
    assert len(e["machines"]) == 5 and "machines" not in e["metrics"]["copy_GBps"]
    assert e["metrics"]["ncu_dram_read_bytes"]["machines"] == ["gpu-eeeeeeeeeeee"]
    assert e["metrics"]["ncu_dram_read_bytes"]["independent_runs"] == 3


def test_promote_says_which_metric_a_measured_run_lacked_and_drops_it(tmp_path, capsys):
    # run 2 counted the case and the counter is not among its counts (a kernel renamed, a metric gone)
    committed = _committed_file(tmp_path)
    runs = [_counted_run_file(tmp_path, f"run-{i}.json", "gpu-eeeeeeeeeeee", i != 2, counting=True) for i in (1, 2, 3)]
    root = tmp_path / "baselines"
    capsys.readouterr()
    assert main(["baselines", "promote", str(committed), *map(str, runs), "--case", COPY,
                 "--baseline-dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert (f"  ! ncu_dram_read_bytes dropped from 1 case ({COPY}): not measured in {runs[1]}, a measured run "
            "(a metric is kept when every measured run among the sources measured it") in out
    e = load_file(root / "nvidia-h200-x1" / "selfcheck.json")["entries"][COPY]
    assert set(e["metrics"]) == {"copy_GBps"} and len(e["machines"]) == 5


def test_promote_of_timed_runs_beside_a_counted_one_keeps_the_counter_of_the_run_that_counted(tmp_path, capsys):
    # the usual lease: three runs timed, one counted (counting takes 4-5x as long); the timed runs say
    # nothing of the counter, so it is kept from the counted run, and the time is over all four
    runs = [_counted_run_file(tmp_path, f"run-{i}.json", "gpu-eeeeeeeeeeee", i == 4) for i in (1, 2, 3, 4)]
    root = tmp_path / "baselines"
    assert main(["baselines", "promote", *map(str, runs), "--case", COPY, "--baseline-dir", str(root)]) == 0
    assert "dropped" not in capsys.readouterr().out
    e = load_file(root / "nvidia-h200-x1" / "selfcheck.json")["entries"][COPY]
    assert e["independent_runs"] == 4 and "independent_runs" not in e["metrics"]["copy_GBps"]
    assert e["metrics"]["ncu_dram_read_bytes"]["independent_runs"] == 1


def test_a_run_that_did_not_count_leaves_out_no_counter_but_still_every_other_metric():
    counted = kernel_entry(24.4, "gpu-e", counted=24.84e6)
    timed = kernel_entry(24.5, "gpu-e")
    e = combine_entries([counted, timed, timed], "k", uncounted=[False, True, True])
    assert e["metrics"]["ncu_dram_read_bytes"]["independent_runs"] == 1 and e["independent_runs"] == 3
    # a time metric the uncounted run lacks is still left out: only a hardware counter may be missing
    counted["metrics"]["other_us"] = dict(counted["metrics"]["graph_us"])
    assert metrics_left_out([counted, timed], None, "k", [False, True]) == {"other_us": (1,)}
