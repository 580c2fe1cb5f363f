"""Reading a torch-profiler trace of decode steps: GPU kernels, and which engine step launched each.

The trace is the Chrome-trace JSON (optionally gzipped) that torch.profiler writes and vLLM's
`profiler_config` produces (`<dir>/<worker>.<time>.pt.trace.json.gz`). What we use of it:
- GPU work: events of category `kernel`, `gpu_memcpy` and `gpu_memset` (start `ts` and `dur` in us,
  and `args.correlation`, the id of the host call that launched it);
- host launches: `cuda_runtime` / `cuda_driver` events carrying the same `correlation` (a kernel run
  inside a CUDA graph correlates to the graph's `cudaGraphLaunch`);
- step boundaries: the engine's own `user_annotation` ranges. vLLM's worker names every step it runs
  under the profiler `execute_context_C(c)_generation_G(g)` (C prefill requests of c tokens, G decode
  requests); only decode-only steps (C = 0, G >= 1) count. With VLLM_CUSTOM_SCOPES_FOR_PROFILING=1 it
  also marks `gpu_model_runner: forward` and `gpu_model_runner: sample` (the sampler's kernels).

A kernel belongs to the step during whose host interval it was launched (from one step's start to the
next's, so the sampler launched after the forward counts with its step). Steps are counted only when
complete: the last annotated step can be cut by the stop of the profiler, so it is left out.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from pathlib import Path

from moebench.results.document import ResultsError, read_json

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
DECODE_STEP = re.compile(r"^execute_context_0\(0\)_generation_([1-9]\d*)\(\d+\)$")
STEP_ANNOTATION = "gpu_model_runner: forward"  # the fallback when the worker's step names are absent
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
    try:
        doc = read_json(path)
    except ResultsError as e:
        raise TraceError(f"{path}: not a readable profiler trace: {str(e).removeprefix(f'{path}: ')}") from None
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
    # Every step the worker annotated, decode-only or not: a prefill or empty step between two decode
    # steps ends the first, and its own kernels belong to no decode step.
    annotations = [e for e in events if e.get("cat") == "user_annotation"]
    bounds = sorted((float(e["ts"]), bool(DECODE_STEP.match(str(e.get("name", ""))))) for e in annotations
                    if str(e.get("name", "")).startswith("execute_context_"))
    if sum(d for _, d in bounds) < 2:
        bounds = sorted((float(e["ts"]), True) for e in annotations if e.get("name") == STEP_ANNOTATION)
    starts = [t for t, _ in bounds]
    samplers = sorted(_span(e) for e in events if e.get("cat") == "user_annotation" and e.get("name") == SAMPLE_ANNOTATION)
    launch_ts = launch_times(events)

    def in_sampler(t: float | None) -> bool:
        if t is None or not samplers:
            return False
        i = bisect.bisect_right(samplers, (t, float("inf"))) - 1
        return i >= 0 and samplers[i][0] <= t <= samplers[i][0] + samplers[i][1]

    def kernel(e: dict, launched: float | None) -> Kernel:
        ts, dur = _span(e)
        return Kernel(str(e.get("name", "")), ts, dur, str(e["cat"]), in_sampler(launched))

    decode_index = {}  # position in `bounds` -> decode step number, the last (maybe cut) step left out
    for j, (_, is_decode) in enumerate(bounds[:-1]):
        if is_decode:
            decode_index[j] = len(decode_index)
    if decode_index:
        per_step: list[list[Kernel]] = [[] for _ in decode_index]
        for e in gpu:
            t = launch_ts.get((e.get("args") or {}).get("correlation"))
            if t is None:
                continue
            j = bisect.bisect_right(starts, t) - 1
            if j in decode_index:
                per_step[decode_index[j]].append(kernel(e, t))
        if any(per_step):
            for ks in per_step:
                ks.sort(key=lambda k: k.ts)
            return Steps(per_step, "annotations")
    if not assumed_steps:
        raise TraceError(f"{where}: no step annotations (execute_context_0(0)_generation_N) to find the steps by, "
                         "and no step count given")
    pool = sorted((kernel(e, launch_ts.get((e.get("args") or {}).get("correlation"))) for e in gpu), key=lambda k: k.ts)
    # One pool spread evenly: per-step figures are then window averages, and their spread is unknown.
    return Steps([pool] + [[] for _ in range(assumed_steps - 1)], f"assumed {assumed_steps} steps")


def launch_times(events: list[dict]) -> dict:
    """Host launch time (us) of every correlation id: when the call that launched a kernel was made."""
    out = {}
    for e in events:
        if e.get("cat") in LAUNCH_CATEGORIES:
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                out[corr] = float(e["ts"])
    return out


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
