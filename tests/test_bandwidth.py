"""The memory ceilings (moebench.core.bandwidth): what each counts as moved, and which one the floors of
read-dominated work divide by. CPU only; the gemm case runs through the plugin with the ceilings faked."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

pytest.importorskip("torch")

from moebench.core import bandwidth  # noqa: E402
from moebench.core.timing import StopRule  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
THREE = StopRule(min_samples=3, max_samples=3)


def test_a_read_counts_its_bytes_once_and_a_copy_twice():
    """read: N bytes read (one number written); copy: N read + N written. Each rate is the bytes it moved
    over the median sample."""
    n = 1 << 22
    read, rs = bandwidth.read_bandwidth(n, device="cpu", rule=THREE)
    copy, cs = bandwidth.copy_bandwidth(n, device="cpu", rule=THREE)
    assert len(rs) == len(cs) == 3
    assert read == pytest.approx(n / statistics.median(rs))
    assert copy == pytest.approx(2 * n / statistics.median(cs))


def test_ceiling_kinds_and_how_a_session_files_them():
    """The copy ceiling keeps the device's own name in results (as before the read ceiling existed);
    an unknown kind is refused by name."""
    assert bandwidth.session_key("cuda") == "cuda" and bandwidth.session_key("cuda", "read") == "cuda-read"
    with pytest.raises(ValueError, match="unknown ceiling kind 'write'"):
        bandwidth.measure_ceiling("cpu", "write")


def test_a_read_that_does_not_sum_its_input_is_refused(monkeypatch):
    """The reduction is checked before it is timed: a wrong sum (zeros read, a skipped block) never
    becomes a fast ceiling."""
    import torch

    monkeypatch.setattr(torch.Tensor, "sum", lambda self, *a, **k: torch.zeros(()))
    with pytest.raises(RuntimeError, match="the reduction is wrong"):
        bandwidth.read_bandwidth(1 << 20, device="cpu", rule=THREE)


# Faked ceilings for the end-to-end run: copy and read differ, so a floor shows which one it used.
FAKE_CEILINGS = '''
from moebench.core import bandwidth

bandwidth.measure_ceiling = lambda device, kind="copy": {"copy": 1e9, "read": 4e9}[kind]
'''


def test_gemm_floor_divides_by_the_read_ceiling(fakebench, tmp_path):
    """Through benchmarks/test_gemm.py and the plugin: the expert GEMMs' floor is bytes over the read
    ceiling (the copy ceiling made Kimi bf16 M = 16 read 103.5% of its floor on an H200), and the
    session files it as cpu-read."""
    fakebench.pytester.makepyfile(test_gemm=(REPO / "benchmarks" / "test_gemm.py").read_text(),
                                  conftest=FAKE_CEILINGS)
    out = tmp_path / "results.json"
    r = fakebench.run("test_gemm.py", "-k", "tiny-tp8-fused-m1-bf16-decode-torch_bmm", "--results-json", str(out))
    r.assert_outcomes(passed=1)
    doc = json.loads(out.read_text())
    assert doc["memory_ceiling_bytes_per_s"] == {"cpu-read": 4e9}
    (case,) = doc["cases"]
    assert case["info"]["ceiling_GBps"] == 4.0
    assert case["metrics"]["floor_us"]["value"] == pytest.approx(case["info"]["bytes_per_call"] / 4e9 * 1e6)


def test_decode_floor_divides_by_the_read_ceiling():
    """A decode step reads its weights (and KV cache): the step's floor and each category's share of it
    divide by the read ceiling, and the floor's record says which ceiling it used."""
    from moebench.decode.runner import floor_metrics
    from moebench.decode.scenarios import DecodeCase, load_scenarios
    from moebench.core.metrics import Metric

    [s] = [x for x in load_scenarios(REPO / "benchmarks" / "decode_scenarios.toml") if x.name == "kimi-k2.5-shard"]
    asked = []

    def ceiling(device, kind="copy"):
        asked.append(kind)
        return {"copy": 1e12, "read": 4e12}[kind]

    info: dict = {}
    metrics = {"ms_per_token": Metric(10.0, "ms", "lower"), "step_routed_experts_ms": Metric(1.0, "ms", "lower")}
    out = floor_metrics(DecodeCase(s, "vllm-server"), metrics, ceiling, info)
    assert asked == ["read"] and info["floor"]["ceiling"] == "read" and info["floor"]["ceiling_GBps"] == 4000.0
    assert out["floor_ms_per_token"].value == pytest.approx(1e3 * info["floor"]["weight_bytes_per_token"] / 4e12,
                                                            rel=1e-6)
    assert out["pct_of_floor_routed_experts"].value == pytest.approx(
        100 * 1e3 * info["floor"]["routed_experts"] / 4e12 / 1.0, rel=1e-3)


def test_selfcheck_reports_both_ceilings(fakebench, tmp_path):
    """The selfcheck's copy case reports the session's copy and read ceilings side by side (informational:
    its gated copy_GBps and definition stay as the committed baselines have them)."""
    fast_copy = "\nfrom moebench.selfcheck import CopyWork\n\nCopyWork.time = lambda self, rule, mode='graph': [0.01] * 20\n"
    fakebench.pytester.makepyfile(test_selfcheck=(REPO / "benchmarks" / "test_selfcheck.py").read_text(),
                                  conftest=FAKE_CEILINGS + fast_copy)
    out = tmp_path / "results.json"
    r = fakebench.run("test_selfcheck.py", "-k", "test_copy_bandwidth", "--results-json", str(out))
    r.assert_outcomes(passed=1, deselected=3)
    (case,) = json.loads(out.read_text())["cases"]
    metrics = case["metrics"]
    assert metrics["session_copy_ceiling_GBps"]["value"] == 1.0 and metrics["session_read_ceiling_GBps"]["value"] == 4.0
    assert [name for name, m in metrics.items() if m["gated"]] == ["copy_GBps"]
