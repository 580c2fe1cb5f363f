"""Baseline storage: atomic writes (an interrupt leaves the old bytes and no temporary file), file modes,
stable formatting (an update rewrites only the updated entry's bytes), merging rules, the update
writer's "no change" path, hardware keys as folder names, and the lock that makes concurrent updates of
one file merge.
"""

from __future__ import annotations

import concurrent.futures
import copy
import fcntl
import io
import json
import os
import re
import socket
import tempfile
import threading
from pathlib import Path

import pytest

from moebench.baselines.schema import BaselineError, fingerprint_id
from moebench.baselines.store import (BaselineSet, check_writable, dumps, family_path, key_folder, load_file, locked,
                                      merge_entries, new_document, other_hardware_entries, other_hardware_problems)
from moebench.outputs.baseline_lines import change_line, write_updates
from moebench.core.files import atomic_write_text
from moebench.core.metrics import Metric
from moebench.suite.session import RunState

HW = "test-hw-x1"  # the hardware key of conftest.valid_document()
NOW = "2026-02-02T00:00:00Z"
OLD = '{"old": true}\n'


# --- stable formatting ------------------------------------------------------------------------------

def test_dumps_is_sorted_indented_and_ends_with_a_newline(valid_doc):
    text = dumps(valid_doc)
    assert text.endswith("}\n") and not text.endswith("\n\n")
    assert json.loads(text) == valid_doc
    top_keys = [line.split('"')[1] for line in text.splitlines() if line.startswith('  "')]
    assert top_keys == sorted(valid_doc)
    assert text == dumps(json.loads(text)), "a dump read back and dumped again must not change"
    assert '\n  "entries": {\n    "fake[a]": {\n      "definition_hash"' in text


def entry_blocks(text: str) -> dict[str, str]:
    """The exact text of each entry in a dumped baseline file, keyed by case key (entries sit at an
    indent of four spaces inside "entries")."""
    blocks: dict[str, str] = {}
    lines = text.splitlines(keepends=True)
    start = lines.index('  "entries": {\n')
    key, buf = None, []
    for line in lines[start + 1:]:
        if line.startswith("  }"):
            break
        if line.startswith('    "') and key is None:
            key, buf = json.loads(line.strip().rstrip("{").rstrip().rstrip(":")), []
        buf.append(line)
        if line.rstrip(",\n") == "    }":
            blocks[key] = "".join(buf)
            key = None
    return blocks


def _update(value: float, rel_tol: float = 0.2, definition_hash: str = "0123456789abcdef") -> dict:
    metric = Metric(value, "us", "lower", noise=0.02, n=30, rel_tol=rel_tol).to_json()
    return {"definition_hash": definition_hash, "metrics": {"latency_us": metric},
            "provenance": {"kind": "measured", "commit": "def456", "date": NOW, "versions": {}}}


def test_merge_updates_one_entry_and_keeps_every_other_entrys_bytes(valid_doc):
    before = dumps(valid_doc)
    original = copy.deepcopy(valid_doc)
    merged, changes = merge_entries(valid_doc, HW, "gemm", {"cpu": {"model": "new"}}, NOW,
                                    {"fake[a]": _update(110.0)})
    after = dumps(merged)
    assert valid_doc == original, "merge_entries must not modify the document it was given"
    old_blocks, new_blocks = entry_blocks(before), entry_blocks(after)
    assert set(new_blocks) == {"fake[a]", "fake[b]"}
    assert new_blocks["fake[b]"] == old_blocks["fake[b]"]
    assert new_blocks["fake[a]"] != old_blocks["fake[a]"]
    m = merged["entries"]["fake[a]"]["metrics"]["latency_us"]
    assert m["value"] == 110.0 and m["n"] == 30 and m["noise"] == 0.02
    # The reviewer's tolerance survives the update (the measurement asked for 0.2).
    assert m["rel_tol"] == 0.05
    assert merged["created"] == valid_doc["created"] and merged["updated"] == NOW
    # The entry names the machine it was measured on; the header's fingerprint, which describes the
    # entries naming none (fake[b]), is left as it was.
    new_fp, bs = {"cpu": {"model": "new"}}, BaselineSet(Path("."), HW, {"gemm": merged})
    assert merged["fingerprint"] == valid_doc["fingerprint"] == bs.fingerprint("gemm", "fake[b]")
    assert merged["fingerprints"] == {merged["entries"]["fake[a]"]["fingerprint"]: new_fp}
    assert bs.fingerprint("gemm", "fake[a]") == new_fp and fingerprint_id(new_fp) in merged["fingerprints"]
    assert [change_line(c) for c in changes] == ["  ~ fake[a] latency_us: 100 -> 110 us (+10.0%)",
                       "  ~ fake[a]: recorded on CPU new now (was CPU fake)"]
    # Outside the updated entry only the header's "updated" line and the new "fingerprints" table moved.
    outside = [l for l in after.splitlines(keepends=True) if l not in new_blocks["fake[a]"]]
    outside_before = [l for l in before.splitlines(keepends=True) if l not in old_blocks["fake[a]"]]
    differ = [l for l in outside if l not in outside_before]
    table = dumps({"fingerprints": merged["fingerprints"]}).splitlines(keepends=True)[1:-1]
    assert all(l.startswith('  "updated"') or l.rstrip(",\n") in {t.rstrip(",\n") for t in table}
               for l in differ), differ


def test_merge_adds_new_entries_and_reports_definition_changes(valid_doc):
    merged, changes = merge_entries(valid_doc, HW, "gemm", {}, NOW,
                                    {"fake[c]": _update(5.0), "fake[a]": _update(100.0, definition_hash="new")})
    assert merged["entries"]["fake[c]"]["metrics"]["latency_us"]["rel_tol"] == 0.2  # new: the measured one
    assert [change_line(c) for c in changes] == ["  ~ fake[a]: case definition changed (was STALE)", "  + fake[c] (latency_us 5 us)"]
    # fake[b] sits between the two in sorted order; adding fake[c] after it costs it at most its comma.
    blocks = entry_blocks(dumps(merged))
    assert blocks["fake[b]"].rstrip(",\n") == entry_blocks(dumps(valid_doc))["fake[b]"].rstrip(",\n")


def test_merge_into_nothing_makes_a_valid_new_document():
    doc, changes = merge_entries(None, HW, "decode", {"gpus": []}, NOW, {"d[x]": _update(97.0)})
    fid = fingerprint_id({"gpus": []})
    # The header claims no machine: every entry of a new file names its own.
    assert doc == {**new_document(HW, "decode", {}, NOW), "fingerprints": {fid: {"gpus": []}},
                   "entries": {"d[x]": {**_update(97.0), "fingerprint": fid}}}
    assert [change_line(c) for c in changes] == ["  + d[x] (latency_us 97 us)"]


# --- atomic writes ----------------------------------------------------------------------------------

@pytest.fixture
def target(tmp_path) -> Path:
    p = tmp_path / "hw" / "gemm.json"
    p.parent.mkdir()
    p.write_text(OLD)
    return p


def _assert_untouched(target: Path) -> None:
    assert target.read_bytes() == OLD.encode(), "the old file changed"
    assert sorted(os.listdir(target.parent)) == ["gemm.json"], "a temporary file was left behind"


def test_atomic_write_replaces_the_file(target):
    atomic_write_text(target, '{"new": 1}\n')
    assert target.read_text() == '{"new": 1}\n'
    assert sorted(os.listdir(target.parent)) == ["gemm.json"]


def test_the_temporary_file_is_made_in_the_targets_own_folder(target, tmp_path, monkeypatch):
    # os.replace is atomic only within one filesystem: a temporary file under $TMPDIR (another mount,
    # often tmpfs) would make the final rename a copy, or fail with EXDEV.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # elsewhere than the target's folder
    replaced, real_replace = [], os.replace

    def replace(src, dst):
        replaced.append((Path(src), Path(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    atomic_write_text(target, '{"new": 1}\n')
    [(src, dst)] = replaced
    assert dst == target and src.parent == target.parent and src.name.startswith(".gemm.json.")


def test_interrupt_in_fsync_leaves_old_file_and_no_temporary(target, monkeypatch):
    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_text(target, '{"new": 1}\n' * 1000)
    _assert_untouched(target)


class _HalfWriter(io.TextIOWrapper):
    """A file whose write() puts half the text on disk, then is interrupted."""

    def write(self, s: str) -> int:
        super().write(s[: len(s) // 2])
        self.flush()
        raise KeyboardInterrupt


def test_interrupt_in_the_middle_of_write_leaves_old_file(target, monkeypatch):
    real_fdopen = os.fdopen

    def fdopen(fd, mode="r", encoding=None):
        return _HalfWriter(real_fdopen(fd, mode.replace("w", "wb")), encoding=encoding)

    monkeypatch.setattr(os, "fdopen", fdopen)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_text(target, '{"new": 1}\n' * 1000)
    _assert_untouched(target)


def test_interrupt_in_replace_leaves_old_file(target, monkeypatch):
    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_text(target, '{"new": 1}\n')
    _assert_untouched(target)


def test_interrupted_first_write_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        atomic_write_text(tmp_path / "new" / "gemm.json", "{}\n")
    assert os.listdir(tmp_path / "new") == []


def test_new_file_mode_follows_umask_and_existing_mode_is_kept(tmp_path):
    # mkstemp makes 0600 files; the written file must not inherit that.
    old_umask = os.umask(0o022)
    try:
        fresh = tmp_path / "fresh.json"
        atomic_write_text(fresh, "{}\n")
        assert fresh.stat().st_mode & 0o777 == 0o644
        kept = tmp_path / "kept.json"
        kept.write_text("{}\n")
        kept.chmod(0o640)
        atomic_write_text(kept, '{"x": 1}\n')
        assert kept.stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(old_umask)


# --- reading ----------------------------------------------------------------------------------------

def test_non_utf8_file_is_a_one_line_baseline_error(tmp_path):
    p = tmp_path / "gemm.json"
    head = b'{"schema_version": 1, "x": "'
    p.write_bytes(head + b'\xff"}')
    with pytest.raises(BaselineError) as e:
        load_file(p)
    assert str(e.value) == f"{p}: byte {len(head)}: not UTF-8 text"  # 0-based offset of the bad byte


def test_unreadable_path_is_a_baseline_error(tmp_path):
    with pytest.raises(BaselineError) as e:
        load_file(tmp_path)  # a folder
    assert str(e.value).startswith(f"{tmp_path}: cannot read: ")


def test_other_hardware_entries_skip_this_key_and_broken_files(tmp_path, valid_doc):
    for key in (HW, "nvidia-h200-x8"):
        doc = {**valid_doc, "hardware_key": key}
        family_path(tmp_path, key, "gemm").parent.mkdir(parents=True)
        family_path(tmp_path, key, "gemm").write_text(dumps(doc))
    family_path(tmp_path, "broken-x1", "gemm").parent.mkdir(parents=True)
    family_path(tmp_path, "broken-x1", "gemm").write_text("{")
    found = other_hardware_entries(tmp_path, HW, "gemm", "fake[b]")
    assert list(found) == ["nvidia-h200-x8"]
    assert found["nvidia-h200-x8"].metrics["tokens_per_s"].value == 10.3
    assert other_hardware_entries(tmp_path, HW, "gemm", "fake[nope]") == {}
    assert other_hardware_entries(tmp_path / "missing", HW, "gemm", "fake[b]") == {}


def test_other_hardware_problems_name_each_broken_file_and_its_problem(tmp_path, valid_doc):
    # other_hardware_entries skips these; they used to be skipped without a word (their rows just went missing).
    for key in (HW, "nvidia-h200-x8"):
        family_path(tmp_path, key, "gemm").parent.mkdir(parents=True)
        family_path(tmp_path, key, "gemm").write_text(dumps({**valid_doc, "hardware_key": key}))
    family_path(tmp_path, HW, "decode").write_text("{")  # this run's own: BaselineSet.load refuses it, not this
    broken = family_path(tmp_path, "broken-x1", "gemm")
    broken.parent.mkdir(parents=True)
    broken.write_text("{")
    invalid = family_path(tmp_path, "invalid-x1", "gemm")
    invalid.parent.mkdir(parents=True)
    invalid.write_text(dumps({**valid_doc, "hardware_key": "invalid-x1", "family": "nope", "fingerprint": []}))
    assert other_hardware_problems(tmp_path, HW) == [
        f"{broken}: line 1 column 2: invalid JSON: Expecting property name enclosed in double quotes",
        f"{invalid}: 2 errors, the first: family: must be one of ('gemm', 'allreduce', 'decode', 'selfcheck'), "
        "got 'nope'"]
    assert other_hardware_problems(tmp_path / "missing", HW) == []


def test_check_writable(tmp_path):
    check_writable(tmp_path / "a" / "b" / "c")  # missing folders are fine: they will be created
    (tmp_path / "file").write_text("")
    with pytest.raises(BaselineError) as e:
        check_writable(tmp_path / "file" / "sub" / HW)
    assert str(e.value) == f"{tmp_path / 'file' / 'sub' / HW}: baseline folder is not writable"


# --- the update writer ------------------------------------------------------------------------------

def _state(root: Path) -> RunState:
    return RunState(baseline_dir=root, hardware_key=HW, fingerprint={"cpu": {"model": "m"}, "gpus": []},
                    strict=False, update=True, baselines=BaselineSet.load(root, HW), key_forced=True)


def _record(state: RunState, value: float, key: str = "fake[a]") -> None:
    state.record(nodeid="t::x", key=key, family="gemm", definition={"a": 1},
                 measure=lambda: {"latency_us": Metric.from_samples([value] * 3, "us", "lower"),
                                  "info": Metric(1.0, "x", "higher", gated=False)})


def test_write_updates_writes_then_reports_no_change(tmp_path):
    state = _state(tmp_path)
    _record(state, 100.0)
    lines, _ = write_updates(state)
    path = family_path(tmp_path, HW, "gemm")
    assert lines[0] == f"moebench: updated {path} (1 change)"
    doc = load_file(path, hardware_key=HW, family="gemm")
    assert list(doc["entries"]["fake[a]"]["metrics"]) == ["latency_us"], "only gated metrics are stored"
    text = path.read_text()

    again = _state(tmp_path)
    _record(again, 100.0)
    assert write_updates(again) == ([f"moebench: {path}: no change"], [])
    assert path.read_text() == text

    proposed = _state(tmp_path)
    _record(proposed, 90.0)
    lines, _ = write_updates(proposed, propose_dir=str(tmp_path / "proposal"))
    assert lines[0].startswith(f"moebench: proposed {family_path(tmp_path / 'proposal', HW, 'gemm')}")
    assert path.read_text() == text, "proposing must not touch the baseline folder"


def test_update_refuses_a_value_the_schema_would_refuse(tmp_path):
    # Written, such a file stopped every later run at load time; now that entry is refused by key, the
    # file is not made, and no empty folder is left behind.
    state = _state(tmp_path)
    state.record(nodeid="t::x", key="fake[a]", family="gemm", definition={"a": 1},
                 measure=lambda: {"latency_us": Metric(0.0, "us", "lower")})
    lines, refused = write_updates(state)
    assert refused == ["fake[a]"]
    assert any(re.search(r"fake\[a\]: baseline NOT written: .*entries\['fake\[a\]'\]\.metrics\.latency_us\.value: "
                         r"must be .* > 0", line) for line in lines), lines
    assert not family_path(tmp_path, HW, "gemm").exists() and not (tmp_path / HW).exists()


# --- hardware keys name folders -----------------------------------------------------------------------

@pytest.mark.parametrize("key", ["../../tmp/evil", "Weird Key!", "nvidia-h200-x1/..", "", "a--b", "-a", "a.b"])
def test_a_key_that_is_not_a_slug_names_no_folder(tmp_path, key):
    with pytest.raises(BaselineError, match="is not a hardware key"):
        family_path(tmp_path, key, "gemm")
    with pytest.raises(BaselineError, match="is not a hardware key"):
        BaselineSet.load(tmp_path, key)


def test_detected_style_keys_are_slugs(tmp_path):
    for key in ("nvidia-h200-x1", "cpu-intel-r-xeon-r-processor-2c", "mixed-a-b-x2"):
        assert key_folder(tmp_path, key) == tmp_path / key


# --- the lock: concurrent updates merge ------------------------------------------------------------------

def test_lock_is_exclusive_and_leaves_no_file(tmp_path):
    path = tmp_path / "hw" / "gemm.json"
    lock = path.parent / ".gemm.json.lock"
    with locked(path):
        fd = os.open(lock, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    assert os.listdir(path.parent) == [], "the lock file is removed on release"
    with locked(path):  # and it can be taken again
        pass


def test_runs_that_loaded_the_file_before_either_wrote_keep_both_entries(tmp_path):
    # Two --baseline-update runs on one folder: each loaded the file at its start (the barrier makes
    # sure both did before either writes). The later write used to keep only its own entries.
    seed = _state(tmp_path)
    _record(seed, 50.0, "fake[z]")
    write_updates(seed)
    barrier = threading.Barrier(2, timeout=60)

    def run(key: str, value: float) -> list[str]:
        state = _state(tmp_path)
        _record(state, value, key)
        barrier.wait()
        return write_updates(state)[0]

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        lines = [f.result() for f in [pool.submit(run, "fake[a]", 100.0), pool.submit(run, "fake[b]", 200.0)]]
    path = family_path(tmp_path, HW, "gemm")
    assert [l[0] for l in lines] == [f"moebench: updated {path} (1 change)"] * 2
    doc = load_file(path, hardware_key=HW, family="gemm")
    assert {k: e["metrics"]["latency_us"]["value"] for k, e in doc["entries"].items()} == \
        {"fake[a]": 100.0, "fake[b]": 200.0, "fake[z]": 50.0}
    assert sorted(os.listdir(path.parent)) == ["gemm.json"]


def test_an_update_waits_for_the_lock_and_merges_what_the_holder_wrote(tmp_path):
    # Run A holds the lock and is writing when run B starts its update: B reads the file only once it
    # holds the lock, so it merges A's entry whenever it started.
    b = _state(tmp_path)
    _record(b, 200.0, "fake[b]")
    a = _state(tmp_path)
    _record(a, 100.0, "fake[a]")
    path = family_path(tmp_path, HW, "gemm")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        with locked(path):
            fb = pool.submit(write_updates, b)
            doc, _ = merge_entries(None, HW, "gemm", a.fingerprint, NOW, a.entries_by_family()["gemm"])
            atomic_write_text(path, dumps(doc))
        fb.result()
    doc = load_file(path, hardware_key=HW, family="gemm")
    assert sorted(doc["entries"]) == ["fake[a]", "fake[b]"]


def test_a_lock_held_too_long_is_one_line_not_an_endless_wait(tmp_path):
    path = tmp_path / "hw" / "gemm.json"
    with locked(path):
        holder = re.escape(f"pid {os.getpid()} on host {socket.gethostname()}")  # the lock names who holds it
        with pytest.raises(BaselineError, match=rf"\.gemm\.json\.lock: {holder} has held this lock too long"):
            with locked(path, timeout_s=0):
                pass
