"""The measured quantity a benchmark reports: a value with its unit, direction, noise and tolerance."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from typing import Iterable, Literal

Direction = Literal["lower", "higher"]
DIRECTIONS: tuple[str, ...] = ("lower", "higher")


def relative_spread(samples: Iterable[float]) -> float:
    """Robust relative noise of samples: 1.4826 * MAD / median (0 for fewer than 2 samples).

    MAD rather than stdev because GPU timings have rare long outliers (a preemption, a clock change)
    that should not widen the noise band of the whole case.
    """
    xs = [float(x) for x in samples]
    if len(xs) < 2:
        return 0.0
    med = statistics.median(xs)
    if med == 0 or not math.isfinite(med):
        return 0.0
    mad = statistics.median(abs(x - med) for x in xs)
    return 1.4826 * mad / abs(med)


@dataclass(frozen=True)
class Metric:
    """One measured metric of a case.

    value: the figure compared with the baseline (the median of the samples when there are samples).
    direction: "lower" or "higher" is better; always stated, never guessed from the name.
    noise: relative spread of the samples (see relative_spread).
    rel_tol: the relative change that counts as a regression when it is also outside the noise.
    gated: False for derived or informational metrics (GB/s next to the time it came from).
    noise_machines: relative spread between machines of the hardware kind (a baseline recorded on two or
        more machines; None where not measured): the spread the gate uses on a machine other than the
        recording ones.
    cliff: a host-bound metric (spread between machines over 10%, e.g. TTFT of a short eager prefill) that
        fails only on a cliff, a doubling (moebench.baselines.compare.CLIFF), whatever rel_tol says.
    kind: what the number is bound by (moebench.core.kinds: device kernel time, GPU-bound decode, host-bound,
        ...), declared by the family that measured it; None where it declares none (the gate then uses
        the stored entry's, else the unknown kind's fallback spread).
    gate_off: a baseline whose noise was too wide to gate (over schema.NOISE_MAX): stored so its value is
        kept, compared always as AMBIGUOUS with that reason.
    """

    value: float
    unit: str
    direction: Direction
    noise: float = 0.0
    n: int = 1
    rel_tol: float = 0.05
    gated: bool = True
    samples: tuple[float, ...] = field(default=(), repr=False, compare=False)
    noise_machines: float | None = None
    cliff: bool = False
    kind: str | None = None
    gate_off: bool = False

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, got {self.direction!r}")
        # Samples are raw measurements: a NaN or inf among them is a broken timer, and it also crashed
        # pytest-benchmark's statistics at session end when fed as the primary metric's samples.
        bad = [x for x in self.samples if not math.isfinite(x)]
        if bad:
            raise ValueError(f"{len(bad)} of {len(self.samples)} samples are not finite numbers (first: {bad[0]!r})")
        # A NaN compares False both ways, so the gate read it as PASS; an update then stored it and the
        # schema refused the file on the next run. A gated measurement that produced no number is a
        # failure where it happens. (Informational metrics may say NaN, e.g. % of an unknown floor.)
        if self.gated and not math.isfinite(self.value):
            raise ValueError(f"a gated metric's value must be a finite number, got {self.value!r}")

    @classmethod
    def from_samples(
        cls, samples: Iterable[float], unit: str, direction: Direction, *, rel_tol: float = 0.05, gated: bool = True,
        kind: str | None = None,
    ) -> "Metric":
        """Median of the samples, with their robust relative spread as noise."""
        xs = tuple(float(x) for x in samples)
        if not xs:
            raise ValueError("no samples")
        return cls(statistics.median(xs), unit, direction, relative_spread(xs), len(xs), rel_tol, gated, xs,
                   kind=kind)

    def derived(self, value: float, unit: str, direction: Direction) -> "Metric":
        """An informational metric computed from this one (same n and noise, not gated)."""
        return replace(self, value=value, unit=unit, direction=direction, gated=False, samples=())

    def to_json(self) -> dict:
        """The fields stored in baselines and results (no raw samples; noise_machines, kind and the gate
        only where set, so entries recorded before they existed keep their bytes)."""
        out = {
            "value": self.value,
            "unit": self.unit,
            "direction": self.direction,
            "noise": round(self.noise, 6),
            "n": self.n,
            "rel_tol": self.rel_tol,
        }
        if self.noise_machines is not None:
            out["noise_machines"] = round(self.noise_machines, 6)
        if self.gate_off:
            out["gate"] = "none"
        elif self.cliff:
            out["gate"] = "cliff"
        if self.kind is not None:
            out["kind"] = self.kind
        return out
