"""Usage errors of a run's selection: a broken decode scenario file is one line naming file, scenario and
field (exit 4, like the plugin's other usage errors) that stops only a run that can select a decode case;
`-m "gpus(2)"` says to write gpus(n=2). These used to be a collection ERROR with a traceback (exit 2)
that stopped every family, and pytest's "not a valid python identifier 2"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from moebench.suite import selection
from moebench.decode.scenarios import ScenarioError, load_scenarios

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "benchmarks" / "decode_scenarios.toml"


def _broken(tmp_path: Path, old: str, new: str) -> Path:
    """The shipped scenario file with its first `old` line replaced by `new`."""
    text = SHIPPED.read_text(encoding="utf-8")
    assert old in text
    path = tmp_path / "decode_scenarios.toml"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return path


def _collect(*args: str) -> subprocess.CompletedProcess:
    # The decode and selfcheck modules only: the gemm family's thousand cases add seconds, not coverage.
    return subprocess.run([sys.executable, "-m", "pytest", "benchmarks/test_decode.py", "benchmarks/test_selfcheck.py",
                           "--collect-only", "-q", *args], cwd=REPO, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("old, new, message", [
    ("trials = 2\n", 'trials = "two"\n', ": scenario 'tiny-cpu': trials: must be an integer >= 1, got 'two'"),
    ("trials = 2\n", "trials = two\n", ": scenario 'tiny-cpu': trials: invalid TOML: Invalid value (at line "),
], ids=["bad-value", "bad-toml"])
def test_a_broken_scenario_file_is_one_usage_line_and_only_stops_decode(tmp_path, old, new, message):
    path = _broken(tmp_path, old, new)
    r = _collect("-m", "decode and tiny", "--decode-scenarios", str(path))
    out = r.stdout + r.stderr
    assert r.returncode == 4, out
    [line] = [ln for ln in out.splitlines() if ln.startswith("ERROR")]
    assert line.startswith(f"ERROR: {path}{message}"), line
    assert "Traceback" not in out and "pytest_generate_tests" not in out, out
    # A run that cannot select a decode case runs as if the file were fine.
    r = _collect("-m", "selfcheck", "--decode-scenarios", str(path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "benchmarks/test_selfcheck.py::test_copy_bandwidth" in r.stdout and "ERROR" not in r.stdout + r.stderr


def test_a_positional_gpus_argument_says_to_write_n():
    r = _collect("-m", "allreduce and gpus(2)")
    out = r.stdout + r.stderr
    assert r.returncode == 4, out
    assert "ERROR: -m 'allreduce and gpus(2)': write gpus(n=2), not gpus(2)" in out, out
    assert "not a valid python identifier" not in out


@pytest.mark.parametrize("expr, selects", [
    ("", True), ("decode", True), ("decode and tiny", True), ("not gemm", True), ("triton", True),
    ("gpus(n=2) and not gpus(n=4)", True), ("(decode or gemm) and not tiny", True),
    ("selfcheck", False), ("gemm and triton", False), ("not decode", False), ("decode and allreduce", False),
    ("allreduce and gpus(n=2)", False), ("tiny and not tiny", False),
])
def test_which_expressions_can_select_a_decode_case(expr, selects):
    assert selection.can_select(expr, "decode") is selects


def test_a_toml_error_names_the_scenario_by_position_when_it_has_no_name_yet(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[[scenario]]\nname = "a"\nengine = "vllm"\n\n[[scenario]]\nengine = "vllm"\nmodel = tiny\n')
    with pytest.raises(ScenarioError) as e:
        load_scenarios(path)
    assert str(e.value).startswith(f"{path}: scenario #2: model: invalid TOML: Invalid value (at line 7")
