"""A deliberate slowdown of vLLM's or SGLang's routed-expert kernel, or of vLLM's MLA decode attention, to
prove the decode gate can fail, and fail on the category that moved.

This is a vLLM general plugin (entry point `vllm.general_plugins`) and an SGLang plugin (entry point
`sglang.srt.plugins`), loaded by every engine process when this folder is on PYTHONPATH: the way a real
kernel regression arrives (a patched or upgraded engine), from outside the case definition. With MOEBENCH_PLANT_EXPERTS=F (a fraction, e.g. 0.10) it runs the
Marlin MoE GEMMs of one MoE layer in every round(1/F) a second time into a scratch output, so the routed
experts' GPU time grows by about F while every result stays what it was (the second call's output is
discarded). With MOEBENCH_PLANT_ATTENTION=F (vLLM, FLASH_ATTN_MLA: the H200 Kimi rank's backend) it runs
the MLA decode attention (FlashAttnMLAImpl.forward_mqa, which returns a new tensor) of one layer call in
every round(1/F) twice and keeps the first result, so the attention category grows by about F of its
FlashAttention kernel time and no other category moves: the plant of issue 36 outside the experts. Unset,
they do nothing.

    PYTHONPATH=ci/planted MOEBENCH_PLANT_EXPERTS=0.10 pytest benchmarks/ -m decode -k "int4 and not server"
    PYTHONPATH=ci/planted MOEBENCH_PLANT_EXPERTS=0.10 pytest benchmarks/ -m "decode and sglang" -k int4
    PYTHONPATH=ci/planted MOEBENCH_PLANT_ATTENTION=0.07 pytest benchmarks/ -m decode -k "kimi and int4 and not server and moe_auto"

The calls happen inside the engine's CUDA-graph capture too, so the extra kernels are part of every replay.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys


VLLM_FA_MLA = "vllm.v1.attention.backends.mla.flashattn_mla"


def register() -> None:
    """vLLM calls this in each of its processes (general plugin)."""
    every = _every()
    if every:
        import vllm._custom_ops as ops

        _plant(ops, every)
    attention = _every("MOEBENCH_PLANT_ATTENTION")
    if attention:  # when vLLM imports its backend: importing it here would load FlashAttention in every process
        plant_when_imported(VLLM_FA_MLA, lambda module: _plant_attention(module.FlashAttnMLAImpl, attention))


SGLANG_MARLIN = "sglang.srt.layers.moe.fused_moe_triton.fused_marlin_moe"


def register_sglang() -> None:
    """SGLang calls this in each of its processes (entry point `sglang.srt.plugins`). Its Marlin MoE
    (`fused_marlin_moe`) calls the module-level `moe_wna16_marlin_gemm` it imported from sglang.jit_kernel,
    with the output buffer as the second positional argument (SGLang 0.5.15).

    The module is planted when SGLang itself imports it, not imported here: importing it from the plugin
    (which SGLang's launcher loads before anything else) pulled in FlashInfer's comm package before
    SGLang's own guarded import of it, failed on `cuda.tile` on the H200 image, and left the plant unapplied."""
    every = _every()
    if every:
        plant_when_imported(SGLANG_MARLIN, lambda module: _plant(module, every))


def plant_when_imported(name: str, then) -> None:
    """then(module) now if `name` is imported already, else right after its own import runs (also ci/planted's
    sitecustomize's way in: it plants the int4 kernel module of whatever process imports it)."""
    if name in sys.modules:
        then(sys.modules[name])
    elif not any(isinstance(f, _PlantOnImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _PlantOnImport(name, then))


class _PlantOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when `name` is being imported, it lets the other finders find it and runs
    `then(module)` right after the module's own code."""

    def __init__(self, name: str, then):
        self.name, self.then = name, then

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # one module, once; and the search below must not find us again
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            self.then(module)

        spec.loader.exec_module = exec_module
        return spec


def _every(variable: str = "MOEBENCH_PLANT_EXPERTS") -> int:
    """One call in how many runs twice, from the fraction in `variable` (0: unset, no plant)."""
    frac = float(os.environ.get(variable, "0") or 0)
    return max(1, round(1 / frac)) if frac > 0 else 0


def _plant_attention(impl, every: int) -> None:
    """Wrap impl.forward_mqa (vLLM's MLA decode attention) so that one call in `every` runs twice; the
    first result is returned, the second discarded (forward_mqa writes no buffer of the caller's)."""
    if getattr(impl.forward_mqa, "_moebench_planted", False):
        return
    original = impl.forward_mqa
    calls = [0]

    def planted(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        if calls[0] % every == 0:
            original(self, *args, **kwargs)
        calls[0] += 1
        return out

    planted._moebench_planted = True
    impl.forward_mqa = planted
    print(f"moebench planted regression: every {every}th MLA decode attention call runs twice", flush=True)


def _plant(module, every: int) -> None:
    """Wrap module.moe_wna16_marlin_gemm so that one MoE layer in `every` runs its two GEMMs twice."""
    if getattr(module.moe_wna16_marlin_gemm, "_moebench_planted", False):
        return
    original = module.moe_wna16_marlin_gemm
    calls = [0]

    def planted(*args, **kwargs):
        out = original(*args, **kwargs)
        # Two Marlin GEMMs per MoE layer (gate-up, then down): layer = call // 2.
        if (calls[0] // 2) % every == 0:
            again = dict(kwargs)
            if "output" in again:
                again["output"] = None  # a fresh scratch output: the layer's result is untouched
                original(*args, **again)
            elif len(args) > 1:
                original(args[0], None, *args[2:], **kwargs)
        calls[0] += 1
        return out

    planted._moebench_planted = True
    module.moe_wna16_marlin_gemm = planted
    print(f"moebench planted regression: every {every}th MoE layer runs its Marlin GEMMs twice", flush=True)
