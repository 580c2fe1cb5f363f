"""Metric kinds: what a gated number is bound by, and the spread between machines the gate assumes for
it where that spread was never measured.

A family declares the kind of each gated metric when it measures it (Metric.kind, stored with the
baseline as `kind`), from what it knows of the measurement (the timer it used, the device it ran on),
never from the metric's name. The kinds differ by orders of magnitude between machines of one kind of
hardware, so one fallback for all of them is either too wide for kernels or too tight for the host:

- device kernel time (gemm graph_us, selfcheck device timings, decode step_* category ms): a third
  H200 that recorded none of the entries read every gemm case within -1.9..+1.6% of its entry (median
  |delta| 0.25%), and the decode step categories within 0.1%; processes on one H200 agree within 0.7%.
  2% covers the widest of those reads. (The 427-472 us of four H200s, 10%, was the old timer, which did
  not warm the device first; the timer that replaced it read the same cases within 2%.)
- GPU-bound steady decode (ms/token of a full-depth rank): engine instances and machines within ~3%
  (6.79-6.94 ms/token over three H200s, two instances 2.1% apart).
- host-bound (eager launches, TTFT of a short eager prefill, NCCL allreduce at decode sizes, anything
  timed by a CPU's wall clock): TTFT read 84-171 ms on H200s running the same ms/token, eager allreduce
  moved +10..+98% between two hosts, a tiny engine's ms/token up to 74% between instances. Only a cliff
  is visible there: 50%, whose noise band (2x) is a doubling, compare.CLIFF.
- device collective (NCCL allreduce at prefill sizes): moved +6..+11% between runs on two H200s; never
  recorded on two machines of one kind, so 5%, the fallback every metric had before kinds existed.
- device counter (Nsight Compute counts of one kernel's work: DRAM bytes, instructions, moebench.core.ncu):
  the same code on the same data counts the same, so a counter gates at COUNTER_REL_TOL (1%) or outside twice
  its stored noise (an A/A of 3 runs), whichever is wider: compare.compare_metric's rule with rel_tol 1%.
  Between machines of one kind it was never measured; 1% is assumed until a fresh-machine A/A says otherwise.
- unknown (an entry recorded before kinds existed, whose measurement declares none either): 5%, as
  before, so an old entry gates as it did.

Pure data and arithmetic: no imports from the rest of moebench (the gate reads it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    """A metric kind: its words for a verdict line, and the spread between machines assumed for it."""

    name: str
    words: str
    machine_spread: float


DEVICE_KERNEL = "device_kernel"
GPU_DECODE = "gpu_decode"
HOST_BOUND = "host_bound"
DEVICE_COLLECTIVE = "device_collective"
DEVICE_COUNTER = "device_counter"
UNKNOWN = "unknown"

KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind(DEVICE_KERNEL, "device kernel time", 0.02),
    Kind(GPU_DECODE, "GPU-bound decode", 0.03),
    Kind(HOST_BOUND, "host-bound", 0.50),
    Kind(DEVICE_COLLECTIVE, "device collective", 0.05),
    Kind(DEVICE_COUNTER, "hardware counter", 0.01),
    Kind(UNKNOWN, "a metric of no recorded kind", 0.05),
)}

# The tolerance rule from a measured spread between machines: a kernel time whose machines agree within
# 1% gates at 3% (twice the spread stays inside the tolerance, and a 4% slowdown is caught anywhere).
# Two machines are too few to say so: session 14's w4 decode router category read 0.4855 ms on two H200s
# (spread 0.0%, so 3%) and 0.4666 (-3.9%, a false IMPROVEMENT) on the third, while 114 gemm cases at 3%
# from three machines read within 2.0% there.
TIGHT_SPREAD = 0.01
TIGHT_REL_TOL = 0.03
TIGHT_MACHINES = 3
# the rule tightens a case's own tolerance only from the standard 5%: a case that declares a wider one
# says its time moves for a reason agreeing machines cannot rule out (vLLM's int4 workaround at M <= 2
# follows where its buffers land, 71.6-89.2 us across builds; its machines agreed within 0.5% in session 14)
TIGHTENS_FROM = 0.05
# A counter that should not move (bytes, instructions) gates at 1%; the gate widens it to NOISE_FACTOR x the
# stored noise where an A/A showed more (compare.compare_metric needs both to call a REGRESSION).
COUNTER_REL_TOL = 0.01


def timed_on(device: str) -> str:
    """The kind of a time taken on `device`: a device timing on a GPU, a CPU's wall clock (host-bound,
    moving with the box's load) on a CPU."""
    return HOST_BOUND if device == "cpu" else DEVICE_KERNEL


def kind_of(name: str | None) -> Kind:
    """The Kind named `name` (UNKNOWN for None or a name this table does not have)."""
    return KINDS.get(name or UNKNOWN, KINDS[UNKNOWN])


def assumed_spread(kind: str | None) -> float:
    """The spread between machines the gate assumes for a metric of `kind` whose entry measured none."""
    return kind_of(kind).machine_spread


# The spread a machine outside an entry's recorders may read, from the half range its n machines showed.
# n machines' half range underestimates the spread of the kind for small n: the expected range of n normal
# draws is d2(n) standard deviations (1.13 for two, 2.06 for four, 3.08 for ten), and a further machine sits
# sqrt(1 + pi / 2n) of them from the n machines' median. PREDICT_Z makes the gate's band (NOISE_FACTOR x
# the spread) about a 99% two-sided interval for that further machine: half range x Z sqrt(1 + pi/2n) / d2(n),
# 3.1x for two machines, 1.9x for three, 1.5x for four, 1.3x for five, never below the half range itself.
# Why: four H200s' half range on the w4 decode router category (1.9%) did not cover a fifth machine at
# -5.7% (session 15, two engine instances, a false IMPROVEMENT); the prediction for a fifth was 2.8% (band 5.6%).
PREDICT_Z = 2.576
_D2 = {2: 1.128, 3: 1.693, 4: 2.059, 5: 2.326, 6: 2.534, 7: 2.704, 8: 2.847, 9: 2.970, 10: 3.078}


def further_machine_factor(machines: int) -> float:
    """How much wider than the half range of `machines` machines' medians the spread of one more machine is
    taken to be (>= 1; 1 where the count is unknown, below two, or past ten, whose factor is about 1)."""
    if machines < 2 or machines > max(_D2):
        return 1.0
    return max(1.0, PREDICT_Z * math.sqrt(1 + math.pi / (2 * machines)) / _D2[machines])


def ruled_rel_tol(kind: str | None, rel_tol: float, noise_machines: float | None, machines: int) -> float:
    """The tolerance the rule gives a metric from its measured spread between machines: TIGHT_REL_TOL for a
    device kernel time whose TIGHT_MACHINES or more machines agree within TIGHT_SPREAD and whose own
    tolerance is at most TIGHTENS_FROM, else rel_tol."""
    if (kind == DEVICE_KERNEL and noise_machines is not None and noise_machines <= TIGHT_SPREAD
            and machines >= TIGHT_MACHINES and rel_tol <= TIGHTENS_FROM):
        return min(rel_tol, TIGHT_REL_TOL)
    return rel_tol
