"""Tile sweep of our int4 kernels (mma: w4_mma.py, tensor cores; rows4: w4.py, CUDA cores; mma_experts:
w4_experts.py, tensor cores, expert-major) on a GPU, through the gemm family's own workload, check and timer;
the other kernels at their table tiles and Marlin (vLLM, when importable) timed beside it on the same workload.

    python -m moebench.gemm.triton_moe.w4_tune [--kernel mma|rows4|mma_experts] [--models kimi-k2.5,deepseek-v3]
                                               [--ms 1,2,4,8,16] [--out w4_tune.json] [--smoke]

Cases are built, checked and timed by the config sweep's Bench (sweep.py), floors at the read ceiling
measured when the tuner starts. Per (model, M): every up tile with the default down tile, then every
down tile with the best up tile; each configuration is checked against the float32 reference before it is
timed (a wrong one is listed with its error and skipped). Prints one line per case and writes all timings plus
`table`: the winners in configs.json's `w4|...` (rows4), `w4mma|K|I|E|topk|M-bucket` (mma) or `w4mmax|...`
(mma_experts) format, for apply_sweep to merge into configs.json (with the run's device, versions and commit).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from moebench.core.files import atomic_write_text
from moebench.core.provenance import git_commit

# (block_n, block_k, num_warps) of the up kernel; the down kernel's (block_n, n_tiles, num_warps) for rows4,
# (block_n, block_k, num_warps) for mma (block_n = 16 x row tiles, block_k = 32 x groups per step, the
# warps beyond the row tiles split K)
UP_TILES = {"rows4": [(4, 2048, 8), (4, 1024, 4), (4, 1024, 8), (8, 256, 4), (8, 512, 4), (8, 1024, 4),
                      (8, 1024, 8), (16, 512, 4)],
            "mma": [(16, 32, 4), (16, 64, 4), (16, 128, 4), (16, 32, 8), (16, 64, 8), (32, 64, 4), (16, 64, 2),
                    (32, 32, 8), (16, 128, 8), (16, 128, 16), (16, 64, 16)],
            # expert-major: a program's work is 8 columns, so more row tiles or lane sets a program are cheap
            "mma_experts": [(16, 128, 4), (16, 64, 4), (16, 32, 4), (16, 64, 8), (32, 64, 4), (32, 64, 8),
                            (16, 128, 8), (64, 64, 8), (16, 64, 2)]}
DOWN_TILES = {"rows4": [(bn, nt, 4) for bn, nt in ((4, 4), (4, 8), (8, 1), (8, 2), (8, 4), (8, 8), (16, 1), (16, 2),
                                                   (16, 4))],
              # one step over I = 256 keeps the 8 slots' fragments in registers (more steps double-buffer
              # them: 200+ registers)
              "mma": [(16, 64, 4), (16, 32, 8), (32, 64, 8), (16, 128, 2), (32, 128, 4), (64, 64, 16)],
              # I = 256 in one step for 1-16 row tiles a program. One lane set a tile won session 20's sweep
              # everywhere ((64, 256, 4) mostly; the (64, 128, 8) written before it, K split over 2 lane sets,
              # read 1.5-1.6x slower), so the list goes on along that line: more or fewer row tiles
              "mma_experts": [(64, 256, 4), (64, 128, 8), (32, 128, 4), (128, 256, 8), (32, 64, 8), (64, 64, 16),
                              (128, 128, 16), (16, 128, 2), (256, 256, 16), (32, 256, 2), (16, 256, 1)]}
# version 9 sweeps mma's tiles (w4_mma.lean_config halves block_k where its steps would not cover K's groups)
for _k in ("mma_lean", "mma_lean_down"):
    UP_TILES[_k], DOWN_TILES[_k] = UP_TILES["mma"], DOWN_TILES["mma"]


def tune_case(model: str, M: int, ceiling: float, log=print, *, kernel: str = "mma", tp: int = 8,
              device: str = "cuda", rule=None, rotations: int | None = None, up_tiles=None, down_tiles=None) -> dict:
    """Sweep one kernel's tiles for one (model, M) on the config sweep's Bench (the family's workload,
    runner.check before runner.measure, floors at the measured read ceiling); returns the timings, the
    winner, the other kernel's time at its table tiles and Marlin's (None without vLLM)."""
    import triton

    from moebench.gemm.backends.triton_backend import build_w4
    from moebench.gemm.cases import ROTATIONS, GemmCase
    from moebench.gemm.triton_moe.config import KernelConfig, m_bucket
    from moebench.gemm.triton_moe.sweep import Bench
    from moebench.gemm.triton_moe import w4_kernels

    case = GemmCase(model, tp, "fused", M, "int4-g32", "decode", "triton")
    bench = Bench(case, device, rotations or ROTATIONS, ceiling, rule)
    wl = bench.wl
    up0, down0 = w4_kernels.get(kernel).config(M, wl.K, wl.I, wl.E, wl.topk)
    bk2 = max(32, triton.next_power_of_2(wl.I))
    rows, best = [], None

    def run(up, down):
        nonlocal best
        try:
            built = build_w4(case, wl, (up, down), kernel)
            bench.check(built)
            us, pct = bench.time_us(built)
        except Exception as exc:  # a failing tile is a finding, not the end of the sweep
            rows.append({"up": up.__dict__, "down": down.__dict__, "error": f"{type(exc).__name__}: {exc}"[:300]})
            log(f"  up {up.block_n}x{up.block_k} w{up.num_warps} down {down.block_n}x{down.n_tiles} "
                f"w{down.num_warps}: {rows[-1]['error']}")
            return
        rows.append({"up": up.__dict__, "down": down.__dict__, "us": us, "pct_of_floor": pct})
        if best is None or us < best[0]:
            best = (us, up, down)

    for bn, bk, nw in up_tiles or UP_TILES[kernel]:
        run(KernelConfig(block_n=bn, block_k=min(bk, wl.K), num_warps=nw), down0)
    up_best = best[1] if best else up0
    for bn, b, nw in down_tiles or DOWN_TILES[kernel]:
        if kernel == "rows4":
            run(up_best, KernelConfig(block_n=bn, block_k=bk2, num_warps=nw, n_tiles=b))
        else:
            run(up_best, KernelConfig(block_n=bn, block_k=min(b, wl.I), num_warps=nw))
    other = {}
    for k in w4_kernels.KERNELS:
        if k != kernel:
            try:
                built = build_w4(case, wl, None, k)
                bench.check(built)
                other[k] = bench.time_us(built)[0]
            except Exception as exc:
                log(f"  {k}: {type(exc).__name__}: {exc}"[:300])
    marlin = _marlin_us(case, bench, log) if device == "cuda" else None
    out = {"model": model, "M": M, "kernel": kernel, "rows": rows, "marlin_us": marlin, "other_us": other,
           "floor_us": bench.floor_us, "key": f"{w4_kernels.get(kernel).table_prefix}|{wl.K}|{wl.I}|{wl.E}|{wl.topk}|{m_bucket(M)}"}
    if best:
        out.update(best_us=best[0], up=best[1].__dict__, down=best[2].__dict__, default_us=next(
            (r.get("us") for r in rows if r["up"] == up0.__dict__ and r["down"] == down0.__dict__), None))
    log(f"{model} M={M}: best {out.get('best_us', float('nan')):.1f} us (up {out.get('up')}, down {out.get('down')}); "
        f"default {out.get('default_us')}; {other}; marlin {marlin}; floor {bench.floor_us:.1f} us at the "
        f"{ceiling / 1e9:.0f} GB/s read ceiling")
    return out


def _marlin_us(case, bench, log) -> float | None:
    from dataclasses import replace

    import torch

    from moebench.gemm.backends import BACKENDS

    mcase = replace(case, backend="vllm_marlin")
    why = BACKENDS["vllm_marlin"].unavailable(mcase, "cuda", torch.cuda.get_device_capability())
    if why:
        log(f"  marlin: {why}")
        return None
    try:
        built = BACKENDS["vllm_marlin"].build(mcase, bench.wl)
        bench.check(built)
        return bench.time_us(built)[0]
    except Exception as exc:
        log(f"  marlin: {type(exc).__name__}: {exc}"[:300])
        return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    from moebench.gemm.triton_moe.w4_kernels import KERNELS

    ap.add_argument("--kernel", default="mma", choices=list(KERNELS))
    ap.add_argument("--models", default="kimi-k2.5,deepseek-v3")
    ap.add_argument("--ms", default="1,2,4,8,16")
    ap.add_argument("--out", type=Path, default=Path("w4_tune.json"))
    ap.add_argument("--smoke", action="store_true", help="the sweep's tiny shapes on CPU through the Triton interpreter")
    args = ap.parse_args(argv)
    from moebench.gemm.triton_moe import sweep

    if args.smoke:
        sweep.reexec_interpreted(__spec__.name)
    device, ceiling, rule = sweep.setup(args.smoke, None)  # the read ceiling, as the suite measures it
    if device != "cuda" and not args.smoke:
        print("no CUDA GPU: run with --smoke for the CPU interpreter check", file=sys.stderr)
        return 2
    if args.smoke:  # one tile each way shows the plumbing; the interpreter's times mean nothing
        plan = [(sweep.SMOKE["model"], 1)]
        extra = dict(tp=sweep.SMOKE["tp"], device=device, rule=rule, rotations=1,
                     up_tiles=UP_TILES[args.kernel][1:2], down_tiles=DOWN_TILES[args.kernel][3:4])
    else:
        plan = [(model, int(m)) for model in args.models.split(",") for m in args.ms.split(",")]
        extra = {}
    extra["kernel"] = args.kernel
    import torch
    import triton

    # apply_sweep records these in configs.json's `_sweeps` when it merges the table
    meta = {"device": torch.cuda.get_device_name() if device == "cuda" else device, "torch": torch.__version__,
            "triton": triton.__version__, "what": f"w4_tune.py --kernel {args.kernel}, tree {git_commit()}"}
    results = []
    for model, M in plan:
        results.append(tune_case(model, M, ceiling, lambda s: print(s, flush=True), **extra))
        table = {r["key"]: {"up": r["up"], "down": r["down"]} for r in results if "up" in r}
        # after every case, atomically: a killed run keeps what it measured
        atomic_write_text(args.out, json.dumps({**meta, "read_ceiling_bytes_per_s": ceiling, "results": results,
                                                "table": table}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
