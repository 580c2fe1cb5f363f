"""Reading and writing baseline files: validated on load, written atomically with stable formatting,
rewritten under a lock so that concurrent runs merge instead of overwriting each other."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

from moebench.baselines.compare import Recorders
from moebench.baselines.entry_change import EntryChange
from moebench.baselines.record import prepare_entry
from moebench.baselines.schema import (SCHEMA_VERSION, BaselineError, entry_problems, fingerprint_id, needs_v2,
                                      parse_document, validate_file, validate_metric)
from moebench.core.hardware import KEY_RULE, is_key, machine_name
from moebench.core.files import temporary_files
from moebench.core.metrics import Metric


def dumps(doc: Mapping[str, Any]) -> str:
    """Canonical text: sorted keys, 2-space indent, trailing newline, so reviews see small diffs and an
    untouched entry keeps its bytes across rewrites."""
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


@contextlib.contextmanager
def locked(path: Path, timeout_s: float = 60.0) -> Iterator[list[str]]:
    """Hold an exclusive lock for rewriting `path` (fcntl.flock on `.<name>.lock` in the same folder);
    yields the lines to show for what a killed writer left (see _clear_leftovers).

    Every writer of a baseline file takes it and re-reads the file under it, so two runs updating one
    file merge their entries instead of the later one silently dropping the earlier one's. A writer
    holds it for moments (merge and write); one still held after timeout_s is a BaselineError naming the
    holder, not an endless wait (the plugin holds Ctrl-C and SIGTERM while it writes). The lock file
    holds the holder's pid and host and is removed on release (while still held); a waiter that then
    holds a lock on the removed file sees that the name no longer points to it and locks the current one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.with_name(f".{path.name}.lock")
    deadline = time.monotonic() + timeout_s
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            _flock_until(fd, deadline, lock)
            try:
                current = os.path.samestat(os.fstat(fd), os.stat(lock))
            except FileNotFoundError:
                current = False
        except BaseException:
            os.close(fd)
            raise
        if current:
            break
        os.close(fd)
    try:
        notes = _clear_leftovers(fd, lock, path)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        yield notes
    finally:
        with contextlib.suppress(FileNotFoundError):  # removed by hand meanwhile: nothing left to clean up
            os.unlink(lock)
        os.close(fd)


def _holder(fd: int) -> str:
    """Who the lock file says holds it ('pid 123 on host h'), or '' for an empty file."""
    text = os.pread(fd, 256, 0).decode(errors="replace").split()
    return f"pid {text[0]} on host {text[1]}" if len(text) >= 2 else ""


def _clear_leftovers(fd: int, lock: Path, path: Path) -> list[str]:
    """What a writer killed inside the lock (SIGKILL, a power cut) left, removed with a line each: its
    pid in the lock file (the lock itself was freed when it died, so holding it now proves it gone)
    and its half-written temporary file beside `path`. Every writer of `path` writes under this lock,
    so no other run's temporary file can be there."""
    notes = []
    holder = _holder(fd)
    if holder:
        notes.append(f"moebench: {lock}: stale lock of {holder}, a run killed while writing; taken over")
    for tmp in temporary_files(path):
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
            notes.append(f"moebench: {tmp}: removed, the half-written file of a run killed while writing")
    return notes


def _flock_until(fd: int, deadline: float, lock: Path) -> None:
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                holder = _holder(fd) or "another run"
                raise BaselineError(f"{lock}: {holder} has held this lock too long; baselines NOT written "
                                    "(remove the file if that run is not writing)") from None
            time.sleep(0.01)


def key_folder(root: Path, hardware_key: str) -> Path:
    """`<root>/<hardware_key>`, refusing a key that is not a plain slug: '..', '/' or a space in it would
    name a folder elsewhere, or a second folder for one machine."""
    if not is_key(hardware_key):
        raise BaselineError(f"{root}: {hardware_key!r} is not a hardware key ({KEY_RULE})")
    return Path(root) / hardware_key


def family_path(root: Path, hardware_key: str, family: str) -> Path:
    """Where a family's baselines for a hardware key live."""
    return key_folder(root, hardware_key) / f"{family}.json"


def load_file(path: Path, *, hardware_key: str | None = None, family: str | None = None) -> dict:
    """Load and validate one baseline file. Raises BaselineError with a one-line message."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise BaselineError(f"{path}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        # Not an OSError: without this a stray binary byte ended the run with an INTERNALERROR traceback.
        raise BaselineError(f"{path}: byte {e.start}: not UTF-8 text") from None
    return validate_file(parse_document(text, str(path)), str(path), hardware_key=hardware_key, family=family)


def entry_fingerprint(doc: Mapping[str, Any], entry: Mapping[str, Any]) -> dict:
    """The machine a stored entry was recorded on: the one it names, else (written before entries named
    theirs) the file header's ({} when that names none)."""
    return doc.get("fingerprints", {}).get(entry.get("fingerprint", "")) or doc["fingerprint"]


@dataclass
class BaselineEntry:
    """A stored entry, as the gate reads it."""

    definition_hash: str
    metrics: dict[str, Metric]
    provenance: dict
    recorded: dict = field(default_factory=dict)  # what ran when it was recorded (decode: engine's backends)
    machines: tuple[str, ...] = ()  # the machines that measured it (none named: recorded before they were)
    independent_runs: int | None = None  # processes / engine instances its values are medians of
    gpus: tuple[dict, ...] = ()  # the GPUs that ran it ({index, uuid}; none named: recorded before they were)
    # metric -> the machines that recorded it, for a metric that names its own (measured on fewer than the entry)
    metric_machines: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def machines_of(self, metric: str) -> tuple[str, ...]:
        """The machines that recorded a metric of this entry: its own where it names them, else the entry's."""
        return self.metric_machines.get(metric) or self.machines

    def measured_on(self, machine: str, metric: str | None = None) -> bool:
        """Whether `machine` (hardware.machine_id) is one of the machines that recorded this entry (with
        `metric`: that metric of it)."""
        return machine in (self.machines_of(metric) if metric is not None else self.machines)

    def recorders(self, machine: str) -> dict[str, Recorders]:
        """Per stored metric, who recorded it as the gate reads it from `machine` (compare.compare_case)."""
        return {n: Recorders(not self.measured_on(machine, n), len(self.machines_of(n))) for n in self.metrics}

    def other_gpu(self, gpu: Mapping[str, Any] | None) -> str:
        """'' when `gpu` (hardware.own_gpu) is one of the GPUs that recorded this entry, or either names none
        (an entry from before entries named their GPU gates as it always did); else the recording GPUs'
        indices ('2', '2, 5'), for the verdict row."""
        if not gpu or not gpu.get("uuid") or not self.gpus or gpu["uuid"] in {g.get("uuid") for g in self.gpus}:
            return ""
        return ", ".join(str(g.get("index", "?")) for g in self.gpus)


@dataclass
class BaselineSet:
    """All baseline files of one hardware key, loaded and validated up front (at session start, so a
    malformed file stops the run before anything is measured)."""

    root: Path
    hardware_key: str
    docs: dict[str, dict] = field(default_factory=dict)  # family -> document

    @classmethod
    def load(cls, root: Path, hardware_key: str) -> "BaselineSet":
        """Load every `<root>/<hardware_key>/<family>.json`; a missing folder is an empty set."""
        folder = key_folder(root, hardware_key)
        docs: dict[str, dict] = {}
        if folder.is_dir():
            for path in sorted(folder.glob("*.json")):
                docs[path.stem] = load_file(path, hardware_key=hardware_key, family=path.stem)
        return cls(Path(root), hardware_key, docs)

    def entry(self, family: str, key: str) -> BaselineEntry | None:
        """The stored entry for a case key, or None."""
        doc = self.docs.get(family)
        raw = doc["entries"].get(key) if doc else None
        if raw is None:
            return None
        where = str(family_path(self.root, self.hardware_key, family))
        metrics = {n: validate_metric(m, where, f"entries[{key!r}].metrics.{n}") for n, m in raw["metrics"].items()}
        return BaselineEntry(raw["definition_hash"], metrics, raw["provenance"], dict(raw.get("recorded") or {}),
                             tuple(raw.get("machines") or ()), raw.get("independent_runs"),
                             tuple(raw.get("gpus") or ()),
                             {n: tuple(m["machines"]) for n, m in raw["metrics"].items() if m.get("machines")})

    def fingerprint(self, family: str, key: str | None = None) -> dict | None:
        """The machine a case's stored entry was recorded on (entry_fingerprint); with no key, or no such
        entry, the file header's."""
        doc = self.docs.get(family)
        return entry_fingerprint(doc, doc["entries"].get(key) or {}) if doc else None


@functools.lru_cache(maxsize=64)
def _load_by_stamp(path: str, mtime_ns: int, size: int) -> dict:
    return load_file(Path(path))


def _load_cached(path: Path) -> dict:
    """load_file, read once per file version: every NEW case of a run asks about the other hardware."""
    st = path.stat()
    return _load_by_stamp(str(path), st.st_mtime_ns, st.st_size)


def _other_hardware_files(root: Path, hardware_key: str, family: str = "*") -> Iterator[Path]:
    """`<root>/<key>/<family>.json` of every hardware key but `hardware_key`, in key order."""
    root = Path(root)
    if not root.is_dir():
        return
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and p.name != hardware_key):
        yield from sorted(p for p in folder.glob(f"{family}.json") if p.is_file())


def other_hardware_entries(root: Path, hardware_key: str, family: str, key: str) -> dict[str, BaselineEntry]:
    """Entries for the same case key stored under other hardware keys (reported as ENV_MISMATCH).
    Unreadable files of other hardware are skipped here: they are not this run's to validate (the
    plugin names them once, at start and end, through other_hardware_problems)."""
    found: dict[str, BaselineEntry] = {}
    for path in _other_hardware_files(root, hardware_key, family):
        try:
            entry = BaselineSet(Path(root), path.parent.name, {family: _load_cached(path)}).entry(family, key)
        except BaselineError:
            continue
        if entry is not None:
            found[path.parent.name] = entry
    return found


def other_hardware_problems(root: Path, hardware_key: str) -> list[str]:
    """One line per baseline file of other hardware that does not load, naming the file and its (first)
    problem: other_hardware_entries skips such a file, and a file dropped without a word hides its
    entries' ENV_MISMATCH rows and notes. Returned, not printed: the caller reports them."""
    problems = []
    for path in _other_hardware_files(root, hardware_key):
        try:
            _load_cached(path)
        except BaselineError as e:
            lines = str(e).splitlines()  # several problems: a count line, then one indented line each
            first = lines[1].strip().removeprefix(f"{path}: ") if len(lines) > 1 else ""
            problems.append(f"{lines[0]}, the first: {first}" if first else lines[0])
    return problems


def new_document(hardware_key: str, family: str, fingerprint: dict, now: str) -> dict:
    """An empty baseline document."""
    return {
        "schema_version": SCHEMA_VERSION,
        "hardware_key": hardware_key,
        "family": family,
        "fingerprint": fingerprint,
        "created": now,
        "updated": now,
        "entries": {},
    }


def merge_entries(doc: dict | None, hardware_key: str, family: str, fingerprint: dict, now: str,
                  updates: Mapping[str, dict],
                  refused: dict[str, list[str]] | None = None) -> tuple[dict, list[EntryChange]]:
    """Return a new document with `updates` (case key -> entry) written over `doc`, and the changes it
    makes (EntryChange: numbers, which moebench.outputs.baseline_lines words). Entries not in `updates` are kept
    as they are, and so is the header's `fingerprint` (see moebench.baselines.schema); each updated entry
    names the machine it was measured on: `fingerprint` (the run's machine) unless the update carries its
    own as an object (a promoted proposal's). Each entry is prepared by record.prepare_entry (the gate it gets, stated: a cliff, a
    noise too wide to gate, the tolerance rule; a reviewer's stored rel_tol kept); a stored metric the
    update does not measure is dropped, and said so. With `refused` (the writers' way), an entry the schema
    refuses is left out, the others merged, and its problems go there (case key -> lines); without it
    nothing is checked here (the caller validates the document).
    A version 1 document says SCHEMA_VERSION once it holds what version 1 cannot say (schema.V2_FIELDS)."""
    out = json.loads(json.dumps(doc)) if doc else new_document(hardware_key, family, {}, now)
    changes: list[EntryChange] = []
    for key, entry in sorted(updates.items()):
        entry, notes = prepare_entry(key, json.loads(json.dumps(entry)), out["entries"].get(key))
        problems = entry_problems(entry, f"{hardware_key}/{family}.json", key) if refused is not None else []
        if problems:
            refused[key] = problems
            continue
        changes.extend(notes)
        entry = _with_machine(out, entry, fingerprint)
        old = out["entries"].get(key)
        if old is not None:
            now_on = out.get("fingerprints", {}).get(entry.get("fingerprint", ""), {})
            changes.extend(_entry_changes(key, old, entry, entry_fingerprint(out, old), now_on))
        else:
            changes.append(EntryChange("entry added", key, metrics=tuple(
                (n, m["value"], m["unit"]) for n, m in sorted(entry["metrics"].items()))))
        out["entries"][key] = entry
    _keep_named_fingerprints(out)
    if needs_v2(out):
        out["schema_version"] = SCHEMA_VERSION
    out["updated"] = now
    return out, changes


def _with_machine(doc: dict, entry: dict, fingerprint: dict) -> dict:
    """The entry naming its machine by id, that machine added to the document's `fingerprints`. An entry
    with no known machine (an empty fingerprint) names none."""
    fp = entry.pop("fingerprint", None)
    fp = fp if isinstance(fp, dict) else fingerprint
    if fp:
        fid = fingerprint_id(fp)
        doc.setdefault("fingerprints", {})[fid] = fp
        entry["fingerprint"] = fid
    return entry


def _keep_named_fingerprints(doc: dict) -> None:
    """Drop the header's fingerprints no entry names any more (the entries recorded there were re-recorded)."""
    named = {e.get("fingerprint") for e in doc["entries"].values()}
    table = {fid: fp for fid, fp in doc.get("fingerprints", {}).items() if fid in named}
    if table:
        doc["fingerprints"] = table
    else:
        doc.pop("fingerprints", None)


def _entry_changes(key: str, old: dict, entry: dict, was: dict, now: dict) -> list[EntryChange]:
    """The changes to a stored entry (recorded on `was`) rewritten by `entry` (measured on `now`, its
    rel_tols already chosen by record.prepare_entry)."""
    changes: list[EntryChange] = []
    stored = old.get("metrics", {})
    for name, m in sorted(entry["metrics"].items()):
        before = stored.get(name, {}).get("value")
        if before is None:
            changes.append(EntryChange("metric added", key, name, after=m["value"], unit=m["unit"]))
        elif before != m["value"]:
            changes.append(EntryChange("metric changed", key, name, before, m["value"], m["unit"]))
    for name in sorted(set(stored) - set(entry["metrics"])):
        # a CPU run filed under an H200 key used to drop the entry's graph_us without a word
        changes.append(EntryChange("metric dropped", key, name))
    if old.get("definition_hash") != entry["definition_hash"]:
        changes.append(EntryChange("definition changed", key))
    if was and now and machine_name(was) != machine_name(now):
        changes.append(EntryChange("machine changed", key, before=machine_name(was), after=machine_name(now)))
    return changes


def looser_tolerances_kept(doc: dict | None, updates: Mapping[str, dict]) -> list[EntryChange]:
    """A change for each updated metric whose stored rel_tol (kept by merge_entries) is wider than the one
    the case measures with: an update keeps a reviewer's tolerance, and says so when it is a looser one."""
    lines = []
    for key, entry in sorted(updates.items()):
        stored = ((doc or {}).get("entries", {}).get(key) or {}).get("metrics", {})
        for name, m in sorted(entry["metrics"].items()):
            kept = stored.get(name, {}).get("rel_tol")
            if kept is not None and kept > m["rel_tol"]:
                lines.append(EntryChange("looser tolerance kept", key, name, kept, m["rel_tol"]))
    return lines


def check_writable(folder: Path, what: str = "baseline folder") -> None:
    """Raise BaselineError naming the folder when files could not be written there."""
    folder = Path(folder)
    probe_dir = folder
    while not probe_dir.exists():
        probe_dir = probe_dir.parent
    if not os.access(probe_dir, os.W_OK | os.X_OK) or not probe_dir.is_dir():
        raise BaselineError(f"{folder}: {what} is not writable")
