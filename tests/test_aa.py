"""`moebench aa`: a selection repeated in separate processes (real pytest subprocesses over the fake cases
of tests/conftest.py), the spread between the runs, false alarms, and promotion of the runs."""

from __future__ import annotations

import json

import pytest

from moebench.history import aa
from moebench.baselines.store import load_file
from moebench.cli.main import main
from conftest import HW, UNRELATED_PLUGINS


def _args(fakebench) -> list[str]:
    return [*UNRELATED_PLUGINS, "-p", "moebench.plugin", "--hardware-key", HW, "--baseline-dir", str(fakebench.baselines),
            "-q", "test_fake.py"]


def _prepare(fakebench, monkeypatch):
    (fakebench.path / "control.json").write_text(json.dumps(fakebench.control))
    monkeypatch.chdir(fakebench.path)


def test_unchanged_code_against_its_own_baseline_reads_no_false_alarm(fakebench, monkeypatch, capsys, tmp_path):
    fakebench.write_baseline({"a": 100.0, "b": 200.0})
    _prepare(fakebench, monkeypatch)
    assert main(["aa", "--runs", "2", "--out", str(tmp_path / "aa"), "--", *_args(fakebench)]) == 0
    out = capsys.readouterr().out
    assert "moebench aa: 2 cases over 2 runs; median spread between runs 0.0%; 0 cases read REGRESSION or IMPROVEMENT" in out
    assert sorted(p.name for p in (tmp_path / "aa").iterdir()) == ["run-1.json", "run-2.json"]


def test_a_run_flagged_against_the_baseline_is_named_and_exits_1(fakebench, monkeypatch, capsys, tmp_path):
    fakebench.write_baseline({"a": 80.0, "b": 200.0})  # 'a' measures 100: +25% in every run
    _prepare(fakebench, monkeypatch)
    assert main(["aa", "--runs", "2", "--out", str(tmp_path / "aa"), "--", *_args(fakebench)]) == 1
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("fake[a]"))
    assert "REGRESSION REGRESSION" in line and line.rstrip().endswith("FLAGGED")


def test_promote_stores_the_runs_median_with_its_runs_and_machine(fakebench, monkeypatch, tmp_path):
    _prepare(fakebench, monkeypatch)
    root = tmp_path / "recorded"
    main(["aa", "--runs", "2", "--out", str(tmp_path / "aa"), "--promote", str(root), "--", *_args(fakebench)])
    e = load_file(root / HW / "gemm.json")["entries"]["fake[a]"]
    assert e["metrics"]["latency_us"]["value"] == 100.0 and e["independent_runs"] == 2 and len(e["machines"]) == 1


def test_the_budget_starts_no_run_that_would_not_fit(tmp_path, monkeypatch):
    clock = [0.0]
    said = []

    def runner(cmd):  # a run of 100 s that writes its results file
        clock[0] += 100.0
        open(cmd[cmd.index("--results-json") + 1], "w").close()
        return type("Done", (), {"returncode": 0})()

    monkeypatch.setattr(aa.time, "monotonic", lambda: clock[0])
    files = aa.repeat(["x"], tmp_path / "o", 5, budget_s=250, say=said.append, runner=runner)
    assert len(files) == 2  # a third run (100 s more) would end at 300 s
    assert said[-1] == "moebench aa: 2 of 5 runs in 200 s; another would pass the 250 s budget"


@pytest.mark.parametrize("argv, msg", [(["--runs", "0"], "--runs 0: must be at least 1"),
                                        (["--budget-s", "-1"], "--budget-s -1.0: must be")])
def test_bad_options_are_one_line_and_exit_2(tmp_path, capsys, argv, msg):
    assert main(["aa", *argv, "--out", str(tmp_path)]) == 2
    assert msg in capsys.readouterr().err


def test_each_run_keeps_its_ncu_tables_in_its_own_folder(tmp_path, monkeypatch):
    # MOEBENCH_NCU_KEEP names one folder; three runs' chunk files of the same names would overwrite each other
    seen = []

    def runner(cmd, env=None):
        seen.append((env or {}).get("MOEBENCH_NCU_KEEP"))
        open(cmd[cmd.index("--results-json") + 1], "w").close()
        return type("Done", (), {"returncode": 0})()

    monkeypatch.setenv("MOEBENCH_NCU_KEEP", str(tmp_path / "ncu"))
    aa.repeat(["x"], tmp_path / "o", 3, say=lambda s: None, runner=runner)
    assert seen == [str(tmp_path / "ncu" / f"run-{i}") for i in (1, 2, 3)]
    monkeypatch.delenv("MOEBENCH_NCU_KEEP")
    seen.clear()
    aa.repeat(["x"], tmp_path / "o", 1, say=lambda s: None, runner=runner)
    assert seen == [None]  # not asked for: the environment is inherited as it was
