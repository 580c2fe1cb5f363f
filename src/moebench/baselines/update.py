"""Writing measured cases into baseline files: explicit, reviewable, atomic, merged under a lock."""

from __future__ import annotations

import contextlib
from pathlib import Path

from moebench.baselines.schema import validate_file
from moebench.baselines.store import atomic_write_text, dumps, family_path, load_file, locked, merge_entries
from moebench.hardware import now_iso


def write_updates(state, *, propose_dir: str | None = None) -> list[str]:
    """Merge the run's measured cases into this hardware's baseline files (or into copies under
    propose_dir) and return the change lines to print. Entries the run did not measure keep their bytes.

    Every target file is locked and its source re-read before merging: another run may have updated it
    since this one loaded it, and its entries are kept. All files are merged and validated before the
    first is written, so a bad merge writes none; each write is atomic."""
    root = Path(propose_dir) if propose_dir else state.baseline_dir
    now = now_iso()
    plans = []  # (target, document, change lines, whether the target is new or a proposal)
    with contextlib.ExitStack() as locks:
        # Sorted: two runs lock their common files in one order, so neither waits for the other in a circle.
        for family, updates in sorted(state.entries_by_family().items()):
            source = family_path(state.baseline_dir, state.hardware_key, family)
            target = family_path(root, state.hardware_key, family)
            locks.enter_context(locked(target))
            current = load_file(source, hardware_key=state.hardware_key, family=family) if source.exists() else None
            doc, changes = merge_entries(current, state.hardware_key, family, state.fingerprint, now, updates)
            validate_file(doc, str(target), hardware_key=state.hardware_key, family=family)
            plans.append((target, doc, changes, current is None or bool(propose_dir)))
        lines: list[str] = []
        for target, doc, changes, always in plans:
            if not changes and not always:
                lines.append(f"moebench: {target}: no change")
                continue
            atomic_write_text(target, dumps(doc))
            verb = "proposed" if propose_dir else "updated"
            lines.append(f"moebench: {verb} {target} ({len(changes)} change{'s' if len(changes) != 1 else ''})")
            lines.extend(changes)
    return lines
