"""A vLLM general plugin that runs moebench's int4 decode kernel in place of Marlin for compressed-tensors
W4A16 (group 32, symmetric) experts, so a decode scenario measures our kernel inside the engine's step.

It is an entry point (group `vllm.general_plugins`), not an edit of vLLM: `hook_path()` writes a
.dist-info folder declaring it, and a scenario with `moe_hook = NAME` (a key of HOOKS) puts that folder
on the engine's PYTHONPATH with MOEBENCH_VLLM_MOE=NAME (decode/commands.py). vLLM calls `register()` in
each of its processes; without the variable, or with a name not in HOOKS, it does nothing.

HOOKS names the kernel each hook runs (w4_kernels.KERNELS): `moebench_w4` the rows-4 CUDA-core kernel,
`moebench_mma` the 16-row tensor-core kernel. Neither name contains the other, because the engine check
(decode/runner.check_choices) accepts a used kernel whose name contains the expected one.

What it changes, per MoE layer whose method is vLLM's CompressedTensorsWNA16MarlinMoEMethod:
  * process_weights_after_loading: the engine's own loaded weights (int32 [E, K/8, N] + scales) are
    repacked once into the hook's kernel's layout, then vLLM's Marlin repack runs as usual. The first such
    layer keeps its Marlin weights for the check below; every other layer's Marlin copy is freed, so
    the engine holds one copy of the experts, as with Marlin alone.
  * apply: our fused MoE (that kernel's fused_moe). On the first forward outside CUDA-graph capture (vLLM's
    profiling run, before any trial), the first layer also runs Marlin on the same input and the two
    outputs are compared; a relative error >= CHECK_BOUND raises, which fails the engine's start and
    the case. Then that layer's Marlin weights are freed too.
Layers the kernel does not cover (act order, another group size or bit width, expert parallelism, a
non-SiLU activation, row counts the 16-row tiles do not divide) keep Marlin and say so in the log.

The log line "Using NAME backend for WNA16 MoE" is what the decode case's engine check reads
(engine_log.py): a scenario expecting NAME fails if the hook did not take over.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ENV = "MOEBENCH_VLLM_MOE"
# hook name (a scenario's moe_hook and expect_moe, the name the engine logs) -> our kernel it runs
HOOKS = {"moebench_w4": "rows4", "moebench_mma": "mma"}
_PLUGIN = "moebench_moe_hook"  # the entry point's name (vLLM's VLLM_PLUGINS filter reads it)
CHECK_BOUND = 2e-2  # two bf16 kernels with different summation orders read ~1e-3 apart; garbage reads ~1
_DIST = "moebench_vllm_hook-0.1.dist-info"


def hook_path() -> str:
    """A folder holding the .dist-info that declares `register` as a vLLM general plugin (made once per
    user; returned for the engine's PYTHONPATH)."""
    from moebench.core.files import atomic_write_text

    root = Path(tempfile.gettempdir()) / f"moebench-vllm-hook-{os.getuid()}"
    dist = root / _DIST
    entry = f"[vllm.general_plugins]\n{_PLUGIN} = {__name__}:register\n"
    if not (dist / "entry_points.txt").is_file() or (dist / "entry_points.txt").read_text() != entry:
        dist.mkdir(parents=True, exist_ok=True)
        atomic_write_text(dist / "METADATA", "Metadata-Version: 2.1\nName: moebench-vllm-hook\nVersion: 0.1\n")
        atomic_write_text(dist / "entry_points.txt", entry)
    return str(root)


def _say(msg: str) -> None:
    print(f"moebench vllm hook: {msg}", file=sys.stderr, flush=True)


def unsupported(method, layer) -> str:
    """Why this layer keeps Marlin ("" when our kernel covers it)."""
    if method.num_bits != 4 or method.group_size != 32:
        return f"{method.num_bits}-bit group {method.group_size} (the kernel is int4 group 32)"
    if method.actorder == "group":
        return "act-order (g_idx) weights"
    if getattr(method, "kernel_backend", "Marlin") != "Marlin" or getattr(method, "marlin_input_dtype", None) is not None:
        return f"backend {method.kernel_backend} / input dtype {method.marlin_input_dtype}"
    if getattr(layer, "expert_map", None) is not None or getattr(layer, "apply_router_weight_on_input", False):
        return "expert parallelism or router weights applied on the input"
    act = str(getattr(layer, "activation", "silu")).lower()
    if "silu" not in act:
        return f"activation {act}"
    for name in ("w13_weight_packed", "w2_weight_packed"):  # int32 [E, K/8, N]: N rows in tiles of 16
        w = getattr(layer, name, None)
        if w is not None and (w.shape[-1] % 16 or (8 * w.shape[-2]) % 32):
            return f"{name} {tuple(w.shape)}: rows not a multiple of 16 or K of 32"
    return ""


def _free(param) -> None:
    import torch

    param.data = torch.empty(0, dtype=param.dtype, device=param.device)


def _free_marlin(layer) -> None:
    for name in ("w13_weight_packed", "w2_weight_packed", "w13_weight_scale", "w2_weight_scale"):
        _free(getattr(layer, name))


def install(method_cls, hook: str = "moebench_w4") -> None:
    """Patch `method_cls` (vLLM's CompressedTensorsWNA16MarlinMoEMethod or a stand-in with its
    interface) in place to run the kernel of `hook` (a key of HOOKS). Idempotent."""
    if getattr(method_cls, "_moebench_w4", False):
        return
    import torch

    from moebench.gemm.triton_moe import w4_kernels

    if hook not in HOOKS:
        raise ValueError(f"moebench vllm hook {hook!r}: not one of {', '.join(HOOKS)}")
    kernel = w4_kernels.get(HOOKS[hook])

    orig_process, orig_apply = method_cls.process_weights_after_loading, method_cls.apply
    state = {"check_layer": None, "announced": False}

    def process_weights_after_loading(self, layer) -> None:
        why = unsupported(self, layer)
        if why:
            _say(f"{getattr(layer, 'layer_name', 'a layer')} keeps Marlin: {why}")
            return orig_process(self, layer)
        w1 = kernel.from_compressed_tensors(layer.w13_weight_packed.data, layer.w13_weight_scale.data)
        w2 = kernel.from_compressed_tensors(layer.w2_weight_packed.data, layer.w2_weight_scale.data)
        orig_process(self, layer)
        layer._moebench_w4 = (w1, w2)
        if state["check_layer"] is None:
            state["check_layer"] = id(layer)  # keeps Marlin's weights until its first forward
            layer._moebench_check = True
        else:
            _free_marlin(layer)
        if not state["announced"]:
            state["announced"] = True
            # the engine check reads this line (engine_log.py): "Using X backend for WNA16 MoE"
            _say(f"Using {hook} backend for WNA16 MoE (moebench {kernel.name} int4 Triton kernel in place of Marlin)")

    pdl = [None]

    def apply(self, layer, x, topk_weights, topk_ids, shared_experts_input=None, **kw):
        w = getattr(layer, "_moebench_w4", None)
        if w is None:
            return orig_apply(self, layer, x, topk_weights, topk_ids, shared_experts_input, **kw)
        if pdl[0] is None:
            pdl[0] = x.is_cuda and torch.cuda.get_device_capability(x.device) >= (9, 0)
        out = kernel.fused_moe(x, w[0], w[1], topk_weights, topk_ids, pdl=pdl[0])
        capturing = x.is_cuda and torch.cuda.is_current_stream_capturing()  # no host sync inside a graph
        if getattr(layer, "_moebench_check", False) and not capturing:
            ref = orig_apply(self, layer, x.clone(), topk_weights, topk_ids, shared_experts_input, **kw)
            err = ((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()
            layer._moebench_check = False
            _free_marlin(layer)
            where = f"{getattr(layer, 'layer_name', 'first MoE layer')}, M={x.shape[0]}"
            if not err < CHECK_BOUND:  # NaN fails too
                raise RuntimeError(f"{hook} differs from Marlin on the first forward ({where}): relative "
                                   f"error {err:.3e} >= {CHECK_BOUND:.0e}")
            _say(f"first forward checked against Marlin ({where}): relative error {err:.2e}")
        return out

    method_cls.process_weights_after_loading = process_weights_after_loading
    method_cls.apply = apply
    method_cls._moebench_w4 = True


def register() -> None:
    """vLLM calls this in each of its processes (general plugin); active only with MOEBENCH_VLLM_MOE set
    to a hook's name (HOOKS)."""
    hook = os.environ.get(ENV, "")
    if not hook:
        return
    if hook not in HOOKS:  # the case's engine check then fails on the kernel the engine reports
        _say(f"{ENV}={hook!r}: not one of {', '.join(HOOKS)}; the engine keeps its own kernel")
        return
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe import (
        compressed_tensors_moe_wna16_marlin as marlin_moe)

    install(marlin_moe.CompressedTensorsWNA16MarlinMoEMethod, hook)
