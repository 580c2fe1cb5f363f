"""Which GPU of the box runs which single-GPU case under `pytest -n N`: stable, balanced, overridable.

Pure (no pytest, no NVML): a function of the case ids, the number of GPUs the run spreads over and the
`--gpu-of CASE=INDEX` pins, so the same selection lands on the same GPUs every night and a case's
history compares like with like.

The rule is rendezvous (highest-random-weight) hashing with bounded loads (Mirrokni, Thorup and
Zadimoghaddam, "Consistent hashing with bounded loads", 2018):
- every case ranks the GPUs by a hash of (case id, GPU index) and takes the first one in its ranking
  that is not full; the ranking depends on that case alone, so a case added to or dropped from the
  selection moves no other case, except the few that overflow a full GPU;
- a GPU is full at CAP = max(ceil(N/G), floor(1.05 * N/G)) cases: hashing alone put 1,200 cases on 8
  GPUs as unevenly as 150 +- 12 (a binomial), and the slowest GPU sets the night's length; the bound
  keeps the largest share within 5% of the mean (exact for small selections);
- cases are placed in sorted id order, so which cases overflow does not depend on collection order.
Counts, not expected durations, are balanced: a duration read from last night's run would move cases
between GPUs whenever it changed, which is what the assignment exists to prevent; over ~150 cases per
GPU drawn by a uniform hash from the same product of axes, the GPUs' sums of durations differ far less
than a single case's does.
"""

from __future__ import annotations

import hashlib
import math
from typing import Iterable, Mapping

SLACK = 0.05  # how far above the mean share a GPU may fill (see the module docstring)
OPTION = "--gpu-of"


class PlanError(ValueError):
    """Bad --gpu-of input; the message is one line naming the option."""


def score(case_id: str, gpu: int) -> int:
    """The case's rendezvous weight for a GPU (stable across processes, Python versions and nights)."""
    return int.from_bytes(hashlib.sha256(f"{case_id}\0{gpu}".encode()).digest()[:8], "big")


def ranking(case_id: str, gpus: int) -> list[int]:
    """The GPUs in the case's order of preference."""
    return sorted(range(gpus), key=lambda g: (-score(case_id, g), g))


def capacity(cases: int, gpus: int) -> int:
    """How many cases a GPU takes before its cases go to their next choice."""
    if gpus <= 0:
        return 0
    return max(math.ceil(cases / gpus), math.floor((1 + SLACK) * cases / gpus))


def assign(case_ids: Iterable[str], gpus: int, pinned: Mapping[str, int] | None = None) -> dict[str, int]:
    """Case id -> GPU index (0..gpus-1) for every case (pinned ones where pinned); see the module docstring."""
    if gpus < 1:
        raise ValueError(f"gpus must be at least 1, got {gpus}")
    ids = sorted(set(case_ids))
    pinned = {c: g for c, g in (pinned or {}).items() if c in set(ids)}
    cap = capacity(len(ids), gpus)
    loads = [0] * gpus
    out: dict[str, int] = {}
    for c, g in pinned.items():
        out[c] = g
        loads[g] += 1
    for c in ids:
        if c in out:
            continue
        order = ranking(c, gpus)
        g = next((g for g in order if loads[g] < cap), min(order, key=lambda x: loads[x]))
        out[c] = g
        loads[g] += 1
    return out


def parse_pins(values: Iterable[str], gpus: int, what: str = "") -> dict[str, int]:
    """`--gpu-of CASE=INDEX` values -> {case: index}; PlanError (one line naming the option) for a value
    without '=', an index that is not a whole number, one >= gpus (`what` says where that count comes
    from), or a case pinned twice to different GPUs."""
    out: dict[str, int] = {}
    for v in values:
        case, sep, index = v.rpartition("=")
        if not sep or not case.strip() or not index.strip().isdigit():
            raise PlanError(f"{OPTION} {v!r}: expected CASE=INDEX (a case id or test id, and a GPU index like 0)")
        g = int(index)
        if g >= gpus:
            raise PlanError(f"{OPTION} {v!r}: GPU index {g} is not below {gpus}" + (f" ({what})" if what else ""))
        if out.get(case.strip(), g) != g:
            raise PlanError(f"{OPTION} {v!r}: {case.strip()} is already pinned to GPU {out[case.strip()]}")
        out[case.strip()] = g
    return out


def unknown_pins(pins: Mapping[str, int], names: Iterable[str]) -> str | None:
    """The usage line for pins that name no case of the selection (`names`: case ids and test ids), else None."""
    known = set(names)
    missing = sorted(p for p in pins if p not in known)
    if not missing:
        return None
    return (f"{OPTION} {missing[0]}={pins[missing[0]]}: no such case in this selection "
            f"(name a case id like gemm[...] or a test id)" + (f"; also unknown: {', '.join(missing[1:])}" if missing[1:] else ""))
