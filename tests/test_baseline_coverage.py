"""moebench.baselines.coverage and `baselines show --short`: which stored metrics fall short of 3 independent
runs on 2 machines, per metric (a counter of one machine beside a time of five falls short on its own)."""

from __future__ import annotations

import json
from pathlib import Path

from moebench.baselines.coverage import coverage
from moebench.cli.main import main

RUN1 = Path(__file__).resolve().parent / "data" / "selfcheck-h200-1.json"
COPY = "selfcheck[copy-1024MiB-cuda]"


def _metric(**own) -> dict:
    return {"value": 1.0, "unit": "us", "direction": "lower", "rel_tol": 0.05, "noise": 0.01, "n": 10, **own}


def _entry(runs, machines, **metrics) -> dict:
    e = {"definition_hash": "h", "metrics": metrics or {"graph_us": _metric()},
         "provenance": {"kind": "measured", "commit": "a", "date": "d", "versions": {}}}
    if runs is not None:
        e.update(independent_runs=runs, machines=[f"gpu-{i}" for i in range(machines)])
    return e


def test_each_metric_is_held_to_three_runs_on_two_machines():
    entries = {"a": _entry(3, 2), "b": _entry(16, 1), "c": _entry(2, 5), "d": _entry(None, 0),
               "e": _entry(9, 5, graph_us=_metric(), ncu=_metric(machines=["gpu-0"], independent_runs=4))}
    c = coverage(entries, entries)
    assert c.metrics == 6
    assert [(s.key, s.metric) for s in c.short] == [("b", "graph_us"), ("c", "graph_us"), ("d", "graph_us"),
                                                    ("e", "ncu")]
    assert c.counts() == {"unsaid": 1, "one machine": 2, "few runs": 1, "external": 0}


def test_an_external_figure_is_short_for_its_own_reason_whatever_it_says_of_runs():
    # the users' 97 ms/token: no run of ours can meet the bar for it, and it is not "unsaid"
    external = _entry(3, 2)
    external["provenance"] = {"kind": "external", "source": "users' 8x RTX PRO 6000", "date": "d"}
    c = coverage({"x": external}, ["x"])
    assert [s.reason for s in c.short] == ["external"] and c.counts()["external"] == 1


def test_the_bar_is_inclusive_and_only_the_keys_asked_for_count():
    entries = {"a": _entry(3, 2), "b": _entry(2, 2), "c": _entry(3, 1)}
    assert coverage(entries, ["a"]).short == ()
    assert [s.key for s in coverage(entries, ["a", "b", "c"]).short] == ["b", "c"]


def test_show_tallies_the_file_and_short_lists_only_the_metrics_below_the_bar(tmp_path, capsys):
    root = tmp_path / "baselines"
    assert main(["baselines", "promote", str(RUN1), "--all", "--baseline-dir", str(root)]) == 0
    path = root / "nvidia-h200-x1" / "selfcheck.json"
    doc = json.loads(path.read_text())
    for k, e in doc["entries"].items():  # every entry from 3 runs on 2 machines but the copy case
        if k != COPY:
            e.update(independent_runs=3, machines=["gpu-aaaaaaaaaaaa", "gpu-bbbbbbbbbbbb"])
    path.write_text(json.dumps(doc))
    n = sum(len(e["metrics"]) for e in doc["entries"].values())
    short = len(doc["entries"][COPY]["metrics"])
    capsys.readouterr()
    assert main(["baselines", "show", str(path), "--short"]) == 0
    out = capsys.readouterr().out
    assert f"  {n - short} of {n} metrics from 3+ runs on 2+ machines; {short} short ({short} few runs" in out
    listed = {line.split()[0] for line in out.splitlines() if line.startswith("selfcheck[")}
    assert listed == {COPY}
    assert main(["baselines", "show", str(path)]) == 0
    assert len({line.split()[0] for line in capsys.readouterr().out.splitlines()
                if line.startswith("selfcheck[")}) == len(doc["entries"])
