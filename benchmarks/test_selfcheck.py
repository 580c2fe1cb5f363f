"""The `selfcheck` family: the harness proves itself on this machine before its numbers are trusted.

- copy: a copy of known bytes, checked byte for byte, whose bandwidth is gated against the stored
  ceiling of this machine and reported against the ceiling measured in this session; the session's two
  ceilings (copy, and the read ceiling that read-dominated floors divide by) are reported beside it.
- A/A: the same work measured twice (interleaved blocks) must agree within noise.
- sensitivity: the same work made 5% larger must be seen as slower.
- graph timer vs triton.testing.do_bench (GPU): timing a ~10 us kernel two ways agrees within 3%.

A/A and sensitivity read AMBIGUOUS, with the measured timing spread, on a machine too noisy to prove the
harness (moebench.selfcheck.TOO_NOISY), and fail on a quiet one where they do not hold.
"""

from __future__ import annotations

import pytest

from moebench.core.method import cpu_timer_method, gpu_timer_method
from moebench.core.kinds import DEVICE_KERNEL, timed_on
from moebench.core.metrics import Metric
from moebench.selfcheck import CopyWork, aa_check, interleaved, sensitivity_check
from moebench.core.timing import StopRule

pytestmark = pytest.mark.selfcheck

# Sizes: large enough to leave the last-level cache (H200 L2 is 50 MB; a CPU's L3 is tens of MB).
GPU_BYTES = 1 << 30
CPU_BYTES = 64 << 20
RULE = StopRule(min_samples=20, max_samples=200, max_seconds=3.0, target_noise=0.005)


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _work(device: str, scale: float = 1.0) -> CopyWork:
    n = int((GPU_BYTES if device == "cuda" else CPU_BYTES) * scale) // 4096 * 4096
    return CopyWork(n, device)


def _definition(work: CopyWork, mode: str = "graph", **axes) -> dict:
    # A CPU copy is timed in one thread (CopyWork.time). The method (timer, warm-up, stopping rule) is
    # part of the definition: a changed timer makes the stored entries STALE (moebench.core.method).
    method = (cpu_timer_method(RULE) if work.device == "cpu"
              else gpu_timer_method(RULE, mode=mode, l2=f"{work.rotate} rotated buffers of {work.nbytes} bytes"))
    return {**axes, "bytes": work.nbytes, "device": work.device, "method": method,
            **({"cpu_threads": 1} if work.device == "cpu" else {})}


def _spread_metric(check) -> Metric:
    return Metric(100 * check.spread, "%", "lower", gated=False)


def test_copy_bandwidth(moebench):
    device = _device()
    work = _work(device)
    ceiling = moebench.ceiling(device)
    read = moebench.ceiling(device, "read")

    def measure():
        # Eager: the same method as the session ceiling (see CopyWork.time on graph-mode memcpy).
        bw = work.bandwidth_metric(work.time(RULE, mode="eager"), rel_tol=0.05)
        # Informational (not gated): what this session's floors divide by, copy and read side by side.
        return {"copy_GBps": bw, "pct_of_session_ceiling": bw.derived(100 * bw.value * 1e9 / ceiling, "%", "higher"),
                "session_copy_ceiling_GBps": Metric(ceiling / 1e9, "GB/s", "higher", gated=False),
                "session_read_ceiling_GBps": Metric(read / 1e9, "GB/s", "higher", gated=False)}

    moebench.record(f"selfcheck[copy-{work.nbytes >> 20}MiB-{device}]", "selfcheck",
                    _definition(work, "eager", op="copy", rotate=work.rotate, timer="eager"), measure,
                    info={"session_ceiling_GBps": ceiling / 1e9, "session_read_ceiling_GBps": read / 1e9})


def test_aa_same_work_agrees(moebench):
    work = _work(_device())
    sa, sb = interleaved(work, work, RULE)
    check = aa_check(sa, sb)
    if check.failure:
        pytest.fail(check.failure, pytrace=False)
    b = Metric.from_samples([x * 1e6 for x in sb], "us", "lower", rel_tol=0.05, kind=timed_on(work.device))
    moebench.record(f"selfcheck[aa-copy-{work.nbytes >> 20}MiB-{work.device}]", "selfcheck", _definition(work, op="aa"),
                    lambda: {"aa_abs_delta_pct": Metric(abs(check.comparison.delta_pct), "%", "lower", gated=False),
                             "timing_spread_pct": _spread_metric(check), "copy_us": b},
                    primary="copy_us", doubt=check.doubt)


def test_sensitivity_5pct_larger_is_slower(moebench):
    device = _device()
    base, big = _work(device), _work(device, 1.05)
    check = sensitivity_check(*interleaved(base, big, RULE), planted=0.05)
    if check.failure:
        pytest.fail(check.failure, pytrace=False)
    moebench.record(f"selfcheck[sensitivity-copy-{base.nbytes >> 20}MiB-{device}]", "selfcheck",
                    _definition(base, op="sensitivity"),
                    lambda: {"seen_slowdown_pct": Metric(check.comparison.delta_pct, "%", "higher", gated=False),
                             "timing_spread_pct": _spread_metric(check)},
                    doubt=check.doubt)


@pytest.mark.gpu
def test_graph_timer_agrees_with_do_bench(moebench):
    torch = pytest.importorskip("torch")
    testing = pytest.importorskip("triton.testing")
    from moebench.core.timing import capture_graph, graph_timer

    # ~10 us of bf16 matmul on an H200. Both timers time the same work: one CUDA graph of R matmuls,
    # ours through graph_timer (events around replays, our stopping rule), Triton's do_bench around
    # g.replay(). Timing a single eager call instead would add the ~3 us the GPU front end takes per
    # launch (an H200 read 15.9 us eager vs 12.5 us in a graph), which is a different quantity.
    n, r = 1536, 32
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g)
    out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    ref = a.float() @ b.float()
    torch.matmul(a, b, out=out)
    err = ((out.float() - ref).norm() / ref.norm()).item()
    assert err < 1e-2, f"matmul check failed: relative error {err:.2e}"

    calls = [lambda: torch.matmul(a, b, out=out)] * r
    rule = StopRule(min_samples=30, max_seconds=3)
    ours = Metric.from_samples([s * 1e6 for s in graph_timer(calls, rule)],
                               "us", "lower", rel_tol=0.05, kind=DEVICE_KERNEL)
    graph = capture_graph(torch, calls)
    theirs = testing.do_bench(graph.replay, warmup=50, rep=300, return_mode="median") * 1e3 / r
    single = testing.do_bench(calls[0], warmup=50, rep=300, return_mode="median") * 1e3
    diff = 100 * (ours.value - theirs) / theirs
    assert abs(diff) < 3, f"graph timer {ours.value:.2f} us vs do_bench {theirs:.2f} us: {diff:+.1f}% (limit 3%)"
    moebench.record(f"selfcheck[matmul-{n}-bf16-graph-vs-do_bench]", "selfcheck",
                    {"op": "matmul", "n": n, "dtype": "bf16", "graph_calls": r,
                     "method": gpu_timer_method(rule, mode="graph", l2="one buffer set (the check is of the timer)")},
                    lambda: {"graph_us": ours, "do_bench_graph_us": Metric(theirs, "us", "lower", gated=False),
                             "do_bench_single_call_us": Metric(single, "us", "lower", gated=False),
                             "diff_pct": Metric(diff, "%", "lower", gated=False)}, primary="graph_us")
