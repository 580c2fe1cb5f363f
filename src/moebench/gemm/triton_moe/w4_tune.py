"""Tile sweep of the rows-4 int4 decode kernel (w4.py) on a GPU, through the gemm family's own workload,
check and timer; Marlin (vLLM) timed beside it on the same workload when vLLM is importable.

    python -m moebench.gemm.triton_moe.w4_tune [--models kimi-k2.5,deepseek-v3] [--ms 1,2,4,8,16]
                                               [--out w4_tune.json]

Per (model, M): every up tile with the default down tile, then every down tile with the best up tile;
each configuration is checked against the float32 reference before it is timed (a wrong one is listed
with its error and skipped). Prints one line per case and writes all timings plus `table`: the winners
in configs.json's `w4|K|I|E|topk|M-bucket` format, to copy into configs.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

UP_TILES = [(4, 2048, 8), (4, 1024, 4), (4, 1024, 8), (8, 256, 4), (8, 512, 4), (8, 1024, 4), (8, 1024, 8),
            (16, 512, 4)]
DOWN_TILES = [(bn, nt, nw) for bn, nt in ((4, 4), (4, 8), (8, 1), (8, 2), (8, 4), (8, 8), (16, 1), (16, 2), (16, 4))
              for nw in (4,)]


def _time(built, wl) -> float:
    """Median graph time per call (us), after the correctness check."""
    from moebench.gemm import runner
    from moebench.timing import graph_timer

    runner.check(built, wl)
    return statistics.median(graph_timer(built.calls, runner.GPU_RULE)) * 1e6


def tune_case(model: str, M: int, log=print) -> dict:
    """Sweep one (model, M); returns the timings, the winner and Marlin's time (None without vLLM)."""
    import triton

    from moebench.gemm.backends.triton_backend import build_w4
    from moebench.gemm.cases import GemmCase
    from moebench.gemm.triton_moe.config import KernelConfig, m_bucket
    from moebench.gemm.triton_moe.w4 import w4_config
    from moebench.gemm.workload import Workload

    case = GemmCase(model, 8, "fused", M, "int4-g32", "decode", "triton")
    wl = Workload(case, "cuda")
    up0, down0 = w4_config(M, wl.K, wl.I, wl.E, wl.topk)
    bk2 = max(32, triton.next_power_of_2(wl.I))
    rows, best = [], None

    def run(up, down):
        nonlocal best
        try:
            us = _time(build_w4(case, wl, (up, down)), wl)
        except Exception as exc:  # a failing tile is a finding, not the end of the sweep
            rows.append({"up": up.__dict__, "down": down.__dict__, "error": f"{type(exc).__name__}: {exc}"[:300]})
            log(f"  up {up.block_n}x{up.block_k} w{up.num_warps} down {down.block_n} w{down.num_warps}: {rows[-1]['error']}")
            return
        rows.append({"up": up.__dict__, "down": down.__dict__, "us": us})
        if best is None or us < best[0]:
            best = (us, up, down)

    for bn, bk, nw in UP_TILES:
        run(KernelConfig(block_n=bn, block_k=bk, num_warps=nw), down0)
    up_best = best[1] if best else up0
    for bn, nt, nw in DOWN_TILES:
        run(up_best, KernelConfig(block_n=bn, block_k=bk2, num_warps=nw, n_tiles=nt))
    marlin = _marlin_us(case, wl, log)
    floor_us = wl.bytes_per_call() / 4.8e12 * 1e6  # HBM3e peak: a reading aid only; the suite uses its measured ceiling
    out = {"model": model, "M": M, "rows": rows, "marlin_us": marlin,
           "key": f"w4|{wl.K}|{wl.I}|{wl.E}|{wl.topk}|{m_bucket(M)}"}
    if best:
        out.update(best_us=best[0], up=best[1].__dict__, down=best[2].__dict__, default_us=next(
            (r.get("us") for r in rows if r["up"] == up0.__dict__ and r["down"] == down0.__dict__), None))
    log(f"{model} M={M}: best {out.get('best_us', float('nan')):.1f} us (up {out.get('up')}, down {out.get('down')}); "
        f"default {out.get('default_us')}; marlin {marlin}; floor at 4.8 TB/s {floor_us:.1f} us")
    return out


def _marlin_us(case, wl, log) -> float | None:
    from dataclasses import replace

    import torch

    from moebench.gemm.backends import BACKENDS

    mcase = replace(case, backend="vllm_marlin")
    why = BACKENDS["vllm_marlin"].unavailable(mcase, "cuda", torch.cuda.get_device_capability())
    if why:
        log(f"  marlin: {why}")
        return None
    try:
        return _time(BACKENDS["vllm_marlin"].build(mcase, wl), wl)
    except Exception as exc:
        log(f"  marlin: {type(exc).__name__}: {exc}"[:300])
        return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="kimi-k2.5,deepseek-v3")
    ap.add_argument("--ms", default="1,2,4,8,16")
    ap.add_argument("--out", default="w4_tune.json")
    args = ap.parse_args(argv)
    results = []
    for model in args.models.split(","):
        for M in (int(m) for m in args.ms.split(",")):
            results.append(tune_case(model, M, log=lambda s: print(s, flush=True)))
            table = {r["key"]: {"up": r["up"], "down": r["down"]} for r in results if "up" in r}
            with open(args.out, "w") as f:  # after every case: a killed run keeps what it measured
                json.dump({"results": results, "table": table}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
