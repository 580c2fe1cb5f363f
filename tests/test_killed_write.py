"""A baseline write killed where nothing can be held back (SIGKILL, a power cut): what it leaves is named
and removed by the next write, never blocks it, and is ignored by git meanwhile. End to end over the fake
project (tests/conftest.py), with a real SIGKILL in the middle of the write.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from moebench.baselines.store import load_file

HW = "test-hw-x1"  # the --hardware-key FakeBench forces (tests/conftest.py)
REPO = Path(__file__).resolve().parents[1]

# The process kills itself with SIGKILL as gemm.json is put in place: the temporary file is written and
# the lock held, and neither a handler nor a `finally` runs.
SIGKILL_CONFTEST = '''
import os
import signal

_replace = os.replace


def replace(src, dst, **kw):
    if os.path.basename(dst) == "gemm.json" and os.environ.get("MOEBENCH_TEST_SIGKILL"):
        os.kill(os.getpid(), signal.SIGKILL)
    return _replace(src, dst, **kw)


os.replace = replace
'''


def test_a_write_killed_by_sigkill_leaves_what_the_next_write_names_and_removes(fakebench):
    fakebench.write_baseline({"a": 100.0})
    before = fakebench.family_file().read_bytes()
    fakebench.pytester.makeconftest(SIGKILL_CONFTEST)
    killed = fakebench.run("--baseline-update", env={"MOEBENCH_TEST_SIGKILL": "1"})
    assert killed.ret == -signal.SIGKILL
    folder = fakebench.family_file().parent
    left = sorted(os.listdir(folder))
    assert fakebench.family_file().read_bytes() == before, "the old file stays whole"
    tmp = [n for n in left if n.startswith(".gemm.json.") and n.endswith(".tmp")]
    assert left == sorted([".gemm.json.lock", "gemm.json", *tmp]) and len(tmp) == 1, left
    # The lock says whose it was.
    pid, host = (folder / ".gemm.json.lock").read_text().split()
    assert int(pid) > 0 and host == socket.gethostname()

    # The next update is not blocked; it names both leftovers, removes them and writes.
    again = fakebench.run("--baseline-update")
    assert again.ret == pytest.ExitCode.OK, again.stdout.str()
    lock_line = (f"moebench: {folder / '.gemm.json.lock'}: stale lock of pid {pid} on host {host}, a run killed "
                 "while writing; taken over")
    assert lock_line in again.outlines, again.stdout.str()
    assert f"moebench: {folder / tmp[0]}: removed, the half-written file of a run killed while writing" in again.outlines
    assert os.listdir(folder) == ["gemm.json"], "after a clean exit nothing sits beside the baselines"
    assert sorted(load_file(fakebench.family_file(), hardware_key=HW, family="gemm")["entries"]) == ["fake[a]", "fake[b]"]


@pytest.mark.parametrize("name", [".gemm.json.lock", ".decode.json.k2x9_q1.tmp"])
def test_git_ignores_what_a_killed_write_leaves(name):
    # `git add baselines/` after a killed run used to commit the lock and the temporary file.
    r = subprocess.run(["git", "check-ignore", "-q", f"baselines/nvidia-h200-x1/{name}"], cwd=REPO)
    if r.returncode == 128:
        pytest.skip("not a git checkout")
    assert r.returncode == 0, f"{name} is not in .gitignore"
