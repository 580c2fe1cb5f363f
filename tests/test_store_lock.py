"""The baseline lock (baselines.store.locked) when its file changes under a waiter: the lock a waiter
gets must be on the file that the name points to now, or two writers hold "the" lock at once. (The
lock's ordinary behaviour, and concurrent updates that merge, are in tests/test_store.py.)"""

from __future__ import annotations

import fcntl
import os

import pytest

from moebench.baselines.schema import BaselineError
from moebench.baselines.store import locked


def test_a_lock_file_removed_and_made_again_by_another_writer_is_not_taken_as_held(tmp_path, monkeypatch):
    # Between the waiter's open of the lock file and its flock, the holder released (removing the
    # file) and a third writer made a new one and locked it. The waiter's flock then succeeds on a
    # file no longer in the folder: it must see that and wait for the new one (here: until its deadline).
    lock = tmp_path / ".gemm.json.lock"
    real_flock = fcntl.flock
    other: list[int] = []

    def flock(fd: int, operation: int) -> None:
        if not other:
            os.unlink(lock)
            other.append(os.open(lock, os.O_RDWR | os.O_CREAT, 0o666))
            real_flock(other[0], fcntl.LOCK_EX)
        real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock)
    try:
        with pytest.raises(BaselineError, match="another run has held this lock too long"):
            with locked(tmp_path / "gemm.json", timeout_s=0.05):
                pass
    finally:
        for fd in other:
            os.close(fd)
    assert other, "the other writer never came: the test did not test the case it names"
