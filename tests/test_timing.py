"""The stopping rule and the sample loop, with a fake clock and a fake sample source, so every stop is
decided by numbers the test chose, not by how fast this machine happens to be."""

from __future__ import annotations

import contextlib
import itertools
import sys
from types import SimpleNamespace

import pytest

from moebench.core import timing
from moebench.core.timing import StopRule, collect, cpu_timer, eager_timer, graph_timer

QUIET = [1.0] * 1000                     # spread 0
NOISY = [1.0, 2.0, 3.0] * 400           # spread (1.4826 * MAD / median) stays above 0.3 from 2 samples on


def exactly(n: int) -> StopRule:
    """A rule that takes exactly n samples: target_noise < 0 is never met, and time never runs out."""
    return StopRule(min_samples=n, max_samples=n, max_seconds=1e9, target_noise=-1)


@pytest.mark.parametrize("n, elapsed, samples, done", [
    (4, 0.0, QUIET, False),       # below min_samples, however quiet
    (4, 99.0, NOISY, False),      # below min_samples, however late
    (5, 0.0, QUIET, True),        # quiet enough at min_samples
    (5, 0.0, NOISY, False),       # noisy, early, few: keep going
    (5, 3.0, NOISY, True),        # out of time
    (5, 2.999, NOISY, False),
    (20, 0.0, NOISY, True),       # max_samples
    (19, 0.0, NOISY, False),
])
def test_stop_rule_done(n, elapsed, samples, done):
    rule = StopRule(min_samples=5, max_samples=20, max_seconds=3.0, target_noise=0.01)
    assert rule.done(samples[:n], elapsed) is done


class FakeClock:
    """Time moves only when a sample is taken (by `step` seconds)."""

    def __init__(self, step: float) -> None:
        self.t = 1000.0
        self.step = step

    def __call__(self) -> float:
        return self.t


def _source(clock: FakeClock, values):
    it = iter(values)

    def sample_once() -> float:
        clock.t += clock.step
        return next(it)

    return sample_once


def test_collect_stops_at_min_samples_when_quiet():
    clock = FakeClock(0.001)
    got = collect(_source(clock, QUIET), StopRule(min_samples=7, max_samples=50, max_seconds=10), clock)
    assert got == [1.0] * 7


def test_collect_stops_on_time_when_noisy():
    # 0.25 s per sample, 1 s budget: the fourth sample reaches it.
    clock = FakeClock(0.25)
    got = collect(_source(clock, NOISY), StopRule(min_samples=2, max_samples=50, max_seconds=1.0), clock)
    assert got == [1.0, 2.0, 3.0, 1.0]


def test_collect_stops_at_max_samples():
    clock = FakeClock(0.0)
    got = collect(_source(clock, NOISY), StopRule(min_samples=2, max_samples=11, max_seconds=1.0), clock)
    assert len(got) == 11


def test_collect_waits_for_min_samples_even_past_the_time_budget():
    clock = FakeClock(10.0)
    got = collect(_source(clock, NOISY), StopRule(min_samples=6, max_samples=50, max_seconds=1.0), clock)
    assert len(got) == 6


def test_collect_stops_once_noise_settles():
    # Noisy start, then identical samples: the median absolute deviation is 1, 1, 0.5 after 4, 5 and 6
    # samples, and 0 from the seventh on (four of seven deviations are 0).
    values = [1.0, 3.0, 5.0] + [2.0] * 100
    clock = FakeClock(0.0)
    got = collect(_source(clock, values), StopRule(min_samples=3, max_samples=100, max_seconds=1.0,
                                                   target_noise=0.0), clock)
    assert got == [1.0, 3.0, 5.0, 2.0, 2.0, 2.0, 2.0]


def test_cpu_timer_returns_one_sample_per_round_of_the_calls():
    counts = [0, 0, 0]
    calls = [lambda i=i: counts.__setitem__(i, counts[i] + 1) for i in range(3)]
    samples = cpu_timer(calls, exactly(4), warmup=2)
    assert len(samples) == 4
    assert all(isinstance(s, float) and s >= 0 for s in samples)
    assert counts == [2 + 4] * 3, "each call runs once per warm-up round and once per sample"


def test_cpu_timer_sample_is_the_time_of_one_call(monkeypatch):
    """Three calls of 2 ms each: every sample reads 2 ms (the round divided by the number of calls)."""
    clock = FakeClock(0.0)
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=clock))
    calls = [lambda: setattr(clock, "t", clock.t + 0.002)] * 3
    assert cpu_timer(calls, exactly(3)) == pytest.approx([0.002] * 3)


class FakeTorch:
    """Just enough of torch for the GPU timers on a CPU box: a simulated GPU clock (ms) that only kernels
    move. kernel(ms) runs now, or is recorded into the CUDA graph being captured (replay runs what was
    recorded); an event stamps the clock; _sleep, the head start, holds the stream for 0.5 ms; the L2
    flusher's zero_() is a kernel of flush_ms. Every kernel and event mark run is logged, in order."""

    uint8 = "uint8"

    def __init__(self, *, with_sleep: bool = True, flush_ms: float = 0.0) -> None:
        self.now, self.log, self.capturing, self.flush_ms = 0.0, [], None, flush_ms
        fake = self
        names = itertools.cycle(("start", "end"))  # event_time makes its start event first

        class Event:
            def __init__(self, enable_timing=False):
                self.name, self.at = next(names), None

            def record(self):
                self.at = fake.now
                fake.log.append(("record", self.name))

            def synchronize(self):
                pass

            def elapsed_time(self, end):
                return end.at - self.at

        class CUDAGraph:
            def __init__(self):
                self.kernels = []

            def replay(self):
                for k in self.kernels:
                    fake.kernel(*k)

        @contextlib.contextmanager
        def graph(g):
            self.capturing = g.kernels
            yield
            self.capturing = None

        stream = SimpleNamespace(wait_stream=lambda other: None)
        self.cuda = SimpleNamespace(
            Event=Event, CUDAGraph=CUDAGraph, graph=graph, Stream=lambda: stream, current_stream=lambda: stream,
            stream=lambda s: contextlib.nullcontext(), synchronize=lambda: None, current_device=lambda: 0,
            get_device_properties=lambda device: SimpleNamespace(L2_cache_size=1 << 20))
        if with_sleep:
            self.cuda._sleep = lambda cycles: self.kernel(0.5, ("sleep", cycles))

    def kernel(self, ms: float, entry: tuple = ("work",)) -> None:
        if self.capturing is not None:
            self.capturing.append((ms, entry))
        else:
            self.now += ms
            self.log.append(entry)

    def empty(self, n, dtype, device):
        return SimpleNamespace(zero_=lambda: self.kernel(self.flush_ms, ("flush",)))


@pytest.mark.parametrize("head_start", [False, True])
def test_event_time_head_start_holds_the_stream_before_the_start_mark_only_when_asked(head_start):
    """The head start runs before the start mark, so its time is not counted: 1 ms of work reads 1 ms."""
    fake = FakeTorch()
    secs = timing.event_time(fake, lambda: fake.kernel(1.0), head_start=head_start)
    expected = [("record", "start"), ("work",), ("record", "end")]
    if head_start:
        expected = [("sleep", timing.HEAD_START_CYCLES)] + expected
    assert fake.log == expected
    assert secs == pytest.approx(1e-3)


def test_event_time_head_start_without_sleep_support_still_times():
    fake = FakeTorch(with_sleep=False)
    timing.event_time(fake, lambda: fake.kernel(1.0), head_start=True)
    assert fake.log == [("record", "start"), ("work",), ("record", "end")]


@pytest.mark.parametrize("timer", [
    graph_timer,
    lambda calls, rule: graph_timer(calls, rule, flush_l2=True),
    eager_timer,
], ids=["graph", "graph-l2-flushed", "eager"])
def test_gpu_timers_sample_is_the_time_of_one_call(timer, monkeypatch):
    """Four calls of 5 us each: every sample reads 5 us, the R calls' time divided by R. With the L2
    flushed before every call (7 us each here), the time of a graph of the flushes alone is subtracted."""
    fake = FakeTorch(flush_ms=0.007)
    monkeypatch.setitem(sys.modules, "torch", fake)
    calls = [lambda: fake.kernel(0.005)] * 4
    assert timer(calls, exactly(3)) == pytest.approx([5e-6] * 3)


class _FakeGPU:
    """A device whose step takes `slow` seconds until `warm_after` seconds of work, then `fast`."""

    def __init__(self, slow, fast, warm_after):
        self.t, self.slow, self.fast, self.warm_after = 0.0, slow, fast, warm_after

    def clock(self):
        return self.t

    def step(self):
        self.t += self.slow if self.t < self.warm_after else self.fast


def test_the_warm_up_runs_past_a_slow_start_until_the_rate_is_steady():
    from moebench.core.timing import WarmRule, warm_until_steady

    class Ramping(_FakeGPU):
        def step(self):  # 30% slower at first, reaching full speed linearly at t = 0.4 s (a clock ramp)
            self.t += 1e-3 * (1 + 0.3 * max(0.0, 1 - self.t / 0.4))

    gpu = Ramping(0, 0, 0)
    steps, steady = warm_until_steady(gpu.step, WarmRule(min_s=0.1, window_s=0.05, tol=0.01, max_s=2.0), gpu.clock)
    assert steady and gpu.t >= 0.4, gpu.t  # not before the ramp ended: each window was >1% faster than the last
    assert gpu.t < 0.6 and steps > 0

    short = _FakeGPU(slow=2e-3, fast=1e-3, warm_after=0.1)  # a slow start shorter than min_s
    warm_until_steady(short.step, WarmRule(min_s=0.2, window_s=0.05, tol=0.01, max_s=2.0), short.clock)
    assert short.t >= 0.2


def test_the_warm_up_busies_the_device_for_its_minimum_and_gives_up_at_its_maximum():
    from moebench.core.timing import WarmRule, warm_until_steady

    steady_gpu = _FakeGPU(slow=1e-3, fast=1e-3, warm_after=0.0)
    _, steady = warm_until_steady(steady_gpu.step, WarmRule(min_s=0.2, window_s=0.05, max_s=1.0), steady_gpu.clock)
    assert steady and 0.2 <= steady_gpu.t < 0.3  # steady from the start: stops just past min_s

    class Drifting(_FakeGPU):
        def step(self):
            self.t += 1e-3 * (1 + 10 * self.t)  # never steady

    drifting = Drifting(0, 0, 0)
    _, steady = warm_until_steady(drifting.step, WarmRule(min_s=0.1, window_s=0.05, tol=0.001, max_s=0.5), drifting.clock)
    assert not steady and 0.5 <= drifting.t < 0.6
