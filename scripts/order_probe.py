"""Does one GEMM case's time depend on what ran before it in the process? (a diagnostic, GPU only)

    python scripts/order_probe.py      # vllm_triton int4-g32 Kimi-K2.5 fused M=1

Session 2 measured this case at 71.6-73.8 us whenever few cases ran before it and 77.5-77.6 us
inside all of `-m gemm`. This times it: fresh; rebuilt; rebuilt after the torch backends' cases that
precede it in the full selection; and rebuilt after torch.cuda.empty_cache(). Each line is the graph
time (check first, as the suite does); the spread between lines is the order effect.
"""

from __future__ import annotations

import sys

import torch

from moebench.gemm import runner
from moebench.gemm.backends import BACKENDS
from moebench.gemm.cases import GemmCase
from moebench.gemm.workload import Workload

DEFAULT = GemmCase("kimi-k2.5", 8, "fused", 1, "int4-g32", "decode", "vllm_triton")
# What precedes the default case in -m gemm (session 2's order): the torch backends on Kimi shapes.
CHURN = [GemmCase("kimi-k2.5", 8, op, m, "bf16", "decode", b)
         for op, m in (("gemm1", 128), ("gemm2", 128), ("fused", 1))
         for b in ("torch_loop", "torch_bmm", "torch_grouped_mm")]


def _time(case: GemmCase) -> float:
    """graph_us of one fresh build, checked first (the ceiling only feeds % of floor, unused here)."""
    wl = Workload(GemmCase(case.model, case.tp, case.op, case.m, case.dtype, case.routing, "-"), "cuda")
    built = BACKENDS[case.backend].build(case, wl)
    runner.check(built, wl, BACKENDS[case.backend].error_bounds.get(case.dtype))
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", None)
    metrics, _ = runner.measure(built, wl, ceiling=4.2e12, l2_bytes=l2)
    return metrics["graph_us"].value


def _forget_repacks() -> None:
    """Drop the vLLM backends' cached weight repacks, so the next build allocates them anew."""
    from moebench.gemm.workload import expert_weights

    cache = expert_weights(DEFAULT.model, DEFAULT.tp, "cuda").quantized
    for key in [k for k in cache if "vllm" in str(k[0])]:
        del cache[key]


def main() -> int:
    if not torch.cuda.is_available():
        print("order_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    case = DEFAULT
    print(f"case {case.key}", flush=True)
    print(f"  fresh process          {_time(case):8.2f} us", flush=True)
    _forget_repacks()
    print(f"  same process, rebuilt  {_time(case):8.2f} us", flush=True)
    for c in CHURN:
        if not BACKENDS[c.backend].unavailable(c, "cuda", torch.cuda.get_device_capability()):
            _time(c)
    _forget_repacks()
    print(f"  after torch cases      {_time(case):8.2f} us", flush=True)
    torch.cuda.empty_cache()
    print(f"  again, same state      {_time(case):8.2f} us", flush=True)
    _forget_repacks()
    torch.cuda.empty_cache()
    print(f"  after empty_cache      {_time(case):8.2f} us", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
