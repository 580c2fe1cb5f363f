"""The stopping rule and the sample loop, with a fake clock and a fake sample source, so every stop is
decided by numbers the test chose, not by how fast this machine happens to be."""

from __future__ import annotations

import pytest

from moebench.timing import StopRule, collect, cpu_timer

QUIET = [1.0] * 1000                     # spread 0
NOISY = [1.0, 2.0, 3.0] * 400           # spread (1.4826 * MAD / median) stays above 0.3 from 2 samples on


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
    # target_noise < 0 is never met: the rule stops at max_samples, so the count is exact.
    samples = cpu_timer(calls, StopRule(min_samples=4, max_samples=4, max_seconds=1e9, target_noise=-1), warmup=2)
    assert len(samples) == 4
    assert all(isinstance(s, float) and s >= 0 for s in samples)
    assert counts == [2 + 4] * 3, "each call runs once per warm-up round and once per sample"


class _FakeCuda:
    """Records the order of stream operations event_time issues; 1 ms between the marks."""

    def __init__(self, log: list, with_sleep: bool = True):
        self.log = log
        if with_sleep:
            self._sleep = lambda cycles: log.append(("sleep", cycles))
        cuda = self
        names = iter(("start", "end"))  # event_time makes its start event first

        class Event:
            def __init__(self, enable_timing=False):
                self.name = next(names)

            def record(self):
                cuda.log.append(("record", self.name))

            def synchronize(self):
                pass

            def elapsed_time(self, other):
                return 1.0

        self.Event = Event


class _FakeTorch:
    def __init__(self, log: list, with_sleep: bool = True):
        self.cuda = _FakeCuda(log, with_sleep)


@pytest.mark.parametrize("head_start", [False, True])
def test_event_time_head_start_holds_the_stream_before_the_start_mark_only_when_asked(head_start):
    from moebench import timing

    log: list = []
    secs = timing.event_time(_FakeTorch(log), lambda: log.append(("work",)), head_start=head_start)
    expected = [("record", "start"), ("work",), ("record", "end")]
    if head_start:
        expected = [("sleep", timing.HEAD_START_CYCLES)] + expected
    assert log == expected
    assert secs == pytest.approx(1e-3)


def test_event_time_head_start_without_sleep_support_still_times():
    from moebench import timing

    log: list = []
    timing.event_time(_FakeTorch(log, with_sleep=False), lambda: log.append(("work",)), head_start=True)
    assert log == [("record", "start"), ("work",), ("record", "end")]
