"""`moebench changes DIR...` on real results files: one line per change point beginning with the case id,
exit 1 on a recent worse one, unreadable files named and skipped, acknowledgement by a note or a newer
baseline, and bad input in one line (exit 2)."""

from __future__ import annotations

import json

import pytest

from history_fixtures import HW, STEP_CASE, step, write_history
from moebench.cli.changes import read_changes
from moebench.cli.main import main

pytest.importorskip("ruptures", reason="ruptures (the history extra) is not installed")


def _changes(capsys, *args):
    code = main(["changes", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


def test_a_recent_step_is_one_line_beginning_with_the_case_id_and_exit_1(tmp_path, capsys):
    write_history(tmp_path / "h", 12, moves=step(STEP_CASE, 9, 0.10))
    code, out, err = _changes(capsys, tmp_path / "h")
    assert code == 1 and err == []
    (line,) = [x for x in out if not x.startswith("1 change point")]
    assert line.startswith(f"{STEP_CASE} wall_us: 2026-11-09 02:17 abc0008 -> 2026-11-10 02:17 abc0009: +10.")
    assert "worse, recent" in line and "noise 0." in line and "reported above 7.5%" in line and HW in line
    assert out[-1] == "1 change point (1 towards worse in the last 3 runs) in 50 series over 12 runs -> exit 1"


def test_an_older_step_is_printed_but_does_not_fail_and_a_quiet_history_says_so(tmp_path, capsys):
    write_history(tmp_path / "old", 12, moves=step(STEP_CASE, 8, 0.10))
    code, out, _ = _changes(capsys, tmp_path / "old")
    assert code == 0 and out[0].startswith(STEP_CASE) and "worse (" in out[0]
    write_history(tmp_path / "quiet", 12)
    assert _changes(capsys, tmp_path / "quiet")[:2] == (0, ["no change point in 50 series over 12 runs"])


def test_corrupt_and_foreign_files_are_named_in_one_line_each_and_skipped(tmp_path, capsys):
    write_history(tmp_path / "h", 12, moves=step(STEP_CASE, 9, 0.10))
    (tmp_path / "h" / "20261113T021700Z-cut.json").write_text('{"hardware_key": "cpu", "started": "2026-')
    (tmp_path / "h" / "pytest-benchmark.json").write_text(json.dumps({"machine_info": {}, "benchmarks": []}))
    (tmp_path / "h" / ".20261114T021700Z.json.tmp.json").write_text("half a file")  # a write in progress: hidden
    code, out, err = _changes(capsys, tmp_path / "h")
    assert code == 1 and len(err) == 2, err
    assert err[0].startswith("moebench changes: skipped ") and "20261113T021700Z-cut.json: line 1" in err[0]
    assert "pytest-benchmark.json: hardware_key: missing" in err[1]
    assert out[-1].endswith("over 12 runs; 2 files skipped -> exit 1")


@pytest.mark.parametrize("make, expect", [
    (lambda p: None, "no such file or folder"),
    (lambda p: p.mkdir(), "no moebench results file in"),
    (lambda p: (p.mkdir(), (p / "x.json").write_text("[]")), "(1 skipped; the first: "),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, make, expect):
    make(tmp_path / "h")
    code, out, err = _changes(capsys, tmp_path / "h")
    assert code == 2 and len(err) == 1, err
    assert err[-1].startswith("moebench changes: error: ") and expect in err[-1]


def _note(tmp_path, **fields):
    body = "".join(f'{k} = "{v}"\n' for k, v in fields.items())
    (tmp_path / "ack.toml").write_text(f"[[acknowledged]]\n{body}")
    return tmp_path / "ack.toml"


def test_a_note_acknowledges_the_change_by_its_date_or_commit(tmp_path, capsys):
    write_history(tmp_path / "h", 12, moves=step(STEP_CASE, 9, 0.10))
    for after in ("2026-11-10 02:17", "abc0009"):
        ack = _note(tmp_path, case=STEP_CASE, metric="wall_us", after=after, reason="accepted in #41")
        code, out, _ = _changes(capsys, tmp_path / "h", "--acknowledged", ack)
        assert code == 0 and out == ["no change point in 50 series over 12 runs; 1 acknowledged"]
    other = _note(tmp_path, case=STEP_CASE, after="2026-11-09", reason="the night before: not this change")
    assert _changes(capsys, tmp_path / "h", "--acknowledged", other)[0] == 1


@pytest.mark.parametrize("text, expect", [
    ('[[acknowledged]]\ncase = "gemm[x]"\nafter = "2026-11-10"\n', "acknowledged[0].reason: missing"),
    ('[[acknowledged]]\ncase = "gemm[x]"\nafter = "2026-11-10"\nreason = "ok"\nwhen = "now"\n',
     "acknowledged[0].when: unknown field"),
    ('[[acknowledge]]\ncase = "gemm[x]"\n', "acknowledge: unknown table"),
    ('[[acknowledged]\n', "cannot read"),
])
def test_a_bad_notes_file_is_one_line_naming_the_field(tmp_path, capsys, text, expect):
    write_history(tmp_path / "h", 5)
    (tmp_path / "ack.toml").write_text(text)
    code, _, err = _changes(capsys, tmp_path / "h", "--acknowledged", tmp_path / "ack.toml")
    assert code == 2 and len(err) == 1 and f"ack.toml: {expect}" in err[0], err


def test_a_baseline_recorded_after_the_change_acknowledges_it(tmp_path, capsys):
    runs = write_history(tmp_path / "h", 12, moves=step(STEP_CASE, 9, 0.10))
    root = tmp_path / "baselines"
    assert main(["baselines", "promote", str(runs[8]), "--case", STEP_CASE, "--baseline-dir", str(root)]) == 0
    capsys.readouterr()
    assert _changes(capsys, tmp_path / "h", "--baseline-dir", root)[0] == 1  # recorded before the change
    assert main(["baselines", "promote", str(runs[10]), "--case", STEP_CASE, "--baseline-dir", str(root)]) == 0
    capsys.readouterr()
    code, out, _ = _changes(capsys, tmp_path / "h", "--baseline-dir", root)
    assert code == 0 and out[-1].endswith("; 1 acknowledged")


def test_json_and_markdown_carry_the_same_change_points(tmp_path, capsys):
    write_history(tmp_path / "h", 12, moves=step(STEP_CASE, 9, 0.10))
    _changes(capsys, tmp_path / "h", "--json", tmp_path / "c.json", "--markdown", tmp_path / "c.md")
    (cp,) = read_changes(tmp_path / "c.json")
    assert (cp.key, cp.after.commit, cp.failing) == (STEP_CASE, "abc0009", True)
    md = (tmp_path / "c.md").read_text()
    assert "1 change point (1 towards worse in the last 3 runs)" in md and f"| {STEP_CASE} | wall_us |" in md


def test_a_changed_case_definition_starts_a_new_series(tmp_path, capsys):
    """A new way of measuring is not a change point: only the runs since the definition changed count."""
    runs = write_history(tmp_path / "h", 12, moves=step(STEP_CASE, 9, 0.10))
    for p in runs[9:]:
        doc = json.loads(p.read_text())
        next(c for c in doc["cases"] if c["key"] == STEP_CASE)["definition_hash"] = "new-method"
        p.write_text(json.dumps(doc))
    assert _changes(capsys, tmp_path / "h")[0] == 0
