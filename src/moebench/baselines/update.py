"""Writing measured cases into baseline files: explicit, reviewable, atomic, merged under a lock.
What was written is worded by moebench.outputs.baseline_lines."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

from moebench.baselines.entry_change import EntryChange
from moebench.baselines.schema import validate_file
from moebench.baselines.store import dumps, family_path, load_file, locked, looser_tolerances_kept, merge_entries
from moebench.core.files import atomic_write_text
from moebench.core.hardware import now_iso


@dataclass
class Merge:
    """One baseline file's merge: where it goes, the merged document, its changes, whether the
    target is new (or a proposal), which is written even without a change, notes for the reader that
    change nothing (a looser tolerance kept, a killed writer's leftovers removed), and the entries the
    schema refused (case key -> its problems), which were left out while the others were written."""

    target: Path
    doc: dict
    changes: list[EntryChange]
    new: bool
    notes: list[str | EntryChange] = field(default_factory=list)
    refused: dict[str, list[str]] = field(default_factory=dict)

    @property
    def written(self) -> bool:
        """Whether this merge writes its file (a change, or a new file that holds an entry)."""
        return bool(self.changes) or (self.new and bool(self.doc["entries"]))


def merge_files(updates: list[tuple[str, str, dict, dict]], *, root: Path, source_root: Path | None = None,
                write: bool = True, proposal: bool = False) -> list[Merge]:
    """The one place baseline files are written (`--baseline-update`, `--baseline-propose` and
    `moebench baselines promote`). updates: (hardware key, family, fingerprint, {case key: entry}).

    Every target file (<root>/<key>/<family>.json) is locked and its source (the same path under
    source_root, default root) re-read before merging: another run may have updated it since, and its
    entries are kept. An entry the schema refuses is left out of its file and listed in the Merge's
    `refused`; the good entries are written. All files are merged and validated before the first is
    written, so a bad merge (a header, not an entry) writes none; each write is atomic; with write=False
    nothing is written (a dry run). A folder made for a file that was then not written is removed again."""
    now = now_iso()
    plans: list[Merge] = []
    folders = {family_path(root, hw, fam).parent for hw, fam, *_ in updates} | {Path(root)}
    made = sorted((f for f in folders if not f.exists()), key=lambda f: -len(f.parts))  # inner ones first
    try:
        _merge_locked(updates, root, source_root, write, proposal, now, plans)
    finally:
        for folder in made:  # what `locked` made for a file that was not written: an empty folder misleads
            with contextlib.suppress(OSError):
                folder.rmdir()
    return plans


def _merge_locked(updates, root: Path, source_root: Path | None, write: bool, proposal: bool, now: str,
                  plans: list[Merge]) -> None:
    with contextlib.ExitStack() as locks:
        # Sorted: two runs lock their common files in one order, so neither waits for the other in a circle.
        for hw, family, fingerprint, entries in sorted(updates, key=lambda u: (u[0], u[1])):
            source = family_path(source_root or root, hw, family)
            target = family_path(root, hw, family)
            # a dry run takes no lock (which would make the folder) and writes nothing
            notes = locks.enter_context(locked(target)) if write else []
            current = load_file(source, hardware_key=hw, family=family) if source.exists() else None
            notes = notes + looser_tolerances_kept(current, entries)
            refused: dict[str, list[str]] = {}
            doc, changes = merge_entries(current, hw, family, fingerprint, now, entries, refused)
            validate_file(doc, str(target), hardware_key=hw, family=family)
            plans.append(Merge(target, doc, changes, current is None or proposal, notes, refused))
        for m in plans:
            if write and m.written:
                atomic_write_text(m.target, dumps(m.doc))
