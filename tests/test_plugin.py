"""The plugin end to end: a fake benchmark project (tests/conftest.py) run in a pytest subprocess with
`-p moebench.plugin`. Its cases return fixed samples from a control file and log every measure() call,
so each test below knows the exact numbers the gate sees and can count re-measurements.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from moebench.baselines.store import load_file
from conftest import table_rows

HW = "test-hw-x1"  # the --hardware-key FakeBench forces (tests/conftest.py)
TABLE = f"*moebench verdicts on {HW}*"
# In fnmatch_lines patterns "[" starts a character class, so case keys are written fake[[]a[]].


def test_update_writes_then_passes_then_one_case_regresses(fakebench):
    # 1. --baseline-update writes <dir>/<key>/<family>.json with the measured cases.
    first = fakebench.run("--baseline-update")
    first.assert_outcomes(passed=2, skipped=2, deselected=1)
    path = fakebench.family_file()
    doc = load_file(path, hardware_key=HW, family="gemm")
    assert sorted(doc["entries"]) == ["fake[a]", "fake[b]"]
    a = doc["entries"]["fake[a]"]["metrics"]
    assert list(a) == ["latency_us"], "the derived GB/s is informational and not stored"
    assert (a["latency_us"]["value"], a["latency_us"]["n"], a["latency_us"]["noise"]) == (100.0, 5, 0.014826)
    first.stdout.fnmatch_lines([f"moebench: updated {path} (2 changes)", "  + fake[[]a[]] (latency_us 100 us)"])

    # 2. The same numbers again, without update: everything passes, nothing is re-measured.
    second = fakebench.run()
    second.assert_outcomes(passed=2, skipped=2, deselected=1)
    assert fakebench.calls() == {"fake[a]": 1, "fake[b]": 1}
    table_rows(second).fnmatch_lines([TABLE, "PASS *fake[[]a[]]*latency_us*100 us*100 us*+0.0%*"])

    # 3. A reviewer's baseline 30% better than what the code now measures: only fake[a] fails, with one line.
    doc["entries"]["fake[a]"]["metrics"]["latency_us"]["value"] = 70.0
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    third = fakebench.run()
    assert third.ret == 1
    third.assert_outcomes(passed=1, failed=1, skipped=2, deselected=1)
    line = ("REGRESSION fake[a] latency_us: 100 us, baseline 70 us, delta +42.9%, tolerance 5.0%, noise 3.0%")
    assert line in third.outlines, "the failing test reports the one readable line"
    third.stdout.fnmatch_lines(["FAILED test_fake.py::test_fake[[]a[]] - Failed: REGRESSION fake[[]a[]]*"])
    assert not any("test_fake[b]" in l and "FAILED" in l for l in third.outlines)
    assert "Traceback" not in third.stdout.str()
    # The suspected regression was measured once more (and only that case).
    assert fakebench.calls() == {"fake[a]": 2, "fake[b]": 1}
    # The progress line was written live, not held back as captured output of the test.
    out = third.stdout.str()
    assert "[moebench] fake[a]: suspected regression, measuring once more" in out
    assert "Captured stdout call" not in out
    table_rows(third).fnmatch_lines([TABLE, "REGRESSION *fake[[]a[]]*latency_us*100 us*70 us*+42.9%*",
                                "PASS *fake[[]b[]]*", "1 REGRESSION, 1 PASS, 2 SKIP"])
    # Without --baseline-update the stored file is left alone.
    assert json.loads(path.read_text())["entries"]["fake[a]"]["metrics"]["latency_us"]["value"] == 70.0


def test_strict_fails_new_and_stale_and_only_them(fakebench):
    # fake[a]: stored under an older definition (STALE); fake[b]: no entry (NEW); fake[full]: matches (PASS).
    fakebench.write_baseline({"a": 100.0, "full": 50.0})
    fakebench.control["rev"] = {"fake[a]": 1}
    lenient = fakebench.run("-m", "gemm or full")
    lenient.assert_outcomes(passed=3, skipped=2)
    table_rows(lenient).fnmatch_lines([TABLE, "STALE *fake[[]a[]]*case definition changed*", "NEW *fake[[]b[]]*",
                                  "PASS *fake[[]full[]]*"])

    strict = fakebench.run("-m", "gemm or full", "--baseline-strict")
    assert strict.ret == 1
    strict.assert_outcomes(passed=1, failed=2, skipped=2)
    assert "STALE fake[a] latency_us: 100 us, baseline 100 us, delta +0.0%" in strict.stdout.str()
    assert "NEW fake[b] latency_us: 200 us, no baseline" in strict.outlines
    strict.stdout.fnmatch_lines(["FAILED *test_fake[[]a[]]*", "FAILED *test_fake[[]b[]]*"])


def test_env_mismatch_is_reported_and_never_fails(fakebench):
    # The file under this key says it was recorded on two H200s: its numbers are not compared here,
    # not even when they are 30% better and the run is strict.
    h200 = {"cpu": {"model": "x"}, "gpus": [{"name": "NVIDIA H200"}, {"name": "NVIDIA H200"}]}
    fakebench.write_baseline({"a": 70.0, "b": 140.0}, fingerprint=h200)
    r = fakebench.run("--baseline-strict")
    r.assert_outcomes(passed=2, skipped=2, deselected=1)
    table_rows(r).fnmatch_lines([TABLE, "ENV_MISMATCH *fake[[]a[]]*recorded on GPUs*", "2 ENV_MISMATCH, 2 SKIP"])
    assert fakebench.calls() == {"fake[a]": 1, "fake[b]": 1}


def test_propose_writes_elsewhere_and_leaves_the_baseline_dir_untouched(fakebench, tmp_path):
    path = fakebench.write_baseline({"a": 100.0, "z": 1.0})
    before = path.read_bytes()
    listing = sorted(os.listdir(path.parent))
    proposal = tmp_path / "proposal"
    r = fakebench.run("--baseline-propose", str(proposal))
    r.assert_outcomes(passed=2, skipped=2, deselected=1)
    proposed = fakebench.family_file(proposal)
    r.stdout.fnmatch_lines([f"moebench: proposed {proposed} (1 change)", "  + fake[[]b[]] (latency_us 200 us)"])
    assert path.read_bytes() == before
    assert sorted(os.listdir(path.parent)) == listing
    doc = load_file(proposed, hardware_key=HW, family="gemm")
    # The proposal is the whole file as it would be committed: the untouched entry is carried over.
    assert sorted(doc["entries"]) == ["fake[a]", "fake[b]", "fake[z]"]
    assert doc["entries"]["fake[z]"] == json.loads(before)["entries"]["fake[z]"]


def test_results_json_markdown_step_summary_and_table(fakebench, tmp_path):
    fakebench.write_baseline({"a": 100.0})
    results, summary, step = tmp_path / "out" / "results.json", tmp_path / "summary.md", tmp_path / "step.md"
    step.write_text("earlier step\n")
    r = fakebench.run("--results-json", str(results), "--summary-md", str(summary),
                      env={"GITHUB_STEP_SUMMARY": str(step)})
    r.assert_outcomes(passed=2, skipped=2, deselected=1)

    doc = json.loads(results.read_text())
    assert doc["hardware_key"] == HW
    assert doc["fingerprint"]["gpus"] == [] and "cpu" in doc["fingerprint"] and "versions" in doc["fingerprint"]
    cases = {c["key"]: c for c in doc["cases"]}
    assert sorted(cases) == ["fake[a]", "fake[b]"]
    for key, verdict, baseline, delta in [("fake[a]", "PASS", 100.0, 0.0), ("fake[b]", "NEW", None, None)]:
        c = cases[key]
        lat = c["metrics"]["latency_us"]
        assert (c["verdict"], lat["verdict"], lat["baseline"], lat["delta_pct"]) == (verdict, verdict, baseline, delta)
        assert lat["value"] == (100.0 if key == "fake[a]" else 200.0)
        assert lat["noise"] > 0 and lat["n"] == 5 and lat["rel_tol"] == 0.05 and lat["direction"] == "lower"
        assert c["samples"] == fakebench.control["samples"][key]
        assert c["metrics"]["busbw_GBps"]["gated"] is False
        assert c["family"] == "gemm" and c["nodeid"].startswith("test_fake.py::test_fake[")
        assert c["info"] == {"what ran": "fake"} and c["definition_hash"]
    assert cases["fake[a]"]["metrics"]["latency_us"]["noise_band"] == pytest.approx(2 * 0.014826)
    skipped = {row["nodeid"]: row for row in doc["not_measured"]}
    assert skipped["test_fake.py::test_needs_gpu"]["verdict"] == "SKIP"
    assert re.fullmatch(r"needs 2 CUDA GPUs, NVML sees \d+ visible here",
                        skipped["test_fake.py::test_needs_two_gpus"]["note"])

    md = summary.read_text()
    assert md.startswith(f"### moebench on {HW}\n\n1 NEW, 1 PASS, 2 SKIP\n\n| verdict | case | metric |")
    assert "| PASS | fake[a] | latency_us | 100 us | 100 us | +0.0% |" in md
    assert "| SKIP | test_fake.py::test_needs_gpu | - | - | - | - | needs 1 CUDA GPU, NVML sees" in md
    # $GITHUB_STEP_SUMMARY is appended to, never overwritten.
    assert step.read_text() == "earlier step\n" + md

    table_rows(r).fnmatch_lines([
        TABLE,
        "verdict*case*metric*value*baseline*delta*note",
        "NEW *fake[[]b[]]*latency_us*200 us*-*no baseline entry",
        "PASS *fake[[]a[]]*latency_us*100 us*100 us*+0.0%",
        "SKIP *test_fake.py::test_needs_gpu*needs 1 CUDA GPU, NVML sees * visible here",
        "SKIP *test_fake.py::test_needs_two_gpus*needs 2 CUDA GPUs, NVML sees * visible here",
        "1 NEW, 1 PASS, 2 SKIP",
        f"moebench: results written to {results}",
        f"moebench: summary written to {summary}",
        f"moebench: summary written to {step}",
    ])
    # `full` cases are outside the default selection: deselected, never measured, not in the table.
    assert "fake[full]" not in r.stdout.str() and "fake[full]" not in fakebench.calls()


def test_full_cases_run_when_the_expression_names_full(fakebench):
    r = fakebench.run("-m", "full")
    r.assert_outcomes(passed=1, deselected=4)
    assert fakebench.calls() == {"fake[full]": 1}
    # ...and `not full` keeps them out, like the default.
    r = fakebench.run("-m", "gemm and not full")
    r.assert_outcomes(passed=2, skipped=2, deselected=1)
    assert "fake[full]" not in fakebench.calls()


OTHER_HARDWARE_TESTS = '''
import pytest

from moebench.core.metrics import Metric


@pytest.mark.decode
def test_headline(moebench):
    # The users' 97 ms/token figure exists only for their 8-GPU box: this box skips, showing it.
    moebench.skip_other_hardware("decode[glm-5-nvfp4-tp8]", "decode", "needs 8 GPUs")


@pytest.mark.decode
def test_measured_here_too(moebench):
    moebench.record("decode[glm-5-nvfp4-tp8]", "decode", {}, lambda: {"itl_ms": Metric(150.0, "ms", "lower")})
'''


def test_external_baseline_of_other_hardware_shows_as_env_mismatch(fakebench):
    from moebench.baselines.store import dumps, new_document

    rtx = "nvidia-rtx-pro-6000-blackwell-server-edition-x8"
    doc = new_document(rtx, "decode", {"gpus": [{"name": "NVIDIA RTX PRO 6000 Blackwell Server Edition"}] * 8}, "d")
    doc["entries"]["decode[glm-5-nvfp4-tp8]"] = {
        "definition_hash": "0", "metrics": {"itl_ms": {"value": 97.0, "unit": "ms", "direction": "lower",
                                                       "rel_tol": 0.05, "noise": 0.0, "n": 1}},
        "provenance": {"kind": "external", "source": "user report: GLM-5-NVFP4, SGLang, TP8", "date": "d"}}
    (fakebench.baselines / rtx).mkdir(parents=True)
    (fakebench.baselines / rtx / "decode.json").write_text(dumps(doc))
    fakebench.pytester.makepyfile(test_other=OTHER_HARDWARE_TESTS)
    r = fakebench.run("test_other.py")
    # 150 ms against 97 ms would be a regression; on other hardware it is never compared.
    r.assert_outcomes(passed=1, skipped=1)
    table_rows(r).fnmatch_lines([
        TABLE,  # rows in the gate's severity order (compare.DISPLAY_ORDER): not compared before new
        f"ENV_MISMATCH *decode[[]glm-5-nvfp4-tp8[]]*itl_ms*-*97 ms*baseline for {rtx}: needs 8 GPUs",
        f"NEW *decode[[]glm-5-nvfp4-tp8[]]*itl_ms*150 ms*baseline exists only for {rtx} (not compared)",
        "1 ENV_MISMATCH, 1 NEW",
    ])


def test_pytest_help_lists_every_option_of_the_plugin_and_its_families():
    # argparse formats each help text with %: one bare "1%" made `pytest --help` a traceback (README
    # tells users to run it to see the options)
    r = subprocess.run([sys.executable, "-m", "pytest", "--help"], cwd=Path(__file__).resolve().parents[1],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    text = " ".join(r.stdout.split())  # argparse wraps the help lines
    assert "--baseline-update" in text and "--counters" in text and "gate at 1% (docs/counters.md)" in text
