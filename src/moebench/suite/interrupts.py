"""Ctrl-C and SIGTERM held back while a run writes its files, so that an interrupt never leaves some of
them written and others not (each file is atomic on its own; a set of them is not), and SIGTERM ending a
run the way Ctrl-C does.

SIGTERM is what CI cancellation, `timeout` and `docker stop` send. Its default action ended the process
at once: during the baseline write that lost the run without a word (exit -15) and left the temporary
file and the lock beside the baselines, where `git add baselines/` would commit them.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Callable, Iterator

HELD = (signal.SIGINT, signal.SIGTERM)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises KeyboardInterrupt: pytest ends the run as interrupted, and
    every `finally` (engines, NCCL ranks, locks) runs on the way out."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated(signal.Signals(signum).name)


class _Chained:
    """moebench's SIGTERM handler over one someone else installed first: theirs runs, then the run ends
    as Ctrl-C ends it (a handler that raises or exits itself has the last word)."""

    def __init__(self, previous: Callable) -> None:
        self.previous = previous

    def __call__(self, signum, frame) -> None:
        self.previous(signum, frame)
        _raise_terminated(signum, frame)


def sigterm_as_interrupt() -> Callable[[], None]:
    """Make SIGTERM raise Terminated, after calling a handler someone else installed first (chained, not
    replaced); returns what puts the previous handler back. Only in the main thread; a SIGTERM set to be
    ignored stays ignored, and one handled from C (unknown to Python) is left alone."""
    previous = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread() or previous in (signal.SIG_IGN, None):
        return lambda: None
    mine = _raise_terminated if previous is signal.SIG_DFL else _Chained(previous)
    signal.signal(signal.SIGTERM, mine)

    def restore() -> None:
        if signal.getsignal(signal.SIGTERM) is mine:
            signal.signal(signal.SIGTERM, previous)
    return restore


def _foreign(handler) -> Callable | None:
    """The handler someone else installed, behind moebench's own where it is chained; None when none."""
    h = handler.previous if isinstance(handler, _Chained) else handler
    return h if callable(h) and h not in (_raise_terminated, signal.default_int_handler) else None


class CtrlC:
    """Holds SIGINT and SIGTERM during `held()` blocks and remembers the first that arrived (`received`:
    its name, "SIGINT" or "SIGTERM"; "" when none did)."""

    def __init__(self) -> None:
        self.received = ""

    def _note(self, signum, frame) -> None:
        self.received = self.received or signal.Signals(signum).name

    def interrupted_line(self, what: str) -> str:
        """The one line saying that an interrupt waited for `what` ("" when none arrived)."""
        if not self.received:
            return ""
        by = "" if self.received == "SIGINT" else f" by {self.received}"
        return f"moebench: interrupted{by} while writing files: held until {what}"

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Run the block with Ctrl-C and SIGTERM recorded instead of acted on; the caller says so afterwards
        and ends the run as interrupted. Only for short, bounded work (writing files): the interrupt waits
        for it. Outside the main thread, where Python cannot install a handler, the block runs unprotected."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.signal(s, self._note) for s in HELD}
        try:
            yield
        finally:
            for s, handler in previous.items():
                # None: a handler installed from C; Python's defaults are the closest to restore.
                fallback = signal.default_int_handler if s == signal.SIGINT else signal.SIG_DFL
                signal.signal(s, handler if handler is not None else fallback)
            theirs = _foreign(previous[signal.SIGTERM])
            if self.received == "SIGTERM" and theirs is not None:
                theirs(signal.SIGTERM, None)  # held, not swallowed: their handler hears of it too
