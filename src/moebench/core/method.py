"""The way of measuring, as data: what goes into a case definition so that a changed method makes the
stored entries STALE, never a REGRESSION or an IMPROVEMENT.

A number means "this work, timed this way". When the GPU timers learned to warm the device until its
replay rate is steady (GPU_TIMER_VERSION 2), a stored 26.6 us case became 24.3 us without any change to
the case, read as IMPROVEMENT, and then hid a planted 8% slowdown. So every family's definition names
its method here:

- gemm and selfcheck: `gpu_timer_method` / `cpu_timer_method` (timer version, warm rule, stopping rule,
  L2 handling); the rotation count is already an axis of the gemm definition.
- decode: `STEADY_STATE` (the steady-state rule) and the breakdown map version (decode.categories).
- allreduce: its own timer, fully described in its definition (allreduce.cases).

A version is a promise about code: tests/test_method.py hashes the code of each method (the timer
functions, the steady-state rule) and fails until the version or the recorded digest below is updated,
so a timer edit cannot slip through as "the same method".
"""

from __future__ import annotations

from dataclasses import asdict

from moebench.core.timing import GPU_WARM, HEAD_START_CYCLES, StopRule

# 1: CUDA events around graph replays after two warm-up rounds (up to 988b5ec).
# 2: the same, once the replays run at a steady rate (timing.warm_until_steady with GPU_WARM), and a
#    head start (torch.cuda._sleep) before each start mark so the host's launch is not timed.
GPU_TIMER_VERSION = 2
# 1: wall clock around the R calls after one warm-up round.
CPU_TIMER_VERSION = 1
# The decode steady-state rule (decode.stats): ms/token is the median of STEADY_WINDOW-token windows of
# the token timeline, windows at least twice the largest stream chunk. Part of the decode definition.
STEADY_STATE_VERSION = 1

# ast digests of the code each version stands for (tests/test_method.py computes and compares them).
# Update a digest alone only for a change that cannot move a number (a rename, a refactor); anything
# else bumps the version above.
CODE_DIGESTS = {
    "gpu_timer": "61eda095ca53450d",
    "cpu_timer": "69d6122c61efae94",
    "steady_state": "c08f1132e601d76e",
}


# The code behind each method, as (module, qualified name) pairs: what CODE_DIGESTS covers.
METHOD_CODE = {
    "gpu_timer": [("moebench.core.timing", n) for n in ("StopRule.done", "collect", "_l2_flusher", "warm_until_steady",
                                                    "event_time", "capture_graph", "graph_timer", "eager_timer")],
    "cpu_timer": [("moebench.core.timing", n) for n in ("StopRule.done", "collect", "cpu_timer")],
    "steady_state": [("moebench.decode.stats", n) for n in ("Trial.token_times_s", "Trial.window_rates_s",
                                                             "decode_metrics")],
}


def steady_state_rule(window: int) -> str:
    """The decode definition's steady-state phrase. Version 1 reads as the entries recorded before the
    rule had a version (the window rule of f21be6e reads one-token GPU streams as before), so they stay
    comparable; a later version names itself, and the entries recorded before it go STALE."""
    rule = f"median of {window}-token windows"
    return rule if STEADY_STATE_VERSION == 1 else f"{rule}, rule version {STEADY_STATE_VERSION}"


def _rule(rule: StopRule) -> dict:
    return asdict(rule)


def gpu_timer_method(rule: StopRule, *, mode: str, l2: str) -> dict:
    """The GPU timing method of a case: mode 'graph' (events around a CUDA-graph replay of the rotated
    calls) or 'eager' (events around the plain calls), the warm-up rule, the stopping rule, and `l2`, the
    family's rule for keeping the L2 cache out of the number (a phrase)."""
    if mode not in ("graph", "eager"):
        raise ValueError(f"mode must be 'graph' or 'eager', got {mode!r}")
    return {"timer": f"cuda-events-{mode}", "timer_version": GPU_TIMER_VERSION, "warm": asdict(GPU_WARM),
            "head_start_cycles": HEAD_START_CYCLES if mode == "graph" else 0, "stop_rule": _rule(rule), "l2": l2}


def cpu_timer_method(rule: StopRule) -> dict:
    """The CPU timing method: wall clock around the rotated calls, and its stopping rule."""
    return {"timer": "perf-counter", "timer_version": CPU_TIMER_VERSION, "stop_rule": _rule(rule)}
