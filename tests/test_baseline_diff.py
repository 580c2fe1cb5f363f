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
