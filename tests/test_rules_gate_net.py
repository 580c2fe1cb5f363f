"""The net of issue 35: rules of combine/promote, the schema round trip, the diff and --baseline-strict that
a hand-made round of bugs showed no test caught. Each test names one rule; each fails when that rule is
broken by hand in src/ (a comparison flipped, a field dropped, a bound loosened) and passes on the code.

CPU only and deterministic: hand-made entries, in-process CLI calls, and one pytester run of the fake
project (tests/conftest.py) for --baseline-strict.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from moebench.baselines.combine import combine_entries, half_range
from moebench.baselines.schema import BaselineError
from moebench.baselines.store import BaselineEntry, BaselineSet, dumps, family_path, load_file, merge_entries
from moebench.baselines.update import merge_files
from moebench.cli.main import main
from moebench.core.metrics import Metric

HW = "test-hw-x1"  # the hardware key of conftest.valid_document() and of the fake project
KEY = "decode[x]"


def run(value, machine="gpu-aaaaaaaaaaaa", noise=0.001, date="2026-12-02T00:00:00Z", gate=None, commit="abc"):
    """One run's entry of a case, as a results file or a proposed baseline gives it to combine_entries."""
    m = {"value": value, "unit": "ms", "direction": "lower", "rel_tol": 0.05, "noise": noise, "n": 10,
         **({"gate": gate} if gate else {})}
    return {"definition_hash": "d1", "machines": [machine], "independent_runs": 1, "metrics": {"ttft_ms": m},
            "provenance": {"kind": "measured", "commit": commit, "date": date, "versions": {}}}


# --- 1. combine and promote ---------------------------------------------------------------------------

@pytest.mark.parametrize("gates", [("cliff", "cliff", "cliff"), ("cliff", None, None), (None, None, "cliff")],
                         ids=["every run", "the first run", "the last run"])
def test_a_metric_any_run_calls_a_cliff_is_a_cliff_when_runs_are_combined(gates):
    """A combined metric is a cliff (gate "cliff") when any of its runs marks it one."""
    e = combine_entries([run(96.0 + i, gate=g) for i, g in enumerate(gates)], KEY)
    assert e["metrics"]["ttft_ms"].get("gate") == "cliff"


def test_a_metric_no_run_calls_a_cliff_is_no_cliff_when_runs_are_combined():
    """A combined metric none of whose runs is a cliff gets no gate of its own."""
    assert "gate" not in combine_entries([run(96.0), run(97.0)], KEY)["metrics"]["ttft_ms"]


def test_a_combined_entry_carries_the_newest_runs_date():
    """The date of a combined entry is the newest of its runs' dates, whatever order the runs come in."""
    dates = ["2026-12-02T10:00:00Z", "2026-12-05T09:00:00Z", "2026-12-01T23:00:00Z"]
    e = combine_entries([run(10.0, date=d, commit=c) for d, c in zip(dates, "bca")], KEY)
    assert e["provenance"]["date"] == "2026-12-05T09:00:00Z"
    assert e["provenance"]["commit"] == "a, b, c"


# (id, runs as (value, machine, the run's own noise), the combined noise, the combined noise_machines)
SPREADS = [
    # machines agree on their median while each one's runs scatter: all of it is noise, none between machines
    ("medians agree", [(9.8, "a", 0.001), (10.2, "a", 0.001), (9.9, "b", 0.001), (10.1, "b", 0.001)],
     0.02, 0.0),
    # machines 10% apart, each machine's runs agree: the spread inside one run is the noise, the machines'
    # spread is noise_machines alone (the runs' own noise is not added to it, nor it to the noise)
    ("machines apart", [(10.0, "a", 0.03), (10.0, "a", 0.001), (11.0, "b", 0.001), (11.0, "b", 0.001)],
     0.03, round(0.5 / 10.5, 6)),
    # one run per machine: no spread between runs, the machines' medians give noise_machines
    ("one run each", [(10.0, "a", 0.002), (10.4, "b", 0.001), (10.2, "c", 0.001)], 0.002, round(0.2 / 10.2, 6)),
]


@pytest.mark.parametrize("runs, noise, between", [s[1:] for s in SPREADS], ids=[s[0] for s in SPREADS])
def test_combined_noise_is_the_widest_spread_of_a_run_or_a_machines_runs_and_noise_machines_the_medians(
        runs, noise, between):
    """Combined noise is the larger of any run's own noise and the spread between one machine's runs;
    noise_machines is the spread between the machines' medians alone."""
    t = combine_entries([run(v, f"gpu-{m * 12}", n) for v, m, n in runs], KEY)["metrics"]["ttft_ms"]
    assert t["noise"] == pytest.approx(noise, abs=1e-6)
    assert t["noise_machines"] == pytest.approx(between, abs=1e-6)


def _kernel_run(value: float, machine: str, kind: str | None = "device_kernel") -> dict:
    e = run(value, machine)
    e["metrics"] = {"graph_us": {**e["metrics"]["ttft_ms"], "unit": "us", **({"kind": kind} if kind else {})}}
    return e


def test_a_kernel_time_whose_machines_agree_within_1_percent_is_stored_at_3_percent_after_combining():
    """Combining keeps what a metric is bound by (its kind), so the rule that needs it beside noise_machines
    fires: three machines 0.1% apart store a device kernel time at rel_tol 0.03, marked as the rule's.
    (Combining once dropped the kind, and every promoted kernel entry kept 0.05.) Two machines are too few."""
    runs = [_kernel_run(24.30, "gpu-aaaaaaaaaaaa"), _kernel_run(24.35, "gpu-bbbbbbbbbbbb"),
            _kernel_run(24.32, "gpu-cccccccccccc")]
    combined = combine_entries(runs, KEY)
    assert combined["metrics"]["graph_us"]["kind"] == "device_kernel"
    doc, _ = merge_entries(None, HW, "gemm", {}, "2026-12-03T00:00:00Z", {KEY: combined})
    assert doc["entries"][KEY]["metrics"]["graph_us"]["rel_tol"] == 0.03
    assert doc["entries"][KEY]["metrics"]["graph_us"]["tol_rule"] == "tight"
    two, _ = merge_entries(None, HW, "gemm", {}, "2026-12-03T00:00:00Z", {KEY: combine_entries(runs[:2], KEY)})
    assert two["entries"][KEY]["metrics"]["graph_us"]["rel_tol"] == 0.05
    assert "tol_rule" not in two["entries"][KEY]["metrics"]["graph_us"]
    older = combine_entries([_kernel_run(24.30, "gpu-aaaaaaaaaaaa", kind=None), _kernel_run(24.35, "gpu-bbbbbbbbbbbb")], KEY)
    assert older["metrics"]["graph_us"]["kind"] == "device_kernel"  # a run from before kinds names none
    disagree = r"decode\[x\] graph_us: the runs disagree on graph_us\.kind \(device_kernel, host_bound\)"
    with pytest.raises(BaselineError, match=disagree):
        combine_entries([_kernel_run(24.30, "gpu-aaaaaaaaaaaa"), _kernel_run(24.35, "gpu-bbbbbbbbbbbb", "host_bound")], KEY)


def _proposal(tmp_path: Path, name: str, entry: dict) -> Path:
    """A proposed baseline file (--baseline-propose DIR) holding one entry."""
    doc, _ = merge_entries(None, HW, "decode", {"cpu": {"model": name}}, "2026-12-01T00:00:00Z", {KEY: entry})
    path = family_path(tmp_path / name, HW, "decode")
    path.parent.mkdir(parents=True)
    path.write_text(dumps(doc))
    return path


def test_promote_of_runs_on_two_machines_stores_the_cliff_the_newest_date_and_both_spreads(tmp_path, capsys):
    """`moebench baselines promote` of several runs stores what combine_entries makes of them: the cliff
    (rel_tol 1.0, the gate it applies), the newest date, the noise and the spread between machines."""
    a = _proposal(tmp_path, "p1", run(100.0, "gpu-aaaaaaaaaaaa", 0.01, "2026-12-03T00:00:00Z", "cliff"))
    b = _proposal(tmp_path, "p2", run(120.0, "gpu-bbbbbbbbbbbb", 0.02, "2026-12-02T00:00:00Z"))
    root = tmp_path / "baselines"
    assert main(["baselines", "promote", str(a), str(b), "--all", "--baseline-dir", str(root)]) == 0
    assert "2 runs:" in capsys.readouterr().out
    e = load_file(family_path(root, HW, "decode"))["entries"][KEY]
    t = e["metrics"]["ttft_ms"]
    assert (t["gate"], t["rel_tol"], t["value"]) == ("cliff", 1.0, 110.0)
    assert t["noise"] == 0.02 and t["noise_machines"] == pytest.approx(half_range([100.0, 120.0]), abs=1e-6)
    assert e["provenance"]["date"] == "2026-12-03T00:00:00Z"
    assert (e["machines"], e["independent_runs"]) == (["gpu-aaaaaaaaaaaa", "gpu-bbbbbbbbbbbb"], 2)


# --- 2. the schema round trip -------------------------------------------------------------------------

def test_every_field_an_entry_is_written_with_is_read_back(tmp_path):
    """Every field of an entry written through the store (merge_files) is read back by BaselineSet.entry:
    noise_machines, the cliff flag, kind and a gate that is off in particular."""
    metrics = {
        "ttft_ms": Metric(96.9, "ms", "lower", noise=0.05, n=12, rel_tol=1.0, noise_machines=0.12, cliff=True,
                          kind="host_bound"),
        "ms_per_token": Metric(5.845, "ms", "lower", noise=0.004, n=384, rel_tol=0.05, noise_machines=0.031,
                               kind="gpu_decode"),
        "tokens_per_s": Metric(171.1, "tok/s", "higher", noise=0.7, n=3, rel_tol=0.1, gate_off=True),
    }
    fp = {"cpu": {"model": "m"}, "gpus": [{"name": "NVIDIA H200"}]}
    want = BaselineEntry(
        definition_hash="0123456789abcdef", metrics=metrics,
        provenance={"kind": "measured", "commit": "c0ffee", "date": "2026-12-02T00:00:00Z", "versions": {"vllm": "1"}},
        recorded={"backends": {"moe": "triton"}}, machines=("gpu-aaaaaaaaaaaa", "gpu-bbbbbbbbbbbb"),
        independent_runs=6, gpus=({"index": 3, "uuid": "GPU-3"}, {"index": 5, "uuid": "GPU-5"}))
    entry = {"definition_hash": want.definition_hash, "metrics": {n: m.to_json() for n, m in metrics.items()},
             "provenance": want.provenance, "recorded": want.recorded, "machines": list(want.machines),
             "independent_runs": want.independent_runs, "gpus": [dict(g) for g in want.gpus]}
    [m] = merge_files([(HW, "decode", fp, {KEY: entry})], root=tmp_path)
    assert m.refused == {} and family_path(tmp_path, HW, "decode").is_file()

    bs = BaselineSet.load(tmp_path, HW)
    got = bs.entry("decode", KEY)
    for f in dataclasses.fields(BaselineEntry):
        if f.name != "metrics":
            assert getattr(got, f.name) == getattr(want, f.name), f"entry field {f.name} not read back"
    assert set(got.metrics) == set(metrics)
    for name, metric in metrics.items():
        for f in dataclasses.fields(Metric):
            if f.compare:
                assert getattr(got.metrics[name], f.name) == getattr(metric, f.name), f"{name}.{f.name} not read back"
    assert bs.fingerprint("decode", KEY) == fp


def _twice(valid_doc: dict, where: str) -> tuple[str, str, str]:
    """(the text to replace in the dumped valid document, its replacement naming one key twice with equal
    values, that key)."""
    if where == "a metric's field":
        return '"noise": 0.01,', '"noise": 0.01,\n          "noise": 0.01,', "noise"
    if where == "an entry":
        same = json.dumps(valid_doc["entries"]["fake[a]"])
        return '"entries": {', f'"entries": {{\n    "fake[a]": {same},', "fake[a]"
    return '"family": "gemm",', '"family": "gemm",\n  "family": "gemm",', "family"


@pytest.mark.parametrize("where", ["a metric's field", "an entry", "the header"])
def test_a_key_named_twice_with_the_same_value_is_refused_in_one_line_naming_file_and_key(tmp_path, valid_doc,
                                                                                          where):
    """A key named twice in one object of a baseline file is refused at load even when both values are equal."""
    old, new, key = _twice(valid_doc, where)
    text = dumps(valid_doc)
    assert text.count(old) == 1, where
    path = family_path(tmp_path, HW, "gemm")
    path.parent.mkdir(parents=True)
    path.write_text(text.replace(old, new))
    with pytest.raises(BaselineError) as e:
        BaselineSet.load(tmp_path, HW)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{path}: duplicate key {key!r} in one object"), msg


# --- 3. diff --------------------------------------------------------------------------------------------

def test_a_direction_flip_is_looser_both_ways(tmp_path, valid_doc, capsys):
    """A metric's direction flipped, lower to higher or higher to lower, is marked [LOOSER] by `baselines diff`."""
    before = family_path(tmp_path / "a", HW, "gemm")
    after = family_path(tmp_path / "b", HW, "gemm")
    for path in (before, after):
        path.parent.mkdir(parents=True)
    before.write_text(dumps(valid_doc))
    valid_doc["entries"]["fake[a]"]["metrics"]["latency_us"]["direction"] = "higher"   # was lower
    valid_doc["entries"]["fake[b]"]["metrics"]["tokens_per_s"]["direction"] = "lower"  # was higher
    after.write_text(dumps(valid_doc))
    assert main(["baselines", "diff", str(before), str(after), "--exit-code"]) == 1
    out = capsys.readouterr().out
    looser = "[LOOSER: direction flipped: worse reads better]"
    assert f"~ {HW}/gemm fake[a]: latency_us direction lower -> higher {looser}" in out, out
    assert f"~ {HW}/gemm fake[b]: tokens_per_s direction higher -> lower {looser}" in out, out
    assert "0 added, 0 removed, 2 changed, 0 unchanged; 2 changes loosen the gate" in out, out


# --- 4. --baseline-strict -------------------------------------------------------------------------------

# Cases with a baseline key (moebench.suite.unmeasured.case_key reads the `key` of a parameter) that skip in
# setup, before their body runs: too few GPUs (the plugin's gpus(n) check), a skipif marker, a fixture
# that skips (a missing package).
KEYED = '''
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Case:
    key: str


@pytest.fixture
def needs_package():
    pytest.importorskip("moebench_no_such_package")


@pytest.mark.gemm
@pytest.mark.parametrize("case", [
    pytest.param(Case("fake[two-gpus]"), marks=pytest.mark.gpus(n=2), id="two-gpus"),
    pytest.param(Case("fake[skipif]"), marks=pytest.mark.skipif(True, reason="not on this box"), id="skipif"),
])
def test_keyed(case, moebench):
    pytest.fail("a case that skips in setup ran its body")


@pytest.mark.gemm
@pytest.mark.parametrize("case", [Case("fake[package]")], ids=["package"])
def test_keyed_package(case, needs_package, moebench):
    pytest.fail("a case that skips in setup ran its body")
'''


def test_strict_fails_a_stored_case_skipped_in_setup(fakebench):
    """Under --baseline-strict a stored case that skips in setup (too few GPUs, a skipif marker, a
    fixture's skip) fails, naming its entry, as one skipped in its call does."""
    fakebench.pytester.makepyfile(test_keyed=KEYED)
    path = fakebench.write_baseline({"two-gpus": 1.0, "skipif": 1.0, "package": 1.0})
    lenient = fakebench.run("test_keyed.py")
    assert lenient.ret == pytest.ExitCode.OK, lenient.stdout.str()
    lenient.assert_outcomes(skipped=3)

    strict = fakebench.run("--baseline-strict", "test_keyed.py")
    out = strict.stdout.str()
    assert strict.ret == pytest.ExitCode.TESTS_FAILED, out
    strict.assert_outcomes(errors=3)  # a failed setup report is an error
    for key, reason in [("fake[two-gpus]", "needs 2 CUDA GPUs, NVML sees 0 visible here"),
                        ("fake[skipif]", "not on this box"),
                        ("fake[package]", "could not import 'moebench_no_such_package'")]:
        assert (f"--baseline-strict: {key} has a baseline in {path} but did not run ({reason}"
                in out), (key, out)
    assert "ran its body" not in out


def test_show_says_which_tolerance_the_rule_set():
    from moebench.baselines.rules import rule_of
    from moebench.outputs.report import fmt_rule

    m = {"rel_tol": 0.03, "noise": 0.004, "noise_machines": 0.005, "kind": "device_kernel"}
    assert fmt_rule(rule_of({**m, "tol_rule": "tight"})) == \
        "rel 3% (ruled: 3+ machines within 1%) + 2x noise(0.4%; machines 0.5%)"
    assert fmt_rule(rule_of(m)) == "rel 3% + 2x noise(0.4%; machines 0.5%)"  # a reviewer's 3%
