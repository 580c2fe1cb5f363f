"""Baseline data that would switch the gate off, tried for real: through a pytest run of the fake project
(tests/conftest.py) and through `moebench baselines diff` on copies of the committed baseline files. Each
change is either refused by the schema, with one line naming the file and field, or shown to the
reviewer as loosening the gate.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from moebench.baselines.schema import BaselineError
from moebench.baselines.store import dumps, load_file
from moebench.cli.main import main

HW = "test-hw-x1"  # the --hardware-key FakeBench forces (tests/conftest.py)
REPO = Path(__file__).resolve().parents[1]
SELFCHECK = Path("baselines") / "nvidia-h200-x1" / "selfcheck.json"  # committed, small
AA = "selfcheck[aa-copy-1024MiB-cuda]"


def _edit(path: Path, mutate) -> None:
    doc = json.loads(path.read_text())
    mutate(doc)
    path.write_text(dumps(doc))


def _lat(doc: dict, key: str = "fake[a]") -> dict:
    return doc["entries"][key]["metrics"]["latency_us"]


def _one_line(result, ret: int, needle: str) -> None:
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == ret, text
    assert "Traceback" not in text and "INTERNALERROR" not in text, text
    assert len([line for line in result.outlines + result.errlines if needle in line]) == 1, text


def test_a_stored_noise_that_hides_a_doubling_is_refused_naming_file_and_field(fakebench):
    # fake[a] measures 100 us against a stored 50: twice as slow. A stored noise of 50 made that
    # AMBIGUOUS, exit 0.
    path = fakebench.write_baseline({"a": 50.0, "b": 200.0})
    _edit(path, lambda d: _lat(d).update(noise=50.0))
    r = fakebench.run()
    _one_line(r, pytest.ExitCode.USAGE_ERROR,
              f"{path}: entries['fake[a]'].metrics.latency_us.noise: must be a relative spread in [0, 0.5]")
    assert fakebench.calls() == {}, "refused before anything was measured"


def test_a_key_named_twice_is_refused_naming_file_and_key(fakebench):
    # `"noise": 0.4` after the measured one: JSON keeps the last silently, and review sees one more line.
    path = fakebench.write_baseline({"a": 50.0})
    text = path.read_text()
    first = text.index('"noise": 0.0,')
    path.write_text(text[:first] + '"noise": 0.0,\n          "noise": 0.4,' + text[first + len('"noise": 0.0,'):])
    r = fakebench.run()
    _one_line(r, pytest.ExitCode.USAGE_ERROR, f"{path}: duplicate key 'noise' in one object")
    with pytest.raises(BaselineError, match=f"^{path}: duplicate key 'noise'"):
        load_file(path)


def test_an_update_over_a_loosened_tolerance_says_it_keeps_it(fakebench):
    # A stored rel_tol of 1.0 (the case's own is 5%) used to survive every --baseline-update unseen.
    path = fakebench.write_baseline({"a": 100.0, "b": 200.0})
    _edit(path, lambda d: _lat(d).update(rel_tol=1.0))
    r = fakebench.run("--baseline-update")
    assert r.ret == pytest.ExitCode.OK, r.stdout.str()
    assert "  ! fake[a] latency_us: keeps the stored rel_tol 100.0%, looser than the case's own 5.0%" in r.outlines
    assert not any("! fake[b]" in line for line in r.outlines)
    assert _lat(load_file(path))["rel_tol"] == 1.0, "the reviewed tolerance is kept, and said"


@pytest.fixture
def committed(tmp_path) -> tuple[Path, Path]:
    """(the committed selfcheck file, a copy of it under tmp_path/b/<key>/ to tamper with)."""
    copy = tmp_path / "b" / SELFCHECK.relative_to("baselines")
    copy.parent.mkdir(parents=True)
    shutil.copy(REPO / SELFCHECK, copy)
    return REPO / SELFCHECK, copy


@pytest.mark.parametrize("field, value, looser", [
    ("noise", 0.45, "wider noise band"),
    ("rel_tol", 1.0, "wider tolerance"),
    ("direction", "higher", "direction flipped: worse reads better"),
])
def test_diff_marks_a_loosened_field_and_exit_code_fails_on_it(committed, capsys, field, value, looser):
    # A stored noise raised read "0 changed", exit 0: the diff never compared noise.
    old, new = committed
    _edit(new, lambda d: d["entries"][AA]["metrics"]["copy_us"].update({field: value}))
    assert main(["baselines", "diff", str(old), str(new), "--exit-code"]) == 1
    out = capsys.readouterr().out
    assert f"~ nvidia-h200-x1/selfcheck {AA}: copy_us {field} " in out and f"[LOOSER: {looser}]" in out
    assert "0 added, 0 removed, 1 changed, 2 unchanged; 1 change loosens the gate" in out


def test_diff_marks_removed_metrics_and_entries_and_passes_tightening(committed, capsys):
    old, new = committed
    _edit(new, lambda d: d["entries"].pop(AA))
    assert main(["baselines", "diff", str(old), str(new), "--exit-code"]) == 1
    assert f"- nvidia-h200-x1/selfcheck {AA} [LOOSER: entry removed" in capsys.readouterr().out
    shutil.copy(old, new)
    stored = json.loads(old.read_text())["entries"][AA]["metrics"]["copy_us"]
    # tighter in every field, whatever the committed entry holds: half its noise, twice its samples
    _edit(new, lambda d: d["entries"][AA]["metrics"]["copy_us"].update(rel_tol=0.03, noise=stored["noise"] / 2,
                                                                      n=2 * stored["n"]))
    assert main(["baselines", "diff", str(old), str(new), "--exit-code"]) == 0, "tightening needs no reason"
    out = capsys.readouterr().out
    assert f"copy_us n {stored['n']} -> {2 * stored['n']}" in out and "copy_us rel_tol 5.0% -> 3.0%" in out
    assert "LOOSER" not in out


def test_diff_reads_a_git_revision(committed, capsys, monkeypatch):
    # What a reviewer runs on a pull request: the base branch's baselines against the tree's.
    old, new = committed
    monkeypatch.chdir(REPO)  # REV:PATH is read from the repository of the working directory
    if subprocess.run(["git", "cat-file", "-e", f"HEAD:{SELFCHECK}"], cwd=REPO, capture_output=True).returncode:
        pytest.skip("not a git checkout with the committed baselines")
    _edit(new, lambda d: d["entries"][AA]["metrics"]["copy_us"].update(noise=0.45))
    assert main(["baselines", "diff", f"HEAD:{SELFCHECK.parent}", str(new.parent), "--exit-code"]) == 1
    assert "[LOOSER: wider noise band]" in capsys.readouterr().out
    assert main(["baselines", "diff", "no-such-rev:baselines", str(new.parent)]) == 2
    assert capsys.readouterr().err.startswith("moebench baselines: error: no-such-rev:baselines: git ls-tree: ")


H200 = {"cpu": {"model": "Intel(R) Xeon(R) Processor"}, "driver": "580.159.04",
        "gpus": [{"name": "NVIDIA H200"}], "versions": {"torch": "2.11.0"}}


def _as_committed(path: Path) -> None:
    """Make a file as the committed ones are: entries naming no machine, the header naming the H200 they
    were recorded on, and a graph_us beside each latency (what a GPU measures and a CPU does not)."""
    def mutate(doc: dict) -> None:
        doc.pop("fingerprints", None)
        doc["fingerprint"] = H200
        for entry in doc["entries"].values():
            entry.pop("fingerprint", None)
            entry["metrics"]["graph_us"] = dict(entry["metrics"]["latency_us"])
    _edit(path, mutate)


def test_other_hardware_update_touches_only_the_selected_entry_and_no_header(fakebench, capsys):
    # `--hardware-key <h200> --baseline-update --baseline-other-hardware` on a CPU rewrote the file's
    # fingerprint header: `baselines show` then said every H200 entry was recorded on a CPU.
    path = fakebench.write_baseline({"a": 100.0, "b": 200.0, "z": 7.0})
    _as_committed(path)
    before = json.loads(path.read_text())
    r = fakebench.run("--baseline-update", "test_fake.py::test_fake[a]")
    assert r.ret == pytest.ExitCode.OK, r.stdout.str()
    assert "  - fake[a] graph_us: not measured by this run, dropped from the entry" in r.outlines
    assert any(line.startswith("  ~ fake[a]: recorded on CPU ") and line.endswith("now (was 1 x NVIDIA H200)")
               for line in r.outlines), r.stdout.str()
    after = load_file(path)
    assert after["fingerprint"] == H200, "the header still describes the entries that name no machine"
    assert {k: after["entries"][k] for k in ("fake[b]", "fake[z]")} == \
        {k: before["entries"][k] for k in ("fake[b]", "fake[z]")}, "entries not selected are not touched"
    [(fid, fp)] = after["fingerprints"].items()
    assert after["entries"]["fake[a]"]["fingerprint"] == fid and fp["gpus"] == []

    assert main(["baselines", "show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "  recorded on 1 x NVIDIA H200, driver 580.159.04; torch 2.11.0 (2 entries)" in out
    assert f"  recorded on CPU {fp['cpu']['model']}" in out and "(1 entry)" in out


def test_the_review_workflow_runs_readmes_check_with_the_standard_library_alone(tmp_path):
    # The reviewer's check: what README tells a reviewer to run is what CI runs on a pull request, and it
    # runs on a bare Python (-S: no site-packages), as the GitHub-hosted runner has no install.
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "baselines-review.yml").read_text())
    [step] = [s for s in workflow["jobs"]["diff"]["steps"] if "run" in s]
    command = "moebench baselines diff origin/main:baselines baselines --exit-code"
    assert command in (REPO / "README.md").read_text()
    assert step["run"] == ('PYTHONPATH=src python3 -m moebench baselines diff "origin/$BASE:baselines" '
                           "baselines --exit-code")
    if subprocess.run(["git", "cat-file", "-e", f"HEAD:{SELFCHECK}"], cwd=REPO, capture_output=True).returncode:
        pytest.skip("not a git checkout with the committed baselines")
    r = subprocess.run([sys.executable, "-S", "-m", "moebench.cli.main", "baselines", "diff", "HEAD:baselines",
                        "HEAD:baselines", "--exit-code"], cwd=REPO, env={**os.environ, "PYTHONPATH": "src"},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "0 changes loosen the gate" in r.stdout, r.stdout + r.stderr
