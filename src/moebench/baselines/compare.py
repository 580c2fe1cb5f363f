"""The gate: one pure function turns a measurement and its baseline into a verdict.

No I/O, no clocks, no globals: tests feed it fake numbers.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Mapping

from moebench.core.kinds import UNKNOWN, assumed_spread, further_machine_factor
from moebench.core.metrics import Metric

# "Outside the noise" means the change exceeds this many times the larger relative spread of the two
# measurements. Two spreads, because either side can be the noisy one; 2x because a median of tens of
# samples rarely moves by more than one spread between clean runs of the same code.
NOISE_FACTOR = 2.0
# The spread between machines of one kind, assumed where a baseline was recorded on one machine only and
# is compared on another, is the metric kind's (moebench.core.kinds: 2% for a device kernel time, 50% for a
# host-bound number, ...); this one is for a metric whose kind neither side declares (an entry recorded
# before kinds existed): the same Kimi-K2.5 bf16 M = 128 case read 427-472 us on four H200s (+-5% around
# their middle, 2026-12-01, tree 733d5c3, the old timer). Recording on two machines replaces it with the
# measured spread (the entry's noise_machines).
UNKNOWN_MACHINE_SPREAD = assumed_spread(UNKNOWN)
# A host-bound (cliff) metric fails only when it doubles: its spread between machines and engine
# instances (TTFT of a 64-token eager prefill: 97 to 171 ms on three H200s) swallows any finer tolerance.
CLIFF = 1.0


class Outcome(str, enum.Enum):
    """Every outcome a row of a table can read, declared worst first: this declaration is the one order
    that every table, tally and plot shows outcomes in (DISPLAY_ORDER), and the gate's verdicts' severity
    (SEVERITY). The gate's own verdicts (Verdict) are among them under the same names; the others are a
    test's own outcomes and a comparison's MISSING. JSON stores the values."""

    REGRESSION = "REGRESSION"      # the gate: worse than tolerance and outside noise
    FAIL = "FAIL"                  # the test failed otherwise: an assert, pytest.fail, an exception
    ERROR = "ERROR"                # its setup or teardown failed (a fixture, the environment)
    MISSING = "MISSING"            # in the reference run, not in the candidate (moebench compare, report)
    STALE = "STALE"
    ENV_MISMATCH = "ENV_MISMATCH"
    AMBIGUOUS = "AMBIGUOUS"
    NEW = "NEW"
    IMPROVEMENT = "IMPROVEMENT"
    PASS = "PASS"
    SKIP = "SKIP"                  # could not run here; the reason names what is missing


class Verdict(str, enum.Enum):
    """The gate's outcome for one metric or one case: the Outcomes compare_metric gives, under the same
    names and values (declared in Outcome's order; their severity is SEVERITY, read from Outcome)."""

    REGRESSION = Outcome.REGRESSION.value
    STALE = Outcome.STALE.value
    ENV_MISMATCH = Outcome.ENV_MISMATCH.value
    AMBIGUOUS = Outcome.AMBIGUOUS.value
    NEW = Outcome.NEW.value
    IMPROVEMENT = Outcome.IMPROVEMENT.value
    PASS = Outcome.PASS.value


DISPLAY_ORDER: tuple[Outcome, ...] = tuple(Outcome)
# Higher is more severe (PASS lowest): the case verdict is its metrics' most severe.
SEVERITY = {v: len(DISPLAY_ORDER) - DISPLAY_ORDER.index(Outcome(v.value)) for v in Verdict}


def display_rank(outcome: str) -> int:
    """Where an outcome (an Outcome, a Verdict or its JSON string) sorts in DISPLAY_ORDER (an unknown one
    first: it needs a look)."""
    return DISPLAY_ORDER.index(outcome) if outcome in DISPLAY_ORDER else -1


@dataclass(frozen=True)
class Comparison:
    """A metric's verdict with the numbers behind it. `worse` is the slowdown as a ratio less one, positive
    when worse whatever the metric's direction: measured / baseline - 1 for a time, baseline / measured - 1
    for a rate, so a tolerance bounds the same slowdown either way (rel_tol 1.0: a time doubling, a rate
    halving). None when nothing was compared."""

    verdict: Verdict
    value: float
    baseline: float | None = None
    worse: float | None = None
    rel_tol: float | None = None
    noise: float | None = None
    reason: str = ""
    # Where the baseline's spread came from when the measurement is from a machine that did not record it:
    # the spread between machines the gate took (None: not measured, and then `assumed_spread`, the fallback
    # of the metric's `kind`, was used): the half range its `machines` recorders measured
    # (`measured_machine_spread`) widened for one more machine (kinds.further_machine_factor).
    other_machine: bool = False
    machine_spread: float | None = None
    kind: str | None = None
    assumed_spread: float | None = None
    # Set when the measurement ran on another GPU of the recording box than the one(s) that recorded it
    # (their indices, "2"): gated as another machine, since GPUs of one kind differ as machines do.
    other_gpu: str = ""
    measured_machine_spread: float | None = None
    machines: int = 0

    @property
    def delta_pct(self) -> float | None:
        """Plain relative change of the value against the baseline, in percent (sign as measured)."""
        if self.baseline in (None, 0):
            return None
        return 100.0 * (self.value - self.baseline) / self.baseline


def compare_metric(
    measured: Metric,
    baseline: Metric | None,
    *,
    stale: bool = False,
    env_mismatch: bool = False,
    throttled: bool = False,
    other_machine: bool = False,
    other_gpu: str = "",
    machines: int = 0,
) -> Comparison:
    """Verdict for one metric.

    REGRESSION needs both: worse (see Comparison.worse) than rel_tol (the baseline's, which a reviewer set;
    CLIFF for a host-bound metric) and worse than NOISE_FACTOR x the spread that applies: the larger noise
    of the two sides and, on a machine that did not record the baseline (other_machine), the spread
    between machines (the entry's noise_machines, the half range of its `machines` recorders, widened for
    one machine more by kinds.further_machine_factor; else the fallback of the metric's kind: the
    measurement's declared kind, else the entry's; moebench.core.kinds), on one that did the entry's
    noise_machines where it has one (its value is its machines' median); a case run on another GPU of the
    recording box than the one that recorded it (other_gpu: that GPU's index) counts as another machine.
    A throttled measurement, or a baseline stored as not gating (gate_off: its noise was too wide), is
    never PASS or REGRESSION: AMBIGUOUS.
    """
    other_machine = other_machine or bool(other_gpu)
    if env_mismatch:
        return Comparison(Verdict.ENV_MISMATCH, measured.value, baseline.value if baseline else None,
                          reason="baseline recorded on other hardware: not compared")
    if baseline is None:
        return Comparison(Verdict.NEW, measured.value, reason="no baseline entry")
    if stale:
        return Comparison(Verdict.STALE, measured.value, baseline.value, reason="case definition changed since recording")
    if measured.direction != baseline.direction:
        return Comparison(Verdict.STALE, measured.value, baseline.value,
                          reason=f"direction changed ({baseline.direction} -> {measured.direction})")
    if baseline.value == 0:
        return Comparison(Verdict.STALE, measured.value, 0.0, reason="baseline value is 0")
    worse = slowdown(measured.value, baseline.value, measured.direction)
    cliff = measured.cliff or baseline.cliff
    tol = CLIFF if cliff else baseline.rel_tol
    spread = max(measured.noise, baseline.noise)
    kind = measured.kind or baseline.kind
    between = assumed = measured_between = None
    if other_machine:
        measured_between = baseline.noise_machines
        if measured_between is None:
            assumed = assumed_spread(kind)
        else:
            between = measured_between * further_machine_factor(machines)
        spread = max(spread, between if between is not None else assumed)
    elif baseline.noise_machines is not None:
        # an entry of several machines is the median of their medians, not this machine's own value: one of
        # them sits up to that spread from it (session 9's machine read norms +7.5% from its 3-machine entry)
        spread = max(spread, baseline.noise_machines)
    noise = NOISE_FACTOR * spread
    common = dict(value=measured.value, baseline=baseline.value, worse=worse, rel_tol=tol, noise=noise,
                  other_machine=other_machine, machine_spread=between, kind=kind, assumed_spread=assumed,
                  other_gpu=other_gpu, measured_machine_spread=measured_between,
                  machines=machines if measured_between is not None else 0)
    if baseline.gate_off:
        return Comparison(Verdict.AMBIGUOUS, reason="baseline stored as not gating: its noise was too wide to gate "
                                                    "(re-record with more runs or on a quieter machine)", **common)
    if throttled:
        return Comparison(Verdict.AMBIGUOUS, reason="clocks throttled during the measurement", **common)
    if worse > tol:
        if worse > noise:
            why = "doubled (host-bound: gated on a cliff only)" if cliff else "worse than tolerance and outside noise"
            return Comparison(Verdict.REGRESSION, reason=why, **common)
        return Comparison(Verdict.AMBIGUOUS, reason="worse than tolerance but inside noise", **common)
    if -worse > tol and -worse > noise:
        return Comparison(Verdict.IMPROVEMENT, reason="better than tolerance and outside noise", **common)
    return Comparison(Verdict.PASS, **common)


def slowdown(value: float, baseline: float, direction: str) -> float:
    """How much worse `value` is than `baseline`, as a ratio less one (positive: worse): value / baseline
    - 1 for lower-is-better, baseline / value - 1 for higher-is-better (a rate at or below 0: infinitely
    worse). A plain relative change cannot pass -100% for a rate, so rel_tol 1.0 let a -90% rate pass;
    as a ratio, 1.0 fails a rate at half its baseline, as it fails a time at twice its baseline."""
    # as differences over the divisor: (105 - 100) / 100 is exactly 0.05, 105 / 100 - 1 is not
    if direction == "lower":
        return (value - baseline) / baseline
    return (baseline - value) / value if value > 0 else float("inf")


def pass_band(baseline: float, rel_tol: float, direction: str) -> tuple[float, float]:
    """The values a metric may read and still be neither worse nor better than `rel_tol` (slowdown's
    ratio, either way): [b (1 - t), b (1 + t)] for lower-is-better, [b / (1 + t), b / (1 - t)] for a rate
    (no upper edge, inf, from t = 1). The band a plot shades; the gate's noise can only widen it."""
    if direction == "lower":
        return baseline * (1 - rel_tol), baseline * (1 + rel_tol)
    return baseline / (1 + rel_tol), (baseline / (1 - rel_tol) if rel_tol < 1 else float("inf"))


@dataclass(frozen=True)
class Recorders:
    """Who recorded a stored metric, as the gate reads it: whether the measuring machine is not one of them
    (other_machine) and how many machines they were (0: not said)."""

    other_machine: bool = False
    machines: int = 0


def compare_case(measured: Mapping[str, Metric], stored: Mapping[str, Metric] | None, *, stale: bool = False,
                 env_mismatch: bool = False, throttled: bool = False,
                 other_machine: bool = False, other_gpu: str = "", machines: int = 0,
                 recorders: Mapping[str, Recorders] | None = None) -> dict[str, Comparison]:
    """Every gated metric of a measurement against a stored entry's metrics (None: no entry at all;
    other_machine: the measuring machine recorded none of the entry; machines: how many machines recorded
    it). A metric in `recorders` is gated with its own instead: a metric that names its own machines (a
    counter counted on one machine beside a time of four) is another machine's on the three that recorded
    only the time. The one comparison loop: the in-run gate and `moebench compare` both call it, so they
    cannot disagree."""
    out: dict[str, Comparison] = {}
    whole = Recorders(other_machine, machines)
    for name, metric in measured.items():
        if not metric.gated:
            continue
        base = stored.get(name) if stored is not None else None
        if stored is not None and base is None:
            out[name] = Comparison(Verdict.NEW, metric.value, reason="metric not in the stored entry")
            continue
        own = (recorders or {}).get(name, whole)
        out[name] = compare_metric(metric, base, stale=stale, env_mismatch=env_mismatch, throttled=throttled,
                                   other_machine=own.other_machine, other_gpu=other_gpu, machines=own.machines)
    return out


def deciding_metric(comparisons: Mapping[str, Comparison], verdict: Verdict, primary: str | None) -> str | None:
    """The metric a row shows: the first that decided a verdict other than PASS/NEW, else the primary."""
    if verdict not in (Verdict.PASS, Verdict.NEW):
        for name, c in comparisons.items():
            if c.verdict is verdict:
                return name
    return primary


def case_verdict(comparisons: Mapping[str, Comparison]) -> Verdict:
    """The case's verdict: the most severe of its metrics' (PASS when it has none)."""
    if not comparisons:
        return Verdict.PASS
    return max((c.verdict for c in comparisons.values()), key=SEVERITY.__getitem__)


def failing(verdict: Verdict, *, strict: bool) -> bool:
    """Whether a case verdict fails its test: REGRESSION always; NEW and STALE under --baseline-strict."""
    if verdict is Verdict.REGRESSION:
        return True
    return strict and verdict in (Verdict.NEW, Verdict.STALE)


def recorded_changes(before: Mapping[str, object], now: Mapping[str, object]) -> list[tuple[str, str, str]]:
    """What ran differently from the recording: (field, recorded, now) for every field both sides name
    whose text differs, sorted by field (report.fmt_changes makes the phrase). Lists compare as their
    ", "-joined text."""
    def text(v: object) -> str:
        return ", ".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)

    return [(k, text(before[k]), text(now[k])) for k in sorted(set(before) & set(now))
            if text(before[k]) != text(now[k])]
