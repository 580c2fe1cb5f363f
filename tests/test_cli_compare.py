"""`moebench compare` on recorded results files (tests/data, real runs of benchmarks/test_selfcheck.py).

The slower run is derived here, in the test, from a recorded file: never hand-edited measured values.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from moebench.cli.main import main

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
H200 = DATA / "selfcheck-h200-1.json"   # recorded on one H200 (ci/nightly.sh --gpu --job selfcheck)
CPU = DATA / "selfcheck-cpu-1.json"     # recorded on this project's shared 2-core CPU box
COPY_KEY = "selfcheck[copy-1024MiB-cuda]"


def slower(doc: dict, key: str, factor: float = 1.10) -> dict:
    """A copy of a results document where case `key` takes `factor` times as long: times grow, rates
    (higher-is-better metrics) shrink; its noise and everything else stay as recorded."""
    out = copy.deepcopy(doc)
    case = next(c for c in out["cases"] if c["key"] == key)
    for m in case["metrics"].values():
        m["value"] = m["value"] * factor if m["direction"] == "lower" else m["value"] / factor
    case["samples"] = [s * factor if case["metrics"][case["primary"]]["direction"] == "lower" else s / factor
                       for s in case.get("samples", [])]
    return out


def write(tmp_path: Path, name: str, doc: dict) -> str:
    p = tmp_path / name
    p.write_text(json.dumps(doc), encoding="utf-8")
    return str(p)


def rows(out: str) -> dict[str, str]:
    """case key -> verdict, from the compare table."""
    found = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2 and "[" in parts[1]:
            found[parts[1]] = parts[0]
    return found


def test_equal_runs_pass_and_exit_0(capsys):
    assert main(["compare", str(H200), str(H200)]) == 0
    out = capsys.readouterr().out
    verdicts = rows(out)
    assert verdicts and set(verdicts.values()) == {"PASS"}
    assert out.rstrip().endswith(f"{len(verdicts)} PASS")


def test_ten_percent_slower_case_is_the_one_regression(tmp_path, capsys):
    doc = json.loads(H200.read_text())
    b = write(tmp_path, "slower.json", slower(doc, COPY_KEY))
    assert main(["compare", str(H200), b]) == 1
    out = capsys.readouterr().out
    verdicts = rows(out)
    assert verdicts[COPY_KEY] == "REGRESSION"
    assert [k for k, v in verdicts.items() if v != "PASS"] == [COPY_KEY]
    line = next(line for line in out.splitlines() if line.startswith("REGRESSION"))
    assert "-9.1%" in line and "5.0%" in line  # GB/s falls by 1 - 1/1.1; the tolerance is the stored 5%


def test_two_recorded_runs_of_the_same_code_pass():
    # The second H200 run of the same commit: within tolerance and noise.
    assert main(["compare", str(H200), str(DATA / "selfcheck-h200-2.json")]) == 0


def test_noisy_cpu_run_flags_the_case_as_ambiguous_not_regression(tmp_path, capsys):
    # On the shared 2-core box the copy's recorded noise is about 10%: a 10% step is inside twice the
    # noise, so the gate's own verdict is AMBIGUOUS. It is flagged; it fails only when asked to.
    doc = json.loads(CPU.read_text())
    key = "selfcheck[copy-64MiB-cpu]"
    assert next(c for c in doc["cases"] if c["key"] == key)["metrics"]["copy_GBps"]["noise"] > 0.05
    b = write(tmp_path, "slower.json", slower(doc, key))
    assert main(["compare", str(CPU), b]) == 0
    verdicts = rows(capsys.readouterr().out)
    assert [k for k, v in verdicts.items() if v != "PASS"] == [key] and verdicts[key] == "AMBIGUOUS"
    assert main(["compare", str(CPU), b, "--fail-on", "REGRESSION", "AMBIGUOUS"]) == 1


def test_missing_new_and_other_hardware(tmp_path, capsys):
    doc = json.loads(H200.read_text())
    fewer = copy.deepcopy(doc)
    fewer["cases"] = [c for c in fewer["cases"] if c["key"] != COPY_KEY]
    b = write(tmp_path, "fewer.json", fewer)
    assert main(["compare", str(H200), b]) == 0
    assert rows(capsys.readouterr().out)[COPY_KEY] == "MISSING"
    assert main(["compare", b, str(H200)]) == 0
    assert rows(capsys.readouterr().out)[COPY_KEY] == "NEW"
    assert main(["compare", str(H200), str(H200), "--fail-on", "MISSING"]) == 0

    other = copy.deepcopy(doc)
    other["hardware_key"] = "nvidia-rtx-pro-6000-x8"
    o = write(tmp_path, "other.json", slower(other, COPY_KEY))
    assert main(["compare", str(H200), o]) == 0
    assert rows(capsys.readouterr().out)[COPY_KEY] == "ENV_MISMATCH"
    assert main(["compare", str(H200), o, "--ignore-hardware"]) == 1


def test_case_selection(tmp_path, capsys):
    b = write(tmp_path, "slower.json", slower(json.loads(H200.read_text()), COPY_KEY))
    assert main(["compare", str(H200), b, "--case", "selfcheck[aa-*"]) == 0
    assert list(rows(capsys.readouterr().out)) == ["selfcheck[aa-copy-1024MiB-cuda]"]


@pytest.mark.parametrize("content, expect", [
    ("{not json", "line 1 column 2: invalid JSON"),
    ('{"cases": []}', "hardware_key: missing"),
    ('{"hardware_key": "x", "started": "last night", "cases": []}', "started: must be an ISO date"),
    ('{"hardware_key": "x", "started": "2026-01-01T00:00:00Z", "cases": [{"key": "k", "verdict": "PASS", '
     '"metrics": {"t": {"value": "fast", "unit": "us", "direction": "lower"}}}]}',
     "cases['k'].metrics.t.value: must be a number"),
    ('{"hardware_key": "x", "started": "2026-01-01T00:00:00Z", "cases": [{"key": "k", "verdict": "PASS", '
     '"metrics": {"t": {"value": 1, "unit": "us", "direction": "down"}}}]}',
     "cases['k'].metrics.t.direction: must be 'lower' or 'higher'"),
])
def test_malformed_file_is_one_line_exit_2(tmp_path, capsys, content, expect):
    bad = tmp_path / "bad.json"
    bad.write_text(content, encoding="utf-8")
    assert main(["compare", str(H200), str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(bad) in err and expect in err, err


def test_process_level_exit_codes_and_no_traceback(tmp_path):
    """Through the interpreter, as the console script runs it: exit codes and stderr."""
    def run(*args):
        return subprocess.run([sys.executable, "-m", "moebench", *args], capture_output=True, text=True,
                              cwd=REPO, env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"}, timeout=60)

    r = run("compare", str(H200), str(tmp_path / "nope.json"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip() == f"moebench compare: error: {tmp_path / 'nope.json'}: no such file"
    r = run("compare", "--fail-on", "SLOWER", str(H200), str(H200))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--fail-on" in r.stderr
    r = run("compare", str(H200), str(H200), "--case", "selfcheck[nope]")
    assert r.returncode == 2 and "--case 'selfcheck[nope]': no such case" in r.stderr
    r = run("frobnicate")
    assert r.returncode == 2 and "invalid choice: 'frobnicate'" in r.stderr
    r = run("--help")
    assert r.returncode == 0 and all(c in r.stdout for c in ("compare", "backends", "baselines", "report"))


def test_the_console_script_names_the_command_line_main():
    # pyproject's [project.scripts] target must import and be callable: a folder move once left it pointing
    # at a package without `main` (pip installs it without complaint; the command then fails at start)
    import importlib
    import tomllib

    target = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]["moebench"]
    module, _, func = target.partition(":")
    assert getattr(importlib.import_module(module), func) is main


def test_case_patterns_treat_brackets_literally():
    from moebench.cli.common import glob_match

    assert glob_match("gemm[tiny-tp8-gemm1-m4-bf16-decode-triton]", "gemm[tiny-tp8-gemm1-m4-*]")
    assert glob_match("selfcheck[copy-64MiB-cpu]", "selfcheck[*]")
    assert not glob_match("gemm[t]", "gemm[abc]")  # not a character class
    assert glob_match("gemm[x-m1-triton]", "*-triton]") and glob_match("gemm[x-m1]", "gemm[x-m?]")


def test_a_throttled_candidate_is_ambiguous_not_a_regression(tmp_path, capsys):
    # The gate never calls a throttled measurement PASS or REGRESSION; `moebench compare` must carry the
    # candidate case's recorded `throttled` flag to the same verdict function.
    doc = slower(json.loads(H200.read_text()), COPY_KEY)
    next(c for c in doc["cases"] if c["key"] == COPY_KEY)["throttled"] = True
    b = write(tmp_path, "throttled.json", doc)
    assert main(["compare", str(H200), b]) == 0
    verdicts = rows(capsys.readouterr().out)
    assert verdicts[COPY_KEY] == "AMBIGUOUS"
    assert [k for k, v in verdicts.items() if v != "PASS"] == [COPY_KEY]
