"""Workloads and checks that prove the harness on the machine it runs on (the `selfcheck` family).

A check that fails on a quiet machine means the harness is wrong, and fails its test. On a machine whose
timing spread is too wide to tell, a check is AMBIGUOUS with that spread, passed or failed: a loaded
laptop or shared CI box is no evidence for or against the harness, and a new user's first command must
not fail on it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence

from moebench.baselines.compare import Comparison, Verdict, compare_metric
from moebench.core.kinds import timed_on
from moebench.core.metrics import Metric, relative_spread
from moebench.core.timing import StopRule, cpu_timer, eager_timer, graph_timer

# At or above this timing spread the machine is too noisy for a check, passed or failed, to say anything
# about the harness. The spread is the robust relative spread (1.4826 x MAD / median) of one work's samples pooled
# over the check's interleaved blocks, so load that comes and goes during the check widens it. Why 5%:
# the checks are built to resolve a 5% change (the planted one; A/A allows 3%) from medians of at least
# 60 samples (3 blocks of StopRule(min_samples=20) in benchmarks/test_selfcheck.py). At a 5% spread
# the median's standard error is 1.2533 x 5% / sqrt(60) = 0.81% and the difference of two medians has
# one of 1.14%, so a correct timer reads the planted 5% below the sensitivity check's 2% bar less than
# 1% of the time (2.6 standard errors); at a 10% spread it does about one run in five, and a failure
# there says more about the machine than about the harness. The A/A check (the gate's rule: worse than
# 3% and than twice the spread) cannot fail on a steady machine's noise; it fails on a systematic
# difference, or on load that moved between its measurements, which the interleaving shares out and the
# pooled spread shows. More samples only make a check below the threshold safer.
TOO_NOISY = 0.05

# A/A: two measurements of the same work may differ by this much (the gate's rel_tol for the check).
AA_TOLERANCE = 0.03
# Sensitivity: the planted change is found when it reads worse than this (and outside the noise).
SENSITIVITY_TOLERANCE = 0.02


@contextlib.contextmanager
def _one_cpu_thread():
    # On CPU the copy runs in one thread. This project's 2-core box, idle, timed a 2-thread copy of
    # 64 MiB and one of 5% more bytes both at 16.0 ms median: the time to wake the second thread, in
    # scheduler steps, not the time to move the bytes, so the sensitivity check read +0.1% for a 5%
    # change. In one thread the same copies took 9.9 and 10.6 ms.
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass(frozen=True)
class CopyWork:
    """A copy of `nbytes` known bytes; `rotate` distinct buffers so the copy does not come from cache."""

    nbytes: int
    device: str
    rotate: int = 2

    def build(self):
        """Allocate buffers filled with a known pattern; returns (calls, verify)."""
        import torch

        n = self.nbytes
        # A pattern with every byte value, offset per buffer, so a copy from the wrong buffer shows.
        srcs = [((torch.arange(n, dtype=torch.int32, device=self.device) + i) % 251).to(torch.uint8)
                for i in range(self.rotate)]
        dsts = [torch.full((n,), 255, dtype=torch.uint8, device=self.device) for _ in range(self.rotate)]
        calls = [lambda s=s, d=d: d.copy_(s) for s, d in zip(srcs, dsts)]

        def verify() -> None:
            for i, (s, d) in enumerate(zip(srcs, dsts)):
                d.fill_(255)  # poison, then copy once and compare every byte
                calls[i]()
                if not torch.equal(s, d):
                    bad = int((s != d).sum())
                    raise AssertionError(f"copy of {n} bytes into buffer {i}: {bad} bytes wrong")

        return calls, verify

    def time(self, rule: StopRule, *, mode: str = "graph") -> list[float]:
        """Per-copy samples in seconds: on a GPU in graph or eager mode, on CPU by wall clock in one thread.

        A device-to-device copy_ is a cudaMemcpyAsync; captured in a CUDA graph it becomes a memcpy node
        that runs on the copy engines, which on an H200 moved 2761 GB/s where the same copy launched
        eagerly (SM copy) moved 4187 GB/s. The ceiling is the eager figure; graph mode is still a fine
        workload for A/A and sensitivity checks of the graph timer.
        """
        calls, verify = self.build()
        verify()
        if self.device == "cpu":
            with _one_cpu_thread():
                return cpu_timer(calls, rule)
        return eager_timer(calls, rule) if mode == "eager" else graph_timer(calls, rule)

    def bandwidth_metric(self, samples: list[float], rel_tol: float) -> Metric:
        """GB/s counting read + write, higher is better."""
        return Metric.from_samples([2 * self.nbytes / s / 1e9 for s in samples], "GB/s", "higher", rel_tol=rel_tol,
                                   kind=timed_on(self.device))


def interleaved(a: CopyWork, b: CopyWork, rule: StopRule, blocks: int = 3) -> tuple[list[float], list[float]]:
    """Samples of a and b timed in alternating blocks (a, b, a, b, ...), each side's blocks pooled, so a
    drift of the machine during the check hits both sides alike."""
    sa: list[float] = []
    sb: list[float] = []
    for _ in range(blocks):
        sa += a.time(rule)
        sb += b.time(rule)
    return sa, sb


@dataclass(frozen=True)
class Check:
    """A selfcheck's outcome: whether the harness did what it should, what it saw, and the machine's
    timing spread during the check (the larger of the two sides')."""

    ok: bool
    seen: str
    spread: float
    comparison: Comparison

    @property
    def too_noisy(self) -> bool:
        """The machine's spread is at or above TOO_NOISY: this check proves nothing here."""
        return self.spread >= TOO_NOISY

    @property
    def failure(self) -> str | None:
        """The line the test fails with when the harness is wrong (a failed check on a quiet machine)."""
        if self.ok or self.too_noisy:
            return None
        return (f"{self.seen}; timing spread {100 * self.spread:.1f}% (< {100 * TOO_NOISY:.0f}%): "
                "the harness is wrong here")

    @property
    def doubt(self) -> str:
        """The AMBIGUOUS note on a machine too noisy to prove the harness, else ''. Also when the check
        passed: a pass proves nothing there either (the A/A's noise band alone is twice the spread)."""
        if not self.too_noisy:
            return ""
        return (f"this machine's timing spread is {100 * self.spread:.1f}% (>= {100 * TOO_NOISY:.0f}%): too noisy "
                f"to prove the harness; rerun on an idle machine ({self.seen})")


def _spread(*sides: Sequence[float]) -> float:
    return max(relative_spread(s) for s in sides)


def aa_check(a: Sequence[float], b: Sequence[float]) -> Check:
    """A/A: the same work measured twice (samples in seconds) must agree by the gate's own rule."""
    ma = Metric.from_samples(a, "s", "lower", rel_tol=AA_TOLERANCE)
    mb = Metric.from_samples(b, "s", "lower", rel_tol=AA_TOLERANCE)
    c = compare_metric(mb, ma)
    seen = (f"A/A: the same copy measured {ma.value * 1e6:.1f} us then {mb.value * 1e6:.1f} us "
            f"({c.delta_pct:+.1f}%, noise {100 * (c.noise or 0):.1f}%): verdict {c.verdict.value}")
    return Check(c.verdict in (Verdict.PASS, Verdict.AMBIGUOUS), seen, _spread(a, b), c)


def _with_median_error(m: Metric) -> Metric:
    return dataclasses.replace(m, noise=1.2533 * m.noise / math.sqrt(m.n))


def sensitivity_check(base: Sequence[float], bigger: Sequence[float], planted: float = 0.05) -> Check:
    """Sensitivity: work made `planted` larger (samples in seconds) must read as a REGRESSION."""
    # The question is whether the timer resolves the change between two medians measured interleaved in
    # one session, so each side's noise is the standard error of its median (1.2533 * spread / sqrt(n)),
    # not the per-sample spread the gate uses between runs (on that alone a 5% change is outside the noise
    # only below a 2.5% spread).
    a = _with_median_error(Metric.from_samples(base, "s", "lower", rel_tol=SENSITIVITY_TOLERANCE))
    b = _with_median_error(Metric.from_samples(bigger, "s", "lower", rel_tol=SENSITIVITY_TOLERANCE))
    c = compare_metric(b, a)
    seen = (f"sensitivity: {100 * planted:.0f}% more bytes measured {c.delta_pct:+.1f}% "
            f"(noise band {100 * (c.noise or 0):.1f}%), verdict {c.verdict.value}")
    return Check(c.verdict is Verdict.REGRESSION, seen, _spread(base, bigger), c)
