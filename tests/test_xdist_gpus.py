"""`pytest -n N` end to end: real xdist workers over a tiny project with 4 fake GPUs (tests/xdist_project.py).

Each case on the GPU of the stable plan, its worker seeing only that GPU while the hardware key and machine
id stay the box's; the multi-GPU case alone after the others, on every GPU; one merged verdict equal to a
single process's; an update from 4 workers writing every entry once; a case moved to another GPU gated
with the spread between machines; bad -n / --gpu-of input as one usage line.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from conftest import table_rows
from moebench.suite.gpu_plan import assign
from xdist_project import CASES, XdistProject

pytest.importorskip("xdist")
KEYS = [f"fake[{c}]" for c in CASES]
BOX_ID = "gpu-" + hashlib.sha256("\n".join(f"GPU-fake-{i}" for i in range(4)).encode()).hexdigest()[:12]


@pytest.fixture
def project(pytester, monkeypatch) -> XdistProject:
    return XdistProject(pytester, monkeypatch)


def _cases(doc: dict) -> dict[str, dict]:
    return {c["key"]: c for c in doc["cases"]}


def test_each_worker_sees_only_its_gpu_and_the_box_stays_the_box(project):
    r = project.run("-n", "2", "--results-json", "r.json")
    assert r.ret == 0, r.stdout.str()
    seen, doc = project.seen(), project.results(project.path / "r.json")
    cases = _cases(doc)
    plan = assign(KEYS, 2)
    for name in CASES:
        gpu = cases[f"fake[{name}]"]["gpu"]
        assert gpu == {"index": plan[f"fake[{name}]"], "uuid": f"GPU-fake-{plan[f'fake[{name}]']}", "name": "NVIDIA H200"}
        assert seen[name]["cuda_visible_devices"] == str(gpu["index"]), "the worker must see its GPU only"
        assert cases[f"fake[{name}]"]["clocks"]["max_sm_clock_mhz"] == 1980 - 10 * gpu["index"], "its GPU's clocks"
        assert cases[f"fake[{name}]"]["wall_s"] >= 0.05
    by_worker = {}
    for name in CASES:
        by_worker.setdefault(seen[name]["worker"], set()).add(seen[name]["cuda_visible_devices"])
    assert sorted(by_worker.values(), key=sorted) == [{"0"}, {"1"}], "one GPU per worker"
    assert {s["key"] for s in seen.values()} == {doc["hardware_key"]} == {"nvidia-h200-x4"}
    assert {s["machine_id"] for s in seen.values()} == {doc["fingerprint"]["machine_id"]} == {BOX_ID}
    # the multi-GPU case: alone, after every single-GPU case, with the box's GPUs visible to what it starts
    assert seen["all"]["cuda_visible_devices"] is None and "gpu" not in cases["fake[all]"]
    assert seen["all"]["t"] > max(seen[n]["t"] for n in CASES)


def test_the_merged_run_equals_a_single_process_run(project):
    single = project.run("-p", "no:xdist", "--results-json", "one.json")
    spread = project.run("-n", "2", "--results-json", "two.json")
    assert single.ret == spread.ret == 0
    one, two = project.results(project.path / "one.json"), project.results(project.path / "two.json")
    assert {k: c["verdict"] for k, c in _cases(one).items()} == {k: c["verdict"] for k, c in _cases(two).items()}
    assert len(_cases(two)) == 13
    assert [r["nodeid"] for r in one["not_measured"]] == [r["nodeid"] for r in two["not_measured"]]
    tally = [line for line in spread.outlines if line.startswith("13 NEW, 1 SKIP")]
    assert len(tally) == 1 and "13 NEW, 1 SKIP" in single.outlines


def test_an_update_from_four_workers_writes_every_entry_once(project):
    r = project.run("-n", "4", "--baseline-update", "--results-json", "r.json")
    assert r.ret == 0, r.stdout.str()
    gemm = json.loads((project.baselines / "nvidia-h200-x4" / "gemm.json").read_text())
    assert sorted(gemm["entries"]) == KEYS
    assert list(json.loads((project.baselines / "nvidia-h200-x4" / "allreduce.json").read_text())["entries"]) == ["fake[all]"]
    # written by the controller alone: had a worker written first, these would read "no change"
    added = [line.strip() for line in r.outlines if line.strip().startswith("+ fake[")]
    assert sorted(a.split()[1] for a in added) == sorted(KEYS + ["fake[all]"])
    cases = _cases(project.results(project.path / "r.json"))
    for key, e in gemm["entries"].items():
        assert e["machines"] == [BOX_ID] and e["gpus"] == [{k: cases[key]["gpu"][k] for k in ("index", "uuid")}]
    again = project.run("-n", "4")
    assert again.ret == 0 and "13 PASS, 1 SKIP" in again.outlines
    assert "gated as another machine" not in again.stdout.str()


def test_a_case_moved_to_another_gpu_is_gated_with_the_spread_between_machines(project):
    assert project.run("-n", "2", "--baseline-update").ret == 0
    home = assign(KEYS, 2)["fake[c00]"]
    project.control["values"]["c00"] = 108.0  # +8%: over the 5% tolerance, inside twice the 5% between machines
    moved = project.run("-n", "2", "--gpu-of", f"fake[c00]={1 - home}")
    assert moved.ret == 0, moved.stdout.str()
    table_rows(moved).fnmatch_lines([f"AMBIGUOUS *fake[[]c00[]]*+8.0%*ran on GPU {1 - home}, baseline from GPU {home}: "
                                     "gated as another machine"])
    at_home = project.run("-n", "2")
    assert at_home.ret == 1
    assert next(line for line in at_home.outlines if "fake[c00]" in line).startswith("REGRESSION")


@pytest.mark.parametrize("args, line", [
    (["-n", "2", "--gpu-of", "fake[nope]=0"], "--gpu-of fake[nope]=0: no such case in this selection"),
    (["-n", "2", "--gpu-of", "test_cases.py::test_all_gpus=0"],
     "--gpu-of test_cases.py::test_all_gpus: a multi-GPU case runs on every GPU"),
    (["-n", "2", "--gpu-of", "fake[c00]=2"], "--gpu-of 'fake[c00]=2': GPU index 2 is not below 2"),
    (["-n", "5"], "-n 5: moebench runs one worker per GPU and this box has 4"),
    (["-p", "no:xdist", "--gpu-of", "fake[c00]=1"], "--gpu-of fake[c00]=1: places cases on the GPUs of an -n run"),
])
def test_bad_input_is_one_usage_line_naming_the_option(project, args, line):
    r = project.run(*args)
    assert r.ret == 4, r.stdout.str() + r.stderr.str()
    hits = [x for x in r.outlines + r.errlines if line in x]
    assert hits, r.stdout.str() + r.stderr.str()
    assert "Traceback" not in r.stdout.str() + r.stderr.str()


def test_aa_per_gpu_runs_a_case_on_every_gpu_and_prints_the_spread_between_them(project, monkeypatch, capsys):
    from moebench.core import hardware
    from moebench.cli.main import main
    from xdist_project import CONFTEST

    ns: dict = {}
    exec(CONFTEST.replace("if os.environ.get", "if False and os.environ.get"), ns)
    monkeypatch.setattr(hardware, "_nvml", lambda: ns["FakeNvml"](4))
    monkeypatch.setenv("MOEBENCH_FAKE_GPUS", "4")  # for the runs' own processes (the project's conftest)
    monkeypatch.chdir(project.path)
    hardware.fingerprint.cache_clear()
    project.control["gpu_factor"] = {"3": 1.1}  # GPU 3 is 10% slower
    (project.path / "control.json").write_text(json.dumps(project.control))
    try:
        rc = main(["aa", "--per-gpu", "--out", "aa", "--", "-p", "moebench.plugin", "-p", "no:xdist", "-q",
                   "--baseline-dir", str(project.baselines), "test_cases.py", "-k", "c00"])
    finally:
        hardware.fingerprint.cache_clear()
    out = capsys.readouterr().out
    assert rc == 0, out
    head = next(line for line in out.splitlines() if line.startswith("case"))
    assert head.split()[2:6] == ["GPU", "0", "GPU", "1"] and "GPU 3" in head
    row = next(line for line in out.splitlines() if line.startswith("fake[c00]"))
    assert row.split()[2:10] == ["100", "us", "100", "us", "100", "us", "110", "us"] and "5.0%" in row
    assert "1 cases over 4 GPUs; median spread between GPUs 5.0%" in out
    for i in range(4):
        doc = project.results(project.path / "aa" / f"gpu-{i}.json")
        assert doc["hardware_key"] == "nvidia-h200-x4" and doc["cases"][0]["gpu"]["index"] == i


def test_a_worker_knows_which_items_run_on_its_gpu(project):
    # what --counters plans its ncu chunks from: a worker's own cases, not the session's every item
    r = project.run("-n", "2")
    assert r.ret == 0, r.stdout.str()
    seen = project.seen()
    ran = {}
    for name in CASES:
        ran.setdefault(seen[name]["worker"], set()).add(f"test_case[{name}]")
    for name in CASES:  # test_skipped is placed too (it skips when it runs, and logs nothing)
        assert set(seen[name]["placed_here"]) - {"test_skipped"} == ran[seen[name]["worker"]]
    assert not any("test_all_gpus" in n for s in seen.values() for n in s["placed_here"])
    one = project.run("-p", "no:xdist")  # one process: every item is its own
    assert one.ret == 0 and len(project.seen()["c00"]["placed_here"]) == len(CASES) + 2  # + all, + skipped
