"""moebench.baselines.diff on hand-made entries: which field changes loosen the gate, and that fields this
code does not know are shown too (never dropped from a review)."""

from __future__ import annotations

from moebench.baselines.diff import diff, entry_changes, loosening

KEY = ("hw", "gemm", "gemm[x]")


def _entry(**metric) -> dict:
    m = {"value": 10.0, "unit": "us", "direction": "lower", "rel_tol": 0.05, "noise": 0.01, "n": 20, **metric}
    return {"definition_hash": "h", "metrics": {"graph_us": m}, "provenance": {"kind": "measured", "commit": "a"}}


def _looser(old: dict, new: dict) -> dict[str, str]:
    return {c.field: c.looser for c in entry_changes(KEY, old, new)}


def test_each_loosening_field_says_why_and_tightening_says_nothing():
    assert _looser(_entry(), _entry(noise=0.2)) == {"noise": "wider noise band"}
    assert _looser(_entry(), _entry(rel_tol=0.5)) == {"rel_tol": "wider tolerance"}
    assert _looser(_entry(), _entry(direction="higher")) == {"direction": "direction flipped: worse reads better"}
    assert _looser(_entry(), _entry(gated=False)) == {"gated": "no longer gated"}
    assert _looser(_entry(), _entry(noise=0.001, rel_tol=0.03, n=50, value=12.0)) == \
        {"value": "", "noise": "", "rel_tol": "", "n": ""}


def test_removed_entries_and_metrics_loosen_and_added_ones_do_not():
    old, new = _entry(), _entry()
    new["metrics"]["eager_us"] = dict(new["metrics"]["graph_us"])
    assert [(c.metric, c.field, c.looser) for c in entry_changes(KEY, old, new)] == [("eager_us", "added", "")]
    assert [(c.metric, c.field, c.looser) for c in entry_changes(KEY, new, old)] == \
        [("eager_us", "removed", "metric no longer gated")]
    changes = diff({KEY: old}, {})
    assert [c.looser for c in loosening(changes)] == ["entry removed: the case is no longer gated"]
    assert loosening(diff({}, {KEY: old})) == []


def test_a_field_this_code_does_not_know_is_shown_with_the_provenance_that_came_with_it():
    old, new = _entry(), _entry()
    new["independent_runs"] = 3
    new["provenance"] = {"kind": "measured", "commit": "b"}
    assert [(c.field, c.old, c.new) for c in entry_changes(KEY, old, new)] == \
        [("independent_runs", None, 3), ("provenance", old["provenance"], new["provenance"])]
    assert entry_changes(KEY, old, {**old, "provenance": new["provenance"]}) == [], \
        "a new provenance alone (the same numbers re-recorded) is no change"


def test_a_kind_whose_assumed_spread_is_wider_loosens_and_a_narrower_one_does_not():
    # no noise_machines: another machine assumes the kind's spread (2% kernel time, 50% host-bound)
    assert _looser(_entry(kind="device_kernel"), _entry(kind="host_bound")) == \
        {"kind": "kind device_kernel -> host_bound: 50.0% between machines assumed (was 2.0%)"}
    assert _looser(_entry(kind="host_bound"), _entry(kind="device_kernel")) == {"kind": ""}
    assert _looser(_entry(kind="device_kernel", noise_machines=0.004),
                   _entry(kind="host_bound", noise_machines=0.004)) == {"kind": ""}, "a measured spread holds"


def test_a_kind_named_beside_a_wider_measured_spread_is_not_blamed_for_it():
    # session 14's promotion: kind None -> device_kernel and noise_machines 0.0% -> 1.1% in one change; the
    # spread is the measured one, so only noise_machines loosens (the kind line read "1.1% assumed")
    looser = _looser(_entry(noise_machines=0.0), _entry(kind="device_kernel", noise_machines=0.011))
    assert looser == {"kind": "", "noise_machines": "wider spread between machines"}


def test_a_spread_between_machines_is_judged_with_the_machines_it_was_measured_over():
    # a promotion that adds a fourth machine and widens the half range 1.0% -> 1.2% narrows what a further
    # machine is given (1.88 x 1.0% -> 1.48 x 1.2%): not looser; the same half range over fewer machines is
    old = {**_entry(noise_machines=0.010), "machines": ["a", "b", "c"]}
    assert _looser(old, {**_entry(noise_machines=0.012), "machines": ["a", "b", "c", "d"]})["noise_machines"] == ""
    fewer = {**_entry(noise_machines=0.011), "machines": ["a", "b"]}
    assert _looser(old, fewer)["noise_machines"] == "wider spread between machines"


FIVE = ["a", "b", "c", "d", "e"]


def _counted(own=None, entry_machines=FIVE, **counter) -> dict:
    """An entry of `entry_machines` whose counter names its own machines (`own`; None: the entry's)."""
    e = {**_entry(), "machines": list(entry_machines)}
    c = {"value": 2.0e7, "unit": "B", "direction": "lower", "rel_tol": 0.01, "noise": 0.0, "n": 3,
         "kind": "device_counter", **counter, **({"machines": own} if own is not None else {})}
    e["metrics"] = {**e["metrics"], "ncu_dram_read_bytes": c}
    return e


def _counter_looser(old: dict, new: dict) -> dict[str, str]:
    return {c.field: c.looser for c in entry_changes(KEY, old, new) if c.metric == "ncu_dram_read_bytes"}


def test_a_metric_s_machines_narrowing_loosens_and_widening_does_not():
    assert _counter_looser(_counted(["e", "f"], FIVE + ["f"]), _counted(["e"], FIVE + ["f"]))["machines"] == \
        "f no longer named as recording: the spread between machines applies there instead of the metric's noise"
    assert _counter_looser(_counted(["e"], FIVE + ["f"]), _counted(["e", "f"], FIVE + ["f"])) == {"machines": ""}


def test_a_metric_gaining_its_own_machines_loosens_where_the_entry_s_no_longer_count_for_it():
    looser = _counter_looser(_counted(None), _counted(["e"]))["machines"]
    assert looser.startswith("a, b, c, d no longer named as recording")
    # losing them to an entry of the same one machine: the same recorder, nothing looser
    assert _counter_looser(_counted(["e"]), _counted(None, ["e"])) == {"machines": ""}


def test_a_metric_s_spread_between_machines_is_judged_over_its_own_machines():
    # the entry's five machines on both sides; the counter's own three (1.0%) -> four (1.2%): a further machine
    # gets 1.88 x 1.0% -> 1.48 x 1.2%, narrower, not looser (over the entry's five both it would read wider)
    old = _counted(["a", "b", "c"], noise_machines=0.010)
    new = _counted(["a", "b", "c", "d"], noise_machines=0.012)
    assert _counter_looser(old, new) == {"noise_machines": "", "machines": ""}
