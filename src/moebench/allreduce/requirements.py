"""Why a case cannot run on this machine: a skip with a reason that names what is missing.

Parent side: NVML and package metadata only (no torch, no CUDA init, vllm is not imported).
"""

from __future__ import annotations

import functools
import importlib.util
import shutil
import subprocess
from typing import Any

from moebench.core import hardware
from moebench.allreduce.cases import VLLM_CUSTOM_AR_MAX_BYTES, AllreduceCase
from moebench.allreduce.transport import why_not


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


@functools.lru_cache(maxsize=1)
def topo_matrix() -> str:
    """`nvidia-smi topo -m` as it printed (the link matrix a reader knows), once per session; a line
    saying why when it cannot be had."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "nvidia-smi not found"
    try:
        r = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"nvidia-smi topo -m failed: {e}"
    return r.stdout.strip() if r.returncode == 0 else f"nvidia-smi topo -m exited {r.returncode}: {r.stderr.strip()[:200]}"


def skip_reason(case: AllreduceCase, fp: dict[str, Any] | None = None) -> str | None:
    """The reason this case cannot run here, or None when it can."""
    if not case.on_gpu:
        return None
    fp = fp if fp is not None else hardware.fingerprint()
    have = len(fp.get("gpus") or [])
    if have < case.world:
        return f"needs {case.world} CUDA GPUs, NVML sees {have} visible here"
    if case.transport != "auto":
        return why_not(case.transport, ranks_topology(case.world, fp), case.world)
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
