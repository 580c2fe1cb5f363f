"""What an entry says when it is recorded: the gate it gets, stated in the entry itself.

`--baseline-update`, `--baseline-propose` and `moebench baselines promote` all write through
store.merge_entries, which prepares each entry here first, so that a stored metric reads as the gate
applies it:

- a cliff metric (a decode scenario's `cliff_metrics`) stores `gate: "cliff"` and rel_tol 1.0 (CLIFF),
  what the gate applies (committed TTFT entries read rel_tol 0.6 while the gate applied a doubling);
- a metric whose noise is too wide to gate (over NOISE_MAX: a loaded 2-core box read 0.55-1.3) stores
  `gate: "none"`: its value is kept and it always compares AMBIGUOUS, and a line says how to gate it
  (the schema refused such an entry, and with it every other entry of its file);
- a device kernel time whose measured spread between three or more machines (of that metric: a metric
  naming its own `machines` counts those) is within 1% gates at 3% (kinds.ruled_rel_tol), marked
  `tol_rule: "tight"` so that a later promotion sets it again from its data;
- a stored rel_tol wider than the case's own is a reviewer's and is kept (and said, by
  store.looser_tolerances_kept); one at most the case's own is kept when tighter than the rule's.

Pure: dicts in, dicts and EntryChange records out.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

from moebench.baselines.compare import CLIFF
from moebench.baselines.entry_change import EntryChange
from moebench.baselines.rules import metric_machines
from moebench.baselines.schema import NOISE_MAX
from moebench.core.kinds import ruled_rel_tol

# a metric's `tol_rule`: its rel_tol was set by the tight rule (kinds.ruled_rel_tol), not by a reviewer
TOL_RULE_TIGHT = "tight"


def choose_rel_tol(new: Mapping[str, Any], stored: Mapping[str, Any] | None, machines: int) -> float:
    """The rel_tol a recorded metric stores: CLIFF for a cliff; else the rule's (kinds.ruled_rel_tol, for
    a metric recorded on `machines` machines: rules.metric_machines) over the case's own, a stored one kept
    when it is wider than the case's own (a reviewer's) or tighter. A stored one the rule set (`tol_rule`)
    is the rule's to set again from the new spread, not a reviewer's to keep: a third machine that
    disagrees must be able to undo it."""
    if new.get("gate") == "cliff":
        return CLIFF
    own = float(new["rel_tol"])
    ruled = ruled_rel_tol(new.get("kind"), own, new.get("noise_machines"), machines)
    if (not stored or stored.get("gate") in ("cliff", "none") or "rel_tol" not in stored
            or stored.get("tol_rule") == TOL_RULE_TIGHT):
        return ruled
    kept = float(stored["rel_tol"])
    return kept if kept > own else min(kept, ruled)


def prepare_entry(key: str, entry: dict, stored: Mapping[str, Any] | None) -> tuple[dict, list[EntryChange]]:
    """The entry as it is written over `stored` (the entry there now, or None), and a change for each rule
    applied that the value changes do not show (a metric stored as not gating, a tolerance set by a rule)."""
    out = copy.deepcopy(entry)
    lines: list[EntryChange] = []
    old = (stored or {}).get("metrics") or {}
    for name, m in sorted(out.get("metrics", {}).items()):
        if not isinstance(m, dict):
            continue  # refused by the schema's check, with the field named
        noise = m.get("noise")
        if isinstance(noise, (int, float)) and noise > NOISE_MAX and m.get("gate") != "none":
            m["gate"] = "none"
            lines.append(EntryChange("stored as not gating", key, name, noise, NOISE_MAX))
        if m.get("gate") == "none" or not isinstance(m.get("rel_tol"), (int, float)):
            continue
        before = m["rel_tol"]
        m.pop("tol_rule", None)  # a source's mark says what the rule did there, not here
        # the metric's own machines: a kernel time measured on one of the entry's four has no spread of three
        machines = len(metric_machines(out, m))
        m["rel_tol"] = choose_rel_tol(m, old.get(name), machines)
        if m["rel_tol"] < before and m["rel_tol"] == ruled_rel_tol(m.get("kind"), before, m.get("noise_machines"),
                                                                   machines):
            m["tol_rule"] = TOL_RULE_TIGHT  # what set it, for the next promotion and the reviewer
        stored_tol = (old.get(name) or {}).get("rel_tol")
        if m["rel_tol"] < before and m["rel_tol"] != stored_tol and m.get("gate") != "cliff":
            lines.append(EntryChange("tolerance ruled", key, name, stored_tol if stored_tol is not None else before,
                                     m["rel_tol"], spread=m["noise_machines"]))
    return out, lines
