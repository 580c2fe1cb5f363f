"""Baseline files as a git revision holds them, for `moebench baselines diff origin/main:baselines baselines`:
what a reviewer runs to see every change a pull request makes to the gate, without a second checkout.

`REV:PATH` names PATH (a baseline file, a <hardware-key>/ folder or the baselines/ root, relative to the
top of the repository, as in `git show REV:PATH`) at revision REV. Read through `git ls-tree` and
`git cat-file`; nothing is checked out or written.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from moebench.baselines.schema import BaselineError, parse_document, validate_file

GIT_TIMEOUT_S = 60


def is_revision(spec: str) -> bool:
    """Whether `spec` reads as REV:PATH rather than a path: it has a ':' after a non-empty REV and is not
    an existing file or folder (a path with a ':' in its name stays a path)."""
    rev, sep, _ = spec.partition(":")
    return bool(sep and rev) and not os.path.exists(spec)


def _git(args: list[str], spec: str, cwd: Path | None) -> bytes:
    try:
        r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, timeout=GIT_TIMEOUT_S)
    except FileNotFoundError:
        raise BaselineError(f"{spec}: git is not installed here, so a REV:PATH cannot be read") from None
    except subprocess.TimeoutExpired:
        raise BaselineError(f"{spec}: git {args[0]} did not answer within {GIT_TIMEOUT_S} s") from None
    if r.returncode != 0:
        why = (r.stderr.decode(errors="replace").strip().splitlines() or [f"exit {r.returncode}"])[0]
        raise BaselineError(f"{spec}: git {args[0]}: {why}")
    return r.stdout


def _pick(names: list[str], path: str) -> list[str]:
    """The baseline files among a revision's files under `path`, as a folder is read: PATH itself when it
    is a file, else its <family>.json files, else its <hardware-key>/<family>.json files."""
    if names == [path]:
        return names
    rel = {n: n[len(path) + 1:] if path else n for n in names}
    top = [n for n, r in rel.items() if "/" not in r and r.endswith(".json")]
    return sorted(top or [n for n, r in rel.items() if r.count("/") == 1 and r.endswith(".json")])


def load_revision(spec: str, cwd: Path | None = None) -> list[tuple[str, dict]]:
    """(where, validated document) for every baseline file under REV:PATH; BaselineError with one line
    naming the spec when git cannot read it or it holds no baseline file."""
    rev, _, path = spec.partition(":")
    path = path.strip("/")
    listing = _git(["ls-tree", "-r", "-z", "--name-only", "--full-tree", rev, "--", path or "."], spec, cwd)
    names = _pick([n for n in listing.decode().split("\0") if n], path)
    if not names:
        raise BaselineError(f"{spec}: no baseline files (<family>.json or <hardware-key>/<family>.json) there")
    docs = []
    for name in names:
        where = f"{rev}:{name}"
        text = _git(["cat-file", "blob", where], spec, cwd).decode("utf-8", errors="replace")
        docs.append((where, validate_file(parse_document(text, where), where)))
    return docs
