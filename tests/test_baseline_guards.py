"""Guards around baseline writes, end to end over the fake project (tests/conftest.py): hardware keys that
are not slugs, writes under another machine's key, conflicting options, a missing baseline folder, a
write that fails at the end (a non-zero exit), Ctrl-C and SIGTERM in every phase of a run, and a write
killed by SIGKILL. Each case checks what a user sees: exit code, one line, no traceback, no file left.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from moebench.core import hardware
from moebench.baselines.store import load_file

HW = "test-hw-x1"  # the --hardware-key FakeBench forces (tests/conftest.py)
REPO = Path(__file__).resolve().parents[1]
# What the fake project's subprocess detects: it sees no GPUs (CUDA_VISIBLE_DEVICES is empty), so a CPU key.
HERE = hardware.hardware_key({**hardware.fingerprint(), "gpus": []})


def _one_line(result, ret: int, *needles: str) -> str:
    """Exit code `ret`, no traceback, and exactly one output line holding every needle."""
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == ret, text
    assert "Traceback" not in text and "INTERNALERROR" not in text, text
    hits = [line for line in result.outlines + result.errlines if all(n in line for n in needles)]
    assert len(hits) == 1, f"expected one line with {needles}, got {hits}\n{text}"
    return hits[0]


# --- hardware keys ------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["../evil", "Weird Key!", "NVIDIA-H200-X1", ""])
def test_a_key_that_is_not_a_slug_is_a_usage_error(fakebench, key):
    # '../evil' used to write <baselines>/../evil/gemm.json, outside the baseline folder.
    result = fakebench.run("--hardware-key", key, "--baseline-update")
    _one_line(result, pytest.ExitCode.USAGE_ERROR, f"--hardware-key {key!r}: not a hardware key", "nvidia-h200-x1")
    assert fakebench.calls() == {}
    assert not (fakebench.path / "evil").exists() and not fakebench.baselines.exists()


@pytest.mark.parametrize("option", [["--baseline-update"], ["--baseline-propose", "proposal"]])
def test_writing_under_another_machines_key_needs_the_option(fakebench, option):
    # `--hardware-key nvidia-h200-x1 --baseline-update` on a CPU box used to overwrite the H200 baselines.
    result = fakebench.run(*option, other_hardware=False)
    line = _one_line(result, pytest.ExitCode.USAGE_ERROR, f"--hardware-key {HW}: {option[0]} writes only")
    assert f"({HERE})" in line and "--baseline-other-hardware" in line
    assert fakebench.calls() == {}
    assert not fakebench.family_file().exists() and not fakebench.family_file(fakebench.path / "proposal").exists()


def test_writing_under_another_key_with_the_option_warns_at_start_and_end(fakebench):
    result = fakebench.run("--baseline-update")
    assert result.ret == pytest.ExitCode.OK
    warning = f"moebench: WARNING: --baseline-other-hardware: --baseline-update files numbers measured on {HERE} under {HW}"
    hits = [i for i, line in enumerate(result.outlines) if line == warning]
    first_case = next(i for i, line in enumerate(result.outlines) if line.startswith("test_fake.py"))
    updated = result.outlines.index(f"moebench: updated {fakebench.family_file()} (2 changes)")
    assert len(hits) == 2 and hits[0] < first_case and hits[1] > updated, result.stdout.str()
    assert sorted(load_file(fakebench.family_file())["entries"]) == ["fake[a]", "fake[b]"]


def test_the_detected_key_writes_without_the_option_or_a_warning(fakebench):
    result = fakebench.run("--hardware-key", HERE, "--baseline-update", other_hardware=False)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert "--baseline-other-hardware" not in result.stdout.str()
    path = fakebench.baselines / HERE / "gemm.json"
    assert sorted(load_file(path, hardware_key=HERE, family="gemm")["entries"]) == ["fake[a]", "fake[b]"]


# --- conflicting options, missing folder ----------------------------------------------------------------

def test_update_and_propose_together_is_a_usage_error(fakebench):
    # Propose used to win silently: the user asked for an update and got none.
    result = fakebench.run("--baseline-update", "--baseline-propose", "proposal")
    _one_line(result, pytest.ExitCode.USAGE_ERROR, "--baseline-update and --baseline-propose DIR: choose one")
    assert fakebench.calls() == {} and not fakebench.baselines.exists()


def test_a_missing_baseline_folder_is_a_warning_naming_it(fakebench):
    typo = fakebench.path / "baseline"  # the folder is `baselines`
    fakebench.write_baseline({"a": 100.0, "b": 200.0})
    result = fakebench.run("--baseline-dir", str(typo))
    assert result.ret == pytest.ExitCode.OK
    warning = f"moebench: WARNING: --baseline-dir {typo}: no such folder: every case is NEW"
    assert result.outlines.count(warning) == 2, result.stdout.str()


def test_a_broken_baseline_file_of_other_hardware_is_a_warning_naming_it(fakebench):
    # It used to be skipped without a word: its entries' ENV_MISMATCH rows went missing unexplained.
    fakebench.write_baseline({"a": 100.0, "b": 200.0})
    broken = fakebench.baselines / "other-hw-x1" / "gemm.json"
    broken.parent.mkdir()
    broken.write_text('{"schema_version": 1,\n')
    result = fakebench.run()
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()  # the run carries on
    warning = (f"moebench: WARNING: {broken}: line 2 column 1: invalid JSON: Expecting property name enclosed in "
               "double quotes (another hardware's baseline file: skipped, its entries not shown)")
    assert result.outlines.count(warning) == 2, result.stdout.str()  # at the start and in the closing lines


def test_a_missing_baseline_folder_is_an_error_when_strict(fakebench):
    typo = fakebench.path / "baseline"
    result = fakebench.run("--baseline-dir", str(typo), "--baseline-strict")
    _one_line(result, pytest.ExitCode.USAGE_ERROR, f"--baseline-dir {typo}: no such folder", "--baseline-strict")
    assert fakebench.calls() == {}


# --- a baseline write that fails ---------------------------------------------------------------------------

# The disk fills up as the fake project's gemm.json is put in place (after the start-up writability check).
DISK_FULL_CONFTEST = '''
import errno
import os

_replace = os.replace


def replace(src, dst, **kw):
    if os.path.basename(dst) == "gemm.json":
        raise OSError(errno.ENOSPC, "No space left on device", dst)
    return _replace(src, dst, **kw)


os.replace = replace
'''


def test_a_baseline_write_that_fails_exits_non_zero_with_one_line(fakebench):
    # Every case passed, but the update the user asked for did not happen: the run must not exit 0.
    fakebench.write_baseline({"a": 100.0})
    before = fakebench.family_file().read_bytes()
    fakebench.pytester.makeconftest(DISK_FULL_CONFTEST)
    result = fakebench.run("--baseline-update")
    _one_line(result, pytest.ExitCode.INTERNAL_ERROR, "moebench: baselines NOT written:", "No space left on device")
    assert fakebench.family_file().read_bytes() == before
    assert os.listdir(fakebench.family_file().parent) == ["gemm.json"], "a temporary file was left behind"


# --- Ctrl-C and SIGTERM in every phase ---------------------------------------------------------------------

# The fake project's conftest sends this process a real signal, MOEBENCH_TEST_SIGNAL (SIGINT: what Ctrl-C
# does; SIGTERM: what CI cancellation, `timeout` and docker send), at the phase named in
# MOEBENCH_TEST_PHASE: while starting (reading the machine's fingerprint), as the second case starts to
# measure, or as a baseline or report file is put in place.
SIGNAL_CONFTEST = '''
import os
import signal

import moebench.core.hardware

PHASE = os.environ.get("MOEBENCH_TEST_PHASE")
SIGNAL = getattr(signal, os.environ.get("MOEBENCH_TEST_SIGNAL", "SIGINT"))
_fingerprint, _clock_monitor, _replace = moebench.core.hardware.fingerprint, moebench.core.hardware.clock_monitor, os.replace
_measured = []
# Python's own Ctrl-C handler, as in a terminal: a run started in the background of a non-interactive
# shell inherits SIGINT ignored, and the signal below would then do nothing.
signal.signal(signal.SIGINT, signal.default_int_handler)


def fingerprint():
    if PHASE == "starting":
        os.kill(os.getpid(), SIGNAL)
    return _fingerprint()


def clock_monitor(*args, **kw):
    _measured.append(1)
    if PHASE == "measuring" and len(_measured) == 2:
        os.kill(os.getpid(), SIGNAL)
    return _clock_monitor(*args, **kw)


def replace(src, dst, **kw):
    if (PHASE, os.path.basename(dst)) in {("baselines", "gemm.json"), ("reports", "results.json")}:
        os.kill(os.getpid(), SIGNAL)
    return _replace(src, dst, **kw)


moebench.core.hardware.fingerprint, moebench.core.hardware.clock_monitor, os.replace = fingerprint, clock_monitor, replace
'''

HELD = "while writing files: held until the files above were written in full"


@pytest.mark.parametrize("phase, expect", [
    ("starting", "moebench: interrupted while starting: nothing was measured or written"),
    ("measuring", "moebench: run interrupted: baselines NOT written"),
    ("baselines", "moebench: interrupted{by} " + HELD),
    ("reports", "moebench: interrupted{by} " + HELD),
], ids=["starting", "measuring", "baselines", "reports"])
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_ctrl_c_and_sigterm_give_one_line_and_lose_nothing(fakebench, sig, phase, expect):
    # Ctrl-C while the baselines were written used to end in a 95-line traceback; while starting, in
    # no output at all. SIGTERM ended the run at once in every phase (exit -15, no line), and during the
    # write left .gemm.json.<random>.tmp and .gemm.json.lock beside the baselines.
    fakebench.pytester.makeconftest(SIGNAL_CONFTEST)
    results = fakebench.path / "results.json"
    result = fakebench.run("--baseline-update", "--results-json", str(results),
                           env={"MOEBENCH_TEST_PHASE": phase, "MOEBENCH_TEST_SIGNAL": sig})
    _one_line(result, pytest.ExitCode.INTERRUPTED, expect.format(by="" if sig == "SIGINT" else f" by {sig}"))
    assert len([line for line in result.outlines + result.errlines if "interrupted" in line]) == 1
    gemm = fakebench.family_file()
    if phase == "starting":
        assert fakebench.calls() == {} and not gemm.exists() and not results.exists()
        return
    # Whatever was written is whole: an interrupted measurement writes no baseline, a held write all of
    # them, and nothing is left beside them.
    assert gemm.exists() == (phase != "measuring")
    if gemm.exists():
        assert sorted(load_file(gemm, hardware_key=HW, family="gemm")["entries"]) == ["fake[a]", "fake[b]"]
        assert os.listdir(gemm.parent) == ["gemm.json"]
    assert [c["key"] for c in json.loads(results.read_text())["cases"]] == \
        (["fake[a]"] if phase == "measuring" else ["fake[a]", "fake[b]"])


# --- SIGKILL: nothing can be held back ----------------------------------------------------------------------

def test_a_write_killed_by_sigkill_leaves_what_the_next_write_names_and_removes(fakebench):
    # Killed as gemm.json is put in place: the temporary file is written and the lock held, and neither
    # a handler nor a `finally` runs. What it leaves used to sit beside the baselines until committed.
    fakebench.write_baseline({"a": 100.0})
    before = fakebench.family_file().read_bytes()
    fakebench.pytester.makeconftest(SIGNAL_CONFTEST)
    killed = fakebench.run("--baseline-update",
                           env={"MOEBENCH_TEST_PHASE": "baselines", "MOEBENCH_TEST_SIGNAL": "SIGKILL"})
    assert killed.ret == -signal.SIGKILL
    folder = fakebench.family_file().parent
    left = sorted(os.listdir(folder))
    assert fakebench.family_file().read_bytes() == before, "the old file stays whole"
    tmp = [n for n in left if n.startswith(".gemm.json.") and n.endswith(".tmp")]
    assert left == sorted([".gemm.json.lock", "gemm.json", *tmp]) and len(tmp) == 1, left
    pid, host = (folder / ".gemm.json.lock").read_text().split()  # the lock says whose it was
    assert int(pid) > 0 and host == socket.gethostname()

    # The next update is not blocked; it names both leftovers, removes them and writes.
    again = fakebench.run("--baseline-update")
    assert again.ret == pytest.ExitCode.OK, again.stdout.str()
    lock_line = (f"moebench: {folder / '.gemm.json.lock'}: stale lock of pid {pid} on host {host}, a run killed "
                 "while writing; taken over")
    assert lock_line in again.outlines, again.stdout.str()
    tmp_line = f"moebench: {folder / tmp[0]}: removed, the half-written file of a run killed while writing"
    assert tmp_line in again.outlines
    assert os.listdir(folder) == ["gemm.json"], "after a clean exit nothing sits beside the baselines"
    assert sorted(load_file(fakebench.family_file())["entries"]) == ["fake[a]", "fake[b]"]


@pytest.mark.parametrize("name", [".gemm.json.lock", ".decode.json.k2x9_q1.tmp"])
def test_git_ignores_what_a_killed_write_leaves(name):
    # `git add baselines/` after a killed run used to commit the lock and the temporary file.
    r = subprocess.run(["git", "check-ignore", "-q", f"baselines/nvidia-h200-x1/{name}"], cwd=REPO)
    if r.returncode == 128:
        pytest.skip("not a git checkout")
    assert r.returncode == 0, f"{name} is not in .gitignore"
