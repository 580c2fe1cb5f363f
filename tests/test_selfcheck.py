"""The selfcheck's verdicts from fake samples: a machine too noisy to tell reads AMBIGUOUS with its measured
spread, never a failure; on a quiet machine a wrong harness (an A/A that differs, a timer that misses
the planted 5%) fails. The spread of the fake samples is exact by construction, so nothing here depends
on this machine's clock."""

from __future__ import annotations

import pytest

from moebench import selfcheck
from moebench.selfcheck import TOO_NOISY, CopyWork, aa_check, interleaved, sensitivity_check
from moebench.core.timing import StopRule

MS = 1e-3
NOISY = "this machine's timing spread is 38.0% (>= 5%): too noisy to prove the harness; rerun on an idle machine"


def samples(median: float, spread: float, n: int = 60) -> list[float]:
    """n samples (n even) with this median and robust relative spread (1.4826 x MAD / median): half at
    median x (1 - d), half at median x (1 + d), d = spread / 1.4826."""
    d = spread / 1.4826
    return [median * (1 + (d if i % 2 else -d)) for i in range(n)]


def test_quiet_machine_and_right_harness_pass():
    aa = aa_check(samples(10 * MS, 0.01), samples(10 * MS, 0.01))
    seen = sensitivity_check(samples(10 * MS, 0.01), samples(10.5 * MS, 0.01))
    for check in (aa, seen):
        assert check.ok and check.failure is None and check.doubt == ""
        assert check.spread == pytest.approx(0.01)
    assert seen.comparison.delta_pct == pytest.approx(5.0)


@pytest.mark.parametrize("check", [
    aa_check(samples(10 * MS, 0.38), samples(32.8 * MS, 0.38)),              # the A/A read +228%
    sensitivity_check(samples(10 * MS, 0.38), samples(10.03 * MS, 0.38)),    # 5% more bytes read +0.3%
], ids=["aa", "sensitivity"])
def test_noisy_machine_is_ambiguous_with_its_spread_not_a_failure(check):
    assert not check.ok and check.too_noisy
    assert check.failure is None
    assert check.doubt.startswith(NOISY + " (")


def test_noisy_machine_is_ambiguous_even_when_the_check_passes():
    # The A/A's noise band alone is twice the spread: agreeing inside it proves nothing.
    check = aa_check(samples(10 * MS, 0.38), samples(10 * MS, 0.38))
    assert check.ok and check.failure is None and check.doubt.startswith(NOISY)


def test_quiet_machine_with_a_wrong_harness_fails():
    aa = aa_check(samples(10 * MS, 0.01), samples(11 * MS, 0.01))
    assert not aa.ok and aa.doubt == ""
    assert aa.failure == ("A/A: the same copy measured 10000.0 us then 11000.0 us (+10.0%, noise 2.0%): verdict "
                          "REGRESSION; timing spread 1.0% (< 5%): the harness is wrong here")
    # A timer that misses the planted change: 5% more bytes read +0.3%.
    missed = sensitivity_check(samples(10 * MS, 0.01), samples(10.03 * MS, 0.01))
    assert not missed.ok and missed.doubt == ""
    assert missed.failure.startswith("sensitivity: 5% more bytes measured +0.3% (noise band 0.3%), verdict PASS; "
                                     "timing spread 1.0% (< 5%): the harness is wrong here")


@pytest.mark.parametrize("spread, noisy", [(TOO_NOISY - 0.001, False), (TOO_NOISY + 0.001, True)])
def test_the_threshold_is_on_the_measured_spread(spread, noisy):
    check = sensitivity_check(samples(10 * MS, spread), samples(10 * MS, spread))
    assert (check.failure is None, bool(check.doubt)) == (noisy, noisy)


class FakeWork:
    """Hands out one block of samples per time() call, and logs the call order."""

    def __init__(self, name: str, blocks: list[list[float]], log: list[str]) -> None:
        self.name, self.blocks, self.log = name, iter(blocks), log

    def time(self, rule: StopRule) -> list[float]:
        self.log.append(self.name)
        return next(self.blocks)


def test_interleaved_blocks_alternate_and_pool_so_drift_shows_as_spread():
    # Each block is tight (1%), but load rose through the check (10, 15, 20 ms): both sides see it alike,
    # the pooled spread shows it, and the check is AMBIGUOUS rather than a verdict.
    log: list[str] = []
    levels = [10 * MS, 15 * MS, 20 * MS]
    a = FakeWork("a", [samples(m, 0.01, 20) for m in levels], log)
    b = FakeWork("b", [samples(m, 0.01, 20) for m in levels], log)
    sa, sb = interleaved(a, b, StopRule())
    assert log == ["a", "b"] * 3 and len(sa) == len(sb) == 60
    check = aa_check(sa, sb)
    assert check.ok and check.spread > 0.3 and check.failure is None and check.doubt


def test_cpu_copy_is_timed_in_one_thread_and_the_thread_count_is_restored(monkeypatch):
    torch = pytest.importorskip("torch")
    seen = []
    monkeypatch.setattr(selfcheck, "cpu_timer", lambda calls, rule: seen.append(torch.get_num_threads()) or [1.0])
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert CopyWork(4096, "cpu").time(StopRule()) == [1.0]
        assert seen == [1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
