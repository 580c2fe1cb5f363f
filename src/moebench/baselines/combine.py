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

An entry's metric over two or more machines also stores each machine's median and run count (`by_machine`;
not a hardware counter's, a count that machines agree on), so the
next promotion weighs its machines one by one: without it, the committed entry of four machines stood as
one median beside a new machine's, and one new machine moved the value halfway towards itself. A machine's
stored median counts as that many runs of it when its new runs join it (the median of the repeated median
and the new values: exact when the stored runs agreed). A source stored before `by_machine` existed is one
group of its machines ("gpu-a+gpu-b", its `by_machine` key once combined) with its own spread carried; in
the value it stands for each of its machines at its one median, so a fifth machine beside a group of four
is one of five there too.

A source is a measured run (a results file) or stored (a baseline file or a proposal, whose entries may
predate a metric). A metric is kept when every measured run among the sources has it, over the sources
that have it: counters counted on one new machine, promoted with the committed file whose time entries
span four, keep those four machines' time and store the counters as measured on the one (the metric's own
`machines` and `independent_runs`, written only where they differ from the entry's). A metric a measured
run lacks is left out (a case that no longer measures it, or a kernel renamed under --counters):
metrics_left_out says which, for the caller to say so. A run that did not count the case (made without
--counters, or on a machine that could not count) lacks its hardware counters without saying they went:
its time joins the timed runs' and the counters stay those of the runs that counted (`uncounted`). Timing
is cheap and counting is not (an 86-case run: 2 minutes timed, 9 under ncu), so three timed runs and one
counted one are the usual sources.

Pure functions over entry dicts (the baseline file's own form): no I/O.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Sequence

from moebench.baselines.rules import metric_machines, metric_runs
from moebench.baselines.schema import BaselineError
from moebench.core.kinds import DEVICE_COUNTER


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


GROUP_JOIN = "+"  # joins the machines of a group stored as one median ("gpu-a+gpu-b")


def _machine_values(group: str, m: dict, runs: int) -> list[tuple[str, float, int]]:
    """(machine group, median, runs) of one source's metric: each machine of a stored `by_machine`, else
    the source as one group (a measured run: its machine, one run)."""
    stored = m.get("by_machine")
    if isinstance(stored, dict) and stored:
        return [(g, float(v["value"]), int(v["runs"])) for g, v in stored.items()]
    return [(group, float(m["value"]), runs)]


def _hides_machines(m: dict) -> bool:
    """Whether a source's metric stands for several machines whose medians it does not store: its spread
    between them (noise_machines) must be carried, since the groups here cannot show it."""
    stored = m.get("by_machine")
    if isinstance(stored, dict) and stored:
        return any(GROUP_JOIN in g for g in stored)
    return True


def _metric(name: str, runs: Sequence[tuple[str, dict, int]], where: str) -> dict:
    ms = [m for _, m, _ in runs]
    for field in ("unit", "direction"):
        _same(ms, lambda m: m[field], f"{name}.{field}", where)
    by_machine: dict[str, list[float]] = defaultdict(list)
    for group, m, n_runs in runs:
        for machine, value, count in _machine_values(group, m, n_runs):
            by_machine[machine].extend([value] * max(count, 1))
    # the median of the machines' medians: a machine that ran three times weighs as one, so the entry
    # sits between its machines rather than on the one that ran most (on one machine: the runs' median);
    # a group stored as one median stands for each of its machines at that median
    medians = {g: statistics.median(v) for g, v in by_machine.items()}
    between_runs = max(half_range(v) for v in by_machine.values())
    per_machine = [v for g, v in medians.items() for _ in g.split(GROUP_JOIN)]
    out = {"value": statistics.median(per_machine), "unit": ms[0]["unit"], "direction": ms[0]["direction"],
           "noise": round(max([between_runs] + [float(m["noise"]) for m in ms]), 6), "n": sum(int(m["n"]) for m in ms),
           "rel_tol": own_rel_tol(ms)}
    # a source already combined over machines it does not list one by one carries their spread: a further
    # machine can widen it, never narrow it (its one median stands for all of its machines here)
    carried = [float(m["noise_machines"]) for m in ms
               if isinstance(m.get("noise_machines"), (int, float)) and _hides_machines(m)]
    if len(by_machine) > 1 or carried:
        between = half_range(list(medians.values()))
        out["noise_machines"] = round(max([between] + carried), 6)
    # hardware counters are counts (instructions identical between machines, bytes within 0.1%): their
    # machines' medians would weigh nothing differently and triple a baseline file with counters
    if len(by_machine) > 1 and not any(m.get("kind") == DEVICE_COUNTER for m in ms):
        out["by_machine"] = {g: {"value": medians[g], "runs": len(v)} for g, v in sorted(by_machine.items())}
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


def _flags(entries: Sequence[dict], flags: Sequence[bool] | None, where: str) -> list[bool]:
    """One flag an entry (`stored`, `uncounted`), all False when None."""
    if flags is None:
        return [False] * len(entries)
    if len(flags) != len(entries):
        raise BaselineError(f"{where}: {len(flags)} source kinds for {len(entries)} runs")
    return [bool(f) for f in flags]


def _names_in_order(entries: Sequence[dict]) -> list[str]:
    """Every metric name of the entries, in the order they first appear."""
    return list(dict.fromkeys(n for e in entries for n in e["metrics"]))


def _is_counter(entries: Sequence[dict], name: str) -> bool:
    """Whether metric `name` is a hardware counter (kind DEVICE_COUNTER) in the entries that have it."""
    return any(e["metrics"][name].get("kind") == DEVICE_COUNTER for e in entries if name in e["metrics"])


def metrics_left_out(entries: Sequence[dict], stored: Sequence[bool] | None = None, where: str = "",
                     uncounted: Sequence[bool] | None = None) -> dict[str, tuple[int, ...]]:
    """The metrics combine_entries leaves out, each with the positions (in `entries`) of the measured runs
    that lack it; `stored[i]`: entries[i] comes from a stored source (a baseline file or a proposal), which
    may lack a metric recorded after it (None: every entry is a measured run); `uncounted[i]`: entries[i] is
    a measured run that did not count the case, whose lack of a hardware counter is no sign the counter went
    (None: every measured run counted what it lacks)."""
    flags = _flags(entries, stored, where)
    not_counting = _flags(entries, uncounted, where)
    out = {}
    for name in _names_in_order(entries):
        counter = _is_counter(entries, name)
        lacking = tuple(i for i, e in enumerate(entries)
                        if not flags[i] and name not in e["metrics"] and not (counter and not_counting[i]))
        if lacking:
            out[name] = lacking
    return out


def _metric_group(entry: dict, metric: dict) -> str:
    """The machine group a source's metric counts as: the machines that recorded that metric (a source
    combined before over several machines is one group of its own, not its first machine's run)."""
    return GROUP_JOIN.join(sorted(metric_machines(entry, metric) or ["unknown"]))


def _recorders(sources: Sequence[dict], name: str) -> tuple[list[str], int]:
    """The machines (sorted) and the independent runs of a metric over the sources that have it."""
    machines = sorted({m for e in sources for m in (metric_machines(e, e["metrics"][name]) or ["unknown"])})
    runs = sum(int(metric_runs(e, e["metrics"][name]) or 1) for e in sources)
    return machines, runs


def combine_entries(entries: Sequence[dict], where: str, stored: Sequence[bool] | None = None,
                    uncounted: Sequence[bool] | None = None) -> dict:
    """One entry from the same case's entries of separate runs (each naming its machines and independent
    runs; an entry naming none counts as one run on an unknown machine). `stored[i]`: entries[i] comes from
    a stored source (a baseline file or a proposal) rather than a measured run (None: every entry is a
    measured run); `uncounted[i]`: entries[i] is a measured run that did not count the case (None: all did).
    A metric is kept when every measured run has it (a hardware counter: every one that counted), combined
    over the entries that have it;
    one measured by fewer than all of them names its own `machines` and `independent_runs` where they differ
    from the entry's (metrics_left_out says which are left out). Raises BaselineError naming `where` (the
    case) when the runs are not of one case."""
    if not entries:
        raise BaselineError(f"{where}: no run to combine")
    if len(entries) == 1:
        return dict(entries[0])
    def_hash = _same(entries, lambda e: e["definition_hash"], "the case definition (definition_hash)", where)
    left_out = metrics_left_out(entries, stored, where, uncounted)
    sources = {n: [e for e in entries if n in e["metrics"]] for n in _names_in_order(entries) if n not in left_out}
    metrics = {n: _metric(n, [(_metric_group(e, e["metrics"][n]), e["metrics"][n],
                               int(metric_runs(e, e["metrics"][n]) or 1)) for e in es], f"{where} {n}")
               for n, es in sources.items()}
    if not metrics:
        raise BaselineError(f"{where}: no metric was measured in every measured run")
    runs = sum(int(e.get("independent_runs") or 1) for e in entries)
    out = {"definition_hash": def_hash, "metrics": metrics, "provenance": _provenance(entries, runs),
           "machines": sorted({m for e in entries for m in (e.get("machines") or ["unknown"])}),
           "independent_runs": runs}
    for name, es in sources.items():
        # said only where it differs from the entry's, so an entry whose metrics share its sources keeps its form
        own_machines, own_runs = _recorders(es, name)
        if own_machines != out["machines"]:
            metrics[name]["machines"] = own_machines
        if own_runs != runs:
            metrics[name]["independent_runs"] = own_runs
    gpus = {g["uuid"]: g for e in entries for g in (e.get("gpus") or ())}
    if gpus:  # the GPUs of every run (`moebench aa --per-gpu --promote`: each GPU of the box)
        out["gpus"] = [gpus[u] for u in sorted(gpus)]
    recorded = entries[-1].get("recorded")
    if recorded:
        out["recorded"] = recorded
    return out
