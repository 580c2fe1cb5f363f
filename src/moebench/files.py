"""File helpers every writer shares (baseline files, results JSON, summaries, reports, the sweep's config
table): nothing of a family or a format lives here."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _mode_for(path: Path) -> int:
    """Permission bits for a (re)written file: the existing file's, else 0666 less the umask."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temporary file in the same folder and os.replace: a reader (or an interrupt) sees the
    old file or the new one, never half of either; the temporary file is removed on any failure."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp creates the file 0600; after os.replace that would be the mode of the baseline or
        # results file. Keep the replaced file's mode, or for a new file the mode open() would give it.
        os.chmod(tmp, _mode_for(path))
        os.replace(tmp, path)
    except BaseException:
        # BaseException: a KeyboardInterrupt mid-write must not leave the temporary file behind either.
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
