"""The `decode` family: single-stream decode through a real engine, ms/token and TTFT against baselines.

Cases come from benchmarks/decode_scenarios.toml (one per scenario and engine), with the --decode-*
options applied. Each case starts its engine once (vLLM in-process, or a vLLM / SGLang server),
runs the warm-up trials (reported apart, never gated) and the measured ones, and gates steady-state
ms/token (median inter-token latency) and TTFT. CI on a CPU: `pytest benchmarks/ -m "decode and tiny"`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from moebench.suite import selection
from moebench.decode.options import DEFAULT_SCENARIOS, apply_overrides, overrides_from
from moebench.decode.runner import run_case
from moebench.decode.scenarios import ScenarioError, cases_of, load_scenarios
from moebench.suite.unmeasured import declare_cases


def _cases(config: pytest.Config):
    path = config.getoption("decode_scenarios") or str(Path(config.rootpath) / DEFAULT_SCENARIOS)
    try:
        scenarios = apply_overrides(load_scenarios(Path(path)), overrides_from(config.getoption))
        return cases_of(scenarios)
    except ScenarioError as e:
        # One usage line (exit 4) when -m can select a decode case; no decode case otherwise, so a broken
        # scenario file stops only the decode family (`-m selfcheck` still runs).
        if selection.can_select(config.getoption("markexpr", default="") or "", "decode"):
            selection.defer_usage_error(config, str(e))
        return []


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "decode_case" in metafunc.fixturenames:
        cases = _cases(metafunc.config)
        declare_cases(metafunc.config, "decode", (c.key for c in cases))
        params = [pytest.param(c, id=c.id, marks=[getattr(pytest.mark, name)(*args) for name, args in c.markers()])
                  for c in cases]
        metafunc.parametrize("decode_case", params)


def test_decode(decode_case, moebench, tmp_path, request):
    log_root = request.config.getoption("decode_log_dir")
    run_case(decode_case, moebench, Path(log_root) / decode_case.id if log_root else tmp_path)
