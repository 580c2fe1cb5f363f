"""One spawned rank: `python -m moebench.allreduce.rank SPEC_JSON RANK`.

Says hello once its imports are done, ready once its process group works, then measures every case
of the group in order (start / beat / result per job) and says bye. Any exception: the traceback to
stderr, one error line to the parent, exit status 1. It exits with os._exit so that nothing
(NCCL's destructors, atexit hooks) can keep it alive after its last message; and a watchdog thread
ends it should its parent die, since it lives in a session of its own and no signal would reach it.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from pathlib import Path

from moebench.allreduce import collectives
from moebench.allreduce.protocol import BEAT_S, GroupSpec, Sender, messages_path
from moebench.allreduce.sampling import measure_case

CLOSE_GRACE_S = 5.0


def _watch_parent(parent_pid: int) -> None:
    def loop() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent_pid:
                os._exit(70)

    threading.Thread(target=loop, name="moebench-parent-watch", daemon=True).start()


def _hang() -> None:
    """A test fault: stay alive and silent until killed."""
    while True:
        time.sleep(3600)


def _fault_at(spec: GroupSpec, rank: int, where: str, job: int | None = None) -> bool:
    f = spec.fault
    return f is not None and f.rank == rank and f.where == where and (job is None or f.job == job)


class _Beat:
    """Heartbeat sender, at most one line every BEAT_S."""

    def __init__(self, out: Sender, job: int) -> None:
        self.out, self.job, self.last = out, job, time.monotonic()

    def __call__(self) -> None:
        now = time.monotonic()
        if now - self.last >= BEAT_S:
            self.last = now
            self.out.send("beat", job=self.job)


def run(spec_path: Path, rank: int) -> None:
    """The rank's whole life (returns only after bye; raises on failure)."""
    spec = GroupSpec.read(spec_path)
    out = Sender(messages_path(spec_path.parent, rank), rank)
    _watch_parent(spec.parent_pid)
    job: int | None = None
    try:
        coll = collectives.make(spec, rank)
        coll.prepare()
        out.send("hello", pid=os.getpid(), pgid=os.getpgid(0))
        if _fault_at(spec, rank, "rendezvous"):
            _hang()
        out.send("join")  # about to block in the rendezvous: tells an absent rank from a waiting one
        coll.connect()
        out.send("ready", info=coll.info())
        for job, case in enumerate(spec.cases):
            out.send("start", job=job)
            if _fault_at(spec, rank, "job", job):
                _hang()
            if _fault_at(spec, rank, "crash", job):
                raise RuntimeError(f"injected fault: rank {rank} crashes at job {job}")
            out.send("result", job=job, **measure_case(coll, case, _Beat(out, job)))
        job = None
        out.send("bye")
        if _fault_at(spec, rank, "teardown"):
            _hang()
        # destroy_process_group has hung on us before: give it a few seconds, then leave regardless
        # (the parent's teardown deadline is the backstop should even this not happen).
        leave = threading.Timer(CLOSE_GRACE_S, os._exit, (0,))
        leave.daemon = True
        leave.start()
        coll.close()
    except BaseException as e:  # noqa: BLE001 - every failure must reach the parent as one line
        traceback.print_exc()
        first = (str(e).strip().splitlines() or [""])[0][:500]
        out.send("error", job=job, error=f"{type(e).__name__}: {first}")
        raise


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    try:
        run(Path(args[0]), int(args[1]))
    except BaseException:  # noqa: BLE001
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
