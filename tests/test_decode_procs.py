"""Where an engine process lives: its own process group (so teardown reaches every rank) inside the
caller's session (so the scheduler does not set it against the timing client as a separate autogroup)."""

from __future__ import annotations

import os
import sys

from moebench.decode.procs import EngineProcess, alive


def test_engine_leads_its_own_group_inside_the_callers_session(tmp_path):
    eng = EngineProcess([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "engine.log")
    try:
        assert os.getpgid(eng.pid) == eng.pid, "the engine must lead a process group of its own"
        assert os.getpgid(eng.pid) != os.getpgid(0)
        # A session of its own (setsid) makes it an autogroup of its own: on a 2-core vLLM-CPU box that
        # starved the streaming client for about 700 ms and whole trials arrived as one burst.
        assert os.getsid(eng.pid) == os.getsid(0), "the engine must stay in the caller's session"
    finally:
        assert eng.stop(grace_s=5, kill_wait_s=5) == []
    assert not alive(eng.pid)
