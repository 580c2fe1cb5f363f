"""The GEMM runner: correct first (a wrong or unwritten output fails the case before anything is timed),
then the gate settings of the times it reports. CPU only: fake backends on the tiny preset, fake timers."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from conftest import table_rows

pytest.importorskip("torch")

import torch  # noqa: E402

from moebench.gemm import runner  # noqa: E402
from moebench.gemm.backends.base import Built  # noqa: E402
from moebench.gemm.cases import GemmCase  # noqa: E402
from moebench.gemm.workload import Workload  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_wl():
    return Workload(GemmCase("tiny", 8, "fused", 1, "bf16", "decode", "-"), "cpu", rotations=2)


def fake_backend(wl, write) -> Built:
    """A backend over preallocated outputs whose kernel is write(out, r). The outputs start out holding
    the right answers, as if an earlier correct call had left them there."""
    outs = [wl.reference(r).to(torch.bfloat16) for r in range(wl.R)]
    return Built([lambda r=r: (write(outs[r], r), outs[r])[1] for r in range(wl.R)], outs)


def off_by(wl, rel: float):
    """A kernel whose output is the reference scaled by (1 + rel): relative error rel (plus bf16 rounding)."""
    return lambda out, r: out.copy_(wl.reference(r) * (1 + rel))


# --- correct first ---------------------------------------------------------------------------------

def test_every_dtypes_default_bound_is_far_below_what_garbage_reads():
    """A garbage output reads a relative error of ~1; the loosest default (fp8's 1e-1) is ten times below."""
    assert max(runner.ERROR_BOUND.values()) <= 1e-1


@pytest.mark.parametrize("bound, limit", [(None, 1e-2), (0.1, 0.1)], ids=["dtype-default", "backend-override"])
def test_check_holds_the_output_to_its_relative_error_bound(tiny_wl, bound, limit):
    """The bound is the backend's override, else the dtype's (1e-2 for bf16, design.md): an output off by
    half the bound passes and reports that error; one off by twice the bound fails, naming the error."""
    checked = runner.check(fake_backend(tiny_wl, off_by(tiny_wl, limit / 2)), tiny_wl, bound)
    assert checked["bound"] == limit
    assert checked["rel_error"] == pytest.approx(limit / 2, rel=0.2)
    with pytest.raises(AssertionError, match="relative error .* >= bound"):
        runner.check(fake_backend(tiny_wl, off_by(tiny_wl, 2 * limit)), tiny_wl, bound)


@pytest.mark.parametrize("rows", [slice(0, 0), slice(0, 1)], ids=["writes-nothing", "writes-part"])
def test_check_fails_an_output_the_kernel_did_not_write(rows):
    """The outputs are poisoned with NaN before each checked call, so a kernel that writes nothing, or only
    some rows, fails even where the buffer still holds the right answer from an earlier call."""
    wl = Workload(GemmCase("tiny", 8, "fused", 2, "bf16", "decode", "-"), "cpu", rotations=2)
    partial = fake_backend(wl, lambda out, r: out[rows].copy_(wl.reference(r)[rows]))
    with pytest.raises(AssertionError, match="NaN"):
        runner.check(partial, wl)


# A plugin for the end-to-end run below: torch_loop with its output scaled by 1.05 (5% off, five times
# bf16's bound), and a record of every runner.measure call (the timing).
WRONG_BACKEND = '''
import dataclasses
import pathlib

from moebench.gemm import runner
from moebench.gemm.backends import BACKENDS

real = BACKENDS["torch_loop"]


def build(case, wl):
    built = real.build(case, wl)
    built.calls = [lambda c=c: c().mul_(1.05) for c in built.calls]
    return built


BACKENDS["torch_loop"] = dataclasses.replace(real, build=build)
real_measure = runner.measure


def measure(*args, **kwargs):
    pathlib.Path("timed.txt").write_text("runner.measure ran")
    return real_measure(*args, **kwargs)


runner.measure = measure
'''


def test_a_wrong_backend_fails_its_case_before_anything_is_timed(fakebench):
    """Through benchmarks/test_gemm.py and the plugin: a backend 5% off fails its case on the check's
    line, and runner.measure never runs (no number is recorded for a wrong kernel)."""
    fakebench.pytester.makepyfile(test_gemm=(REPO / "benchmarks" / "test_gemm.py").read_text(),
                                  conftest=WRONG_BACKEND)
    r = fakebench.run("test_gemm.py", "-k", "tiny-tp8-fused-m1-bf16-decode-torch_loop")
    r.assert_outcomes(failed=1)
    table_rows(r).fnmatch_lines(["FAIL *test_gemm[[]tiny-tp8-fused-m1-bf16-decode-torch_loop[]]*"
                            "rotation 0: relative error 5.*e-02 >= bound 1e-02"])
    assert not (fakebench.path / "timed.txt").exists(), "a wrong kernel was timed"


def test_a_case_is_checked_against_its_backends_own_error_bound(monkeypatch):
    """benchmarks/test_gemm.py hands the backend's error_bounds to the check (the GPU backends whose
    arithmetic is coarser than their dtype's, as Marlin's int4): torch_loop 5% off, with a 10% bound of
    its own, passes its check and is recorded."""
    import dataclasses
    import importlib.util

    from moebench.gemm.backends import BACKENDS

    spec = importlib.util.spec_from_file_location("benchmarks_test_gemm", REPO / "benchmarks" / "test_gemm.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    real = BACKENDS["torch_loop"]

    def build(case, wl):
        built = real.build(case, wl)
        built.calls = [lambda c=c: c().mul_(1.05) for c in built.calls]
        return built

    monkeypatch.setitem(BACKENDS, "torch_loop", dataclasses.replace(real, build=build, error_bounds={"bf16": 0.1}))
    monkeypatch.setattr(bench, "_workload", lambda shape, device: Workload(shape, device, rotations=2))
    recorded = []
    moebench = type("FakeBench", (), {"progress": lambda self, msg: None, "ceiling": lambda self, dev, kind: 1e9,
                                      "record": lambda self, key, *a, **kw: recorded.append((key, kw["info"]))})()
    bench.test_gemm(GemmCase("tiny", 8, "fused", 1, "bf16", "decode", "torch_loop"), moebench, None)
    [(key, info)] = recorded
    assert info["check"]["bound"] == 0.1 and 0.04 < info["check"]["rel_error"] < 0.06


# --- what the times mean to the gate -----------------------------------------------------------------

def test_primary_time_takes_the_builds_tolerance(tiny_wl):
    """A build that declares a wider gate (vllm_triton's int4 workaround cases) gets it on its primary
    time; every other build keeps the family default."""
    calls = [lambda: None] * tiny_wl.R
    default, _ = runner.measure(Built(calls), tiny_wl, ceiling=1e11, l2_bytes=None)
    wide, _ = runner.measure(Built(calls, rel_tol=0.25), tiny_wl, ceiling=1e11, l2_bytes=None)
    assert default["wall_us"].rel_tol == 0.15
    assert wide["wall_us"].rel_tol == 0.25


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_times_are_lower_is_better_and_rates_higher(tiny_wl, device, monkeypatch):
    """Each metric states its direction: a time (wall clock on CPU; graph and eager on a GPU, the GPU
    timers faked here) is better lower, a rate or share of the floor is better higher."""
    monkeypatch.setattr(runner, "graph_timer", lambda calls, rule, flush_l2: [2e-6] * 3)
    monkeypatch.setattr(runner, "eager_timer", lambda calls, rule: [3e-6] * 3)
    wl = copy.copy(tiny_wl)
    wl.device = device
    metrics, _ = runner.measure(Built([lambda: None] * wl.R), wl, ceiling=1e11, l2_bytes=50 << 20)
    times = {"cpu": ["wall_us"], "cuda": ["graph_us", "eager_us"]}[device]
    assert {k: m.direction for k, m in metrics.items() if k != "experts_touched"} == {
        **dict.fromkeys(times + ["floor_us"], "lower"), **dict.fromkeys(["pct_of_floor", "GBps", "TFLOPs"], "higher")}
