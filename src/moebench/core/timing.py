"""Timers and the stopping rule.

Three clocks, one contract: a timer takes R callables (the same work over R rotated inputs, so repeated
calls do not measure a warm L2) and returns per-iteration samples in seconds.

- graph: CUDA events around one CUDA-graph replay of all R calls. GPU time only, launch gaps inside a
  graph are the GPU's own. This is the figure kernels are judged by.
- eager: CUDA events around R plain calls. Host launch overhead shows up whenever the host is slower
  than the GPU, which is exactly the host-side regression an engine feels at decode.
- cpu: wall clock around R calls, for CPU-only work.

Warm-up (Triton JIT and autotune, cuBLAS heuristics, graph capture) always happens before the first
timed sample, and the GPU timers then keep the GPU busy until its speed is steady (`warm_until_steady`):
a GPU that idled while the host built the case runs its first milliseconds slower, and a stopping rule
that is satisfied in ten quick samples would otherwise record that state (an H200 read a bf16 M = 1
fused MoE at 26.7 us in its first measurement after setup and 24.4 us in every later one).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

from moebench.core.metrics import relative_spread

Call = Callable[[], object]


@dataclass(frozen=True)
class StopRule:
    """Collect at least min_samples; then stop once the relative noise is at most target_noise, or at
    max_samples, or after max_seconds of sampling (whichever comes first)."""

    min_samples: int = 10
    max_samples: int = 100
    max_seconds: float = 3.0
    target_noise: float = 0.01

    def done(self, samples: Sequence[float], elapsed: float) -> bool:
        n = len(samples)
        if n < self.min_samples:
            return False
        return n >= self.max_samples or elapsed >= self.max_seconds or relative_spread(samples) <= self.target_noise


def collect(sample_once: Callable[[], float], rule: StopRule, clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Call sample_once until the stopping rule says done; returns the samples."""
    samples: list[float] = []
    start = clock()
    while not rule.done(samples, clock() - start):
        samples.append(sample_once())
    return samples


def cpu_timer(calls: Sequence[Call], rule: StopRule = StopRule(), warmup: int = 1) -> list[float]:
    """Wall-clock per-iteration samples of the R calls (CPU work)."""
    for _ in range(warmup):
        for c in calls:
            c()

    def once() -> float:
        t0 = time.perf_counter()
        for c in calls:
            c()
        return (time.perf_counter() - t0) / len(calls)

    return collect(once, rule)


def _l2_flusher(torch, device):
    """A callable that evicts L2 by writing a buffer twice the L2 size (writes also push out dirty lines)."""
    l2 = torch.cuda.get_device_properties(device).L2_cache_size or (64 << 20)
    buf = torch.empty(2 * l2, dtype=torch.uint8, device=device)
    return lambda: buf.zero_()


# GPU clock cycles the stream is held busy before a graph replay's start mark (~100 us at H200 clocks).
HEAD_START_CYCLES = 200_000


@dataclass(frozen=True)
class WarmRule:
    """Busy the device for at least min_s, then in windows of window_s until a window's rate (work per
    second) is within tol of the previous window's; never past max_s."""

    min_s: float = 0.2
    window_s: float = 0.05
    tol: float = 0.01
    max_s: float = 1.0


GPU_WARM = WarmRule()


def warm_until_steady(step: Callable[[], object], rule: WarmRule = GPU_WARM,
                      clock: Callable[[], float] = time.perf_counter) -> tuple[int, bool]:
    """Run step() (one unit of work, waited for) until the rate of windows of rule.window_s is steady.
    Returns (steps run, whether it became steady before rule.max_s)."""
    start = clock()
    steps, prev = 0, None
    while True:
        w0, n = clock(), 0
        while clock() - w0 < rule.window_s or n == 0:
            step()
            n += 1
        now = clock()
        steps += n
        rate = n / max(now - w0, 1e-12)
        if now - start >= rule.min_s and prev is not None and abs(rate - prev) <= rule.tol * prev:
            return steps, True
        if now - start >= rule.max_s:
            return steps, False
        prev = rate


def event_time(torch, fn, *, head_start: bool = False) -> float:
    """Seconds between CUDA events recorded around fn() on the current stream (waits for the end).

    head_start: hold the stream busy (torch.cuda._sleep) before the start mark, so the host has
    enqueued fn's work by the time the mark fires and the interval is GPU time only. Without it the
    host's launch of a graph replay after the mark is counted too, and that varies with how busy the
    host is (another phase on the other GPU, the other rank's process). Eager timings keep the launch
    cost on purpose and do not use it."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if head_start and hasattr(torch.cuda, "_sleep"):
        torch.cuda._sleep(HEAD_START_CYCLES)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def capture_graph(torch, calls: Sequence[Call]):
    """Capture the calls, in order, into one CUDA graph (on a side stream, after a side-stream warm-up
    as torch requires)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    torch.cuda.synchronize()
    return g


def graph_timer(calls: Sequence[Call], rule: StopRule = StopRule(), *, flush_l2: bool = False, warmup: int = 2,
                warm: WarmRule | None = GPU_WARM) -> list[float]:
    """Per-iteration GPU time from CUDA events around a graph replay of the R calls, sampled once the
    replays run at a steady rate (warm; None skips that).

    With flush_l2, L2 is evicted before every call inside the graph and the time of a graph holding only
    the flushes is subtracted, sample by sample (so the flush's own time is not charged to the work).
    """
    import torch

    for _ in range(warmup):
        for c in calls:
            c()
    torch.cuda.synchronize()
    r = len(calls)
    if not flush_l2:
        g = capture_graph(torch, calls)
        g.replay()
        if warm:
            warm_until_steady(lambda: (g.replay(), torch.cuda.synchronize()), warm)
        return collect(lambda: event_time(torch, g.replay, head_start=True) / r, rule)
    flush = _l2_flusher(torch, torch.cuda.current_device())
    interleaved = [f for c in calls for f in (flush, c)]
    g_work = capture_graph(torch, interleaved)
    g_flush = capture_graph(torch, [flush] * r)
    g_work.replay()
    g_flush.replay()
    if warm:
        warm_until_steady(lambda: (g_work.replay(), torch.cuda.synchronize()), warm)
    return collect(lambda: (event_time(torch, g_work.replay, head_start=True)
                            - event_time(torch, g_flush.replay, head_start=True)) / r, rule)


def eager_timer(calls: Sequence[Call], rule: StopRule = StopRule(), *, warmup: int = 2,
                warm: WarmRule | None = GPU_WARM) -> list[float]:
    """Per-iteration time from CUDA events around R eager calls (host launch overhead included), sampled
    once they run at a steady rate (warm; None skips that)."""
    import torch

    for _ in range(warmup):
        for c in calls:
            c()
    torch.cuda.synchronize()

    def run_all() -> None:
        for c in calls:
            c()

    if warm:
        warm_until_steady(lambda: (run_all(), torch.cuda.synchronize()), warm)

    return collect(lambda: event_time(torch, run_all) / len(calls), rule)


def device_properties(device: int | None = None) -> dict:
    """torch's view of the GPU the work ran on (initializes CUDA: call only while measuring)."""
    import torch

    p = torch.cuda.get_device_properties(device if device is not None else torch.cuda.current_device())
    return {"name": p.name, "sm_count": p.multi_processor_count, "l2_bytes": getattr(p, "L2_cache_size", None),
            "memory_bytes": p.total_memory, "compute_capability": f"{p.major}.{p.minor}"}
