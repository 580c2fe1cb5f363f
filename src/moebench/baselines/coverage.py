"""How far a baseline file's metrics are from the bar a committed entry should meet: the median of at least
MIN_RUNS independent runs (processes, engine instances) on at least MIN_MACHINES machines.

The gate reads a metric of one machine as from that machine only, so on every other machine of the kind it
assumes the kind's spread between machines instead of a measured one; and a metric of fewer than three runs
has no spread between runs to speak of. `moebench baselines show` prints this tally under each file's header,
and `--short` lists only the metrics short of the bar: what the next lease should run.

Per metric, not per entry: counters counted on one machine beside a time of five machines fall short on
their own (rules.metric_machines, metric_runs). Pure: stored entries in, numbers out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from moebench.baselines.rules import metric_machines, metric_runs

MIN_RUNS = 3
MIN_MACHINES = 2


@dataclass(frozen=True)
class Shortfall:
    """One metric short of the bar: its runs (None: recorded before entries said) and machines; external:
    a figure from elsewhere (provenance kind "external", the users' 97 ms/token), which no run of ours makes."""

    key: str
    metric: str
    runs: int | None
    machines: int
    external: bool = False

    @property
    def reason(self) -> str:
        """"external", "unsaid" (recorded before entries named their runs and machines), "few runs" (fewer
        than MIN_RUNS) or "one machine" (enough runs, fewer than MIN_MACHINES machines)."""
        if self.external:
            return "external"
        if self.runs is None:
            return "unsaid"
        return "few runs" if self.runs < MIN_RUNS else "one machine"


def shortfall(key: str, entry: Mapping[str, Any], name: str) -> Shortfall | None:
    """The metric `name` of `entry` as a Shortfall, or None when it meets the bar."""
    m = entry["metrics"][name]
    runs, machines = metric_runs(entry, m), len(metric_machines(entry, m))
    external = (entry.get("provenance") or {}).get("kind") == "external"
    if not external and runs is not None and runs >= MIN_RUNS and machines >= MIN_MACHINES:
        return None
    return Shortfall(key, name, runs, machines, external)


@dataclass(frozen=True)
class Coverage:
    """metrics: how many were tallied; short: those short of the bar, in key and metric order."""

    metrics: int
    short: tuple[Shortfall, ...]

    def counts(self) -> dict[str, int]:
        """How many short metrics fall in each reason (Shortfall.reason), in a fixed order."""
        out = {"one machine": 0, "few runs": 0, "unsaid": 0, "external": 0}
        for s in self.short:
            out[s.reason] += 1
        return out


def coverage(entries: Mapping[str, Mapping[str, Any]], keys: Iterable[str]) -> Coverage:
    """The tally of every metric of the entries `keys`."""
    n, short = 0, []
    for k in sorted(keys):
        for name in sorted(entries[k]["metrics"]):
            n += 1
            s = shortfall(k, entries[k], name)
            if s is not None:
                short.append(s)
    return Coverage(n, tuple(short))
