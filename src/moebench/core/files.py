"""File helpers every writer shares (baseline files, results JSON, summaries, reports, the sweep's config
table): nothing of a family or a format lives here."""

from __future__ import annotations

import glob
import json
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


def _temporary_name(path: Path) -> tuple[str, str]:
    """(prefix, suffix) of atomic_write_text's temporary files for `path`: `.<name>.<random>.tmp`."""
    return f".{path.name}.", ".tmp"


def temporary_files(path: Path) -> list[Path]:
    """atomic_write_text's temporary files for `path` that exist now (left by a process killed mid-write)."""
    prefix, suffix = _temporary_name(Path(path))
    return sorted(Path(path).parent.glob(f"{glob.escape(prefix)}*{suffix}"))


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temporary file in the same folder and os.replace: a reader (or an interrupt) sees the
    old file or the new one, never half of either; the temporary file is removed on any failure (a
    SIGKILL leaves it: temporary_files finds it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    prefix, suffix = _temporary_name(path)
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=path.parent)
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


def json_error(e: json.JSONDecodeError) -> str:
    """A JSON decode error as the middle of a one-line message: "line 3 column 5: invalid JSON: <what json
    said>". json's own sentence is completed where it ends in " at" ("Unterminated string starting at",
    "Invalid control character at"): json puts the position after it only in str(e), so e.msg alone read
    as a message cut off."""
    said = f"{e.msg} line {e.lineno} column {e.colno}" if e.msg.endswith(" at") else e.msg
    return f"line {e.lineno} column {e.colno}: invalid JSON: {said}"
