"""Where a measured number came from: commit, date, versions."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any

from moebench.core.hardware import now_iso


def parse_date(s: str) -> datetime:
    """An ISO date as the harness writes it (hardware.now_iso: '2026-11-29T22:04:32Z'), as an aware datetime."""
    d = datetime.fromisoformat(s.replace("Z", "+00:00"))
    return d if d.tzinfo else d.replace(tzinfo=timezone.utc)


@lru_cache(maxsize=1)
def git_commit(cwd: str | None = None) -> str:
    """HEAD's hash, with '-dirty' when the tree has uncommitted changes; 'unknown' outside a checkout.

    MOEBENCH_COMMIT wins when set: a tree copied to a lent GPU machine travels without .git, so the
    command that sends it names the commit (ci/lent.sh refuses to record without it).
    """
    if os.environ.get("MOEBENCH_COMMIT"):
        return os.environ["MOEBENCH_COMMIT"]
    where = cwd or str(Path(__file__).resolve().parent)
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=where,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def measured(fingerprint: dict[str, Any]) -> dict[str, Any]:
    """Provenance of a value measured by this code on this machine now."""
    versions = {k: v for k, v in (fingerprint.get("versions") or {}).items() if v}
    if fingerprint.get("driver"):
        versions["driver"] = fingerprint["driver"]
    if fingerprint.get("cuda_driver"):
        versions["cuda_driver"] = fingerprint["cuda_driver"]
    return {"kind": "measured", "commit": git_commit(), "date": now_iso(), "versions": versions}


def definition_hash(definition: dict[str, Any]) -> str:
    """Stable hash of a case definition (everything that shapes the measurement). A change makes the
    stored entry STALE."""
    text = json.dumps(definition, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
