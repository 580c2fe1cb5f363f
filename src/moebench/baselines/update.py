"""Writing measured cases into baseline files: explicit, reviewable, atomic, merged under a lock."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

from moebench.baselines.schema import validate_file
from moebench.baselines.store import dumps, family_path, load_file, locked, looser_tolerances_kept, merge_entries
from moebench.files import atomic_write_text
from moebench.hardware import now_iso


@dataclass
class Merge:
    """One baseline file's merge: where it goes, the merged document, its change lines, whether the
    target is new (or a proposal), which is written even without a change, and notes for the reader that
    change nothing (a looser tolerance kept, a killed writer's leftovers removed)."""

    target: Path
    doc: dict
    changes: list[str]
    new: bool
    notes: list[str] = field(default_factory=list)


def merge_files(updates: list[tuple[str, str, dict, dict]], *, root: Path, source_root: Path | None = None,
                write: bool = True, proposal: bool = False) -> list[Merge]:
    """The one place baseline files are written (`--baseline-update`, `--baseline-propose` and
    `moebench baselines promote`). updates: (hardware key, family, fingerprint, {case key: entry}).

    Every target file (<root>/<key>/<family>.json) is locked and its source (the same path under
    source_root, default root) re-read before merging: another run may have updated it since, and its
    entries are kept. All files are merged and validated before the first is written, so a bad merge
    writes none; each write is atomic; with write=False nothing is written (a dry run)."""
    now = now_iso()
    plans: list[Merge] = []
    with contextlib.ExitStack() as locks:
        # Sorted: two runs lock their common files in one order, so neither waits for the other in a circle.
        for hw, family, fingerprint, entries in sorted(updates, key=lambda u: (u[0], u[1])):
            source = family_path(source_root or root, hw, family)
            target = family_path(root, hw, family)
            # a dry run takes no lock (which would make the folder) and writes nothing
            notes = locks.enter_context(locked(target)) if write else []
            current = load_file(source, hardware_key=hw, family=family) if source.exists() else None
            notes = notes + looser_tolerances_kept(current, entries)
            doc, changes = merge_entries(current, hw, family, fingerprint, now, entries)
            validate_file(doc, str(target), hardware_key=hw, family=family)
            plans.append(Merge(target, doc, changes, current is None or proposal, notes))
        for m in plans:
            if write and (m.changes or m.new):
                atomic_write_text(m.target, dumps(m.doc))
    return plans


def write_updates(state, *, propose_dir: str | None = None) -> list[str]:
    """Merge the run's measured cases into this hardware's baseline files (or into copies under
    propose_dir) and return the change lines to print. Entries the run did not measure keep their bytes
    (see merge_files)."""
    updates = [(state.hardware_key, family, state.fingerprint, entries)
               for family, entries in state.entries_by_family().items()]
    merges = merge_files(updates, root=Path(propose_dir) if propose_dir else state.baseline_dir,
                         source_root=state.baseline_dir, proposal=bool(propose_dir))
    lines: list[str] = []
    for m in merges:
        if not m.changes and not m.new:
            lines.append(f"moebench: {m.target}: no change")
        else:
            verb = "proposed" if propose_dir else "updated"
            lines.append(f"moebench: {verb} {m.target} ({len(m.changes)} change{'s' if len(m.changes) != 1 else ''})")
            lines.extend(m.changes)
        lines.extend(m.notes)
    return lines
