"""`moebench baselines show|diff|promote` on recorded results files, into temporary baseline folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moebench.baselines.store import load_file
from moebench.cli.main import main

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
RUN1 = DATA / "selfcheck-h200-1.json"
RUN2 = DATA / "selfcheck-h200-2.json"
HW = "nvidia-h200-x1"
COPY = "selfcheck[copy-1024MiB-cuda]"
AA = "selfcheck[aa-copy-1024MiB-cuda]"


def stored(root: Path) -> dict:
    return load_file(root / HW / "selfcheck.json", hardware_key=HW, family="selfcheck")


def test_promote_only_the_selected_case(tmp_path, capsys):
    root = tmp_path / "baselines"
    assert main(["baselines", "promote", str(RUN1), "--case", COPY, "--baseline-dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"promoted 1 case (measured in {RUN1}) into {root / HW / 'selfcheck.json'}: 1 change" in out
    doc = stored(root)
    assert list(doc["entries"]) == [COPY]
    entry = doc["entries"][COPY]
    run = json.loads(RUN1.read_text())
    case = next(c for c in run["cases"] if c["key"] == COPY)
    assert entry["metrics"]["copy_GBps"]["value"] == case["metrics"]["copy_GBps"]["value"]
    assert "pct_of_session_ceiling" not in entry["metrics"]  # informational metrics are not baselines
    assert entry["provenance"]["date"] == run["finished"] and entry["definition_hash"] == case["definition_hash"]


def test_promote_keeps_other_entries_bytes_and_reviewed_rel_tol(tmp_path, capsys):
    root = tmp_path / "baselines"
    assert main(["baselines", "promote", str(RUN1), "--all", "--baseline-dir", str(root)]) == 0
    path = root / HW / "selfcheck.json"
    doc = json.loads(path.read_text())
    doc["entries"][COPY]["metrics"]["copy_GBps"]["rel_tol"] = 0.08  # a reviewer widened it
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    aa_before = json.dumps(doc["entries"][AA], sort_keys=True)
    capsys.readouterr()

    assert main(["baselines", "promote", str(RUN2), "--case", "selfcheck[copy-*", "--baseline-dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"~ {COPY} copy_GBps:" in out
    after = stored(root)
    assert json.dumps(after["entries"][AA], sort_keys=True) == aa_before
    assert after["entries"][COPY]["metrics"]["copy_GBps"]["rel_tol"] == 0.08


def test_dry_run_writes_nothing(tmp_path, capsys):
    root = tmp_path / "baselines"
    assert main(["baselines", "promote", str(RUN1), "--all", "--dry-run", "--baseline-dir", str(root)]) == 0
    assert "would promote 2 cases" in capsys.readouterr().out
    assert not root.exists()


def test_promote_from_a_proposed_folder(tmp_path, capsys):
    proposed, root = tmp_path / "proposed", tmp_path / "baselines"
    assert main(["baselines", "promote", str(RUN1), "--all", "--baseline-dir", str(proposed)]) == 0
    assert main(["baselines", "promote", str(proposed), "--case", AA, "--baseline-dir", str(root)]) == 0
    assert "proposed in" in capsys.readouterr().out
    assert list(stored(root)["entries"]) == [AA]


def test_promote_flags_a_regressed_case(tmp_path, capsys):
    doc = json.loads(RUN2.read_text())
    next(c for c in doc["cases"] if c["key"] == COPY)["verdict"] = "REGRESSION"  # as a gated run would say
    src = tmp_path / "reviewed.json"
    src.write_text(json.dumps(doc))
    assert main(["baselines", "promote", str(src), "--case", COPY, "--baseline-dir", str(tmp_path / "b")]) == 0
    assert f"! {COPY} was REGRESSION in that run" in capsys.readouterr().out


@pytest.mark.parametrize("args, expect", [
    (["--case", "selfcheck[nope]"], "--case 'selfcheck[nope]': no such case"),
    ([], "one of the arguments --case --all is required"),
])
def test_promote_bad_selection_is_exit_2(tmp_path, capsys, args, expect):
    with pytest.raises(SystemExit) as e:
        code = main(["baselines", "promote", str(RUN1), "--baseline-dir", str(tmp_path / "b"), *args])
        raise SystemExit(code)
    assert e.value.code == 2
    assert expect in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_promote_refuses_a_malformed_target_before_writing(tmp_path, capsys):
    root = tmp_path / "baselines"
    (root / HW).mkdir(parents=True)
    (root / HW / "selfcheck.json").write_text('{"schema_version": 1}')
    assert main(["baselines", "promote", str(RUN1), "--all", "--baseline-dir", str(root)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("moebench baselines: error: ") and "selfcheck.json: hardware_key: missing" in err
    assert (root / HW / "selfcheck.json").read_text() == '{"schema_version": 1}'


def test_show_lists_entries_with_provenance(tmp_path, capsys):
    root = tmp_path / "baselines"
    main(["baselines", "promote", str(RUN1), "--all", "--baseline-dir", str(root)])
    capsys.readouterr()
    assert main(["baselines", "show", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"{root / HW / 'selfcheck.json'}: {HW} / selfcheck, 2 entries" in out
    assert "recorded on 1 x NVIDIA H200" in out
    assert COPY in out and "GB/s" in out and "measured " in out
    assert main(["baselines", "show", str(root / HW / "selfcheck.json"), "--case", AA]) == 0
    out = capsys.readouterr().out
    assert AA in out and COPY not in out


def test_diff_reports_changes_and_exit_code(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    main(["baselines", "promote", str(RUN1), "--all", "--baseline-dir", str(a)])
    main(["baselines", "promote", str(RUN1), "--case", COPY, "--baseline-dir", str(b)])
    main(["baselines", "promote", str(RUN2), "--case", COPY, "--baseline-dir", str(b)])
    capsys.readouterr()
    assert main(["baselines", "diff", str(a), str(a), "--exit-code"]) == 0
    assert "0 added, 0 removed, 0 changed, 2 unchanged" in capsys.readouterr().out
    assert main(["baselines", "diff", str(a), str(b), "--exit-code"]) == 1
    out = capsys.readouterr().out
    assert f"- {HW}/selfcheck {AA}" in out
    assert f"~ {HW}/selfcheck {COPY}: copy_GBps " in out and "0 added, 1 removed, 1 changed" in out


def test_show_a_missing_path_is_exit_2(tmp_path, capsys):
    assert main(["baselines", "show", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err.strip() == f"moebench baselines: error: {tmp_path / 'none'}: no such file or folder"


def test_promote_takes_the_same_lock_as_an_update(tmp_path, capsys, monkeypatch):
    # one write path: promote merges under store.locked like --baseline-update, so a concurrent update's
    # entries survive (the lock's own behaviour is tested in test_store.py)
    import moebench.baselines.update as update

    seen = []
    real = update.locked

    def spy(path):
        seen.append(path)
        return real(path)

    monkeypatch.setattr(update, "locked", spy)
    root = tmp_path / "baselines"
    assert main(["baselines", "promote", str(RUN1), "--all", "--baseline-dir", str(root)]) == 0
    assert [p.name for p in seen] == ["selfcheck.json"] and seen[0].parent.parent == root


def test_promote_that_cannot_write_exits_non_zero_and_leaves_nothing(tmp_path, capsys, monkeypatch):
    # A disk-full os.replace: the promotion the user asked for did not happen, so the command must not exit 0.
    import errno
    import os

    root = tmp_path / "baselines"

    def replace(src, dst, **kw):
        raise OSError(errno.ENOSPC, "No space left on device", str(dst))

    monkeypatch.setattr(os, "replace", replace)
    assert main(["baselines", "promote", str(RUN1), "--all", "--baseline-dir", str(root)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "No space left on device" in err, err
    assert not (root / HW / "selfcheck.json").exists()
    assert not (root / HW).exists(), "a temporary file, or the folder made for the file, was left behind"


def _with_counter(root: Path, own: list[str], machines: list[str], noise_machines=None) -> Path:
    """The copy entry of `root` recorded on `machines`, with a DRAM bytes counter recorded on `own` of them."""
    path = root / HW / "selfcheck.json"
    doc = json.loads(path.read_text())
    e = doc["entries"][COPY]
    e.update(machines=machines, independent_runs=8)
    e["metrics"]["ncu_dram_read_bytes"] = {
        "value": 2.147e9, "unit": "B", "direction": "lower", "rel_tol": 0.01, "noise": 0.0, "n": 3,
        "kind": "device_counter", "machines": own, "independent_runs": 3,
        **({"noise_machines": noise_machines} if noise_machines is not None else {})}
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return path


FIVE = [f"gpu-{c * 12}" for c in "abcde"]


def test_show_gives_a_metric_its_own_runs_machines_and_rule(tmp_path, capsys):
    root = tmp_path / "baselines"
    main(["baselines", "promote", str(RUN1), "--case", COPY, "--baseline-dir", str(root)])
    _with_counter(root, FIVE[3:], FIVE, noise_machines=0.005)
    capsys.readouterr()
    assert main(["baselines", "show", str(root)]) == 0
    rows = {line.split()[1]: line for line in capsys.readouterr().out.splitlines() if line.startswith(COPY)}
    assert " 8x5 " in rows["copy_GBps"]
    # the counter's 3 runs on its 2 machines, its half range widened for a third by its own count
    assert " 3x2 " in rows["ncu_dram_read_bytes"] and "(0.5% over 2)" in rows["ncu_dram_read_bytes"]


def test_diff_marks_a_narrowing_of_a_metric_s_machines_looser(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    for root in (a, b):
        main(["baselines", "promote", str(RUN1), "--case", COPY, "--baseline-dir", str(root)])
    _with_counter(a, FIVE[3:], FIVE)
    _with_counter(b, FIVE[4:], FIVE)
    capsys.readouterr()
    assert main(["baselines", "diff", str(a), str(b), "--exit-code"]) == 1
    out = capsys.readouterr().out
    assert (f"ncu_dram_read_bytes machines {FIVE[3]}, {FIVE[4]} -> {FIVE[4]} [LOOSER: {FIVE[3]} no longer named "
            "as recording") in out
    assert main(["baselines", "diff", str(b), str(a), "--exit-code"]) == 0, "a machine added to a metric is not looser"


def test_diff_shows_the_machine_medians_that_came_and_moved_not_the_two_whole_maps(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    main(["baselines", "promote", str(RUN1), "--case", COPY, "--baseline-dir", str(a)])
    main(["baselines", "promote", str(RUN1), "--case", COPY, "--baseline-dir", str(b)])
    for root, medians in ((a, {"gpu-a": (100.0, 3), "gpu-b": (104.0, 1)}),
                          (b, {"gpu-a": (101.0, 4), "gpu-b": (104.0, 1), "gpu-c": (99.0, 2)})):
        path = root / "nvidia-h200-x1" / "selfcheck.json"
        doc = json.loads(path.read_text())
        doc["entries"][COPY]["metrics"]["copy_GBps"]["by_machine"] = {g: {"value": v, "runs": r}
                                                                      for g, (v, r) in medians.items()}
        path.write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["baselines", "diff", str(a), str(b)]) == 0
    assert "copy_GBps machine medians +gpu-c 99, gpu-a 100 -> 101 (3 -> 4 runs)" in capsys.readouterr().out
