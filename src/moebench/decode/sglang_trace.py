"""SGLang's profiled decode steps: where its trace lands, how its steps are told apart, its kernel names.

SGLang (0.5.15: managers/scheduler_components/profiler_manager.py) profiles through `POST /start_profile`.
With `profile_by_stage` and `num_steps` N the scheduler profiles the prefill, stops, then profiles N decode
steps and writes `<output_dir>/<profile_id>-TP-<rank>-DECODE.trace.json.gz`, torch.profiler's Chrome trace
(what moebench.decode.trace reads).

Steps: SGLang marks its scheduler's steps with NVTX ranges only, which torch.profiler does not record, so
the trace has none of the step annotations vLLM writes (`execute_context_...`). Under CUDA graphs one
decode step is one `cudaGraphLaunch` (the decode graph's `full` backend), so the launches are the step
boundaries: a kernel belongs to the step of the last graph launch before its own launch (the graph's
kernels, then what the step launches eagerly after it: sampling, the next step's inputs). The step after
the last launch can be cut by the profiler's stop and is left out. Where the window holds k launches per
step (a split graph), every k-th launch is a boundary. Without graph launches (eager mode) the window is
one pool spread over the steps, as trace.split_steps does, and its categories are not gated.

Kernel names: `RULES` run before the category map (moebench.decode.categories, written from vLLM's trace):
- SGLang runs every SiLU-and-mul (the dense MLPs', the shared expert's and the routed experts') through
  one `act_and_mul` kernel, so its name cannot say whose it is: all count as norms_elementwise here, where
  vLLM's map puts it in routed_experts (vLLM compiles the dense ones into Inductor kernels). SGLang's
  routed_experts are the Marlin GEMMs, the token sort and the sum, without the activation.
- SGLang's router kernels (`moe_fused_gate`, FlashInfer's DeepSeek top-k) count as router_topk_align.
- Greedy sampling in SGLang is an argmax launched outside any annotation: it counts by its name
  (norms_elementwise), not as sampling.
- GLM-5's router (256 experts, one group) takes its top-k through torch.topk, whose kernel is a sort
  (`at::native::bitonicSortKVInPlace`): router_topk_align. On the first H200 trace of the GLM-5 rank it
  was 0.60 ms/step of `other` (6.5% of the GPU busy time); greedy sampling is an argmax, no sort.
- SGLang's RMSNorms (fused add + norm, and the plain one) are FlashInfer's CuTe DSL kernels, named
  `kernel_cutlass_kernel_flashinfernormkernels...RMSNormKernel...`: norms_elementwise, where the shared
  map's attention rule (`flash`) would take them. Version 1 did: on the first H200 trace (SGLang 0.5.15,
  Kimi INT4 rank) 0.51 ms/step of norms read as attention (1.63 ms/step instead of about 1.1).
Checked on that trace: `other` was 0.006 ms/step (0.1% of the GPU busy time: a metadata kernel, the
position clamp, two copies). A change here bumps SGLANG_MAP_VERSION, which is part of the SGLang cases'
definition (their stored category entries turn STALE, not REGRESSION).
"""

from __future__ import annotations

import bisect
import re
from pathlib import Path

from moebench.decode.categories import MAP_VERSION, category
from moebench.decode.trace import GPU_CATEGORIES, LAUNCH_CATEGORIES, Kernel, Steps, TraceError, launch_times

# 2: FlashInfer's CuTe DSL RMSNorm kernels moved from attention (the shared `flash` rule) to norms_elementwise,
#    torch.topk's sort (GLM-5's router) from other to router_topk_align
SGLANG_MAP_VERSION = 2
GRAPH_LAUNCH = "cudaGraphLaunch"
DECODE_TRACE_GLOB = "*-DECODE.trace.json*"

RULES: tuple[tuple[str, re.Pattern[str]], ...] = tuple((cat, re.compile(pat, re.I)) for cat, pat in (
    ("norms_elementwise", r"act_and_mul|flashinfer.*norm|rms_?norm"),
    ("router_topk_align", r"moe_fused_gate|fused_topk_deepseek|deepseek.*topk|biased_grouped|bitonicSort"),
))


def breakdown_map() -> str:
    """What the SGLang cases' categories mean: the shared map's version and this module's rules'."""
    return f"{MAP_VERSION}+sglang{SGLANG_MAP_VERSION}"


def sglang_category(k: Kernel) -> str:
    """The category of one kernel of an SGLang trace: SGLang's rules first, then the shared map."""
    if k.kind == "kernel" and not k.in_sampler:
        for cat, pat in RULES:
            if pat.search(k.name):
                return cat
    return category(k)


def find_decode_trace(folder: Path | str) -> Path:
    """The newest decode-stage trace SGLang wrote under a folder."""
    folder = Path(folder)
    found = sorted(folder.rglob(DECODE_TRACE_GLOB), key=lambda p: p.stat().st_mtime)
    if not found:
        others = sorted(p.name for p in folder.rglob("*.trace.json*")) if folder.is_dir() else []
        raise TraceError(f"{folder}: SGLang wrote no {DECODE_TRACE_GLOB} file"
                         + (f" (only {', '.join(others)})" if others else ""))
    return found[-1]


def split_by_graph_launches(events: list[dict], steps: int, where: str = "trace") -> Steps:
    """Group the trace's GPU work into decode steps at its CUDA-graph launches (see the module docstring).
    `steps`: how many decode steps the profiler was asked for."""
    gpu = [e for e in events if e.get("cat") in GPU_CATEGORIES]
    if not gpu:
        raise TraceError(f"{where}: no GPU kernel in the trace (was CUDA activity profiled?)")
    launch_ts = launch_times(events)
    launches = sorted(float(e["ts"]) for e in events
                      if e.get("cat") in LAUNCH_CATEGORIES and str(e.get("name", "")).startswith(GRAPH_LAUNCH))

    def kernel(e: dict) -> tuple[float | None, Kernel]:
        t = launch_ts.get((e.get("args") or {}).get("correlation"))
        return t, Kernel(str(e.get("name", "")), float(e["ts"]), float(e.get("dur", 0.0)), str(e["cat"]))

    if not launches:  # eager: one pool, window averages
        pool = sorted((kernel(e)[1] for e in gpu), key=lambda k: k.ts)
        return Steps([pool] + [[] for _ in range(steps - 1)], f"assumed {steps} steps (no CUDA-graph launches)")
    per_step = max(1, round(len(launches) / max(steps, 1)))
    bounds = launches[::per_step]
    out: list[list[Kernel]] = [[] for _ in bounds[:-1]]  # the step after the last boundary may be cut
    for e in gpu:
        t, k = kernel(e)
        if t is None:
            continue
        j = bisect.bisect_right(bounds, t) - 1
        if 0 <= j < len(out):
            out[j].append(k)
    if not any(out):
        raise TraceError(f"{where}: {len(launches)} CUDA-graph launches but no kernel launched between them")
    for ks in out:
        ks.sort(key=lambda k: k.ts)
    return Steps(out, "graph launches" if per_step == 1 else f"graph launches ({per_step} per step)")
