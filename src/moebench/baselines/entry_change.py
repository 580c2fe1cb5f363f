"""What recording does to a stored entry, as numbers: the gate's side of an update's change lines.

The store (merge_entries) and the recording rules (record.prepare_entry) return these; the outputs
(moebench.outputs.baseline_lines) word them. The gate returns numbers; the report formats them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EntryChange:
    """One change an update makes to an entry of a baseline file.

    what, and what the other fields hold:
    - "entry added": metrics, each (name, value, unit);
    - "metric added": metric, after (its value), unit;
    - "metric changed": metric, before -> after, unit;
    - "metric dropped": metric (not measured by this run);
    - "definition changed": the case's definition hash differs (the entry was STALE);
    - "machine changed": before -> after, the machines' names;
    - "looser tolerance kept": metric, before (the stored rel_tol kept), after (the case's own);
    - "stored as not gating": metric, before (its noise), after (the schema's NOISE_MAX);
    - "tolerance ruled": metric, before -> after (rel_tol), spread (its noise_machines)."""

    what: str
    key: str
    metric: str | None = None
    before: Any = None
    after: Any = None
    unit: str = ""
    metrics: tuple[tuple[str, float, str], ...] = ()
    spread: float | None = None
