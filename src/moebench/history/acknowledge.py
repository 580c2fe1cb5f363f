"""Acknowledged change points: the ones a person has looked at and accepted, so `moebench changes` does
not report them again.

Two ways, both reviewable in a pull request:
- a new baseline: a case whose stored baseline entry was recorded (provenance date) at or after the
  run after the change has accepted its new level;
- a note in a TOML file (`--acknowledged FILE`), one table per accepted change:

      [[acknowledged]]
      case = "gemm[kimi-k2.5-tp8-fused-m1-bf16-decode-triton]"   # the case id, as printed
      metric = "graph_us"                                        # optional: any gated metric of the case
      after = "2026-12-03 02:17"     # the run after the change, as printed: its date (or a prefix) or commit
      hardware = "nvidia-h200-x1"    # optional: any hardware key
      reason = "vLLM 0.22: the Triton MoE path is 4% slower at M=1; accepted in #41"
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from moebench.baselines.store import BaselineSet
from moebench.history.changes import ChangePoint
from moebench.core.provenance import parse_date

_FIELDS = {"case": True, "after": True, "reason": True, "metric": False, "hardware": False}


class AcknowledgeError(ValueError):
    """A notes file that cannot be used; one line naming the file and the field."""


@dataclass(frozen=True)
class Note:
    """One acknowledged change point of the notes file."""

    case: str
    after: str
    reason: str
    metric: str = ""
    hardware: str = ""

    def matches(self, cp: ChangePoint) -> bool:
        """Whether this note accepts the change point: same case (and metric and hardware when the note
        names them), and `after` names the run after the change by its date (a prefix; 'T' or a space
        between date and time) or its commit (a prefix of at least 7 characters)."""
        if cp.key != self.case or self.metric not in ("", cp.metric) or self.hardware not in ("", cp.hardware_key):
            return False
        when = self.after.replace(" ", "T")
        by_commit = len(self.after) >= 7 and cp.after.commit.startswith(self.after)
        return cp.after.started.startswith(when) or by_commit


def load_notes(path: str | Path) -> list[Note]:
    """Read and check a notes file; AcknowledgeError in one line naming the file and the field."""
    where = str(path)
    try:
        doc = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AcknowledgeError(f"{where}: no such file") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise AcknowledgeError(f"{where}: cannot read: {e}") from None
    unknown = sorted(set(doc) - {"acknowledged"})
    if unknown:
        raise AcknowledgeError(f"{where}: {unknown[0]}: unknown table (the file holds [[acknowledged]] entries)")
    entries = doc.get("acknowledged", [])
    if not isinstance(entries, list):
        raise AcknowledgeError(f"{where}: acknowledged: must be a list of tables ([[acknowledged]])")
    return [_note(e, f"{where}: acknowledged[{i}]") for i, e in enumerate(entries)]


def _note(e: object, where: str) -> Note:
    if not isinstance(e, dict):
        raise AcknowledgeError(f"{where}: must be a table")
    for name in e:
        if name not in _FIELDS:
            raise AcknowledgeError(f"{where}.{name}: unknown field (fields: {', '.join(_FIELDS)})")
    for name, required in _FIELDS.items():
        value = e.get(name)
        if value is None and not required:
            continue
        if not isinstance(value, str) or not value.strip():
            raise AcknowledgeError(f"{where}.{name}: {'missing' if value is None else 'must be a non-empty string'}")
    return Note(**{k: e[k].strip() for k in e})


def acknowledged_by_baseline(cp: ChangePoint, baselines: BaselineSet) -> bool:
    """Whether the case's stored entry was recorded at or after the run after the change (its new level
    is the baseline now). An entry without a provenance date (an external figure) acknowledges nothing."""
    entry = baselines.entry(cp.family, cp.key) if cp.family else None
    date = entry.provenance.get("date") if entry is not None else None
    if not isinstance(date, str):
        return False
    try:
        return parse_date(date) >= parse_date(cp.after.started)
    except ValueError:
        return False
