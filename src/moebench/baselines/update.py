"""Writing measured cases into baseline files: explicit, reviewable, atomic."""

from __future__ import annotations

from pathlib import Path

from moebench.baselines.store import atomic_write_text, dumps, family_path, merge_entries
from moebench.hardware import now_iso


def write_updates(state, *, propose_dir: str | None = None) -> list[str]:
    """Merge the run's measured cases into this hardware's baseline files (or into copies under
    propose_dir) and return the change lines to print. Each file is written once, atomically; entries
    the run did not measure keep their bytes."""
    lines: list[str] = []
    now = now_iso()
    for family, updates in sorted(state.entries_by_family().items()):
        current = state.baselines.docs.get(family)
        doc, changes = merge_entries(current, state.hardware_key, family, state.fingerprint, now, updates)
        root = Path(propose_dir) if propose_dir else state.baseline_dir
        path = family_path(root, state.hardware_key, family)
        if not changes and current is not None and not propose_dir:
            lines.append(f"moebench: {path}: no change")
            continue
        atomic_write_text(path, dumps(doc))
        verb = "proposed" if propose_dir else "updated"
        lines.append(f"moebench: {verb} {path} ({len(changes)} change{'s' if len(changes) != 1 else ''})")
        lines.extend(changes)
    return lines
