"""--baseline-strict over stored entries the run selected but did not measure, on the real decode family
(benchmarks/test_decode.py, a scenario file of our own): an `only_on` line that leaves this machine out
and a scenario removed from the file both fail the strict run, naming the entry; an entry of a case the
-m expression did not select does not. Plus the pure part (moebench.suite.unmeasured.gone).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from moebench.baselines.store import dumps, new_document
from moebench.decode.scenarios import cases_of, load_scenarios
from moebench.suite.unmeasured import gone

REPO = Path(__file__).resolve().parents[1]
HW = "test-hw-x1"
H200 = '"fingerprint": {"gpus": [{"name": "NVIDIA H200"}]}'

# "skipped": a CPU scenario that a new `only_on` line moved off this machine (selected by -m tiny, skips);
# "narrower": not `tiny`, so `-m "decode and tiny"` does not select it. Neither starts an engine here.
SCENARIOS = """
[[scenario]]
name = "{name}"
engine = "vllm"
model = "tiny"
model_label = "tiny-{name}"
device = "cpu"
moe_backend = "auto"
tiny = {tiny}
only_on = ["somewhere-else-x1"]
"""

def _entry(value: float) -> dict:
    return {"definition_hash": "0123456789abcdef",
            "metrics": {"ms_per_token": {"value": value, "unit": "ms", "direction": "lower", "rel_tol": 0.1,
                                         "noise": 0.01, "n": 2}},
            "provenance": {"kind": "measured", "commit": "c0ffee", "date": "2026-01-01T00:00:00Z", "versions": {}}}


def _project(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    toml = tmp_path / "scenarios.toml"
    toml.write_text(SCENARIOS.format(name="skipped", tiny="true") + SCENARIOS.format(name="narrower", tiny="false"))
    keys = {c.scenario.name: c.key for c in cases_of(load_scenarios(toml))}
    keys["removed"] = keys["skipped"].replace("tiny-skipped", "tiny-removed")  # a scenario since deleted from the file
    assert keys["removed"] != keys["skipped"]
    doc = new_document(HW, "decode", {}, "2026-01-01T00:00:00Z")
    doc["entries"] = {k: _entry(2.0) for k in keys.values()}
    path = tmp_path / "b" / HW / "decode.json"
    path.parent.mkdir(parents=True)
    path.write_text(dumps(doc))
    return toml, keys


def _run(tmp_path: Path, toml: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run([sys.executable, "-m", "pytest", str(REPO / "benchmarks" / "test_decode.py"),
                           "-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:anyio",
                           "--decode-scenarios", str(toml), "--baseline-dir", str(tmp_path / "b"),
                           "--hardware-key", HW, "-m", "decode and tiny", "-rfEs", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=120, env=env)


def test_strict_fails_a_stored_case_that_skipped_or_no_longer_exists_and_only_those(tmp_path):
    toml, keys = _project(tmp_path)
    lenient = _run(tmp_path, toml)
    assert lenient.returncode == 0, lenient.stdout + lenient.stderr  # as before: a SKIP, not a failure

    strict = _run(tmp_path, toml, "--baseline-strict", "--results-json", str(tmp_path / "r.json"))
    out = strict.stdout + strict.stderr
    assert strict.returncode == 1, out
    where = tmp_path / "b" / HW / "decode.json"
    assert (f"--baseline-strict: {keys['skipped']} has a baseline in {where} but did not run (runs only on "
            f"somewhere-else-x1; this is {HW}); remove the entry to stop gating it") in out
    assert (f"moebench: MISSING {keys['removed']}: --baseline-strict: stored in {where}, but decode has no such "
            "case any more (remove the entry, or restore the case)") in out
    assert keys["narrower"] not in out, "an entry of a case -m did not select is not this run's to gate"
    rows = json.loads((tmp_path / "r.json").read_text())["not_measured"]
    assert {r["key"]: r["verdict"] for r in rows if r["verdict"] == "MISSING"} == {keys["removed"]: "MISSING"}

    # Entries recorded on an H200, run here under its key: the skipped case would never have been compared
    # (ENV_MISMATCH), so only the case that no longer exists fails.
    (tmp_path / "b" / HW / "decode.json").write_text(where.read_text().replace('"fingerprint": {}', H200))
    elsewhere = _run(tmp_path, toml, "--baseline-strict")
    out = elsewhere.stdout + elsewhere.stderr
    assert elsewhere.returncode == 1 and f"MISSING {keys['removed']}" in out, out
    assert "did not run" not in out, out


def test_gone_names_only_entries_of_declared_families_without_their_case():
    stored = {"decode": ["decode[a]", "decode[b]"], "gemm": ["gemm[x]"]}
    assert gone(stored, {"decode": {"decode[a]"}}) == [("decode", "decode[b]")]
    assert gone(stored, {"decode": {"decode[a]", "decode[b]"}, "gemm": {"gemm[x]"}}) == []
    assert gone(stored, {}) == [], "a family that declared nothing (not collected) judges nothing"
