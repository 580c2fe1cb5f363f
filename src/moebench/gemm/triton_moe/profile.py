"""One fused-MoE case run the way the suite times it, for a profiler to look at where a call's time goes.

    python -m moebench.gemm.triton_moe.profile --model kimi-k2.5 --m 1          # GPU: check, then time
    ncu --clock-control none --graph-profiling node -k regex:moe_ \\
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \\
        python -m moebench.gemm.triton_moe.profile --m 1 --replays 2
    python -m moebench.gemm.triton_moe.profile --smoke                          # CPU interpreter, tiny shapes

It builds the sweep's weights and R routed inputs, checks the output against the float32 reference
(exit 1 if wrong), captures the R calls with config_for's configuration (or --config, a MoEConfig as
JSON) in one CUDA graph, replays it inside an NVTX range, and prints the per-call time and % of the
4.3 TB/s floor. The kernels are in the profiler's report: this only makes them happen as the suite runs
them (the Triton fused-MoE issue's M = 1 question: where do ~4 us go). Nsight Systems does not produce
reports on the lent machines; ncu does (`scripts/h200.sh profile`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from .sweep import HBM_BYTES_PER_S, MODELS, SMOKE_MODEL, Case, Runner, Weights

DTYPES = ("bf16", "int4_w4a16-g32")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="kimi-k2.5", choices=sorted(MODELS))
    ap.add_argument("--dtype", default="bf16", choices=DTYPES)
    ap.add_argument("--m", type=int, default=1, help="tokens in the step")
    ap.add_argument("--rotations", type=int, default=16, help="calls per graph (distinct routings)")
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--config", default=None, help="a MoEConfig as JSON (default: config_for's choice)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU through the Triton interpreter")
    args = ap.parse_args(argv)
    if args.m < 1:
        ap.error(f"--m must be >= 1, got {args.m}")

    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("profile: no CUDA GPU (run with --smoke for the CPU interpreter check)", file=sys.stderr)
        return 2
    if args.smoke and os.environ.get("TRITON_INTERPRET") != "1":
        # kernels are built for the interpreter only if the variable is set before the first import
        os.execve(sys.executable, [sys.executable, "-m", __spec__.name, *sys.argv[1:]],
                  dict(os.environ, TRITON_INTERPRET="1"))
    import moebench.gemm.triton_moe as tm

    device = torch.device("cpu" if args.smoke else "cuda")
    name, shape = next(iter(SMOKE_MODEL.items())) if args.smoke else (args.model, MODELS[args.model])
    case = Case(name, args.dtype, args.m, **shape)
    weights = Weights(case, tm, torch, device)
    runner = Runner(case, weights, tm, torch, device, 1 if args.smoke else args.rotations,
                    1 if args.smoke else args.replays)
    pdl = device.type == "cuda" and torch.cuda.get_device_capability() >= (9, 0)
    try:
        cfg = (tm.MoEConfig.from_dict(json.loads(args.config)) if args.config else
               tm.config_for(case.M, case.K, case.I, case.E, case.topk, weights.quant, pdl=pdl))
    except (ValueError, KeyError, TypeError) as e:
        print(f"profile: --config is not a MoEConfig ({type(e).__name__}: {e})", file=sys.stderr)
        return 2
    print(f"{name} {args.dtype} M={args.m}: config {json.dumps(cfg.as_dict(), sort_keys=True)}", flush=True)
    err = runner.check(cfg)
    if not err < 1e-2:
        print(f"profile: wrong output (relative error {err:.3g} against the float32 reference)", file=sys.stderr)
        return 1
    if device.type == "cuda":
        torch.cuda.nvtx.range_push(f"moe {name} {args.dtype} M={args.m} x{args.rotations} per replay")
    try:
        us = runner.time_us(cfg)
    finally:
        if device.type == "cuda":
            torch.cuda.nvtx.range_pop()
    print(f"checked (rel err {err:.2e}); {us:.2f} us per call, floor {runner.floor_us:.2f} us at "
          f"{HBM_BYTES_PER_S / 1e12:.1f} TB/s ({100 * runner.floor_us / us:.1f}%)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
