"""Change points in a case's history: where a metric's level moved across nightly runs, and whether
that move is big enough to report.

The gate compares one run with one stored baseline, so a slow drift (1-3% a night, each night inside
the tolerance) or a sub-tolerance step that stays passes it. Here the whole history of a case's metric
is segmented by `ruptures` (PELT over a median-shift cost, on the values scaled by the series' noise);
then each boundary is kept only when the level after it differs from the level before it by more than
the series' reporting threshold: the larger of NOISE_FACTOR x its noise (the gate's "outside the
noise") and half its tolerance; the level before it must span MIN_REFERENCE runs. A boundary below the
threshold is dropped and its segments merge, so a drift that moves a little each night is reported
where it has added up to the threshold.

The noise judged against is the larger of the runs' own recorded spread (median over the history) and
the spread between consecutive nights that the history itself shows (once it has HISTORY_NOISE_RUNS
runs): the intra-run spread alone undersells what moves from night to night.

Pure: no I/O. `ruptures` is an optional dependency (`pip install 'moebench[history]'`);
`require_ruptures()` says so in one line when it is missing.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass

from moebench.baselines.compare import NOISE_FACTOR

# The change point's run-after must be among a series' last RECENT runs for it to fail `moebench changes`.
RECENT = 3
# Shortest segment on either side of a change point: one odd night is an outlier, not a new level. It
# also sets the earliest a step can be found: the second night after it.
MIN_SEGMENT = 2
# Below this many runs the history's own night-to-night spread is not estimated (too few differences).
HISTORY_NOISE_RUNS = 6
# PELT's cost of one more segment, in units of the noise, per log n of the history. The cost is "l1"
# (absolute deviations from each segment's median): one odd night then cannot buy a segment of its own
# with a neighbour, as it can under the squared cost. 2.0 was chosen on the synthetic histories of
# docs/change-points.md: 1.5 let the noise of a 10%-noise allreduce case through, 2.5 found the quiet
# cases' drifts and steps later. The reporting threshold, not this, keeps small changes out; this keeps
# the segmentation from cutting the noise into pieces.
PENALTY_PER_LOG_N = 2.0
# A level is a reference for a change only once it spans this many runs: the median of fewer nights is
# itself too noisy (the synthetic A/A of docs/change-points.md flagged a 7%-noise allreduce case in 1 of
# 980 histories, two high nights after six: 22% against a threshold of 14%). A new history gates
# nothing in its first MIN_REFERENCE nights; the baseline gate does meanwhile.
MIN_REFERENCE = 8
MIN_RUNS = MIN_REFERENCE + MIN_SEGMENT
# A floor under the noise so a series of identical values (a stub, a cached figure) can be scaled.
NOISE_FLOOR = 1e-4


class ChangesUnavailable(RuntimeError):
    """ruptures is not installed."""


def require_ruptures():
    """Import ruptures, or raise ChangesUnavailable with the install hint."""
    try:
        import ruptures
    except ImportError:
        raise ChangesUnavailable("ruptures is not installed: pip install 'moebench[history]' "
                                 "(or pip install ruptures)") from None
    return ruptures


@dataclass(frozen=True)
class RunPoint:
    """A case's metric in one run: the run's start date, commit and file, the value and its recorded
    relative spread."""

    started: str
    commit: str
    value: float
    noise: float = 0.0
    path: str = ""

    @property
    def label(self) -> str:
        """'2026-11-29 22:04 10e9d2c', as the tables show a run."""
        return f"{self.started[:16].replace('T', ' ')} {self.commit[:7]}".strip()


@dataclass(frozen=True)
class Series:
    """One case's metric over the runs that measured it on one hardware key, oldest first."""

    hardware_key: str
    key: str
    metric: str
    unit: str
    direction: str
    rel_tol: float
    points: tuple[RunPoint, ...]
    family: str = ""

    def values(self) -> list[float]:
        return [p.value for p in self.points]


@dataclass(frozen=True)
class ChangePoint:
    """A reported change of a series' level, between run `before` and run `after` (`index` of its series'
    points).

    change: relative change of the level (median of the segment after over the median of the segment
    before, minus 1); worse: the change is towards worse for the metric's direction; noise: the relative
    noise judged against; threshold: the smallest change reported for this series; recent: the run after
    lies among the series' last RECENT runs."""

    hardware_key: str
    key: str
    metric: str
    unit: str
    index: int
    before: RunPoint
    after: RunPoint
    level_before: float
    level_after: float
    change: float
    worse: bool
    noise: float
    threshold: float
    recent: bool
    family: str = ""

    @property
    def failing(self) -> bool:
        """A recent change towards worse: what makes `moebench changes` exit 1."""
        return self.worse and self.recent

    def to_json(self) -> dict:
        """The change point as `moebench changes --json` writes it (and `moebench report --changes` reads)."""
        return {k: (asdict(v) if isinstance(v, RunPoint) else v) for k, v in vars(self).items()}

    @classmethod
    def from_json(cls, d: dict) -> ChangePoint:
        """Read one back (a KeyError or TypeError on a malformed one: the caller names the file)."""
        return cls(**{k: RunPoint(**d[k]) if k in ("before", "after") else d[k] for k in cls.__dataclass_fields__})


def night_to_night_noise(values: list[float]) -> float:
    """The relative spread between consecutive nights: 1.4826 x the median absolute deviation of the
    night-to-night differences (relative to the series' median), over sqrt(2) since a difference carries
    two nights' noise. The median keeps the few nights of a step or a drift from inflating it. 0 for
    fewer than HISTORY_NOISE_RUNS values."""
    if len(values) < HISTORY_NOISE_RUNS:
        return 0.0
    mid = statistics.median(values)
    diffs = [(b - a) / mid for a, b in zip(values, values[1:])]
    centre = statistics.median(diffs)
    return 1.4826 * statistics.median(abs(d - centre) for d in diffs) / math.sqrt(2)


def series_noise(series: Series) -> float:
    """The relative noise a series' changes are judged against (see the module's docstring)."""
    recorded = statistics.median(p.noise for p in series.points)
    return max(recorded, night_to_night_noise(series.values()), NOISE_FLOOR)


def threshold(series: Series, noise: float) -> float:
    """The smallest relative change reported: outside the noise band (NOISE_FACTOR x noise, as the gate
    reads "outside the noise") and at least half the case's tolerance."""
    return max(NOISE_FACTOR * noise, series.rel_tol / 2)


def segment_ends(values: list[float], noise: float) -> list[int]:
    """ruptures' PELT segmentation of the values (scaled to units of the noise): the end index of each
    segment, the last being len(values)."""
    import numpy as np

    rpt = require_ruptures()
    mid = statistics.median(values)
    z = (np.asarray(values, dtype=float) / mid - 1.0) / noise
    algo = rpt.Pelt(model="l1", min_size=MIN_SEGMENT, jump=1).fit(z.reshape(-1, 1))
    return list(algo.predict(pen=PENALTY_PER_LOG_N * math.log(len(values))))


def find_changes(series: Series) -> list[ChangePoint]:
    """The reported change points of a series, oldest first (none below MIN_RUNS runs, or for a series
    whose values are not all positive: its relative changes mean nothing)."""
    values = series.values()
    if len(values) < MIN_RUNS or min(values) <= 0:
        return []
    noise = series_noise(series)
    limit = threshold(series, noise)
    ends = segment_ends(values, noise)
    out: list[ChangePoint] = []
    start = 0  # the reference level: everything since the last reported change
    for here, nxt in zip(ends, ends[1:]):
        if here - start < MIN_REFERENCE:
            continue  # too few runs to be a level: this segment joins the reference
        before = statistics.median(values[start:here])
        after = statistics.median(values[here:nxt])
        change = after / before - 1.0
        if abs(change) <= limit:
            continue  # below the threshold: this segment joins the reference level
        worse = change > 0 if series.direction == "lower" else change < 0
        out.append(ChangePoint(series.hardware_key, series.key, series.metric, series.unit, here,
                               series.points[here - 1], series.points[here], before, after, change, worse, noise,
                               limit, here >= len(values) - RECENT, series.family))
        start = here
    return out
