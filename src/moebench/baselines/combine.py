"""One baseline entry from several independent runs of a case: separate processes, engine instances or
machines (`moebench baselines promote run1.json run2.json run3.json`).

A single run's spread says how its samples scatter, not how far the next process lands: on one H200 the
same case agreed within 0.7% across 8 processes, and spread 10% across four machines. So an entry stores
the median of its machines' medians (on one machine, of its runs' values), and two spreads:

- noise: what the gate uses on a recording machine, the larger of the spread inside any run and the
  spread between the runs of one machine (half their range over the median: with 3 runs a MAD can read 0);
- noise_machines: only from runs on two or more machines, the spread between the machines' medians (half
  their range over the median), which the gate uses on any other machine of the kind; a source combined
  before over several machines keeps its own spread, so adding a machine never narrows it.

Pure functions over entry dicts (the baseline file's own form): no I/O.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Sequence

from moebench.baselines.schema import BaselineError


def half_range(values: Sequence[float]) -> float:
    """Half the range of values over their median (0 for fewer than two, or a zero median)."""
    if len(values) < 2:
        return 0.0
    mid = statistics.median(values)
    return (max(values) - min(values)) / 2 / abs(mid) if mid else 0.0


def _same(entries: Sequence[dict], get, what: str, where: str):
    seen = {repr(get(e)) for e in entries}
    if len(seen) > 1:
        raise BaselineError(f"{where}: the runs disagree on {what} ({', '.join(sorted(seen))}): not one case")
    return get(entries[0])


def own_rel_tol(ms: Sequence[dict]) -> float:
    """The case's own rel_tol among the runs' metrics: the last one the tight rule did not set (a source
    promoted before may carry the rule's 3%, which record.prepare_entry sets again from the new spread)."""
    own = [m["rel_tol"] for m in ms if m.get("tol_rule") is None]
    return own[-1] if own else ms[-1]["rel_tol"]


def _metric(name: str, runs: Sequence[tuple[str, dict]], where: str) -> dict:
    ms = [m for _, m in runs]
    for field in ("unit", "direction"):
        _same(ms, lambda m: m[field], f"{name}.{field}", where)
    by_machine: dict[str, list[float]] = defaultdict(list)
    for machine, m in runs:
        by_machine[machine].append(float(m["value"]))
    # the median of the machines' medians: a machine that ran three times weighs as one, so the entry
    # sits between its machines rather than on the one that ran most (on one machine: the runs' median)
    medians = [statistics.median(v) for v in by_machine.values()]
    between_runs = max(half_range(v) for v in by_machine.values())
    out = {"value": statistics.median(medians), "unit": ms[0]["unit"], "direction": ms[0]["direction"],
           "noise": round(max([between_runs] + [float(m["noise"]) for m in ms]), 6), "n": sum(int(m["n"]) for m in ms),
           "rel_tol": own_rel_tol(ms)}
    # a source already combined over machines carries their spread: a further machine can widen it, never
    # narrow it (its one median stands for all of its machines here, so the spread between them is kept)
    carried = [float(m["noise_machines"]) for m in ms if isinstance(m.get("noise_machines"), (int, float))]
    if len(by_machine) > 1 or carried:
        between = half_range(medians)
        out["noise_machines"] = round(max([between] + carried), 6)
    if any(m.get("gate") == "cliff" for m in ms):
        out["gate"] = "cliff"
    # what the metric is bound by: the tolerance rule needs it beside noise_machines (a kernel time whose
    # machines agree within 1% gates at 3%), and dropping it here kept that rule from ever firing
    kinds = {m["kind"] for m in ms if m.get("kind")}
    if len(kinds) > 1:
        raise BaselineError(f"{where}: the runs disagree on {name}.kind ({', '.join(sorted(kinds))}): not one case")
    if kinds:
        out["kind"] = kinds.pop()
    return out


def _provenance(entries: Sequence[dict], runs: int) -> dict:
    provs = [e["provenance"] for e in entries]
    commits = sorted({str(p.get("commit")) for p in provs})
    out = dict(provs[-1])
    out.update(commit=", ".join(commits), date=max(str(p.get("date", "")) for p in provs),
               combined=f"median of {runs} independent runs")
    # a reviewer's reason for a kept rel_tol lives in a stored source's note: taking only the last
    # source's provenance dropped it while the rel_tol it explains stayed
    reviewed = list(dict.fromkeys(str(p["commit_note"]) for p in provs if p.get("commit_note")))
    if reviewed:
        out["commit_note"] = "; ".join(reviewed)
    return out


def combine_entries(entries: Sequence[dict], where: str) -> dict:
    """One entry from the same case's entries of separate runs (each naming its machines and independent
    runs; an entry naming none counts as one run on an unknown machine). Metrics measured in every run
    are kept. Raises BaselineError naming `where` (the case) when the runs are not of one case."""
    if not entries:
        raise BaselineError(f"{where}: no run to combine")
    if len(entries) == 1:
        return dict(entries[0])
    def_hash = _same(entries, lambda e: e["definition_hash"], "the case definition (definition_hash)", where)
    # an entry of several machines (combined before) is one group of its own, not its first machine's run
    machine_of = ["+".join(sorted(e.get("machines") or ["unknown"])) for e in entries]
    names = [n for n in entries[0]["metrics"] if all(n in e["metrics"] for e in entries)]
    metrics = {n: _metric(n, [(mach, e["metrics"][n]) for mach, e in zip(machine_of, entries)], f"{where} {n}")
               for n in names}
    if not metrics:
        raise BaselineError(f"{where}: no metric was measured in every run")
    runs = sum(int(e.get("independent_runs") or 1) for e in entries)
    out = {"definition_hash": def_hash, "metrics": metrics, "provenance": _provenance(entries, runs),
           "machines": sorted({m for e in entries for m in (e.get("machines") or ["unknown"])}),
           "independent_runs": runs}
    gpus = {g["uuid"]: g for e in entries for g in (e.get("gpus") or ())}
    if gpus:  # the GPUs of every run (`moebench aa --per-gpu --promote`: each GPU of the box)
        out["gpus"] = [gpus[u] for u in sorted(gpus)]
    recorded = entries[-1].get("recorded")
    if recorded:
        out["recorded"] = recorded
    return out
