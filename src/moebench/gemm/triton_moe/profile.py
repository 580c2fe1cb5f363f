"""One fused-MoE case run the way the suite times it, for a profiler to look at where a call's time goes.

    python -m moebench.gemm.triton_moe.profile --model kimi-k2.5 --m 1          # GPU: check, then time
    ncu --clock-control none --graph-profiling node -k regex:moe_ \\
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \\
        python -m moebench.gemm.triton_moe.profile --m 1 --rotations 4 --replays 2
    python -m moebench.gemm.triton_moe.profile --smoke                          # CPU interpreter, tiny shapes

It builds the case as the sweep does (the gemm family's GemmCase and Workload, the `triton` backend's calls
with config_for's configuration or --config, a MoEConfig as JSON), checks the output against the float32
reference (exit 1 if wrong), times the R calls in one CUDA graph (gemm.runner.measure) inside an NVTX range,
and prints the per-call time and % of the floor at this device's read ceiling (moebench.core.bandwidth). The
kernels are in the profiler's report: this only makes them happen as the suite runs them. Nsight Systems
does not produce reports on the lent machines; ncu does (`ci/lent.sh triton-profile`).
"""

from __future__ import annotations

import argparse
import json
import sys

from moebench.gemm.triton_moe.sweep import MODELS, PLAN, SMOKE, Bench, reexec_interpreted, setup


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="kimi-k2.5", choices=MODELS)
    ap.add_argument("--dtype", default="bf16", choices=sorted(PLAN))
    ap.add_argument("--m", type=int, default=1, help="tokens in the step")
    ap.add_argument("--rotations", type=int, default=16, help="calls per graph (distinct routings)")
    ap.add_argument("--replays", type=int, default=None, help="timed graph replays (default: the suite's rule)")
    ap.add_argument("--config", default=None, help="a MoEConfig as JSON (default: config_for's choice)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU through the Triton interpreter")
    args = ap.parse_args(argv)
    if args.m < 1:
        ap.error(f"--m must be >= 1, got {args.m}")

    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("profile: no CUDA GPU (run with --smoke for the CPU interpreter check)", file=sys.stderr)
        return 2
    if args.smoke:
        reexec_interpreted(__spec__.name)
    import moebench.gemm.triton_moe as tm
    from moebench.gemm.cases import GemmCase

    try:
        cfg = tm.MoEConfig.from_dict(json.loads(args.config)) if args.config else None
    except (ValueError, KeyError, TypeError) as e:
        print(f"profile: --config is not a MoEConfig ({type(e).__name__}: {e})", file=sys.stderr)
        return 2
    device, ceiling, rule = setup(args.smoke, args.replays)
    model, tp = (SMOKE["model"], SMOKE["tp"]) if args.smoke else (args.model, 8)
    case = GemmCase(model, tp, "fused", args.m, args.dtype, "decode", "triton")
    bench = Bench(case, device, 1 if args.smoke else args.rotations, ceiling, rule)
    built = bench.built(cfg)
    print(f"{case.key}: config {json.dumps(built.info['config'], sort_keys=True)}", flush=True)
    try:
        err = bench.check(built)
    except AssertionError as e:
        print(f"profile: wrong output ({e})", file=sys.stderr)
        return 1
    if device == "cuda":
        torch.cuda.nvtx.range_push(f"moe {case.key} x{bench.wl.R} per replay")
    try:
        us, pct = bench.time_us(built)
    finally:
        if device == "cuda":
            torch.cuda.nvtx.range_pop()
    print(f"checked (rel err {err:.2e}); {us:.2f} us per call, floor {bench.floor_us:.2f} us at the "
          f"{ceiling / 1e9:.0f} GB/s read ceiling ({pct:.1f}%)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
