"""A deliberate slowdown of vLLM's fused Marlin MoE at one shape, to prove the gemm gate fails exactly
the case it hits and passes the rest.

A pytest plugin (`-p moebench_planted_gemm`, with this folder on PYTHONPATH): the way a real kernel
regression arrives (an engine upgrade that slows one shape's kernel), from outside the case definition
and outside moebench's code. With MOEBENCH_PLANT_MARLIN_CYCLES=C it wraps vLLM's fused_marlin_moe so that
every call whose tokens x experts match MOEBENCH_PLANT_MARLIN_SHAPE (default "1x384": M = 1 on the
Kimi-K2.5 shape) first holds the stream for C GPU cycles (torch.cuda._sleep: a kernel that occupies the
GPU, as a slower kernel would, captured into every graph replay). On an H200 a _sleep(2000) took 1.55 us
and (3000) 2.04 us inside a graph: about 0.57 us + C / 2040 cycles per us. Unset, it does nothing.

    PYTHONPATH=ci/planted MOEBENCH_PLANT_MARLIN_CYCLES=4500 \\
        pytest -p moebench_planted_gemm benchmarks/ -m "gemm and vllm_marlin"
"""

from __future__ import annotations

import functools
import os


def _targets():
    mods = []
    for name in ("vllm.model_executor.layers.fused_moe.experts.marlin_moe",
                 "vllm.model_executor.layers.fused_moe.fused_marlin_moe"):
        try:
            mods.append(__import__(name, fromlist=["fused_marlin_moe"]))
        except ImportError:
            continue
    return [m for m in mods if hasattr(m, "fused_marlin_moe")]


def pytest_configure(config) -> None:
    cycles = int(os.environ.get("MOEBENCH_PLANT_MARLIN_CYCLES", "0") or 0)
    if cycles <= 0:
        return
    import torch

    m, e = (int(x) for x in os.environ.get("MOEBENCH_PLANT_MARLIN_SHAPE", "1x384").split("x"))
    for mod in _targets():
        original = mod.fused_marlin_moe
        if getattr(original, "_moebench_planted", False):
            continue

        @functools.wraps(original)  # the backend reads the signature (inspect follows __wrapped__)
        def planted(*args, _original=original, **kwargs):
            x = kwargs.get("hidden_states", args[0] if args else None)
            w1 = kwargs.get("w1", args[1] if len(args) > 1 else None)
            if x is not None and w1 is not None and x.shape[0] == m and w1.shape[0] == e:
                torch.cuda._sleep(cycles)
            return _original(*args, **kwargs)

        planted._moebench_planted = True
        mod.fused_marlin_moe = planted
        print(f"moebench planted regression: {mod.__name__}.fused_marlin_moe holds the GPU {cycles} cycles "
              f"before every call with M = {m} and {e} experts", flush=True)
