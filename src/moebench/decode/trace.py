"""Reading a torch-profiler trace of decode steps: GPU kernels, and which engine step launched each.

The trace is the Chrome-trace JSON (optionally gzipped) that torch.profiler writes and vLLM's
`profiler_config` produces (`<dir>/<worker>.<time>.pt.trace.json.gz`). What we use of it:
- GPU work: events of category `kernel`, `gpu_memcpy` and `gpu_memset` (start `ts` and `dur` in us,
  and `args.correlation`, the id of the host call that launched it);
- host launches: `cuda_runtime` / `cuda_driver` events carrying the same `correlation` (a kernel run
  inside a CUDA graph correlates to the graph's `cudaGraphLaunch`);
- step boundaries: the engine's own `user_annotation` ranges, `gpu_model_runner: forward` once per step
  in vLLM, and `gpu_model_runner: sample` around the sampler.

A kernel belongs to the step during whose host interval it was launched (from one forward's start to
the next's). Steps are counted only when complete: the last annotated step can be cut by the stop of
the profiler, so it is left out.
"""

from __future__ import annotations

import bisect
import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
STEP_ANNOTATION = "gpu_model_runner: forward"
SAMPLE_ANNOTATION = "gpu_model_runner: sample"


class TraceError(ValueError):
    """A trace file that cannot be read or holds no usable decode step; one line naming the file."""


@dataclass(frozen=True)
class Kernel:
    """One piece of GPU work: name, start and duration (us), and what launched it."""

    name: str
    ts: float
    dur: float
    kind: str  # kernel | gpu_memcpy | gpu_memset
    in_sampler: bool = False


@dataclass
class Steps:
    """The complete decode steps of a profiled window: each step's GPU work, in launch order."""

    kernels: list[list[Kernel]] = field(default_factory=list)
    source: str = ""  # how steps were found: "annotations" or "assumed N steps"

    @property
    def count(self) -> int:
        """Number of complete steps."""
        return len(self.kernels)


def load_events(path: Path | str) -> list[dict]:
    """The trace's event list. Raises TraceError naming the file when it is not a Chrome trace."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        text = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        doc = json.loads(text)
    except (OSError, EOFError, gzip.BadGzipFile, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: not a readable profiler trace: {e}") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise TraceError(f"{path}: no traceEvents list (not a Chrome trace)")
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]


def _span(e: dict) -> tuple[float, float]:
    return float(e["ts"]), float(e.get("dur", 0.0))


def split_steps(events: list[dict], assumed_steps: int | None = None, where: str = "trace") -> Steps:
    """Group the trace's GPU work by the decode step that launched it.

    With the engine's step annotations present, kernels are attributed through their launch's
    correlation id. Without them (another engine, annotations off), every kernel of the window is one
    pool divided over `assumed_steps` (the steps the caller ran while profiling), and `source` says so.
    """
    gpu = [e for e in events if e.get("cat") in GPU_CATEGORIES]
    if not gpu:
        raise TraceError(f"{where}: no GPU kernel in the trace (was CUDA activity profiled?)")
    starts = sorted(float(e["ts"]) for e in events
                    if e.get("cat") == "user_annotation" and e.get("name") == STEP_ANNOTATION)
    samplers = sorted(_span(e) for e in events if e.get("cat") == "user_annotation" and e.get("name") == SAMPLE_ANNOTATION)
    launch_ts = {}
    for e in events:
        if e.get("cat") in LAUNCH_CATEGORIES:
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                launch_ts[corr] = float(e["ts"])

    def in_sampler(t: float | None) -> bool:
        if t is None or not samplers:
            return False
        i = bisect.bisect_right(samplers, (t, float("inf"))) - 1
        return i >= 0 and samplers[i][0] <= t <= samplers[i][0] + samplers[i][1]

    def kernel(e: dict, launched: float | None) -> Kernel:
        ts, dur = _span(e)
        return Kernel(str(e.get("name", "")), ts, dur, str(e["cat"]), in_sampler(launched))

    if len(starts) >= 2:
        per_step: list[list[Kernel]] = [[] for _ in range(len(starts) - 1)]
        for e in gpu:
            t = launch_ts.get((e.get("args") or {}).get("correlation"))
            if t is None:
                continue
            i = bisect.bisect_right(starts, t) - 1
            if 0 <= i < len(per_step):
                per_step[i].append(kernel(e, t))
        if any(per_step):
            for ks in per_step:
                ks.sort(key=lambda k: k.ts)
            return Steps(per_step, "annotations")
    if not assumed_steps:
        raise TraceError(f"{where}: no '{STEP_ANNOTATION}' annotations to find the steps by, and no step count given")
    pool = sorted((kernel(e, launch_ts.get((e.get("args") or {}).get("correlation"))) for e in gpu), key=lambda k: k.ts)
    # One pool spread evenly: per-step figures are then window averages, and their spread is unknown.
    return Steps([pool] + [[] for _ in range(assumed_steps - 1)], f"assumed {assumed_steps} steps")


def busy_us(kernels: list[Kernel]) -> float:
    """Time the GPU was busy with these kernels: the union of their intervals (overlaps counted once)."""
    total, end = 0.0, float("-inf")
    for k in sorted(kernels, key=lambda k: k.ts):
        lo, hi = max(k.ts, end), k.ts + k.dur
        if hi > lo:
            total += hi - lo
        end = max(end, hi)
    return total


def find_trace(folder: Path | str) -> Path:
    """The newest torch-profiler trace file under a folder (vLLM names them *.pt.trace.json[.gz])."""
    folder = Path(folder)
    found = sorted(folder.rglob("*.pt.trace.json*"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise TraceError(f"{folder}: the profiler wrote no *.pt.trace.json[.gz] file")
    return found[-1]
