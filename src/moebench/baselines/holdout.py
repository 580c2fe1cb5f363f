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


def hold_out(runs: Mapping[str, Sequence[dict]], stored: Mapping[str, dict]) -> list[HeldOut]:
    """For each case (`runs`: key -> its entries from every source) and each of its machine groups with
    at least two others beside it, that group's runs gated against the other groups' combined entry
    (prepared over `stored[key]`, the entry in the baseline file now, if any). Cases measured on fewer
    than three machine groups are left out: one machine left over has no spread between machines to test."""
    out: list[HeldOut] = []
    for key in sorted(runs):
        groups: dict[str, list[dict]] = {}
        for e in runs[key]:
            groups.setdefault(machine_group(e), []).append(e)
        if len(groups) < 3:
            continue
        for machine in sorted(groups):
            rest = [e for g, es in groups.items() if g != machine for e in es]
            entry, _ = prepare_entry(key, combine_entries(rest, key), stored.get(key))
            baseline = {n: validate_metric(m, key, f"{key}.{n}") for n, m in entry["metrics"].items()}
            for run in groups[machine]:
                comps = {n: compare_metric(validate_metric(m, key, f"{key}.{n}"), baseline[n], other_machine=True,
                                           machines=len(entry.get("machines") or ()))
                         for n, m in run["metrics"].items() if n in baseline}
                out.append(HeldOut(machine, key, case_verdict(comps), comps, len(groups) - 1))
    return out


def false_verdicts(rows: Sequence[HeldOut]) -> list[tuple[HeldOut, str, Comparison]]:
    """(row, metric, comparison) for each metric that read REGRESSION or IMPROVEMENT."""
    return [(r, n, c) for r in rows for n, c in sorted(r.comparisons.items()) if c.verdict in FALSE]
