"""Why a case cannot run on this machine: a skip with a reason that names what is missing.

Parent side: NVML and package metadata only (no torch, no CUDA init, vllm is not imported).
"""

from __future__ import annotations

import importlib.util
from typing import Any

from moebench import hardware
from moebench.allreduce.cases import VLLM_CUSTOM_AR_MAX_BYTES, AllreduceCase


def vllm_importable() -> bool:
    """Whether `import vllm` could work here (found, not imported: importing it is the rank's job)."""
    return importlib.util.find_spec("vllm") is not None


def ranks_topology(world: int, fp: dict[str, Any] | None = None) -> dict[str, Any]:
    """The links between the GPUs rank 0..world-1 use (the first `world` visible GPUs), from NVML."""
    fp = fp if fp is not None else hardware.fingerprint()
    gpus = [g["index"] for g in (fp.get("gpus") or [])][:world]
    pairs = (fp.get("topology") or {}).get("pairs") or {}
    mine = {k: v for k, v in pairs.items() if all(int(i) in gpus for i in k.split("-"))}
    links = {p["link"] for p in mine.values()}
    return {"gpus": gpus, "interconnect": "nvlink" if links == {"nvlink"} else ("pcie" if links else "none"),
            "pairs": mine}


def skip_reason(case: AllreduceCase, fp: dict[str, Any] | None = None) -> str | None:
    """The reason this case cannot run here, or None when it can."""
    if not case.on_gpu:
        return None
    fp = fp if fp is not None else hardware.fingerprint()
    have = len(fp.get("gpus") or [])
    if have < case.world:
        return f"needs {case.world} CUDA GPUs, NVML sees {have} visible here"
    if case.backend != "vllm_custom_ar":
        return None
    if case.nbytes >= VLLM_CUSTOM_AR_MAX_BYTES:
        return (f"vLLM's custom allreduce takes messages under {VLLM_CUSTOM_AR_MAX_BYTES >> 20} MiB "
                f"(this one is {case.nbytes} bytes): vLLM uses NCCL here")
    if not vllm_importable():
        return "vllm is not importable here (vLLM's custom allreduce needs vllm==0.21.0; see shared/gpu/vllm-stage)"
    topo = ranks_topology(case.world, fp)
    if case.world > 2 and topo["interconnect"] != "nvlink":
        return (f"vLLM's custom allreduce runs on NVLink or on at most two PCIe GPUs; GPUs {topo['gpus']} "
                f"are linked by {topo['interconnect']}")
    return None
