"""What the leave-one-out times of the tensor-core int4 decode kernel (w4_split.py) say: plain arithmetic on
measured times, no GPU and no torch, so every number in the report can be checked from fake timings.

    kernel_bytes(experts, M, K, I, topk, dtype) -> (up bytes, down bytes)
    summarize(times, up_bytes, down_bytes, ceiling) -> dict    the report's numbers for one case
    verdict(M, down_share_us) -> str | None                    issue 32's rule for what to change (M = 1)
    case_line(model, M, summary, ceiling) -> str               one printed line per case
    launch_summary(times) -> dict                              each launch over one empty launch's graph time
    prefetch_summary(times, mode) -> dict                      --prefetch-down: what the L2 prefetch did
    prefetch_line(model, M, mode, summary) -> str              its printed line

The four times (us per call, each with the relative noise of its samples) are named as w4_split.py times them:
bench (the `triton` backend's calls, the benchmark's graph_us), both (up then down through w4_mma's split
launches), up (up alone) and down (down alone, on activations kept from a real up run).
"""

from __future__ import annotations

from typing import NamedTuple

from moebench.gemm.workload import matrix_bytes

VARIANTS = ("bench", "both", "up", "down")
# issue 32's rule (docs/triton-moe-notes.md, "What Nsight Compute read at M = 1"), written for M = 1's 14.0 us
# graph: down's share of the graph over FUSE_OVER_US -> load down's weights in up's launch; under
# UP_GAP_UNDER_US -> the gap is up's (ramp, K reduction), split-K across experts in up.
RULE_M = 1
FUSE_OVER_US = 5.0
UP_GAP_UNDER_US = 3.0
# Two graph timings of the same work agree when they differ by at most twice the sum of their sample spreads
# (each a robust relative spread, metrics.relative_spread), and never by less than 1%: the suite's GPU
# stopping rule aims at 1% noise (runner.GPU_RULE), so a tighter band would flag a quiet run's luck.
AGREE_MIN = 0.01


class Timed(NamedTuple):
    """One variant's per-call time (us) and the relative spread of its samples."""

    us: float
    noise: float


def kernel_bytes(experts: float, M: int, K: int, I: int, topk: int, dtype: str = "int4-g32") -> tuple[float, float]:
    """(up, down) bytes each launch must move: its weights for the distinct experts (mean over the rotations,
    as Workload.bytes_per_call counts them) plus its activations. up reads w1 [2I, K] per expert and x [M, K],
    and writes h [M topk, I]; down reads w2 [K, I] per expert and h, and writes out [M, K] (bf16 activations).
    Their sum is the case's bytes plus h written and read back (2 M topk I bf16: 8 KB at M = 1)."""
    h = M * topk * I * 2
    up = experts * matrix_bytes(dtype, 2 * I, K) + M * K * 2 + h
    down = experts * matrix_bytes(dtype, K, I) + h + M * K * 2
    return up, down


def agree_tol(a: Timed, b: Timed) -> float:
    """The relative difference up to which two timings of the same work count as equal (see AGREE_MIN)."""
    return max(AGREE_MIN, 2 * (a.noise + b.noise))


def summarize(times: dict[str, Timed], up_bytes: float, down_bytes: float, ceiling: float) -> dict:
    """The report's numbers for one case from its four timings (VARIANTS) and its kernels' bytes, floors at
    `ceiling` (bytes/s; the run's read ceiling):

    overlap_us     up + down - both: what running the two together saves over running each alone (PDL's
                   early start of down's weight loads, and the launch gap between them)
    down_share_us  both - up: what down adds to the graph beyond up alone (issue 32's "down's own share")
    up_share_us    both - down: the same for up
    *_floor_us     a kernel's bytes at the ceiling; *_pct_of_floor = floor / its time alone
    both_vs_bench  (both - bench) / bench; agree: within agree_tol, i.e. the split launches time the
                   benchmark's work
    """
    missing = [v for v in VARIANTS if v not in times]
    if missing:
        raise ValueError(f"summarize needs the times of {', '.join(VARIANTS)}; missing {', '.join(missing)}")
    if not ceiling > 0:
        raise ValueError(f"the read ceiling must be positive bytes/s, got {ceiling!r}")
    bench, both, up, down = (times[v] for v in VARIANTS)
    up_floor, down_floor = up_bytes / ceiling * 1e6, down_bytes / ceiling * 1e6
    rel = (both.us - bench.us) / bench.us
    out = {f"{v}_us": times[v].us for v in VARIANTS}
    out.update({f"{v}_noise": times[v].noise for v in VARIANTS})
    out.update({
        "both_vs_bench": rel,
        "agree": abs(rel) <= agree_tol(both, bench),
        "overlap_us": up.us + down.us - both.us,
        "down_share_us": both.us - up.us,
        "up_share_us": both.us - down.us,
        "up_bytes": up_bytes,
        "down_bytes": down_bytes,
        "up_floor_us": up_floor,
        "down_floor_us": down_floor,
        "up_pct_of_floor": 100.0 * up_floor / up.us,
        "down_pct_of_floor": 100.0 * down_floor / down.us,
    })
    return out


def verdict(M: int, down_share_us: float) -> str | None:
    """Issue 32's rule at M = 1 (None at other M: its thresholds were written for M = 1's 14.0 us graph)."""
    if M != RULE_M:
        return None
    if down_share_us > FUSE_OVER_US:
        return (f"down's share {down_share_us:.2f} us > {FUSE_OVER_US:g}: load down's weights in up's launch "
                f"(one fused launch)")
    if down_share_us < UP_GAP_UNDER_US:
        return (f"down's share {down_share_us:.2f} us < {UP_GAP_UNDER_US:g}: the gap is up's (ramp, K "
                f"reduction): split-K across experts in up")
    return (f"down's share {down_share_us:.2f} us is between {UP_GAP_UNDER_US:g} and {FUSE_OVER_US:g}: "
            f"neither change is decided by this rule")


def case_line(model: str, M: int, s: dict, ceiling: float) -> str:
    """One line of a case's numbers, as printed while the run goes on."""
    agree = "agree" if s["agree"] else "DISAGREE"
    return (f"{model} M={M}: bench {s['bench_us']:.2f} us, both {s['both_us']:.2f} ({100 * s['both_vs_bench']:+.1f}%, "
            f"{agree}), up alone {s['up_us']:.2f}, down alone {s['down_us']:.2f}; overlap {s['overlap_us']:.2f}, "
            f"down's share {s['down_share_us']:.2f}; at {ceiling / 1e9:.0f} GB/s up {s['up_bytes'] / 1e6:.2f} MB = "
            f"{s['up_floor_us']:.2f} us ({s['up_pct_of_floor']:.0f}% of its time), down {s['down_bytes'] / 1e6:.2f} MB "
            f"= {s['down_floor_us']:.2f} us ({s['down_pct_of_floor']:.0f}%)")


def launch_summary(times: dict[str, Timed]) -> dict:
    """Each launch's time over the graph's floor for one launch (`launch`: a graph of one empty kernel,
    timed as the others are), from the timings `launch`, `up`, `down` and `both` of one process:

    launch_us          one empty kernel's graph time: what no kernel change can take out of a launch
    up_over_launch_us  up alone - launch: what up's own work adds (the part its code decides); down_ alike
    both_over_two_us   both - 2 x launch: the call's work over two launches' floor (PDL may hide part of the
                       second's, so this is an upper bound of what the two kernels' code decides)
    """
    launch = times["launch"].us
    return {"launch_us": launch, "launch_noise": times["launch"].noise,
            "up_over_launch_us": times["up"].us - launch, "down_over_launch_us": times["down"].us - launch,
            "both_over_two_us": times["both"].us - 2 * launch}


def launch_line(model: str, M: int, s: dict) -> str:
    """One line of a case's launch floor, as printed while the run goes on."""
    return (f"  {model} M={M} one empty launch in the graph: {s['launch_us']:.2f} us; over it up alone "
            f"{s['up_over_launch_us']:.2f}, down alone {s['down_over_launch_us']:.2f}; both over two launches "
            f"{s['both_over_two_us']:.2f}")


def prefetch_summary(times: dict[str, Timed], mode: str) -> dict:
    """What the up launch's L2 prefetch of down's weights (w4_prefetch.py, `mode`) did to one case, from the
    timings `up` and `both` (prefetch off) and `up_pf_<mode>`, `both_pf_<mode>` (on), all of one process:

    saved_us         both - both with the prefetch: the graph time the prefetch buys (> 0: it wins)
    up_cost_us       up alone with it - up alone: what issuing the prefetch (and its DRAM reads) costs up
    down_share_us    both - up with the prefetch: down's share of the graph once its weights are in L2
    agree            saved_us is outside the two both timings' spread (agree_tol): a real difference
    """
    up, both = times["up"], times["both"]
    up_pf, both_pf = times[f"up_pf_{mode}"], times[f"both_pf_{mode}"]
    saved = both.us - both_pf.us
    return {"up_us": up_pf.us, "up_noise": up_pf.noise, "both_us": both_pf.us, "both_noise": both_pf.noise,
            "saved_us": saved, "up_cost_us": up_pf.us - up.us, "down_share_us": both_pf.us - up_pf.us,
            "significant": abs(saved) / both.us > agree_tol(both, both_pf)}


def prefetch_line(model: str, M: int, mode: str, p: dict) -> str:
    """One line of a case's prefetch numbers, as printed while the run goes on."""
    return (f"{model} M={M}: prefetch {mode}: both {p['both_us']:.2f} us (saves {p['saved_us']:+.2f}"
            f"{'' if p['significant'] else ', within noise'}), up alone {p['up_us']:.2f} "
            f"({p['up_cost_us']:+.2f}), down's share {p['down_share_us']:.2f}")


def fused_summary(times: dict[str, Timed], name: str = "fused") -> dict:
    """The one-launch kernel (w4_fused.py; its timing `name`) against both launches of the same calls, one process:

    us, noise      its graph time per call
    saved_us       both - fused (> 0: one launch wins)
    vs_up_us       fused - up alone: what its down work adds beyond up's
    significant    saved_us is outside the two timings' spread (agree_tol)
    """
    both, fused, up = times["both"], times[name], times["up"]
    saved = both.us - fused.us
    return {"us": fused.us, "noise": fused.noise, "saved_us": saved, "vs_up_us": fused.us - up.us,
            "significant": abs(saved) / both.us > agree_tol(both, fused)}


def _against_both(saved_us: float, significant: bool) -> str:
    """'2.07 us faster than both' or '1.55 us slower than both', and whether it is within the spread: in words,
    not a sign (session 24 read "-1.55 us against both" as a gain at first glance)."""
    sig = "" if significant else " (within the timings' spread)"
    return f"{_faster(saved_us)} than both{sig}"


def _faster(saved_us: float) -> str:
    return f"{abs(saved_us):.2f} us {'faster' if saved_us >= 0 else 'slower'}"


def fused_line(model: str, M: int, f: dict, label: str = "one launch") -> str:
    """One line of the one-launch kernel's result, as printed while the run goes on."""
    return (f"  {model} M={M} {label}: {f['us']:.2f} us, {_against_both(f['saved_us'], f['significant'])}; "
            f"{f['vs_up_us']:.2f} us over up alone")


def down_experts_summary(times: dict[str, Timed]) -> dict:
    """The pair-major up launch followed by the expert-major down and top-k sum (w4_experts.down_launch), timed
    as `both_dx`, and that down alone on the kept activations (`down_dx`), against `both` and `down`, one process:

    us, noise       both_dx's graph time per call
    saved_us        both - both_dx (> 0: the expert-major down wins)
    down_us         down_dx: the expert-major down and sum alone
    pair_down_us    down: the pair-major down alone, on the same activations
    significant     saved_us is outside the two timings' spread (agree_tol)
    """
    both, bdx = times["both"], times["both_dx"]
    saved = both.us - bdx.us
    return {"us": bdx.us, "noise": bdx.noise, "saved_us": saved, "down_us": times["down_dx"].us,
            "pair_down_us": times["down"].us, "significant": abs(saved) / both.us > agree_tol(both, bdx)}


def down_experts_line(model: str, M: int, d: dict) -> str:
    """One line of the expert-major down's result, as printed while the run goes on."""
    return (f"  {model} M={M} pair-major up, expert-major down: {d['us']:.2f} us, "
            f"{_against_both(d['saved_us'], d['significant'])}; down alone {d['down_us']:.2f} us "
            f"(pair-major {d['pair_down_us']:.2f})")


def lean_summary(times: dict[str, Timed]) -> dict:
    """Version 9's K loop (w4_mma.plan_call(lean=...)) against the default kernel's, one process: `both_lean`,
    `up_lean` and `down_lean` (on the kept activations) against both, up and down, and `both_lean_down` (the
    default up, then version 9's down) against both.

    us, noise       both_lean's graph time per call
    saved_us        both - both_lean (> 0: version 9 wins)
    up_saved_us     up - up_lean
    up_u1_saved_us  up - up_lean_u1 (its loop unrolled once: the default's registers)
    down_saved_us   down - down_lean
    significant     saved_us is outside the two timings' spread (agree_tol)
    down_only       {us, noise, saved_us, significant}: both_lean_down, the same way against both
    """
    both = times["both"]

    def against_both(name):
        t = times[name]
        saved = both.us - t.us
        return {"us": t.us, "noise": t.noise, "saved_us": saved, "significant": abs(saved) / both.us > agree_tol(both, t)}

    return {**against_both("both_lean"), "up_saved_us": times["up"].us - times["up_lean"].us,
            "up_u1_saved_us": times["up"].us - times["up_lean_u1"].us,
            "down_saved_us": times["down"].us - times["down_lean"].us, "down_only": against_both("both_lean_down")}


def lean_line(model: str, M: int, d: dict) -> str:
    """One line of version 9's result, as printed while the run goes on."""
    return (f"  {model} M={M} lean (version 9): {d['us']:.2f} us, {_against_both(d['saved_us'], d['significant'])}; "
            f"up alone {_faster(d['up_saved_us'])} (unrolled once {_faster(d['up_u1_saved_us'])}), "
            f"down alone {_faster(d['down_saved_us'])}; "
            f"the default up then version 9's down {d['down_only']['us']:.2f} us, "
            f"{_against_both(d['down_only']['saved_us'], d['down_only']['significant'])}")
