"""Ctrl-C held back while a run writes its files, so that an interrupt never leaves some of them written
and others not (each file is atomic on its own; a set of them is not)."""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator


class CtrlC:
    """Holds SIGINT during `held()` blocks and remembers whether one arrived (`received`)."""

    def __init__(self) -> None:
        self.received = False

    def _note(self, signum, frame) -> None:
        self.received = True

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Run the block with Ctrl-C recorded instead of raised; the caller says so afterwards and ends the
        run as interrupted. Only for short, bounded work (writing files): the user's Ctrl-C waits for it.
        Outside the main thread, where Python cannot install a handler, the block runs unprotected."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.signal(signal.SIGINT, self._note)
        try:
            yield
        finally:
            # None: a handler installed from C; Python's default one is the closest to restore.
            signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
