"""What both vLLM backends share at build time: the version, caching repacked weights on the model,
input checks, vLLM's config context, the first-call probe, and keyword arguments by signature."""

from __future__ import annotations

import contextlib
import inspect


def _vllm_version() -> str:
    import vllm

    return str(getattr(vllm, "__version__", "unknown"))


def _cached(wl, key, make):
    """Build-time repacks live on the model's ExpertWeights (one copy per model and device)."""
    cache = wl.weights.quantized
    if key not in cache:
        cache[key] = make()
    return cache[key]


def _expect(name: str, t, shape: tuple, dtype) -> None:
    if tuple(t.shape) != tuple(shape) or t.dtype != dtype:
        raise ValueError(f"{name}: expected {dtype} {tuple(shape)}, got {t.dtype} {tuple(t.shape)}")


def _check_inputs(wl) -> None:
    import torch

    for r in range(wl.R):
        x, ids, w = wl.x[r], wl.topk_ids[r], wl.topk_weights[r]
        _expect(f"x[{r}]", x, (wl.M, wl.K), torch.bfloat16)
        _expect(f"topk_ids[{r}]", ids, (wl.M, wl.topk), torch.int32)
        _expect(f"topk_weights[{r}]", w, (wl.M, wl.topk), torch.float32)
        if not (x.is_contiguous() and ids.is_contiguous() and w.is_contiguous()):
            raise ValueError(f"rotation {r}: inputs and routing must be contiguous")
        if x.device.type != "cuda":
            raise ValueError(f"vLLM's MoE kernels need CUDA tensors; the workload is on {x.device}")


def _vllm_config_context():
    """set_current_vllm_config(VllmConfig()) when vLLM has it, else a no-op context."""
    try:
        from vllm.config import VllmConfig, set_current_vllm_config
    except ImportError:
        return contextlib.nullcontext()
    return set_current_vllm_config(VllmConfig())


def _probe(calls: list, info: dict) -> list:
    """Run rotation 0 once at build (JIT, tuned-config file reads and lazy inits happen outside the timed
    region, and a broken call fails here with its own message). vLLM 0.21 raises AssertionError
    "Current vLLM config is not set" from code that wants a VllmConfig: then the calls run inside
    set_current_vllm_config(VllmConfig()) and the record says so."""
    import torch

    try:
        calls[0]()
        torch.cuda.synchronize()
        info["vllm_config_context"] = "not needed"
        return calls
    except AssertionError as e:
        if "vLLM config" not in str(e):
            raise
    with _vllm_config_context():
        calls[0]()
        torch.cuda.synchronize()

    def wrap(f):
        def call():
            with _vllm_config_context():
                return f()
        return call

    info["vllm_config_context"] = "calls run inside set_current_vllm_config(VllmConfig())"
    return [wrap(f) for f in calls]


def _kwargs_for(fn, wanted: dict, required: tuple[str, ...]) -> dict:
    """The keyword arguments `fn` accepts; a missing required one is a clear error naming the version."""
    params = inspect.signature(fn).parameters
    missing = [k for k in required if k not in params]
    if missing:
        raise RuntimeError(f"{fn.__module__}.{fn.__qualname__} has no parameter(s) {missing} in vLLM "
                           f"{_vllm_version()}; moebench's vLLM backends were written against 0.21.0")
    return {k: v for k, v in wanted.items() if k in params}
