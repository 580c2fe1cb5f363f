"""Tile sweep of the rows-4 int4 decode kernel (w4.py) on a GPU, through the gemm family's own workload,
check and timer; Marlin (vLLM) timed beside it on the same workload when vLLM is importable.

    python -m moebench.gemm.triton_moe.w4_tune [--models kimi-k2.5,deepseek-v3] [--ms 1,2,4,8,16]
                                               [--out w4_tune.json] [--smoke]

Cases are built, checked and timed by the config sweep's Bench (sweep.py), floors at the read ceiling
measured when the tuner starts. Per (model, M): every up tile with the default down tile, then every
down tile with the best up tile; each configuration is checked against the float32 reference before it is timed (a wrong one is listed
with its error and skipped). Prints one line per case and writes all timings plus `table`: the winners
in configs.json's `w4|K|I|E|topk|M-bucket` format, to copy into configs.json.
"""

from __future__ import annotations

import argparse
import json
import sys

UP_TILES = [(4, 2048, 8), (4, 1024, 4), (4, 1024, 8), (8, 256, 4), (8, 512, 4), (8, 1024, 4), (8, 1024, 8),
            (16, 512, 4)]
DOWN_TILES = [(bn, nt, nw) for bn, nt in ((4, 4), (4, 8), (8, 1), (8, 2), (8, 4), (8, 8), (16, 1), (16, 2), (16, 4))
              for nw in (4,)]


def tune_case(model: str, M: int, ceiling: float, log=print, *, tp: int = 8, device: str = "cuda", rule=None,
              rotations: int | None = None, up_tiles=UP_TILES, down_tiles=DOWN_TILES) -> dict:
    """Sweep one (model, M) on the config sweep's Bench (the family's workload, runner.check before
    runner.measure, floors at the measured read ceiling); returns the timings, the winner and Marlin's
    time (None without vLLM)."""
    import triton

    from moebench.gemm.backends.triton_backend import build_w4
    from moebench.gemm.cases import ROTATIONS, GemmCase
    from moebench.gemm.triton_moe.config import KernelConfig, m_bucket
    from moebench.gemm.triton_moe.sweep import Bench
    from moebench.gemm.triton_moe.w4 import w4_config

    case = GemmCase(model, tp, "fused", M, "int4-g32", "decode", "triton")
    bench = Bench(case, device, rotations or ROTATIONS, ceiling, rule)
    wl = bench.wl
    up0, down0 = w4_config(M, wl.K, wl.I, wl.E, wl.topk)
    bk2 = max(32, triton.next_power_of_2(wl.I))
    rows, best = [], None

    def run(up, down):
        nonlocal best
        try:
            built = build_w4(case, wl, (up, down))
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

    for bn, bk, nw in up_tiles:
        run(KernelConfig(block_n=bn, block_k=min(bk, wl.K), num_warps=nw), down0)
    up_best = best[1] if best else up0
    for bn, nt, nw in down_tiles:
        run(up_best, KernelConfig(block_n=bn, block_k=bk2, num_warps=nw, n_tiles=nt))
    marlin = _marlin_us(case, bench, log) if device == "cuda" else None
    out = {"model": model, "M": M, "rows": rows, "marlin_us": marlin, "floor_us": bench.floor_us,
           "key": f"w4|{wl.K}|{wl.I}|{wl.E}|{wl.topk}|{m_bucket(M)}"}
    if best:
        out.update(best_us=best[0], up=best[1].__dict__, down=best[2].__dict__, default_us=next(
            (r.get("us") for r in rows if r["up"] == up0.__dict__ and r["down"] == down0.__dict__), None))
    log(f"{model} M={M}: best {out.get('best_us', float('nan')):.1f} us (up {out.get('up')}, down {out.get('down')}); "
        f"default {out.get('default_us')}; marlin {marlin}; floor {bench.floor_us:.1f} us at the "
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
    ap.add_argument("--models", default="kimi-k2.5,deepseek-v3")
    ap.add_argument("--ms", default="1,2,4,8,16")
    ap.add_argument("--out", default="w4_tune.json")
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
        extra = dict(tp=sweep.SMOKE["tp"], device=device, rule=rule, rotations=1, up_tiles=UP_TILES[1:2],
                     down_tiles=DOWN_TILES[3:4])
    else:
        plan = [(model, int(m)) for model in args.models.split(",") for m in args.ms.split(",")]
        extra = {}
    results = []
    for model, M in plan:
        results.append(tune_case(model, M, ceiling, lambda s: print(s, flush=True), **extra))
        table = {r["key"]: {"up": r["up"], "down": r["down"]} for r in results if "up" in r}
        with open(args.out, "w") as f:  # after every case: a killed run keeps what it measured
            json.dump({"read_ceiling_bytes_per_s": ceiling, "results": results, "table": table}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
