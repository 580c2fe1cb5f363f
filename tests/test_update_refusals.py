"""A `--baseline-update` that cannot write what it measured fails, and says what to do; one bad entry no
longer blocks the good ones; a spread too wide to gate is recorded as not gating (AMBIGUOUS, with the
reason). Through a pytest run of the fake project (tests/conftest.py) and on the writer directly.
"""

from __future__ import annotations

import pytest

from moebench.baselines.record import prepare_entry
from moebench.baselines.store import load_file, merge_entries
from moebench.cli.main import main

WIDE = [100.0, 190.0, 40.0, 260.0, 20.0, 100.0, 170.0]  # a loaded 2-core box: noise ~ 1.04


def test_an_update_that_refuses_an_entry_writes_the_others_names_it_and_fails(fakebench):
    # A value the schema refuses (a time <= 0) used to block the whole file, and pytest exited 0 under "passed".
    fakebench.control["samples"]["fake[a]"] = [-5.0, -5.0, -5.0]
    r = fakebench.run("--baseline-update")
    text = r.stdout.str()
    assert r.ret == pytest.ExitCode.TESTS_FAILED, text
    doc = load_file(fakebench.family_file())
    assert sorted(doc["entries"]) == ["fake[b]"], "the good entry is written"
    assert any(line.startswith("moebench: fake[a]: baseline NOT written: ") and "latency_us.value" in line
               for line in r.outlines), text
    assert "moebench: 1 entry NOT written (fake[a]): fix what the line names, or measure again" in text


def test_a_noise_too_wide_to_gate_is_stored_as_not_gating_and_always_reads_ambiguous(fakebench):
    fakebench.control["samples"]["fake[a]"] = WIDE
    r = fakebench.run("--baseline-update")
    assert r.ret == pytest.ExitCode.OK, r.stdout.str()
    stored = load_file(fakebench.family_file())["entries"]["fake[a]"]["metrics"]["latency_us"]
    assert stored["gate"] == "none" and stored["noise"] > 0.5
    assert any("fake[a] latency_us: noise" in line and "stored as not gating" in line and "moebench aa --runs 3" in line
               for line in r.outlines), r.stdout.str()
    # ten times slower: never PASS nor REGRESSION against a baseline that cannot gate, and the row says why
    fakebench.control["samples"]["fake[a]"] = [1000.0] * 5
    r = fakebench.run("--baseline-strict")
    assert r.ret == pytest.ExitCode.OK, r.stdout.str()
    assert any(line.startswith("AMBIGUOUS") and "fake[a]" in line for line in r.outlines), r.stdout.str()
    assert "noise was too wide to gate" in r.stdout.str()


def test_a_cliff_metric_is_stored_as_the_gate_applies_it(tmp_path, capsys):
    # TTFT entries read rel_tol 0.6 while the gate applied a doubling; an update over one now says 1.0.
    m = {"value": 96.9, "unit": "ms", "direction": "lower", "rel_tol": 0.2, "noise": 0.05, "n": 3, "gate": "cliff"}
    entry = {"definition_hash": "h", "metrics": {"ttft_ms": m},
             "provenance": {"kind": "measured", "commit": "c", "date": "d", "versions": {}}}
    stored = {**entry, "metrics": {"ttft_ms": {**m, "rel_tol": 0.6}}}
    out, _ = prepare_entry("decode[x]", entry, stored)
    assert out["metrics"]["ttft_ms"]["rel_tol"] == 1.0 and out["metrics"]["ttft_ms"]["gate"] == "cliff"
    doc, _ = merge_entries(None, "hw-x1", "decode", {}, "now", {"decode[x]": entry})
    path = tmp_path / "hw-x1" / "decode.json"
    path.parent.mkdir()
    from moebench.baselines.store import dumps
    path.write_text(dumps(doc))
    assert main(["baselines", "show", str(path)]) == 0
    assert "cliff (fails at 2x)" in capsys.readouterr().out


THREE = ["gpu-a", "gpu-b", "gpu-c"]


@pytest.mark.parametrize("between, machines, stored, kind, expected", [
    (0.004, THREE, None, "device_kernel", 0.03),        # kernel time, 3 machines within 1%: 3%
    (0.004, THREE[:2], None, "device_kernel", 0.05),    # 2 machines are too few (0.0% by chance in session 14)
    (0.004, THREE, dict(rel_tol=0.05), "device_kernel", 0.03),  # over the case's own stored 5%: tightened
    (0.004, THREE, dict(rel_tol=0.25), "device_kernel", 0.25),  # a reviewer's wider one is kept (and said)
    (0.015, THREE, None, "device_kernel", 0.05),        # machines 1.5% apart: the case's own
    (0.004, THREE, None, "host_bound", 0.05),           # not a kernel time: the case's own
    (0.004, THREE, "own 0.25", "device_kernel", 0.25),  # a case's own wider tolerance (a known cause) stays
    (None, THREE[:1], dict(rel_tol=0.03), "device_kernel", 0.03),  # a reviewer's tighter one is never loosened
    # the rule's own 3%, from machines a new one disagrees with: the rule sets it again
    (0.02, THREE, dict(rel_tol=0.03, tol_rule="tight"), "device_kernel", 0.05),
])
def test_a_kernel_time_whose_machines_agree_within_1pct_gates_at_3pct(between, machines, stored, kind, expected):
    m = {"value": 24.3, "unit": "us", "direction": "lower", "rel_tol": 0.05, "noise": 0.003, "n": 40, "kind": kind,
         **({"noise_machines": between} if between is not None else {})}
    if stored == "own 0.25":
        m["rel_tol"], stored = 0.25, dict(rel_tol=0.25)
    old = {"metrics": {"graph_us": {**m, **stored}}} if stored is not None else None
    out, _ = prepare_entry("gemm[x]", {"metrics": {"graph_us": m}, "machines": machines}, old)
    assert out["metrics"]["graph_us"]["rel_tol"] == expected
    assert ("tol_rule" in out["metrics"]["graph_us"]) == (expected == 0.03 and between is not None)


@pytest.mark.parametrize("own, expected", [
    (THREE[:2], 0.05),  # a kernel time recorded on two of the entry's four machines: too few for the rule
    (THREE, 0.03),      # on three of them: the rule's 3%
    (None, 0.03),       # naming none: the entry's four
])
def test_the_tight_rule_counts_the_machines_of_the_metric_not_of_its_entry(own, expected):
    m = {"value": 24.3, "unit": "us", "direction": "lower", "rel_tol": 0.05, "noise": 0.003, "n": 40,
         "kind": "device_kernel", "noise_machines": 0.004, **({"machines": own} if own else {})}
    out, _ = prepare_entry("gemm[x]", {"metrics": {"graph_us": m}, "machines": THREE + ["gpu-d"]}, None)
    assert out["metrics"]["graph_us"]["rel_tol"] == expected


def test_the_report_page_says_what_was_not_written():
    # ci/nightly.sh passes the plugin's "NOT written" / "not gating" lines with --note; the page shows them
    from moebench.outputs.report_page import Page, index_html, index_markdown

    page = Page("t", "latest run: 1 PASS", [], None, [], notes=("moebench: fake[a]: baseline NOT written: x",))
    assert "moebench: fake[a]: baseline NOT written: x" in index_html(page)
    assert "moebench: fake[a]: baseline NOT written: x" in index_markdown(page)
