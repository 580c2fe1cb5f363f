"""What changed between two sets of baseline entries, field by field, and which changes loosen the gate.

Pure: entries in, Change records out; `moebench baselines diff` formats them. A change loosens the gate
when it lets a slower measurement pass that passed no check before: an entry or a metric removed (its
case or metric no longer gated), a wider tolerance (rel_tol up), a wider noise band (noise up: the gate
reads a change inside NOISE_FACTOR x noise as AMBIGUOUS), a metric no longer gated, or a flipped
direction (worse then reads better); a gate set to "cliff" or "none", a wider or removed spread between
machines, a kind whose assumed spread is wider, and a machine dropped from `machines` (it then gates
with the spread between machines): each was once an edit that let a -90% regression pass unflagged. A
stored noise of 50 switched the gate off for a case, and the diff of the time said "0 changed": every
field is compared here, also ones this code does not know.

A metric that names its own `machines` (measured on fewer than its entry: rules.metric_machines) is judged
by those: gaining, changing or losing them loosens the gate where a machine that recorded it no longer
counts as one, and its spread between machines is judged over its own machines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from moebench.baselines.rules import metric_machines, rule_of

Key = tuple[str, str, str]  # (hardware key, family, case key)

# Entry fields shown their own way (definition_hash as one phrase, provenance only beside other changes).
_ENTRY_SPECIAL = ("metrics", "definition_hash", "provenance")


@dataclass(frozen=True)
class Change:
    """One changed field. `metric` is None for the entry itself or one of its fields; `field` is "added"
    or "removed" for a whole entry or metric; `looser` says why the change loosens the gate ("" when it
    does not)."""

    key: Key
    metric: str | None
    field: str
    old: Any = None
    new: Any = None
    looser: str = ""


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _machines_gone(old: Sequence[str], new: Sequence[str], what: str) -> str:
    """Why recorders dropped from `old` to `new` loosen the gate, or "" when none was dropped: a machine no
    longer named as one that recorded `what` gates with the spread between machines there."""
    gone = sorted(set(old) - set(new))
    if not gone:
        return ""
    return (f"{', '.join(gone)} no longer named as recording: the spread between machines applies there "
            f"instead of {what}")


def _metric_looser(field: str, old: Mapping[str, Any], new: Mapping[str, Any],
                   recorders: tuple[Sequence[str], Sequence[str]]) -> str:
    """Why changing a stored metric's `field` (old and new: the whole metric; recorders: the machines that
    recorded each side, rules.metric_machines) loosens the gate, or "". The tolerance, gate, spread between
    machines and kind are judged by the rule they make (rules.rule_of: a half range over fewer machines is a
    wider spread for a further one), so a field edit counts by what the gate then lets through, not by the
    number's size."""
    o, n = old.get(field), new.get(field)
    bigger = isinstance(o, (int, float)) and isinstance(n, (int, float)) and n > o
    ro, rn = rule_of(old, len(recorders[0])), rule_of(new, len(recorders[1]))
    if field == "rel_tol" and rn.rel_tol > ro.rel_tol:
        return "wider tolerance"
    if field == "gate" and rn.rel_tol > ro.rel_tol:
        return "not gated: always AMBIGUOUS" if rn.gate == "none" else "gated on a cliff only: fails at 2x"
    if field == "noise" and bigger:
        return "wider noise band"
    # the kind decides only an assumed spread: beside a measured one, the noise_machines check speaks for it
    kind_decides = field == "kind" and not rn.measured_between
    if (field == "noise_machines" or kind_decides) and rn.machine_spread > ro.machine_spread:
        if field == "kind":
            return f"kind {o} -> {n}: {_pct(rn.machine_spread)} between machines assumed (was {_pct(ro.machine_spread)})"
        if n is None:
            return f"spread between machines removed: {_pct(rn.machine_spread)} assumed (was {_pct(o)})"
        return "wider spread between machines"
    if field == "machines":  # the metric's own recorders, gained, changed or lost (its entry's stand in)
        return _machines_gone(recorders[0], recorders[1], "the metric's noise")
    if field == "direction":
        return "direction flipped: worse reads better"
    if field == "gated" and o is not False and n is False:
        return "no longer gated"
    return ""


def metric_changes(key: Key, name: str, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None,
                   recorders: tuple[Sequence[str], Sequence[str]] = ((), ())) -> list[Change]:
    """Every field of one stored metric that differs; value first, then the others by name (recorders: the
    machines that recorded the old and the new metric, rules.metric_machines)."""
    if old is None:
        return [Change(key, name, "added", None, dict(new or {}))]
    if new is None:
        return [Change(key, name, "removed", dict(old), None, "metric no longer gated")]
    fields = sorted(set(old) | set(new), key=lambda f: (f != "value", f))
    return [Change(key, name, f, old.get(f), new.get(f), _metric_looser(f, old, new, recorders))
            for f in fields if old.get(f) != new.get(f)]


def _entry_looser(field: str, old: Any, new: Any) -> str:
    """Why changing an entry's own `field` loosens the gate, or "": a machine no longer named as one that
    recorded it gates with the spread between machines (the entry's, or its kind's assumed one)."""
    if field == "machines":
        return _machines_gone(old or (), new or (), "the entry's noise")
    return ""


def entry_changes(key: Key, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> list[Change]:
    """Every change between two versions of one stored entry (None: the entry does not exist there)."""
    if old is None:
        return [Change(key, None, "added", None, dict(new or {}))]
    if new is None:
        return [Change(key, None, "removed", dict(old), None, "entry removed: the case is no longer gated")]
    out: list[Change] = []
    om, nm = old.get("metrics") or {}, new.get("metrics") or {}
    for name in sorted(set(om) | set(nm)):
        o, n = om.get(name), nm.get(name)
        out += metric_changes(key, name, o, n, (metric_machines(old, o or {}), metric_machines(new, n or {})))
    if old.get("definition_hash") != new.get("definition_hash"):
        out.append(Change(key, None, "definition_hash", old.get("definition_hash"), new.get("definition_hash")))
    for f in sorted((set(old) | set(new)) - set(_ENTRY_SPECIAL)):
        if old.get(f) != new.get(f):
            out.append(Change(key, None, f, old.get(f), new.get(f), _entry_looser(f, old.get(f), new.get(f))))
    if out and old.get("provenance") != new.get("provenance"):
        out.append(Change(key, None, "provenance", old.get("provenance"), new.get("provenance")))
    return out


def diff(a: Mapping[Key, Mapping[str, Any]], b: Mapping[Key, Mapping[str, Any]]) -> dict[Key, list[Change]]:
    """Key -> its changes from `a` to `b`, for every key of either side (an empty list: unchanged)."""
    return {k: entry_changes(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b))}


def loosening(changes: Mapping[Key, list[Change]]) -> list[Change]:
    """The changes that loosen the gate."""
    return [c for cs in changes.values() for c in cs if c.looser]
