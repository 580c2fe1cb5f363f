"""Hold each machine out: would the entries combined from the other machines' runs have gated its runs
without a false verdict? (`moebench baselines holdout RUN...`)

A fresh machine is the only honest test of a tolerance meant for any machine of a kind, and a promotion
already holds several: before the entries are written, each machine of the sources in turn plays the fresh
one. Its runs are gated, as on a machine that recorded none of the entries, against what promote would have
stored from the rest (combine.combine_entries, then record.prepare_entry over the entry stored now, so the
same tolerance rules apply). On unchanged code every verdict other than PASS or AMBIGUOUS is a false one.
Session 14: two H200s read the w4 decode router category 0.0% apart; the third read it 3.9% off (a false
IMPROVEMENT at the 3% their agreement gave), and holding machine A out of four showed 6 bf16 cases it runs
2.4-4% faster than three machines that agree within 1%.

Pure: entry dicts (the baseline file's form) in, rows out; the CLI reads the files and prints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from moebench.baselines.combine import combine_entries
from moebench.baselines.compare import Comparison, Verdict, case_verdict, compare_metric
from moebench.baselines.record import prepare_entry
from moebench.baselines.rules import metric_machines
from moebench.baselines.schema import validate_metric

FALSE = (Verdict.REGRESSION, Verdict.IMPROVEMENT)


def machine_group(entry: Mapping) -> str:
    """The machines an entry was measured on, as one name ("unknown" for an entry naming none): a source
    combined before over several machines is held out, and held in, as one."""
    return "+".join(sorted(entry.get("machines") or ["unknown"]))


@dataclass(frozen=True)
class HeldOut:
    """One run of a case on the held-out machine, gated against the entry the others would make."""

    machine: str
    key: str
    verdict: Verdict
    comparisons: Mapping[str, Comparison]  # per gated metric
    others: int  # machines the entry was combined from


def hold_out(runs: Mapping[str, Sequence[dict]], stored: Mapping[str, dict],
             from_stored: Mapping[str, Sequence[bool]] | None = None,
             uncounted: Mapping[str, Sequence[bool]] | None = None) -> list[HeldOut]:
    """For each case (`runs`: key -> its entries from every source) and each of its machine groups with
    at least two others beside it, that group's runs gated against the other groups' combined entry
    (prepared over `stored[key]`, the entry in the baseline file now, if any). `from_stored[key][i]`: the
    i-th of runs[key] comes from a stored baseline file or a proposal, which may predate a metric (as
    promote combines them; none given: every run is a measured one); `uncounted[key][i]`: it is a measured
    run that did not count the case (combine.combine_entries). Cases measured on fewer than three
    machine groups are left out: one machine left over has no spread between machines to test."""
    out: list[HeldOut] = []
    for key in sorted(runs):
        kinds = (from_stored or {}).get(key) or [False] * len(runs[key])
        counting = (uncounted or {}).get(key) or [False] * len(runs[key])
        groups: dict[str, list[tuple[dict, bool, bool]]] = {}
        for e, is_stored, not_counted in zip(runs[key], kinds, counting, strict=True):
            groups.setdefault(machine_group(e), []).append((e, is_stored, not_counted))
        if len(groups) < 3:
            continue
        for machine in sorted(groups):
            rest = [t for g, ts in groups.items() if g != machine for t in ts]
            combined = combine_entries([e for e, _, _ in rest], key, [s for _, s, _ in rest], [u for _, _, u in rest])
            entry, _ = prepare_entry(key, combined, stored.get(key))
            out += [_held_out_run(machine, key, run, entry, len(groups) - 1) for run, _, _ in groups[machine]]
    return out


def _held_out_run(machine: str, key: str, run: dict, entry: dict, others: int) -> HeldOut:
    """One held-out run gated against the entry the others make, on a machine that recorded none of it,
    each metric with the spread of the machines that recorded that metric (rules.metric_machines)."""
    comps = {}
    for n, m in run["metrics"].items():
        if n not in entry["metrics"]:
            continue
        stored = entry["metrics"][n]
        comps[n] = compare_metric(validate_metric(m, key, f"{key}.{n}"), validate_metric(stored, key, f"{key}.{n}"),
                                  other_machine=True, machines=len(metric_machines(entry, stored)))
    return HeldOut(machine, key, case_verdict(comps), comps, others)


def false_verdicts(rows: Sequence[HeldOut]) -> list[tuple[HeldOut, str, Comparison]]:
    """(row, metric, comparison) for each metric that read REGRESSION or IMPROVEMENT."""
    return [(r, n, c) for r in rows for n, c in sorted(r.comparisons.items()) if c.verdict in FALSE]
