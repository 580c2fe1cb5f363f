"""From per-chunk timestamps to the decode metrics: TTFT, inter-token latency, steady-state ms/token.

A trial is one request: the time it was sent and, for every chunk of output the engine handed back,
its arrival time and how many tokens it carried. Warm-up trials (torch.compile, Triton JIT, CUDA graph
capture, autotuning: the users' first trial read 192 ms/token against 97 steady) are reported on their
own and never mixed into the steady-state figures.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from moebench.core.metrics import Metric

# Tokens per window of the steady-state rate: 16 spans the bursts a loaded server sends (several tokens
# per stream chunk) and is short against the 64-256 tokens of a trial.
STEADY_WINDOW = 16
# A steady rate under this fraction of the end-to-end rate after the first token cannot be right for
# one stream (the windows span the whole trial): the timeline is broken, not fast.
MIN_STEADY_OVER_TPOT = 0.5


@dataclass
class Trial:
    """One request's output timeline. chunks: (seconds since the request was sent, tokens in chunk)."""

    warmup: bool
    chunks: list[tuple[float, int]] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        """Output tokens the trial produced."""
        return sum(n for _, n in self.chunks)

    @property
    def ttft_s(self) -> float:
        """Time to first token: from sending the request to the first chunk."""
        return self.chunks[0][0]

    @property
    def total_s(self) -> float:
        """From sending the request to the last chunk."""
        return self.chunks[-1][0]

    def itls_s(self) -> list[float]:
        """Inter-token latencies. A chunk of k tokens arriving g seconds after the previous chunk counts
        as k tokens of g/k each (engines may batch tokens into a chunk; the user waited g for k)."""
        out: list[float] = []
        for (t0, _), (t1, n) in zip(self.chunks, self.chunks[1:]):
            out.extend([(t1 - t0) / n] * n)
        return out

    def token_times_s(self) -> list[float]:
        """Arrival time of every output token (the tokens of one chunk share its arrival time)."""
        return [t for t, n in self.chunks for _ in range(n)]

    def window_rates_s(self, window: int = STEADY_WINDOW) -> list[float]:
        """Seconds per token over every run of `window` consecutive tokens after the first: counts and
        times that stay right when a chunk carries several tokens (a burst of k tokens 0.01 ms apart
        no longer reads as k fast tokens: the window spans the wait before it). A rare stall moves a
        few windows, not their median. The window is at least twice the largest chunk after the first
        token, so that every window spans a wait: a starved server (2-core box) that flushes 30 tokens at
        once is read over the whole trial, its end-to-end rate. On a stream of one token per chunk (every
        GPU run) that changes nothing."""
        times = self.token_times_s()[1:]  # the first token is TTFT's, not the steady state's
        if len(times) < 2:
            return []
        largest = max([n for _, n in self.chunks[1:]] + [self.chunks[0][1] - 1])
        w = min(max(window, 2 * largest), len(times) - 1)
        return [(times[i + w] - times[i]) / w for i in range(len(times) - w)]


def _pct(xs: list[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation between closest ranks."""
    xs = sorted(xs)
    if len(xs) == 1:
        return xs[0]
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def check_trial(trial: Trial, expected_tokens: int, vocab_size: int | None) -> str | None:
    """Why a trial's output is wrong (token count, token ids out of the vocabulary), or None."""
    if not trial.chunks:
        return "no output token"
    if trial.tokens != expected_tokens:
        return f"{trial.tokens} output tokens, expected {expected_tokens}"
    if vocab_size and trial.token_ids and not all(0 <= t < vocab_size for t in trial.token_ids):
        bad = next(t for t in trial.token_ids if not 0 <= t < vocab_size)
        return f"token id {bad} outside the vocabulary (0..{vocab_size - 1})"
    return None


def decode_metrics(trials: list[Trial], *, rel_tol_ms_per_token: float = 0.10, rel_tol_ttft: float = 0.20) -> dict[str, Metric]:
    """The family's metrics. Gated: ms_per_token (steady state: the median over measured trials of
    seconds per token in windows of STEADY_WINDOW tokens after the first) and ttft_ms (median over
    measured trials). Informational: ITL p90/p99, TPOT (mean ITL), tokens/s, end-to-end ms per token, and
    the warm-up trials' own figures."""
    measured = [t for t in trials if not t.warmup]
    warm = [t for t in trials if t.warmup]
    if not measured:
        raise ValueError("no measured trial")
    itl_ms = [x * 1e3 for t in measured for x in t.itls_s()]
    rates_ms = [x * 1e3 for t in measured for x in t.window_rates_s()]
    if not itl_ms or not rates_ms:
        raise ValueError("measured trials produced fewer than 3 tokens: no steady-state rate")
    ttft_ms = [t.ttft_s * 1e3 for t in measured]
    steady = Metric.from_samples(rates_ms, "ms", "lower", rel_tol=rel_tol_ms_per_token)
    out = {
        "ms_per_token": steady,
        "ttft_ms": Metric.from_samples(ttft_ms, "ms", "lower", rel_tol=rel_tol_ttft),
        "itl_p90_ms": Metric(_pct(itl_ms, 0.90), "ms", "lower", n=len(itl_ms), gated=False),
        "itl_p99_ms": Metric(_pct(itl_ms, 0.99), "ms", "lower", n=len(itl_ms), gated=False),
        # Time per output token after the first (mean ITL): equal to the median ITL on a smooth stream,
        # far above it when tokens arrive in bursts (a starved server process flushing several at once).
        "tpot_ms": Metric(statistics.median(1e3 * (t.total_s - t.ttft_s) / (t.tokens - 1) for t in measured if t.tokens > 1),
                          "ms", "lower", n=len(measured), gated=False),
        "tokens_per_s": Metric(statistics.median(t.tokens / t.total_s for t in measured), "tokens/s", "higher",
                               n=len(measured), gated=False),
        "e2e_ms_per_token": Metric(statistics.median(1e3 * t.total_s / t.tokens for t in measured), "ms", "lower",
                                   n=len(measured), gated=False),
    }
    if warm:
        warm_itl = [x * 1e3 for t in warm for x in t.itls_s()]
        if warm_itl:
            out["warmup_ms_per_token"] = Metric(statistics.median(warm_itl), "ms", "lower", n=len(warm_itl), gated=False)
        out["warmup_ttft_ms"] = Metric(statistics.median(t.ttft_s * 1e3 for t in warm), "ms", "lower",
                                       n=len(warm), gated=False)
        out["warmup_e2e_ms_per_token"] = Metric(statistics.median(1e3 * t.total_s / t.tokens for t in warm), "ms",
                                                "lower", n=len(warm), gated=False)
    return out


def implausible(metrics: dict[str, Metric], floor_ms: float | None = None) -> str | None:
    """Why a measured steady state cannot be true, with both numbers, or None. Below the memory floor
    (the weights must be read once per token) or far under the stream's own end-to-end rate, the
    timeline is broken (a starved host flushing tokens in bursts); such a figure must never become a
    baseline."""
    steady, tpot = metrics["ms_per_token"].value, metrics["tpot_ms"].value
    if floor_ms is not None and steady < floor_ms:
        return (f"steady state {steady:.4g} ms/token is below the memory floor {floor_ms:.4g} ms/token "
                "(the weights cannot be read that fast): the token timeline is wrong")
    if steady < MIN_STEADY_OVER_TPOT * tpot:
        return (f"steady state {steady:.4g} ms/token against {tpot:.4g} ms/token end to end after the first token: "
                "the tokens arrived in bursts (an overloaded host), so no steady rate can be read from this run")
    return None


def trial_name(index: int, warmup: bool = False) -> str:
    """How every message names the trial at 0-based `index` of a case's run: 1-based, in the order the
    engine ran them with the warm-up trials counted ("trial 1 (warm-up)", "trial 3"), as the progress
    lines number them ("trial 3/5"). One way for all: stats said "trial 1" for the trial the progress
    lines called "trial 2/5"."""
    return f"trial {index + 1}" + (" (warm-up)" if warmup else "")


def burst_phrase(trials: list[Trial]) -> str | None:
    """Where a quarter or more of the chunks of a measured trial arrived all but together with the one
    before (under 1% of the trial's mean time per chunk apart), the worst such trial in words ("trial 2:
    126 of the 127 chunks after the first came under 0.07 ms after the one before, the last 902.0 ms
    after the request"), else None. Such a stream was held back and flushed, whole or in parts, by its host: a
    stream whose chunks carry several tokens each still has them spaced."""
    worst = None
    for i, t in enumerate(trials):
        if t.warmup or len(t.chunks) < 3:
            continue
        times = [c[0] for c in t.chunks]
        close = 0.01 * t.total_s / len(times)
        held = sum(1 for a, b in zip(times, times[1:]) if b - a < close)
        if 4 * held >= len(times) - 1 and (worst is None or held > worst[0]):
            worst = (held, i, len(times) - 1, close, times[-1])
    if worst is None:
        return None
    held, i, n, close, end = worst
    return (f"{trial_name(i)}: {held} of the {n} chunks after the first came under {close * 1e3:.2f} ms after the one "
            f"before, the last {end * 1e3:.1f} ms after the request")


def per_trial_summary(trials: list[Trial]) -> list[dict]:
    """One line of figures per trial, warm-up marked, for the results JSON; "trial" numbers it as
    trial_name does (1-based, warm-up trials counted)."""
    rows = []
    for i, t in enumerate(trials):
        itl = t.itls_s()
        rows.append({"trial": i + 1, "warmup": t.warmup, "tokens": t.tokens, "ttft_ms": round(t.ttft_s * 1e3, 3),
                     "median_itl_ms": round(statistics.median(itl) * 1e3, 4) if itl else None,
                     "e2e_ms_per_token": round(1e3 * t.total_s / t.tokens, 4) if t.tokens else None})
    return rows
