"""The steady-state rules of decode/stats.py, each pinned by a timeline whose right answer is known: the
window spans twice the largest burst (the first chunk's extra tokens included), and the burst check
compares the steady rate with TPOT (not the end-to-end rate, which holds the prefill) at ratio 0.5."""

from __future__ import annotations

import pytest

from moebench.decode.stats import Trial, decode_metrics, implausible
from moebench.core.metrics import Metric


def test_the_window_is_twice_the_largest_chunk_so_that_every_window_spans_whole_waits():
    # the first token, then 8 chunks of 12 tokens 120 ms apart (the engine made one every 10 ms): a
    # 24-token window always spans two waits and reads 10 ms; a 12- or 16-token one reads 7.5 or 15 ms
    chunks = [(0.1, 1)] + [(0.1 + 0.12 * k, 12) for k in range(1, 9)]
    rates = Trial(False, chunks, []).window_rates_s()
    assert len(rates) == 96 - 24
    assert rates == pytest.approx([0.010] * len(rates))


def test_extra_tokens_in_the_first_chunk_are_a_burst_too():
    # the first chunk brings the first token and 11 more at once, then one token every 10 ms: the 11
    # count as a burst (window 22), so no window ends within 11 tokens of the burst
    chunks = [(0.1, 12)] + [(0.1 + 0.01 * k, 1) for k in range(1, 41)]
    rates = Trial(False, chunks, []).window_rates_s()
    assert len(rates) == (11 + 40) - 22
    assert rates[0] == pytest.approx(0.12 / 22)  # from the burst to 12 tokens after it
    assert min(rates) > 0.005


def test_a_long_prefill_does_not_make_a_smooth_stream_read_as_bursts():
    # a 2 s prefill, then 64 tokens 10 ms apart: the end-to-end rate (41 ms/token) holds the prefill;
    # the burst check compares with TPOT, the rate after the first token (10 ms)
    m = decode_metrics([Trial(False, [(2.0 + 0.01 * i, 1) for i in range(64)], [])])
    assert m["e2e_ms_per_token"].value > 4 * m["tpot_ms"].value
    assert m["ms_per_token"].value == pytest.approx(10) and implausible(m) is None


@pytest.mark.parametrize("ratio, flagged", [(0.45, True), (0.55, False)])
def test_a_steady_rate_under_half_of_tpot_is_flagged(ratio, flagged):
    m = {"ms_per_token": Metric(10.0 * ratio, "ms", "lower"), "tpot_ms": Metric(10.0, "ms", "lower"),
         "e2e_ms_per_token": Metric(10.0, "ms", "lower")}
    assert (implausible(m) is not None) is flagged
