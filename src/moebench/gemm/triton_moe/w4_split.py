"""Leave one kernel out: how much of the tensor-core int4 decode kernel's graph time is its up launch's and how
much its down launch's (issue 32; docs/triton-moe-notes.md, "The next device calls").

    python -m moebench.gemm.triton_moe.w4_split --out split.json [--models kimi-k2.5,deepseek-v3]
                                                [--ms 1,2,4,8,16] [--replays N]
                                                [--prefetch-down [l2,evict_last]] [--fused]
                                                [--down-experts] [--lean]
    python -m moebench.gemm.triton_moe.w4_split --smoke --out smoke.json   # CPU interpreter, tiny shapes

A case is the gemm family's GemmCase(model, 8, "fused", M, "int4-g32", "decode", "triton") on its Workload
(the suite's weights, its 16 rotated routings and inputs, its float32 reference). Four things are timed over
those rotations, each by gemm.runner.measure (the benchmark's graph timer and L2 rule):

    bench  the `triton` backend's calls, built as benchmarks/test_gemm.py builds them: its graph_us
    both   up then down through w4_mma.up_launch / down_launch, the two launches fused_moe_w4_mma makes
    up     up alone (gate and up GEMMs, SiLU * up) on rotation r's input
    down   down alone on rotation r's activations, kept from a real up run before anything is timed

and, beside them, `launch`: one empty kernel a call (launch_build), the graph's floor for a launch, so the report
can say what each launch's own work adds over it (w4_split_report.launch_summary).

With --prefetch-down (issue 32's L2 prefetch of down's weights from the up launch, w4_prefetch.py; a bare flag
means both modes), each mode adds two more, timed right after `both` in the same process: up alone and both
with the prefetch on (`up_pf_<mode>`, `both_pf_<mode>`), and the report's `prefetch` holds what it saved
(w4_split_report.prefetch_summary). The prefetch cannot change a result: both with it is checked against the
reference and up alone with it must reproduce the kept activations bit for bit, like the others.

With --fused (issue 32's one launch, w4_fused.py), its variants (FUSED_VARIANTS) are timed right after `both`:
the same call in one launch, its programs' own down work issued behind their up loop and a wait for their pair's
activations (all of its down loads before the wait, or the second half after it; I's groups over 1, 2 or 4 lane
sets). Each is checked against the reference like both, twice (the second call starts from the workspace and
counters the first left), and no program may have given up its wait; a variant plan_fused refuses (a grid that
does not fit the GPU in one wave: M > 1 on the real shapes; lane sets the shape cannot take) records why and the
rest are timed. The report's `fused` holds its time and what it saved against both
(w4_split_report.fused_summary), and each other variant under its own name.

With --down-experts (issue 32 at M = 16: down's share is where the pair-major call loses most), two more are
timed after `both`: `both_dx`, the same up launch followed by the expert-major kernel's down launch and top-k
sum (w4_experts.down_launch, at its own tiles, experts_config), and `down_dx`, that down alone on the kept
activations. Both are checked against the reference first. The report's `down_experts` holds them against both
and against the pair-major down alone (w4_split_report.down_experts_summary).

With --lean (issue 32's version 9: the same sums in fewer instructions, w4_mma.plan_call(lean=...)), five more
are timed after `both`: `up_lean`, `down_lean` and `both_lean`, the two launches with version 9's K loop at its
tiles (w4_mma.lean_config; tiles["lean"]); `up_lean_u1`, its up loop unrolled once (the default's registers);
and `both_lean_down`, the default up then version 9's down (lean="down", the candidate session 27's first run
pointed to). Those with a down are checked against the reference; both ups must repeat themselves bit for bit
and stay within 1e-3 of the kept activations (check_lean_up: where lean_config halves block_k, K's groups fall
to other lane sets and the float32 sums add in another order; the report's `lean_up_vs_default` and
`lean_up_u1_vs_default`). The report's `lean` holds them against both, up and down
(w4_split_report.lean_summary).

Correct before fast: bench and both are checked against the float32 reference (gemm.runner.check), down
alone too (it reads real activations, so its output is the call's), and up alone must reproduce the kept
activations bit for bit. A case that fails a check is recorded with the reason and not timed.
The report (w4_split_report.py): the four times, overlap = up + down - both, down's share = both - up, each
launch's bytes and their time at the read ceiling measured in this run (moebench.core.bandwidth, as the
suite measures it), and at M = 1 issue 32's rule. The JSON is rewritten (atomically) after every case.

Exit status: 0 every case measured and both agreeing with bench; 3 measured, but both and bench disagree
somewhere (the split would not time the benchmark's work; not judged with --smoke); 1 a case wrong or
failed; 2 a bad option or no GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import triton
import triton.language as tl

from moebench.core.files import atomic_write_text
from moebench.core.provenance import git_commit
from moebench.gemm import runner
from moebench.gemm.backends import BACKENDS
from moebench.gemm.backends.base import Built
from moebench.gemm.backends.triton_backend import w4_operands
from moebench.gemm.cases import ROTATIONS, GemmCase
from moebench.gemm.presets import PRESETS
from moebench.gemm.triton_moe import w4_experts, w4_fused, w4_mma
from moebench.gemm.triton_moe.config import GEMV_MAX_M
from moebench.gemm.triton_moe.sweep import SMOKE, reexec_interpreted, setup
from moebench.gemm.triton_moe.w4_prefetch import MODES as PREFETCH_MODES
from moebench.gemm.triton_moe.w4_split_report import (Timed, case_line, down_experts_line, down_experts_summary,
                                                      fused_line, fused_summary, kernel_bytes, launch_line,
                                                      launch_summary, lean_line, lean_summary, prefetch_line,
                                                      prefetch_summary, summarize, verdict)
from moebench.gemm.workload import Workload

PROG = "w4_split"
MODELS = ("kimi-k2.5", "deepseek-v3")
MS = (1, 2, 4, 8, 16)
TP = 8
DTYPE = "int4-g32"
PREFETCH_ALL = ",".join(m for m in PREFETCH_MODES if PREFETCH_MODES[m])  # what a bare --prefetch-down times
LABELS = {"launch": "one empty launch", "bench": "bench (the backend's calls)", "bench_i32": "bench on int32 ids",
          "up": "up alone", "down": "down alone", "both": "both (up then down)", "fused": "fused (one launch)",
          "fused_late_b": "fused, second down chunk after the wait", "fused_dks2": "fused, down over 2 lane sets",
          "fused_dks4": "fused, down over 4 lane sets", "down_dx": "down alone, expert-major",
          "both_dx": "up, then the expert-major down", "up_lean": "up alone, version 9",
          "down_lean": "down alone, version 9", "both_lean": "both, version 9",
          "both_lean_down": "up, then version 9's down", "up_lean_u1": "up alone, version 9 unrolled once"}
# --fused's variants: w4_fused.plan_fused's (early_b, down_lane_sets): both of down's load chunks before the
# pair's wait or the second after it; I's groups over 1, 2 or 4 lane sets (fewer activation registers a lane)
FUSED_VARIANTS = {"fused": (True, 1), "fused_late_b": (False, 1), "fused_dks2": (True, 2), "fused_dks4": (True, 4)}
DOWN_EXPERTS = ("down_dx", "both_dx")  # --down-experts: that down alone, then after the pair-major up
# --lean: version 9's launches alone (its up also unrolled once: 128 registers, not 160), then both, then the
# default up with version 9's down
LEAN = ("up_lean", "up_lean_u1", "down_lean", "both_lean", "both_lean_down")


@triton.jit
def _mark_kernel(out_ptr, value):
    """The launch floor's kernel: one program stores `value` (the work a launch cannot do without)."""
    tl.store(out_ptr, value)


def launch_build(device: str, rotations: int) -> Built:
    """One empty launch per call (rotation r stores r + 1 into its own one-element buffer, so the check can
    tell that each call ran): the graph time of a launch that does no work, which up alone and down alone
    each pay once and both twice."""
    bufs = [torch.zeros(1, dtype=torch.float32, device=device) for _ in range(rotations)]
    return Built([lambda b=b, r=r: _mark(b, r + 1) for r, b in enumerate(bufs)], out_buffers=bufs)


def _mark(buf: torch.Tensor, value: int) -> torch.Tensor:
    _mark_kernel[(1,)](buf, float(value))
    return buf


def check_launch(built: Built, device: str, key: str) -> None:
    """Each empty launch must have stored its rotation's mark; AssertionError naming the rotation otherwise."""
    for b in built.out_buffers:
        b.fill_(float("nan"))
    for r, call in enumerate(built.calls):
        got = call()
        if device != "cpu":
            torch.cuda.synchronize()
        if float(got[0]) != r + 1:
            raise AssertionError(f"{key}: rotation {r}: the empty launch stored {float(got[0])}, not {r + 1}")


class _Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (no usage block), exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def select_cases(models: str | None, ms: str | None, smoke: bool = False) -> list[GemmCase]:
    """The cases to split: models x M (comma-separated; default MODELS x MS), each the suite's int4-g32 fused
    decode case on the `triton` backend at TP 8; with smoke, the sweep's tiny preset at M = 1 alone. ValueError
    with a one-line reason for an unknown model, an M that is not an integer or not on the tensor-core decode
    path (1..GEMV_MAX_M), or --models / --ms given with smoke."""
    if smoke:
        if models is not None or ms is not None:
            raise ValueError("--smoke runs the tiny preset at M = 1; --models and --ms do not apply")
        return [GemmCase(SMOKE["model"], SMOKE["tp"], "fused", 1, DTYPE, "decode", "triton")]
    names = _items(models, MODELS, "--models")
    unknown = [n for n in names if n not in PRESETS]
    if unknown:
        raise ValueError(f"--models: unknown model {unknown[0]!r} (known: {', '.join(PRESETS)})")
    items = _items(ms, MS, "--ms")
    try:
        values = list(dict.fromkeys(int(v) for v in items))
    except ValueError:
        raise ValueError(f"--ms: {ms!r} is not a comma-separated list of integers") from None
    off = [m for m in values if not 1 <= m <= GEMV_MAX_M]
    if off:
        raise ValueError(f"--ms: M = {off[0]} is not on the tensor-core int4 decode path (M 1..{GEMV_MAX_M}; "
                         f"larger M runs the grouped path)")
    return [GemmCase(n, TP, "fused", m, DTYPE, "decode", "triton") for n in names for m in values]


def _items(value: str | None, default: tuple, flag: str) -> list:
    """A comma-separated option's items in order, duplicates dropped; the default when not given."""
    if value is None:
        return list(default)
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise ValueError(f"{flag}: empty")
    return list(dict.fromkeys(items))


def prefetch_modes(value: str | None) -> tuple[str, ...]:
    """--prefetch-down's modes in order (w4_prefetch.MODES names other than "off"); () when not given.
    ValueError with a one-line reason for an unknown or empty one."""
    if value is None:
        return ()
    modes = _items(value, (), "--prefetch-down")
    known = [m for m in PREFETCH_MODES if PREFETCH_MODES[m]]
    bad = [m for m in modes if m not in known]
    if bad:
        raise ValueError(f"--prefetch-down: unknown mode {bad[0]!r} (known: {', '.join(known)})")
    return tuple(modes)


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[GemmCase]]:
    """The options and the cases they select; a bad option exits 2 with a one-line error."""
    ap = _Parser(prog=PROG, description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="the JSON report (rewritten atomically after every case)")
    ap.add_argument("--models", default=None, help=f"comma-separated presets (default {','.join(MODELS)})")
    ap.add_argument("--ms", default=None, help=f"comma-separated M, 1..{GEMV_MAX_M} (default {','.join(map(str, MS))})")
    ap.add_argument("--replays", type=int, default=None, help="timed graph replays (default: the suite's rule)")
    ap.add_argument("--smoke", action="store_true", help="the tiny preset on CPU through the Triton interpreter")
    ap.add_argument("--prefetch-down", nargs="?", const=PREFETCH_ALL, default=None, metavar="MODES",
                    help=f"also time the up launch's L2 prefetch of down's weights, on against off (comma-separated "
                         f"modes; bare: {PREFETCH_ALL})")
    ap.add_argument("--fused", action="store_true",
                    help="also time the one-launch kernel (w4_fused.py) right after both (up then down)")
    ap.add_argument("--down-experts", action="store_true",
                    help="also time the up launch followed by the expert-major kernel's down (w4_experts.py)")
    ap.add_argument("--lean", action="store_true",
                    help="also time both launches with version 9's K loop (w4_mma.plan_call(lean=True))")
    args = ap.parse_args(argv)
    if args.replays is not None and args.replays < 1:
        ap.error(f"--replays must be >= 1, got {args.replays}")
    try:
        args.prefetch_down = prefetch_modes(args.prefetch_down)
        return args, select_cases(args.models, args.ms, args.smoke)
    except ValueError as e:
        ap.error(str(e))


def write_report(path: str | Path, doc: dict) -> None:
    """The report as JSON, atomically: a reader or a killed run sees the previous version or this one."""
    atomic_write_text(Path(path), json.dumps(doc, indent=1) + "\n")


@dataclass
class FusedBuilt(Built):
    """The one-launch calls, with the FusedCall of each rotation (its error word is read after the check)."""

    fused_calls: list = field(default_factory=list)


def split_builds(wl, prefetch: tuple[str, ...] = (), fused: bool = False, down_experts: bool = False,
                 lean: bool = False) -> tuple[dict, dict[str, Built], list]:
    """(tiles, {"both", "up", "down", "bench_i32", "launch"}, activations) over the workload's rotations, on the
    weights and tiles the `triton` backend's tensor-core kernel runs at (triton_backend.w4_operands). The
    activations are those of one real up run per rotation, made here: down alone reads them. "bench_i32" is the
    backend's call with the routing ids converted to int32 beforehand (no conversion kernel in its graph);
    "launch" one empty kernel a call (launch_build). Each prefetch mode adds "up_pf_<mode>" and "both_pf_<mode>":
    the same calls with the up launch prefetching down's weights into L2. fused adds "fused", the one-launch
    kernel on the same calls (w4_fused.plan_fused each, so each rotation has its own workspace and counters), with
    its variants (FUSED_VARIANTS); one plan_fused refuses is left out, its reason in tiles["fused_refused"][name].
    down_experts adds "both_dx" and "down_dx": the same calls with the expert-major down launch and sum
    (w4_experts.down_launch) at its tiles (tiles["down_experts"]). lean adds "up_lean", "down_lean" and
    "both_lean": the same calls planned with version 9's K loop, at its tiles (tiles["lean"]); "up_lean_u1", its
    up with the loop unrolled once; and "both_lean_down", the default up then version 9's down
    (plan_call(lean="down"))."""
    k, w1, w2, (up, down) = w4_operands(wl, kernel="mma")
    calls = [w4_mma.plan_call(x, w1, w2, w, ids, config=(up, down))
             for x, ids, w in zip(wl.x, wl.topk_ids, wl.topk_weights)]
    # the backend's calls on routing ids already int32: plan_call's conversion is then no kernel, so its
    # graph launches what `both` launches; the one difference left between bench and both (session 17)
    ids32 = [ids.to(torch.int32) for ids in wl.topk_ids]
    hs = [w4_mma.up_launch(c) for c in calls]
    if wl.device != "cpu":
        torch.cuda.synchronize()
    builds = {
        "both": Built([lambda c=c: w4_mma.down_launch(c, w4_mma.up_launch(c)) for c in calls]),
        "up": Built([lambda c=c: w4_mma.up_launch(c) for c in calls]),
        "down": Built([lambda c=c, h=h: w4_mma.down_launch(c, h) for c, h in zip(calls, hs)]),
        "bench_i32": Built([lambda x=x, ids=ids, w=w: k.fused_moe(x, w1, w2, w, ids, config=(up, down))
                            for x, ids, w in zip(wl.x, ids32, wl.topk_weights)]),
        "launch": launch_build(wl.device, wl.R),
    }
    for mode in prefetch:
        pf = [replace(c, prefetch_down=PREFETCH_MODES[mode]) for c in calls]
        builds[f"up_pf_{mode}"] = Built([lambda c=c: w4_mma.up_launch(c) for c in pf])
        builds[f"both_pf_{mode}"] = Built([lambda c=c: w4_mma.down_launch(c, w4_mma.up_launch(c)) for c in pf])
    tiles = {"up": up.__dict__, "down": down.__dict__, "pdl": calls[0].pdl}
    if fused:
        for name, (early_b, dks) in FUSED_VARIANTS.items():
            try:
                fcs = [w4_fused.plan_fused(c, early_b=early_b, down_lane_sets=dks) for c in calls]
            except ValueError as e:
                tiles.setdefault("fused_refused", {})[name] = str(e)
                continue
            builds[name] = FusedBuilt([lambda fc=fc: w4_fused.fused_launch(fc) for fc in fcs], fused_calls=fcs)
            tiles["fused_warps"] = fcs[0].ks
    if down_experts:
        dx = w4_experts.experts_config(wl.M, wl.K, wl.I, wl.E, wl.topk)[1]
        w4_mma.lane_sets(dx)  # tiles the kernel cannot lay out are refused before anything runs
        cdx = [replace(c, down=dx) for c in calls]
        builds["both_dx"] = Built([lambda c=c: w4_experts.down_launch(c, w4_mma.up_launch(c)) for c in cdx])
        builds["down_dx"] = Built([lambda c=c, h=h: w4_experts.down_launch(c, h) for c, h in zip(cdx, hs)])
        tiles["down_experts"] = dx.__dict__
    if lean:
        lcs, dcs = ([w4_mma.plan_call(x, w1, w2, w, ids, config=(up, down), lean=which)
                     for x, ids, w in zip(wl.x, wl.topk_ids, wl.topk_weights)] for which in ("both", "down"))
        builds["up_lean"] = Built([lambda c=c: w4_mma.up_launch(c) for c in lcs])
        builds["up_lean_u1"] = Built([lambda c=replace(c, up_unroll=1): w4_mma.up_launch(c) for c in lcs])
        builds["down_lean"] = Built([lambda c=c, h=h: w4_mma.down_launch(c, h) for c, h in zip(lcs, hs)])
        builds["both_lean"] = Built([lambda c=c: w4_mma.down_launch(c, w4_mma.up_launch(c)) for c in lcs])
        builds["both_lean_down"] = Built([lambda c=c: w4_mma.down_launch(c, w4_mma.up_launch(c)) for c in dcs])
        tiles["lean"] = {"up": lcs[0].up.__dict__, "down": lcs[0].down.__dict__}
    return tiles, builds, hs


def check_up_alone(up: Built, activations: list, wl, key: str) -> None:
    """up alone on rotations 0 and R-1 must give the kept activations bit for bit (the kernel has no atomics
    and no order-dependent sums); AssertionError naming the rotation otherwise."""
    for r in sorted({0, wl.R - 1}):
        got, kept = up.calls[r](), activations[r]
        if wl.device != "cpu":
            torch.cuda.synchronize()
        if not torch.equal(got, kept):
            raise AssertionError(f"{key}: rotation {r}: up alone differs from the kept activations in "
                                 f"{int((got != kept).sum())} of {kept.numel()} values")


# version 9's up against the default's kept activations: its tiles may split K over lane sets differently (block_k
# halved), which reorders the float32 sums; a wrong load moves them by far more than this
LEAN_UP_TOL = 1e-3


def check_lean_up(up_lean: Built, activations: list, wl, key: str) -> float:
    """Version 9's up alone: it repeats itself bit for bit (check_up_alone against its own first run) and is within
    LEAN_UP_TOL (relative norm) of the default kernel's kept activations on every rotation; AssertionError naming
    the rotation otherwise. The largest relative difference."""
    own = [call() for call in up_lean.calls]
    if wl.device != "cpu":
        torch.cuda.synchronize()
    check_up_alone(up_lean, own, wl, key)
    worst = 0.0
    for r, (got, kept) in enumerate(zip(own, activations)):
        rel = float((got.float() - kept.float()).norm() / kept.float().norm().clamp_min(1e-30))
        if not rel <= LEAN_UP_TOL:
            raise AssertionError(f"{key}: rotation {r}: differs from the default up's activations by {rel:.1e} "
                                 f"(relative norm; at most {LEAN_UP_TOL:.0e})")
        worst = max(worst, rel)
    return worst


def check_fused(fused: FusedBuilt, wl, key: str) -> float:
    """The one-launch calls against the float32 reference, twice (the second call starts from the workspace and
    counters the first left); AssertionError if a check fails or a program gave up its wait. Its rel_error."""
    err = runner.check(fused, wl, key=key)["rel_error"]
    err = max(err, runner.check(fused, wl, key=f"{key}, second call")["rel_error"])
    failed = [r for r, fc in enumerate(fused.fused_calls) if w4_fused.wait_failed(fc)]
    if failed:
        raise AssertionError(f"{key}: a program gave up waiting for its pair in rotation {failed[0]} (the grid was "
                             f"not resident at once)")
    return err


def measure_case(case: GemmCase, device: str, ceiling: float, l2: int | None, rule, rotations: int, log,
                 prefetch: tuple[str, ...] = (), fused: bool = False, down_experts: bool = False,
                 lean: bool = False) -> dict:
    """Check, then time, one case's four variants (and two per prefetch mode); the case's entry of the report.
    AssertionError when an output is wrong (nothing is timed then)."""
    entry = {"case": case.key, "model": case.model, "tp": case.tp, "M": case.m, "dtype": case.dtype}
    log(f"{case.model} M={case.m}: building")
    wl = Workload(GemmCase(case.model, case.tp, case.op, case.m, case.dtype, case.routing, "-"), device, rotations)
    backend = BACKENDS[case.backend]
    bench = backend.build(case, wl)
    tiles, builds, activations = split_builds(wl, prefetch, fused, down_experts, lean)
    if bench.info["config"] != {"path": "w4_mma", "up": tiles["up"], "down": tiles["down"]}:
        raise RuntimeError(f"{case.key}: the backend runs {bench.info['config']}, not w4_mma at {tiles}: the split "
                           f"would time another kernel")
    entry.update(K=wl.K, I=wl.I, E=wl.E, topk=wl.topk, rotations=wl.R, experts_touched=wl.mean_experts_touched(),
                 tiles=tiles, bench=bench.info)
    log(f"{case.model} M={case.m}: checking (bench, both, down alone against the float32 reference; up alone)")
    entry["rel_error"] = {
        "bench": runner.check(bench, wl, backend.error_bounds.get(case.dtype), key=case.key)["rel_error"],
        "both": runner.check(builds["both"], wl, key=f"{case.key} up+down")["rel_error"],
        "down": runner.check(builds["down"], wl, key=f"{case.key} down alone")["rel_error"],
        "bench_i32": runner.check(builds["bench_i32"], wl, key=f"{case.key} int32 ids")["rel_error"],
    }
    check_up_alone(builds["up"], activations, wl, f"{case.key} up alone")
    check_launch(builds["launch"], device, f"{case.key} one empty launch")
    for name in FUSED_VARIANTS:
        if name in builds:
            entry["rel_error"][name] = check_fused(builds[name], wl, f"{case.key} {LABELS[name]}")
    for name in DOWN_EXPERTS:
        if name in builds:  # down_dx reads real activations, so its output is the call's too
            entry["rel_error"][name] = runner.check(builds[name], wl, key=f"{case.key} {LABELS[name]}")["rel_error"]
    if lean:
        for name in ("down_lean", "both_lean", "both_lean_down"):
            entry["rel_error"][name] = runner.check(builds[name], wl, key=f"{case.key} {LABELS[name]}")["rel_error"]
        # against the default up's activations, not the reference: kept apart from rel_error
        entry["lean_up_vs_default"] = check_lean_up(builds["up_lean"], activations, wl,
                                                    f"{case.key} {LABELS['up_lean']}")
        entry["lean_up_u1_vs_default"] = check_lean_up(builds["up_lean_u1"], activations, wl,
                                                       f"{case.key} {LABELS['up_lean_u1']}")
    for name, why in tiles.get("fused_refused", {}).items():
        log(f"{case.model} M={case.m}: no {LABELS[name]} timing: {why}")
    for mode in prefetch:
        entry["rel_error"][f"both_pf_{mode}"] = runner.check(
            builds[f"both_pf_{mode}"], wl, key=f"{case.key} up+down, prefetch {mode}")["rel_error"]
        check_up_alone(builds[f"up_pf_{mode}"], activations, wl, f"{case.key} up alone, prefetch {mode}")
    times = {}
    # bench first and both after the other three: a drift of the device during the case shows as their
    # disagreement; each prefetch mode's pair right after both, the time it is compared with
    order = ["bench", "bench_i32", "launch", "up", "down", "both"] + [v for v in FUSED_VARIANTS if v in builds] \
        + [v for v in DOWN_EXPERTS if v in builds] + [v for v in LEAN if v in builds] \
        + [f"{v}_pf_{m}" for m in prefetch for v in ("up", "both")]
    for name in order:
        built = bench if name == "bench" else builds[name]
        log(f"{case.model} M={case.m}: timing {LABELS[name] if name in LABELS else _pf_label(name)}")
        metrics, info = runner.measure(built, wl, ceiling=ceiling, l2_bytes=l2, rule=rule, eager=False)
        t = metrics["wall_us" if device == "cpu" else "graph_us"]
        times[name] = Timed(t.value, t.noise)
        entry.setdefault("l2", info["l2"])
    up_bytes, down_bytes = kernel_bytes(wl.mean_experts_touched(), wl.M, wl.K, wl.I, wl.topk, case.dtype)
    entry.update(summarize(times, up_bytes, down_bytes, ceiling))
    # does bench's extra kernel (int64 -> int32 ids) make the bench/both difference? i32 near both: yes
    entry.update(bench_i32_us=times["bench_i32"].us, bench_i32_noise=times["bench_i32"].noise,
                 bench_i32_vs_bench=(times["bench_i32"].us - times["bench"].us) / times["bench"].us)
    # the rule reads graph times; the interpreter's wall times would only make a confusing line
    entry["verdict"] = verdict(case.m, entry["down_share_us"]) if device == "cuda" else None
    log(case_line(case.model, case.m, entry, ceiling))
    log(f"  bench on int32 ids (no conversion kernel): {entry['bench_i32_us']:.2f} us "
        f"({100 * entry['bench_i32_vs_bench']:+.1f}% against bench)")
    entry["launch"] = launch_summary(times)
    log(launch_line(case.model, case.m, entry["launch"]))
    for name in FUSED_VARIANTS:
        if name in times:
            entry[name] = fused_summary(times, name)
            log(fused_line(case.model, case.m, entry[name], LABELS[name]))
    if down_experts:
        entry["down_experts"] = down_experts_summary(times)
        log(down_experts_line(case.model, case.m, entry["down_experts"]))
    if lean:
        entry["lean"] = lean_summary(times)
        log(lean_line(case.model, case.m, entry["lean"]))
    if prefetch:
        entry["prefetch"] = {m: prefetch_summary(times, m) for m in prefetch}
        for m in prefetch:
            log(prefetch_line(case.model, case.m, m, entry["prefetch"][m]))
    if entry["verdict"]:
        log(f"  M = 1 rule: {entry['verdict']}")
    return entry


def _pf_label(name: str) -> str:
    """'up_pf_l2' -> 'up alone, prefetch l2'."""
    variant, mode = name.split("_pf_")
    return f"{LABELS[variant]}, prefetch {mode}"


def _cuda_unusable() -> bool:
    try:
        torch.cuda.synchronize()
        return False
    except Exception:
        return True


def exit_status(entries: list[dict], aborted: bool, judge_agreement: bool = True) -> int:
    """1 if a case failed or the run stopped early, else 3 if a case's both and bench disagree (judged on a
    GPU only: the interpreter's wall times mean nothing), else 0."""
    if aborted or any("error" in e for e in entries):
        return 1
    return 3 if judge_agreement and any(not e["agree"] for e in entries) else 0


def main(argv: list[str] | None = None) -> int:
    args, cases = parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        print(f"{PROG}: error: no CUDA GPU (run with --smoke for the CPU interpreter check)", file=sys.stderr)
        return 2
    if args.smoke:
        reexec_interpreted(__spec__.name)
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:7.1f}s] {msg}", flush=True)

    device, ceiling, rule = setup(args.smoke, args.replays)
    rotations = 1 if args.smoke else ROTATIONS  # the suite's; one in the interpreter, whose times mean nothing
    l2 = torch.cuda.get_device_properties(0).L2_cache_size if device == "cuda" else None
    doc = {"what": "w4_split: leave-one-out graph times of the tensor-core int4 decode kernel (issue 32)",
           "argv": sys.argv[1:] if argv is None else list(argv), "commit": git_commit(),
           "device": torch.cuda.get_device_name() if device == "cuda" else "cpu (Triton interpreter)",
           "torch": torch.__version__, "triton": triton.__version__, "read_ceiling_bytes_per_s": ceiling,
           "rotations": rotations, "prefetch_down": list(args.prefetch_down), "fused": args.fused,
           "down_experts": args.down_experts, "lean": args.lean,
           "timer": "gemm.runner.measure, graph_us" if device == "cuda" else "wall_us",
           "done": False, "cases": []}
    log(f"{len(cases)} cases, read ceiling {ceiling / 1e9:.0f} GB/s, {rotations} rotations; writing {args.out}")
    write_report(args.out, doc)
    aborted = False
    for case in cases:
        try:
            entry = measure_case(case, device, ceiling, l2, rule, rotations, log, prefetch=args.prefetch_down,
                                 fused=args.fused, down_experts=args.down_experts, lean=args.lean)
        except Exception as exc:  # one failing case is a finding; the others still run
            entry = {"case": case.key, "model": case.model, "M": case.m,
                     "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"}
            log(f"{case.model} M={case.m}: {entry['error']}")
            aborted = device == "cuda" and _cuda_unusable()
        doc["cases"].append(entry)
        write_report(args.out, doc)
        if aborted:
            log("the CUDA context is unusable after that error: stopping")
            break
    doc["done"] = not aborted
    write_report(args.out, doc)
    status = exit_status(doc["cases"], aborted, judge_agreement=device == "cuda")
    log(f"wrote {args.out} (exit {status})")
    return status


if __name__ == "__main__":
    sys.exit(main())
