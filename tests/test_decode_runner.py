"""decode/runner.run_case with the engine replaced by a fake timeline: what the runner hands on from the
scenario (category tolerances, the memory floor to the plausibility check) and the floor it computes (the
KV cache at the trial's mean context). No engine, no process: run_engine returns the EngineRun."""

from __future__ import annotations

import re

import pytest

from moebench.decode import runner
from moebench.decode.breakdown import Breakdown
from moebench.decode.procs import EngineError
from moebench.decode.categories import CATEGORIES
from moebench.decode.runner import EngineRun, floor_metrics, run_case
from moebench.decode.scenarios import DecodeCase, ScenarioError, parse_scenario
from moebench.decode.stats import Trial, burst_phrase
from moebench.core.metrics import Metric
from moebench.outputs.report import NOTE_WIDTH, text_table
from moebench.results.document import Row

# The shipped tiny config (models/tiny): 2 layers, kv_lora_rank 512, qk_rope_head_dim 64, bf16.
TINY_KV_BYTES_PER_TOKEN = 2 * (512 + 64) * 2


class FakeBench:
    """The `moebench` fixture as run_case uses it: record() measures once and keeps what it got."""

    hardware_key = "cpu-test-2c"

    def __init__(self, read_bytes_per_s: float = 1e12):
        self.read_bytes_per_s = read_bytes_per_s
        self.metrics: dict[str, Metric] = {}

    def progress(self, message: str) -> None:
        pass

    def ceiling(self, device: str, kind: str) -> float:
        return self.read_bytes_per_s

    def record(self, key, family, definition, measure, **kw) -> None:
        self.metrics = measure()


def _case(**kw) -> DecodeCase:
    base = {"name": "x", "engine": "vllm", "model": "tiny", "moe_backend": "triton", "device": "cpu"}
    return DecodeCase(parse_scenario(base | kw, "f.toml"), "vllm")


def _run(case: DecodeCase, monkeypatch, tmp_path, bench: FakeBench, ms_per_token: float = 2.0) -> FakeBench:
    """run_case on a fake engine: every trial 16 ms to the first token, then ms_per_token per token; with
    profile_steps a breakdown of 1 ms/step in each category."""
    s = case.scenario
    n = s.output_tokens
    trials = [Trial(i < s.warmup_trials, [(0.016 + i * ms_per_token / 1e3, 1) for i in range(n)], [])
              for i in range(s.warmup_trials + s.trials)]
    bd = None
    if s.profile_steps:
        bd = Breakdown(4, "annotations", {c: [1.0, 1.01, 0.99, 1.0] for c in CATEGORIES}, [8.0] * 4)
    run = EngineRun(trials, 1.0, None, {}, {"moe": ["TRITON (Unquantized MoE)"], "attention": [], "lines": []},
                    [], bd)
    monkeypatch.setattr(runner, "why_not_here", lambda case, key: None)
    monkeypatch.setattr(runner, "run_engine", lambda case, log, say: run)
    run_case(case, bench, tmp_path)
    return bench


def test_the_scenarios_per_category_tolerances_reach_the_gated_metrics(monkeypatch, tmp_path):
    case = _case(gate_categories=["attention", "routed_experts"], profile_steps=8,
                 rel_tol_category=0.05, rel_tol_categories={"attention": 0.25})
    m = _run(case, monkeypatch, tmp_path, FakeBench()).metrics
    assert m["step_attention_ms"].gated and m["step_attention_ms"].rel_tol == 0.25
    assert m["step_routed_experts_ms"].gated and m["step_routed_experts_ms"].rel_tol == 0.05


def test_the_scenarios_cliff_metrics_gate_only_on_a_doubling(monkeypatch, tmp_path):
    m = _run(_case(cliff_metrics=["ttft_ms"]), monkeypatch, tmp_path, FakeBench()).metrics
    assert m["ttft_ms"].cliff and m["ttft_ms"].gated and not m["ms_per_token"].cliff
    assert not _run(_case(), monkeypatch, tmp_path, FakeBench()).metrics["ttft_ms"].cliff


@pytest.mark.parametrize("bad", [["itl_p99_ms"], "ttft_ms"])
def test_a_cliff_metric_must_be_a_gated_decode_metric(bad):
    with pytest.raises(ScenarioError, match="scenario 'x': cliff_metrics: must"):
        _case(cliff_metrics=bad)


def test_the_engine_instances_are_the_cases_independent_runs(monkeypatch, tmp_path):
    seen = {}

    class Keeps(FakeBench):
        def record(self, key, family, definition, measure, **kw):
            seen.update(kw)
            super().record(key, family, definition, measure, **kw)

    _run(_case(engine_instances=3), monkeypatch, tmp_path, Keeps())
    assert seen["independent_runs"] == 3


def test_a_steady_state_under_the_memory_floor_fails_the_case(monkeypatch, tmp_path):
    case = _case()
    # fast enough to read the tiny model's weights in far less than 2 ms: plausible
    ok = _run(case, monkeypatch, tmp_path, FakeBench(1e12))
    assert ok.metrics["floor_ms_per_token"].value < 2.0
    # a read ceiling of 1 MB/s puts the floor at seconds per token: 2 ms/token cannot be true
    with pytest.raises(pytest.fail.Exception, match="below the memory floor"):
        _run(case, monkeypatch, tmp_path, FakeBench(1e6))


def test_the_kv_cache_counts_at_the_trials_mean_context():
    # decode step i of a trial reads the prompt and the i tokens made before it: on average the prompt
    # and half the output
    case = _case(prompt_tokens=64, output_tokens=128)
    info: dict = {}
    metrics = {"ms_per_token": Metric(2.0, "ms", "lower"), "step_attention_ms": Metric(0.5, "ms", "lower")}
    out = floor_metrics(case, metrics, lambda device, kind: 1e9, info)
    kv = TINY_KV_BYTES_PER_TOKEN * (64 + 128 / 2)
    assert info["floor"]["kv_cache_mean"] == kv
    assert out["pct_of_floor_attention"].value == pytest.approx(100 * (kv / 1e9 * 1e3) / 0.5)


def _burst_run(case: DecodeCase, monkeypatch, tmp_path, *held: set[int] | None) -> None:
    """run_case on a stream its host held back: the first token at 29 ms, the other 127 within 2 ms at 0.9 s
    (what a loaded 2-core box made of the tiny vLLM server, CI 2026-12-02). `held`, one per engine instance:
    None for every trial held back, else the trials numbered there (0-based, warm-up counted), the others
    smooth at 8 ms/token."""
    s = case.scenario
    n = s.output_tokens
    burst = [(0.029, 1)] + [(0.9 + i * 0.002 / n, 1) for i in range(n - 1)]
    smooth = [(0.020 + 0.008 * i, 1) for i in range(n)]
    runs = iter([EngineRun([Trial(i < s.warmup_trials, list(burst if h is None or i in h else smooth), [])
                            for i in range(s.warmup_trials + s.trials)], 1.0,
                           None, {}, {"moe": ["TRITON (Unquantized MoE)"], "attention": [], "lines": []}, [], None)
                 for h in held or (None,)])
    monkeypatch.setattr(runner, "why_not_here", lambda case, key: None)
    monkeypatch.setattr(runner, "run_engine", lambda case, log, say: next(runs))
    run_case(case, FakeBench(1e10), tmp_path)


def test_a_stream_held_back_by_a_cpu_host_is_not_timed_and_says_why(monkeypatch, tmp_path):
    with pytest.raises(pytest.skip.Exception, match=r"^not timed on this host: the stream arrived in bursts "
                       r"\(trial 2: 126 of the 127 chunks after the first came under 0\.07 ms after the one "
                       r"before, the last 902\.0 ms after the request; load average"):
        _burst_run(_case(), monkeypatch, tmp_path)


def test_the_held_back_streams_advice_survives_the_closing_table(monkeypatch, tmp_path):
    # The reason runs past the table's NOTE_WIDTH: clipped there, the row lost "time it on a quieter box".
    with pytest.raises(pytest.skip.Exception) as e:
        _burst_run(_case(), monkeypatch, tmp_path)
    reason = e.value.msg
    assert len(reason) > NOTE_WIDTH and reason.endswith("; time it on a quieter box")
    assert reason in " ".join(text_table([Row("t::x", "", "SKIP", note=reason)]).split())  # wrapped, whole


def test_one_held_back_trial_among_smooth_ones_is_not_timed_either(monkeypatch, tmp_path):
    # CPU box, one busy loop (2026-12-07): trial 2 smooth at 7.9 ms/token, trial 3 whole; the pooled windows'
    # median read 6.4 ms/token, plausible against the mean ITL, so the run passed with neither trial's rate
    with pytest.raises(pytest.skip.Exception, match=r"^not timed on this host: the stream arrived in bursts "
                       r"\(trial 3: 126 of the 127 chunks .*, so no steady rate can be read from it; "):
        _burst_run(_case(trials=2), monkeypatch, tmp_path, {2})
    with pytest.raises(pytest.fail.Exception, match=r"the stream arrived in bursts \(trial 3: 126 of the 127 chunks"):
        _burst_run(_case(trials=2, device="cuda"), monkeypatch, tmp_path, {2})
    _burst_run(_case(trials=2), monkeypatch, tmp_path, {0})  # a held-back warm-up trial is not measured


def test_a_held_back_trial_in_any_engine_instance_is_named_with_its_instance(monkeypatch, tmp_path):
    # with several instances the run kept for the log is the last one; the first's burst still counts
    with pytest.raises(pytest.skip.Exception, match=r"bursts \(engine instance 1, trial 2: 126 of the 127"):
        _burst_run(_case(trials=2, engine_instances=3), monkeypatch, tmp_path, {1}, set(), set())
    _burst_run(_case(trials=2, engine_instances=3), monkeypatch, tmp_path, set(), set(), set())


def test_a_burst_from_an_engine_on_a_gpu_fails_naming_the_burst(monkeypatch, tmp_path):
    try:
        with pytest.raises(pytest.fail.Exception, match=r"below the memory floor.*; trial 2: 126 of the 127 chunks"):
            _burst_run(_case(device="cuda"), monkeypatch, tmp_path)
    except pytest.skip.Exception as e:  # a skip here would hide an engine that streams in bursts
        pytest.fail(f"a GPU engine's burst was skipped: {e}")


# --- trial numbers: one convention in every message -------------------------------------------------------

class FakeEngine:
    """What run_engine asks of an engine, handing out `trials` in turn (no process, no log)."""

    log = None

    def __init__(self, trials: list[Trial]):
        self.trials = trials

    def start(self, progress) -> float:
        return 1.0

    def trial(self, index: int, prompt, max_tokens: int, warmup: bool) -> Trial:
        t = self.trials[index]
        return Trial(warmup, t.chunks, t.token_ids)

    def stop(self) -> list[int]:
        return []


def _smooth(n: int, ttft_s: float = 0.016) -> Trial:
    return Trial(False, [(ttft_s + 0.002 * i, 1) for i in range(n)], [])


def test_stats_and_the_runner_name_the_same_trial_by_the_same_number(monkeypatch, tmp_path):
    # stats counted trials from 0 and the progress lines from 1: the burst of "trial 1" was "trial 2/3"'s
    case = _case(trials=2)  # one warm-up trial, then two measured ones
    n = case.scenario.output_tokens
    held = Trial(False, [(0.029, 1)] + [(0.9 + i * 0.002 / n, 1) for i in range(n - 1)], [])
    said: list[str] = []
    monkeypatch.setattr(runner, "make_engine", lambda case, log: (FakeEngine([_smooth(n), _smooth(n), held]), {}))
    run = runner.run_engine(case, tmp_path / "engine.log", said.append)
    name = burst_phrase(run.trials).split(":")[0]
    assert name == "trial 3"
    line = next(x for x in said if x.startswith(f"{case.id}: {name}/"))
    assert line.startswith(f"{case.id}: trial 3/3: TTFT 29.0 ms")  # the held-back trial's own first token


@pytest.mark.parametrize("bad, name", [(0, "trial 1 (warm-up)"), (2, "trial 3")])
def test_a_wrong_trial_is_named_as_the_progress_lines_number_it(monkeypatch, tmp_path, bad, name):
    # runner.py said "trial 2: wrong output" of the trial its progress lines had been counting as the third
    case = _case(trials=2)
    n = case.scenario.output_tokens
    trials = [_smooth(n) for _ in range(3)]
    trials[bad] = _smooth(n - 1)
    said: list[str] = []
    monkeypatch.setattr(runner, "make_engine", lambda case, log: (FakeEngine(trials), {}))
    with pytest.raises(EngineError, match=rf"^{re.escape(name)}: wrong output: {n - 1} output tokens, expected {n}$"):
        runner.run_engine(case, tmp_path / "engine.log", said.append)
    numbered = [x.split(": ")[1].split("/")[0] for x in said if x.startswith(f"{case.id}: trial ")]
    assert numbered == [f"trial {i + 1}" for i in range(bad)]  # the wrong one is the next the lines would number
