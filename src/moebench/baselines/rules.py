"""The gate a stored metric gets, as numbers: what `baselines show` and `baselines diff` print for each
metric, and what the diff compares to tell a looser gate from a tighter one.

compare.compare_metric applies these rules to a measurement; here they are read from the stored metric
alone (the entry's own `gate`, `rel_tol`, `noise`, `noise_machines` and `kind`), as a reviewer sees it, with
the machines that recorded it (metric_machines: the metric's own where it names them, else its entry's).
Pure: a stored metric's dict in, a GateRule out; the report layer words it (report.fmt_rule).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from moebench.baselines.compare import CLIFF, NOISE_FACTOR
from moebench.core.kinds import assumed_spread, further_machine_factor


@dataclass(frozen=True)
class GateRule:
    """gate: "tolerance", "cliff" (fails at 2x) or "none" (never gates: always AMBIGUOUS); rel_tol: the
    tolerance the gate applies (CLIFF for a cliff, inf for none); noise: the spread on a recording
    machine; machine_spread: the spread between machines used on any other machine, measured (noise_machines,
    the half range of the entry's `machines` recorders, widened for one machine more: measured_spread x
    kinds.further_machine_factor) or assumed for the metric's kind (moebench.core.kinds)."""

    gate: str
    rel_tol: float
    noise: float
    machine_spread: float
    measured_between: bool
    kind: str | None
    ruled: bool = False  # rel_tol set by the tight rule (three or more machines within 1%), not a reviewer
    measured_spread: float | None = None  # the half range the recorders measured (None: assumed)
    machines: int = 0  # how many machines recorded it (0: not said)

    def lets_through(self, other_machine: bool) -> float:
        """The largest slowdown (compare.slowdown) that does not fail: the tolerance or the noise band,
        whichever is wider (a change inside either is PASS or AMBIGUOUS)."""
        if self.gate == "none":
            return math.inf
        spread = max(self.noise, self.machine_spread) if other_machine else self.noise
        return max(self.rel_tol, NOISE_FACTOR * spread)


def _number(x: Any, default: float) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else default


def metric_machines(entry: Mapping[str, Any], metric: Mapping[str, Any]) -> tuple[str, ...]:
    """The machines that recorded a stored metric: its own `machines` where it names them (a metric measured
    on fewer machines than its entry: counters counted on one machine beside a time of four, see
    combine.combine_entries), else its entry's (none: an entry recorded before entries named them)."""
    return tuple(metric.get("machines") or entry.get("machines") or ())


def metric_runs(entry: Mapping[str, Any], metric: Mapping[str, Any]) -> int | None:
    """The independent runs a stored metric's value is the median of: its own `independent_runs` where it
    names them, else its entry's (None: recorded before entries said)."""
    return metric.get("independent_runs", entry.get("independent_runs"))


def rule_of(m: Mapping[str, Any], machines: int = 0) -> GateRule:
    """The rule a stored metric gets from its own fields (a field missing reads as the gate's default) and
    the number of machines that recorded it (`machines`, len(metric_machines(...)): their half range widens
    for one more machine)."""
    gate = m.get("gate") if m.get("gate") in ("cliff", "none") else "tolerance"
    tol = {"cliff": CLIFF, "none": math.inf}.get(gate, _number(m.get("rel_tol"), 0.0))
    between = m.get("noise_machines")
    measured = isinstance(between, (int, float)) and not isinstance(between, bool)
    spread = float(between) * further_machine_factor(machines) if measured else assumed_spread(m.get("kind"))
    return GateRule(gate, tol, _number(m.get("noise"), 0.0), spread, measured, m.get("kind"),
                    ruled=m.get("tol_rule") == "tight", measured_spread=float(between) if measured else None,
                    machines=machines)
