"""The change-point detector on synthetic histories with the committed H200 cases' own spread
(tests/aa_histories.py): A/A flags nothing, a 3%/night drift is found within 3 nights and a 4% step
within 2, and what is below the noise band or half the tolerance is not reported."""

from __future__ import annotations

import pytest

from aa_histories import CaseSpread, committed_cases, history, nights_to_detect
from moebench.history.changes import RunPoint, Series, find_changes, series_noise

pytest.importorskip("ruptures", reason="ruptures (the history extra) is not installed")

CASES = committed_cases()
# The goals hold for the quiet cases: tolerance 5% (the threshold is then half of it, 2.5%) and a night-to-night
# spread under 1% (docs/change-points.md has the noisier ones). One of each family and kind of them.
QUIET = [c for c in CASES if c.rel_tol <= 0.05 and c.noise < 0.01]
# The picks stay clear of the edge: docs/change-points.md's study finds a 4% step within 2 nights in 721 of 732
# quiet histories, the misses being cases just under 1% (the w4 decode norms entry, 0.92% since session 14,
# takes 3 nights or more at some seeds).
PICKS = [c for c in QUIET if c.noise < 0.008 and c.key.startswith(("selfcheck[copy-1024", "decode[kimi-k2.5-int4-rank-vllm-tp1"))
         or c.key in ("gemm[kimi-k2.5-tp8-fused-m1-bf16-decode-triton]", "gemm[deepseek-v3-tp8-fused-m16-int4-g32-decode-vllm_marlin]",
                      "allreduce[nccl-w2-h7168-t8192-bf16-graph]")]


def _series(values, *, noise=0.003, rel_tol=0.05, direction="lower") -> Series:
    points = tuple(RunPoint(f"2026-11-{1 + i:02d}T02:17:00Z", f"c{i:06d}", v, noise) for i, v in enumerate(values))
    return Series("hw", "gemm[x]", "graph_us", "us", direction, rel_tol, points, "gemm")


def test_the_committed_cases_are_all_there():
    assert len(CASES) > 200 and len(PICKS) >= 6, [c.key for c in PICKS]


def test_aa_histories_of_every_committed_case_report_no_change():
    """30 nights of every case's metric at its own spread: not one change point, worse or better."""
    found = {(c.key, c.metric): find_changes(history(c, seed=0)) for c in CASES}
    assert {k: v for k, v in found.items() if v} == {}


@pytest.mark.parametrize("case", PICKS, ids=lambda c: f"{c.key}-{c.metric}")
def test_a_drift_of_3pct_a_night_fails_within_3_nights(case: CaseSpread):
    assert nights_to_detect(case, seed=1, drift=0.03) <= 3


@pytest.mark.parametrize("case", PICKS, ids=lambda c: f"{c.key}-{c.metric}")
def test_a_4pct_step_fails_within_2_nights(case: CaseSpread):
    assert nights_to_detect(case, seed=2, step=0.04) <= 2


def test_a_step_is_reported_with_its_runs_size_and_noise():
    values = [100.0] * 10 + [104.0] * 4
    (cp,) = find_changes(_series(values))
    assert (cp.index, cp.before.commit, cp.after.commit) == (10, "c000009", "c000010")
    assert cp.level_before == 100.0 and cp.level_after == 104.0 and cp.change == pytest.approx(0.04)
    assert cp.worse and not cp.recent and not cp.failing  # 4 runs after it: older than the last 3
    assert cp.noise == pytest.approx(0.003) and cp.threshold == pytest.approx(0.025)


def test_a_change_below_half_the_tolerance_or_inside_the_noise_band_is_not_reported():
    assert find_changes(_series([100.0] * 10 + [102.0] * 3)) == []  # 2% < half of 5%
    assert len(find_changes(_series([100.0] * 10 + [103.0] * 3))) == 1
    assert find_changes(_series([100.0] * 10 + [105.0] * 3, noise=0.03)) == []  # 5% < 2 x 3% noise
    assert len(find_changes(_series([100.0] * 10 + [107.0] * 3, noise=0.03))) == 1
    assert find_changes(_series([100.0] * 10 + [104.0] * 3, rel_tol=0.10)) == []  # 4% < half of 10%


def test_direction_decides_worse_and_only_recent_worse_changes_fail():
    (faster,) = find_changes(_series([100.0] * 10 + [90.0] * 2))
    assert not faster.worse and faster.recent and not faster.failing
    (less_bandwidth,) = find_changes(_series([100.0] * 10 + [90.0] * 2, direction="higher"))
    assert less_bandwidth.worse and less_bandwidth.failing


def test_one_odd_night_is_not_a_change_and_too_short_a_history_says_nothing():
    assert find_changes(_series([100.0] * 10 + [130.0] + [100.0] * 3)) == []
    assert find_changes(_series([100.0] * 10 + [130.0])) == []  # tonight alone: known tomorrow
    assert find_changes(_series([100.0] * 7 + [120.0] * 3)) == []  # seven nights are not yet a level
    assert len(find_changes(_series([100.0] * 8 + [120.0] * 3))) == 1


def test_a_slow_drift_is_reported_where_it_adds_up():
    """1% a night never crosses the threshold from one segment to the next; merged below-threshold
    segments make it add up."""
    values = [100.0] * 10 + [100.0 * (1 + 0.01 * i) for i in range(1, 9)]
    cps = find_changes(_series(values))
    assert cps and all(c.worse for c in cps) and cps[0].level_after / 100.0 - 1 > 0.025


def test_the_noise_judged_against_is_the_history_s_own_when_the_runs_undersell_it():
    """Runs that each record 0.1% spread but wander 3% from night to night: a 5% step is inside that."""
    wander = [100.0, 103.0, 97.0, 101.5, 98.0, 103.5, 96.5, 100.5, 102.0, 98.5, 101.0, 97.5]
    assert series_noise(_series(wander, noise=0.001)) > 0.02
    assert find_changes(_series(wander + [105.0, 108.0, 102.0], noise=0.001)) == []
