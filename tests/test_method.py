"""The way of measuring is part of every case definition (moebench.core.method): a changed timer, warm-up,
stopping rule or steady-state rule makes the stored entries STALE, never a REGRESSION or IMPROVEMENT."""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib
import inspect
import textwrap
from pathlib import Path

import pytest

from moebench.core import method, provenance, timing
from moebench.decode.options import DEFAULT_SCENARIOS
from moebench.decode.scenarios import cases_of, load_scenarios
from moebench.gemm import runner
from moebench.gemm.cases import ALL_CASES


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return tree


def code_digest(parts) -> str:
    """sha256 prefix of the named functions' code without docstrings and comments (ast.unparse: stable
    across Python versions, blind to formatting)."""
    h = hashlib.sha256()
    for module, qualname in parts:
        obj = importlib.import_module(module)
        for name in qualname.split("."):
            obj = getattr(obj, name)
        tree = ast.parse(textwrap.dedent(inspect.getsource(obj)))
        h.update(ast.unparse(_strip_docstrings(tree)).encode())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("name", sorted(method.METHOD_CODE))
def test_method_code_matches_its_version(name):
    got = code_digest(method.METHOD_CODE[name])
    assert got == method.CODE_DIGESTS[name], (
        f"the {name} code changed (digest {got}, recorded {method.CODE_DIGESTS[name]}): if it can move a number, "
        f"bump its version in moebench/core/method.py (stored entries go STALE and are re-recorded); for a pure "
        f"refactor, record the new digest")


def _gemm_case():
    return next(c for c in ALL_CASES if c.model == "deepseek-v3" and c.op == "fused" and c.m == 1 and c.dtype == "bf16"
                and c.routing == "decode" and c.backend == "triton")


def test_the_timer_version_is_in_the_gemm_definition(monkeypatch):
    case = _gemm_case()
    before = provenance.definition_hash(runner.definition(case, "cuda"))
    monkeypatch.setattr(method, "GPU_TIMER_VERSION", method.GPU_TIMER_VERSION + 1)
    assert provenance.definition_hash(runner.definition(case, "cuda")) != before


def test_the_warm_up_rule_is_in_the_gemm_definition(monkeypatch):
    case = _gemm_case()
    before = provenance.definition_hash(runner.definition(case, "cuda"))
    monkeypatch.setattr(method, "GPU_WARM", dataclasses.replace(timing.GPU_WARM, tol=0.02))
    assert provenance.definition_hash(runner.definition(case, "cuda")) != before


def test_the_stopping_rule_and_l2_rule_are_in_the_gemm_definition(monkeypatch):
    case = _gemm_case()
    before = provenance.definition_hash(runner.definition(case, "cuda"))
    monkeypatch.setattr(runner, "GPU_RULE", dataclasses.replace(runner.GPU_RULE, max_seconds=1.0))
    assert provenance.definition_hash(runner.definition(case, "cuda")) != before
    monkeypatch.undo()
    monkeypatch.setattr(runner, "L2_RULE", "no rotation")
    assert provenance.definition_hash(runner.definition(case, "cuda")) != before


def test_a_cpu_timer_change_leaves_the_gpu_definition_alone(monkeypatch):
    case = _gemm_case()
    gpu, cpu = runner.definition(case, "cuda"), runner.definition(case, "cpu")
    assert gpu["method"]["timer"] == "cuda-events-graph" and cpu["method"]["timer"] == "perf-counter"
    monkeypatch.setattr(method, "CPU_TIMER_VERSION", method.CPU_TIMER_VERSION + 1)
    assert runner.definition(case, "cuda") == gpu
    assert runner.definition(case, "cpu") != cpu


def test_the_steady_state_version_is_in_the_decode_definition(monkeypatch):
    case = next(c for c in cases_of(load_scenarios(Path(DEFAULT_SCENARIOS))) if c.scenario.name == "kimi-k2.5-int4-rank")
    before = case.definition()
    # version 1 is the phrase the committed entries were recorded under
    assert before["steady_state"] == "median of 16-token windows"
    monkeypatch.setattr(method, "STEADY_STATE_VERSION", 2)
    assert case.definition()["steady_state"] != before["steady_state"]


def test_an_unknown_timer_mode_is_refused():
    with pytest.raises(ValueError, match="mode"):
        method.gpu_timer_method(runner.GPU_RULE, mode="graphs", l2="x")
