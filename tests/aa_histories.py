"""Synthetic nightly histories with each committed H200 case's own spread, for the change-point
detector's A/A rate and detection delay (tests/test_changes.py; the numbers in docs/change-points.md).

Each gated metric of the committed H200 results (baselines/nvidia-h200-x*/ and tests/data's H200 results
files) gives a case: its value, its recorded relative noise, its tolerance and direction. A history is
NIGHTS nightly values drawn around the value with that noise (normal, relative), each run recording that
noise; a planted drift or step moves the nights from `start` on towards worse.

    python tests/aa_histories.py [SEEDS] [--noise-floor X]   # prints the numbers of docs/change-points.md
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from moebench.history.changes import RunPoint, Series, find_changes  # noqa: E402

NIGHTS = 30


@dataclass(frozen=True)
class CaseSpread:
    """A committed case's metric: what a synthetic history of it is drawn from."""

    key: str
    metric: str
    unit: str
    direction: str
    value: float
    noise: float
    rel_tol: float


def committed_cases() -> list[CaseSpread]:
    """Every gated metric of the committed H200 baselines and H200 results files, once per case+metric
    (a baseline's figures win over a results file's)."""
    out: dict[tuple[str, str], CaseSpread] = {}
    for path in sorted(REPO.glob("tests/data/*h200*.json")):
        doc = json.loads(path.read_text())
        for c in doc.get("cases", []) if isinstance(doc, dict) else []:
            for name, m in c["metrics"].items():
                if m.get("gated", True):
                    out[c["key"], name] = CaseSpread(c["key"], name, m["unit"], m["direction"], m["value"],
                                                     m.get("noise", 0.0), m.get("rel_tol", 0.05))
    for path in sorted(REPO.glob("baselines/nvidia-h200-x*/*.json")):
        for key, e in json.loads(path.read_text())["entries"].items():
            for name, m in e["metrics"].items():
                out[key, name] = CaseSpread(key, name, m["unit"], m["direction"], m["value"], m["noise"], m["rel_tol"])
    return sorted(out.values(), key=lambda c: (c.key, c.metric))


def history(case: CaseSpread, seed: int, *, nights: int = NIGHTS, start: int | None = None, drift: float = 0.0,
            step: float = 0.0, noise_floor: float = 0.0) -> Series:
    """A synthetic history of `nights` runs of a case. From night `start` on, the level moves towards
    worse by `step` at once and by `drift` more each night (relative)."""
    rng = random.Random(f"{case.key}/{case.metric}/{seed}")
    sign = 1.0 if case.direction == "lower" else -1.0
    noise = max(case.noise, noise_floor)
    points = []
    for i in range(nights):
        moved = 0.0 if start is None or i < start else step + drift * (i - start + 1)
        value = case.value * (1 + sign * moved) * (1 + rng.gauss(0.0, noise))
        points.append(RunPoint(f"2026-12-{1 + i // 24:02d}T{i % 24:02d}:17:00Z", f"c{i:06d}", value, noise))
    return Series("nvidia-h200-x1", case.key, case.metric, case.unit, case.direction, case.rel_tol, tuple(points))


def flagged(series: Series) -> bool:
    """Whether `moebench changes` would exit 1 on this history (a worse change in its last runs)."""
    return any(c.failing for c in find_changes(series))


def nights_to_detect(case: CaseSpread, seed: int, *, start: int = 24, drift: float = 0.0, step: float = 0.0,
                     noise_floor: float = 0.0, most: int = 6) -> int | None:
    """How many nights after `start` (counting the first changed night as 1) the nightly run's
    `moebench changes` first fails; None when not within `most` nights."""
    full = history(case, seed, nights=start + most, start=start, drift=drift, step=step, noise_floor=noise_floor)
    for n in range(1, most + 1):
        if flagged(Series(full.hardware_key, full.key, full.metric, full.unit, full.direction, full.rel_tol,
                          full.points[:start + n])):
            return n
    return None


def aa_alarms(case: CaseSpread, seed: int, noise_floor: float = 0.0) -> int:
    """Nights of a 30-night A/A history on which the nightly `moebench changes` would fail."""
    full = history(case, seed, noise_floor=noise_floor)
    return sum(flagged(Series(full.hardware_key, full.key, full.metric, full.unit, full.direction, full.rel_tol,
                              full.points[:n])) for n in range(1, NIGHTS + 1))


def classes(cases: list[CaseSpread]) -> dict[str, list[CaseSpread]]:
    """The committed cases by what their reporting threshold lets through (docs/change-points.md)."""
    return {
        "tolerance 5%, noise < 1%": [c for c in cases if c.rel_tol <= 0.05 and c.noise < 0.01],
        "tolerance 5%, noise 1-2%": [c for c in cases if c.rel_tol <= 0.05 and c.noise >= 0.01],
        "tolerance 10%": [c for c in cases if 0.05 < c.rel_tol <= 0.10],
        "tolerance >= 15% (cliff detectors)": [c for c in cases if c.rel_tol > 0.10],
    }


def main(argv: list[str]) -> None:
    seeds = int(argv[0]) if argv and argv[0].isdigit() else 4
    floor = float(argv[argv.index("--noise-floor") + 1]) if "--noise-floor" in argv else 0.0
    cases = committed_cases()
    print(f"{len(cases)} case metrics x {seeds} seeds, {NIGHTS} nights, noise floor {floor}")
    alarms = [(c, s) for c in cases for s in range(seeds) if aa_alarms(c, s, floor)]
    print(f"A/A: {len(alarms)} of {len(cases) * seeds} histories had a night that would fail: "
          f"{sorted({f'{c.key} {c.metric}' for c, _ in alarms})}")
    for name, group in classes(cases).items():
        for label, kw in (("drift 3%/night", dict(drift=0.03)), ("step 4%", dict(step=0.04))):
            delays: dict[int | None, int] = {}
            for c in group:
                for s in range(seeds):
                    d = nights_to_detect(c, s, noise_floor=floor, **kw)
                    delays[d] = delays.get(d, 0) + 1
            shown = ", ".join(f"{'never' if d is None else d}: {n}"
                              for d, n in sorted(delays.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)))
            print(f"{name} ({len(group)} metrics), {label}: nights to fail -> histories: {shown}")


if __name__ == "__main__":
    main(sys.argv[1:])
