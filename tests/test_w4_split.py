"""The leave-one-out split of the tensor-core int4 decode kernel (triton_moe/w4_split.py, w4_split_report.py)
on CPU: its options and case selection, the report's arithmetic from fake timings, the JSON written
atomically, the run loop with a fake measurement, that up alone and down alone launch the very kernels the
`triton` backend launches, and the whole command in Triton's interpreter (--smoke). The GPU timings themselves
are the next H200 lease's (docs/triton-moe-notes.md, "The next device calls")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from moebench.core.files import temporary_files  # noqa: E402
from moebench.gemm.backends import BACKENDS  # noqa: E402
from moebench.gemm.backends.base import Built  # noqa: E402
from moebench.gemm.cases import GemmCase, is_default  # noqa: E402
from moebench.gemm.triton_moe import w4_mma, w4_split  # noqa: E402
from moebench.gemm.triton_moe import w4_split_report as rep  # noqa: E402
from moebench.gemm.workload import Workload  # noqa: E402

SRC = Path(__file__).resolve().parents[1] / "src"
MODULE = "moebench.gemm.triton_moe.w4_split"


# --- options and cases --------------------------------------------------------------------------------

def test_the_default_cases_are_the_suites_int4_decode_cases_on_both_tp8_shapes():
    _, cases = w4_split.parse_args(["--out", "x.json"])
    assert [(c.model, c.m) for c in cases] == [(m, M) for m in ("kimi-k2.5", "deepseek-v3") for M in (1, 2, 4, 8, 16)]
    for c in cases:
        # the very case benchmarks/test_gemm.py times (same key, so the same seed, routings and inputs)
        assert c == GemmCase(c.model, 8, "fused", c.m, "int4-g32", "decode", "triton")
        assert is_default(c) and BACKENDS["triton"].supports(c)


def test_models_and_ms_narrow_the_selection_in_order_without_repeats():
    _, cases = w4_split.parse_args(["--out", "x", "--models", "deepseek-v3", "--ms", "4,1,4"])
    assert [(c.model, c.m) for c in cases] == [("deepseek-v3", 4), ("deepseek-v3", 1)]
    _, smoke = w4_split.parse_args(["--out", "x", "--smoke"])
    assert smoke == [GemmCase("tiny", 32, "fused", 1, "int4-g32", "decode", "triton")]


@pytest.mark.parametrize("argv, modes", [
    ([], ()),                                                   # off unless asked: the split as it was
    (["--prefetch-down"], ("l2", "evict_last")),                # bare: every mode
    (["--prefetch-down", "evict_last"], ("evict_last",)),
    (["--prefetch-down", "evict_last,l2,evict_last"], ("evict_last", "l2")),
])
def test_prefetch_down_names_the_modes_to_time_in_order(argv, modes):
    args, cases = w4_split.parse_args(["--out", "x", "--models", "kimi-k2.5", "--ms", "1"] + argv)
    assert args.prefetch_down == modes and [c.m for c in cases] == [1]


@pytest.mark.parametrize("argv, needle", [
    (["--out", "x", "--models", "kimi"], "--models: unknown model 'kimi' (known: kimi-k2.5, deepseek-v3"),
    (["--out", "x", "--ms", "32"], "--ms: M = 32 is not on the tensor-core int4 decode path (M 1..16"),
    (["--out", "x", "--ms", "0"], "--ms: M = 0 is not on the tensor-core int4 decode path"),
    (["--out", "x", "--ms", "1,two"], "--ms: '1,two' is not a comma-separated list of integers"),
    (["--out", "x", "--ms", ","], "--ms: empty"),
    (["--out", "x", "--smoke", "--ms", "1"], "--smoke runs the tiny preset at M = 1; --models and --ms do not apply"),
    (["--out", "x", "--replays", "0"], "--replays must be >= 1, got 0"),
    (["--out", "x", "--prefetch-down", "l3"], "--prefetch-down: unknown mode 'l3' (known: l2, evict_last)"),
    (["--out", "x", "--prefetch-down", "off"], "--prefetch-down: unknown mode 'off' (known: l2, evict_last)"),
    (["--out", "x", "--prefetch-down", ","], "--prefetch-down: empty"),
    (["--out", "x", "--bogus"], "unrecognized arguments: --bogus"),
    ([], "the following arguments are required: --out"),
])
def test_a_bad_option_is_one_line_on_stderr_and_exit_2(argv, needle, capsys):
    with pytest.raises(SystemExit) as exc:
        w4_split.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.count("\n") == 1 and err.startswith("w4_split: error: ") and needle in err, err


def test_the_module_refuses_an_unknown_case_from_the_command_line():
    proc = subprocess.run([sys.executable, "-m", MODULE, "--out", "x.json", "--models", "glm-4"],
                          env=dict(os.environ, PYTHONPATH=str(SRC)), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "w4_split: error: --models: unknown model 'glm-4' (known: kimi-k2.5, deepseek-v3, glm-5, tiny)"]


# --- the report's arithmetic --------------------------------------------------------------------------

T = rep.Timed
TIMES = {"bench": T(14.0, 0.002), "both": T(14.07, 0.002), "up": T(9.6, 0.003), "down": T(6.0, 0.004)}


def test_kimi_m1_bytes_per_launch_are_the_notes_16_5_and_8_3_mb():
    up, down = rep.kernel_bytes(8, 1, 7168, 256, 8)
    h, x = 8 * 256 * 2, 7168 * 2  # activations: h [8, 256] and x / out [1, 7168], bf16
    assert up == 8 * 512 * 7168 * (0.5 + 2 / 32) + x + h   # w1 int4 + bf16 scales per 32
    assert down == 8 * 7168 * 256 * (0.5 + 2 / 32) + h + x
    assert round(up / 1e6, 2) == 16.53 and round(down / 1e6, 2) == 8.28


def test_the_two_launches_bytes_are_the_cases_bytes_plus_the_activations_round_trip():
    wl = Workload(GemmCase("tiny", 8, "fused", 3, "int4-g32", "decode", "-"), "cpu", 4)
    up, down = rep.kernel_bytes(wl.mean_experts_touched(), wl.M, wl.K, wl.I, wl.topk, "int4-g32")
    assert up + down == pytest.approx(wl.bytes_per_call() + 2 * (wl.M * wl.topk * wl.I * 2))


def test_prefetch_summary_from_fake_timings():
    times = dict(TIMES, up_pf_l2=T(9.7, 0.002), both_pf_l2=T(12.5, 0.002), up_pf_evict_last=T(9.6, 0.002),
                 both_pf_evict_last=T(14.0, 0.002))
    p = rep.prefetch_summary(times, "l2")
    assert p["saved_us"] == pytest.approx(1.57) and p["up_cost_us"] == pytest.approx(0.1)
    assert p["down_share_us"] == pytest.approx(2.8) and p["significant"] is True
    assert rep.prefetch_summary(times, "evict_last")["significant"] is False  # 0.07 us of 14.07: under 1%
    assert rep.prefetch_line("kimi-k2.5", 1, "l2", p) == (
        "kimi-k2.5 M=1: prefetch l2: both 12.50 us (saves +1.57), up alone 9.70 (+0.10), down's share 2.80")


def test_fused_summary_from_fake_timings():
    f = rep.fused_summary(dict(TIMES, fused=T(12.0, 0.002)))
    assert f["us"] == 12.0 and f["saved_us"] == pytest.approx(14.07 - 12.0) and f["vs_up_us"] == pytest.approx(2.4)
    assert f["significant"] is True
    assert rep.fused_summary(dict(TIMES, fused=T(14.1, 0.002)))["significant"] is False  # 0.03 us: under 1%
    late = rep.fused_summary(dict(TIMES, fused_late_b=T(13.0, 0.002)), "fused_late_b")
    assert late["us"] == 13.0 and late["saved_us"] == pytest.approx(1.07)
    assert rep.fused_line("kimi-k2.5", 1, f) == (
        "  kimi-k2.5 M=1 one launch: 12.00 us, 2.07 us faster than both; 2.40 us over up alone")
    # session 24's H200 reading: the one launch lost
    slow = rep.fused_summary(dict(TIMES, fused=T(15.62, 0.002)))
    assert rep.fused_line("kimi-k2.5", 1, slow) == (
        "  kimi-k2.5 M=1 one launch: 15.62 us, 1.55 us slower than both; 6.02 us over up alone")


def test_down_experts_summary_from_fake_timings():
    times = dict(TIMES, down_dx=T(3.1, 0.003), both_dx=T(12.9, 0.002))
    d = rep.down_experts_summary(times)
    assert d["us"] == 12.9 and d["saved_us"] == pytest.approx(14.07 - 12.9) and d["significant"] is True
    assert (d["down_us"], d["pair_down_us"]) == (3.1, 6.0)
    assert rep.down_experts_line("kimi-k2.5", 16, d) == (
        "  kimi-k2.5 M=16 pair-major up, expert-major down: 12.90 us, 1.17 us faster than both; down alone 3.10 us "
        "(pair-major 6.00)")
    worse = rep.down_experts_summary(dict(times, both_dx=T(14.1, 0.002)))
    assert worse["significant"] is False and "0.03 us slower than both (within the timings' spread)" in (
        rep.down_experts_line("kimi-k2.5", 16, worse))


def test_launch_summary_from_fake_timings():
    d = rep.launch_summary(dict(TIMES, launch=T(2.5, 0.004)))
    assert d["launch_us"] == 2.5 and d["launch_noise"] == 0.004
    assert d["up_over_launch_us"] == pytest.approx(TIMES["up"].us - 2.5)
    assert d["down_over_launch_us"] == pytest.approx(TIMES["down"].us - 2.5)
    assert d["both_over_two_us"] == pytest.approx(TIMES["both"].us - 5.0)
    assert rep.launch_line("kimi-k2.5", 1, d).startswith("  kimi-k2.5 M=1 one empty launch in the graph: 2.50 us; over it ")


def test_the_empty_launch_check_fails_a_call_that_did_not_store_its_mark():
    bufs = [torch.zeros(1) for _ in range(3)]
    good = Built([lambda b=b, r=r: b.fill_(r + 1) for r, b in enumerate(bufs)], out_buffers=bufs)
    w4_split.check_launch(good, "cpu", "k")
    stale = Built([lambda b=b: b for b in bufs], out_buffers=bufs)  # returns the buffer, stores nothing
    with pytest.raises(AssertionError, match=r"k: rotation 0: the empty launch stored nan, not 1"):
        w4_split.check_launch(stale, "cpu", "k")


def test_a_one_launch_program_that_gave_up_its_wait_fails_the_case(monkeypatch):
    """Correct output is not enough: a wait that gave up means the grid was not resident, so the next launch
    may not be right either; check_fused names the rotation."""
    monkeypatch.setattr(w4_split.runner, "check", lambda built, wl, key: {"rel_error": 0.001})
    fake = w4_split.FusedBuilt([], fused_calls=["r0", "r1"])
    monkeypatch.setattr(w4_split.w4_fused, "wait_failed", lambda fc: False)
    assert w4_split.check_fused(fake, None, "k") == 0.001
    monkeypatch.setattr(w4_split.w4_fused, "wait_failed", lambda fc: fc == "r1")
    with pytest.raises(AssertionError, match="gave up waiting for its pair in rotation 1"):
        w4_split.check_fused(fake, None, "k")


def test_summary_from_fake_timings():
    s = rep.summarize(TIMES, up_bytes=16.8e6, down_bytes=8.4e6, ceiling=4.2e12)
    assert s["overlap_us"] == pytest.approx(9.6 + 6.0 - 14.07)     # what running them together saves
    assert s["down_share_us"] == pytest.approx(14.07 - 9.6)        # what down adds beyond up alone
    assert s["up_share_us"] == pytest.approx(14.07 - 6.0)
    assert s["up_floor_us"] == pytest.approx(4.0) and s["down_floor_us"] == pytest.approx(2.0)
    assert s["up_pct_of_floor"] == pytest.approx(100 * 4.0 / 9.6)
    assert s["down_pct_of_floor"] == pytest.approx(100 * 2.0 / 6.0)
    assert s["both_vs_bench"] == pytest.approx(0.005) and s["agree"] is True
    assert (s["bench_us"], s["both_us"], s["up_us"], s["down_us"]) == (14.0, 14.07, 9.6, 6.0)
    assert s["down_noise"] == 0.004 and s["up_bytes"] == 16.8e6
    json.dumps(s)  # plain JSON


def test_both_and_bench_agree_within_twice_their_noise_and_at_least_one_percent():
    def agree(both, noise):
        times = {**TIMES, "bench": T(14.0, noise), "both": T(both, noise)}
        return rep.summarize(times, 1.0, 1.0, 1e12)["agree"]

    assert agree(14.13, 0.001) and not agree(14.15, 0.001)   # 0.93% in, 1.07% out of the 1% floor
    assert agree(14.5, 0.01) and not agree(14.6, 0.01)       # 3.6% within 2 x (1% + 1%), 4.3% beyond
    assert not agree(13.8, 0.001)                            # faster counts too


@pytest.mark.parametrize("times, ceiling, needle", [
    ({k: v for k, v in TIMES.items() if k != "down"}, 1e12, "missing down"),
    (TIMES, 0.0, "the read ceiling must be positive"),
])
def test_summary_refuses_incomplete_timings_or_no_ceiling(times, ceiling, needle):
    with pytest.raises(ValueError, match=needle):
        rep.summarize(times, 1.0, 1.0, ceiling)


@pytest.mark.parametrize("M, share, starts", [
    (1, 5.01, "down's share 5.01 us > 5: load down's weights in up's launch"),
    (1, 5.0, "down's share 5.00 us is between 3 and 5"),
    (1, 3.0, "down's share 3.00 us is between 3 and 5"),
    (1, 2.99, "down's share 2.99 us < 3: the gap is up's"),
    (2, 9.0, None),  # the rule's thresholds were written for M = 1's 14 us graph
])
def test_the_m1_rule(M, share, starts):
    got = rep.verdict(M, share)
    assert got == starts if starts is None else got.startswith(starts)


def test_the_case_line_names_every_number():
    s = rep.summarize(TIMES, 16.8e6, 8.4e6, 4.2e12)
    assert rep.case_line("kimi-k2.5", 1, s, 4.2e12) == (
        "kimi-k2.5 M=1: bench 14.00 us, both 14.07 (+0.5%, agree), up alone 9.60, down alone 6.00; overlap 1.53, "
        "down's share 4.47; at 4200 GB/s up 16.80 MB = 4.00 us (42% of its time), down 8.40 MB = 2.00 us (33%)")


def test_exit_status():
    ok, off = {"agree": True}, {"agree": False}
    assert w4_split.exit_status([ok, ok], aborted=False) == 0
    assert w4_split.exit_status([ok, off], aborted=False) == 3
    assert w4_split.exit_status([ok, off], aborted=False, judge_agreement=False) == 0
    assert w4_split.exit_status([off, {"error": "AssertionError: wrong"}], aborted=False) == 1
    assert w4_split.exit_status([ok], aborted=True) == 1


# --- the JSON -----------------------------------------------------------------------------------------

def test_the_report_is_written_whole_or_not_at_all(tmp_path):
    path = tmp_path / "sub" / "split.json"
    w4_split.write_report(path, {"cases": [{"M": 1}]})
    assert json.loads(path.read_text()) == {"cases": [{"M": 1}]}
    with pytest.raises(TypeError):  # a value JSON cannot hold: the old report stays, no temporary file is left
        w4_split.write_report(path, {"cases": [{"M": object()}]})
    assert json.loads(path.read_text()) == {"cases": [{"M": 1}]} and temporary_files(path) == []


def test_the_run_writes_after_every_case_and_records_a_failed_one(tmp_path, monkeypatch, capsys):
    """main's loop with a fake measurement (the GPU part is the lease's): progress lines, the JSON holding the
    cases measured so far while the next one runs, a failing case recorded with its reason, exit 1."""
    out = tmp_path / "split.json"
    seen = []

    def fake_measure(case, device, ceiling, l2, rule, rotations, log, prefetch=(), fused=False, down_experts=False,
                     lean=False):
        seen.append([c["M"] for c in json.loads(out.read_text())["cases"]])  # what a reader sees now
        log(f"{case.model} M={case.m}: timing")
        if case.m == 2:
            raise AssertionError(f"{case.key}: rotation 0: relative error 1.0e+00 >= bound 1e-02")
        return {"case": case.key, "M": case.m, "agree": True, "rotations": rotations}

    monkeypatch.setattr(w4_split.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(w4_split, "setup", lambda smoke, replays: ("cpu", 4.2e12, None))
    monkeypatch.setattr(w4_split, "measure_case", fake_measure)
    status = w4_split.main(["--out", str(out), "--models", "kimi-k2.5", "--ms", "1,2,4"])
    doc = json.loads(out.read_text())
    assert status == 1 and doc["done"] is True and seen == [[], [1], [1, 2]]
    assert [c["M"] for c in doc["cases"]] == [1, 2, 4] and doc["cases"][2]["rotations"] == 16
    assert doc["cases"][1]["error"] == ("AssertionError: gemm[kimi-k2.5-tp8-fused-m2-int4-g32-decode-triton]: "
                                        "rotation 0: relative error 1.0e+00 >= bound 1e-02")
    assert doc["read_ceiling_bytes_per_s"] == 4.2e12 and doc["argv"][:2] == ["--out", str(out)]
    lines = capsys.readouterr().out.splitlines()
    assert "3 cases, read ceiling 4200 GB/s, 16 rotations" in lines[0]
    assert any(line.endswith("kimi-k2.5 M=2: AssertionError: gemm[kimi-k2.5-tp8-fused-m2-int4-g32-decode-triton]: "
                             "rotation 0: relative error 1.0e+00 >= bound 1e-02") for line in lines)
    assert lines[-1].endswith(f"wrote {out} (exit 1)")


# --- the split launches are the backend's launches ------------------------------------------------------

def test_up_alone_must_reproduce_the_kept_activations_bit_for_bit():
    kept = [torch.ones(8, 32, dtype=torch.bfloat16) for _ in range(3)]
    wl = type("Wl", (), {"R": 3, "device": "cpu"})()
    same = Built([lambda r=r: kept[r].clone() for r in range(3)])
    w4_split.check_up_alone(same, kept, wl, "k")
    off = kept[2].clone()
    off[0, 0] = off[0, 0] + 2 ** -7  # one value one bf16 step (2^-7 at 1.0) away: a 1% tolerance would pass it
    with pytest.raises(AssertionError, match=r"^k: rotation 2: up alone differs from the kept activations in 1 of 256"):
        w4_split.check_up_alone(Built([lambda: kept[0], lambda: kept[1], lambda: off]), kept, wl, "k")


class _Recorder:
    """Stands in for the Triton kernel: records each launch (grid, the weights' and routing's storage, every
    scalar and compile-time argument) and runs nothing."""

    def __init__(self):
        self.launches = []
        self.pointers = []  # (a, out) of each launch: apart, since a fresh output differs from call to call

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            a, w, s, ids, tw, out = args[:6]
            self.pointers.append((a.data_ptr(), out.data_ptr()))
            self.launches.append({"grid": grid, "a": (tuple(a.shape), a.dtype), "out": (tuple(out.shape), out.dtype),
                                  "storage": [t.data_ptr() for t in (w, s, ids, tw)], "scalars": args[6:],
                                  "kwargs": {k: v.data_ptr() if isinstance(v, torch.Tensor) else v
                                             for k, v in kwargs.items()}})
        return launch


def test_up_alone_and_down_alone_launch_what_the_backend_launches(monkeypatch):
    # a table entry with different up and down tiles (the tiny shape's heuristic gives both the same), so a
    # split that ran either launch at the other's tiles would show
    table = {"up": {"block_n": 16, "block_k": 32, "num_warps": 2},
             "down": {"block_n": 32, "block_k": 32, "num_warps": 4}}
    monkeypatch.setattr(w4_mma, "table_entry", lambda key: table if key == "w4mma|1024|128|32|4|4" else None)
    case = GemmCase("tiny", 8, "fused", 3, "int4-g32", "decode", "triton")
    wl = Workload(GemmCase("tiny", 8, "fused", 3, "int4-g32", "decode", "-"), "cpu", 2)
    bench = BACKENDS["triton"].build(case, wl)
    assert bench.info["config"]["up"]["num_warps"] == 2 and bench.info["config"]["down"]["block_n"] == 32
    rec = _Recorder()
    monkeypatch.setattr(w4_mma, "moebench_w4_mma", rec)
    tiles, builds, activations = w4_split.split_builds(wl)
    assert len(rec.launches) == 2 and len(activations) == 2  # one real up run per rotation, for down alone
    for r in range(2):
        rec.launches.clear()
        bench.calls[r]()
        backend = list(rec.launches)
        rec.launches.clear()
        builds["up"].calls[r]()
        builds["down"].calls[r]()
        alone = list(rec.launches)
        rec.launches.clear()
        builds["both"].calls[r]()
        assert len(backend) == 2 and alone == backend and rec.launches == backend, r
        rec.launches.clear()
        builds["bench_i32"].calls[r]()
        assert rec.launches == backend, r
    up, down = backend
    assert up["kwargs"]["UP_ROWS"] == wl.I and down["kwargs"]["SLOTS"] == wl.topk  # the up launch, then down
    assert bench.info["config"] == {"path": "w4_mma", "up": tiles["up"], "down": tiles["down"]}


def test_the_smoke_run_checks_and_times_the_split_in_the_interpreter(tmp_path):
    """The whole command on CPU: the tiny case built by the backend and split, every check against the float32
    reference passed, five wall times with --fused (the one launch as its two interpreter phases), version 9's
    three with --lean, and the report's fields (the interpreter's times mean nothing)."""
    out = tmp_path / "smoke.json"
    proc = subprocess.run([sys.executable, "-m", MODULE, "--smoke", "--fused", "--lean", "--out", str(out)],
                          env=dict(os.environ, PYTHONPATH=str(SRC)), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["done"] is True and doc["device"] == "cpu (Triton interpreter)" and doc["rotations"] == 1
    (c,) = doc["cases"]
    assert c["case"] == "gemm[tiny-tp32-fused-m1-int4-g32-decode-triton]" and "error" not in c
    assert set(c["rel_error"]) == {"bench", "both", "down", "bench_i32", "fused", "fused_late_b", "down_lean",
                                   "both_lean", "both_lean_down"} and max(c["rel_error"].values()) < 1e-2
    assert 0 <= c["lean_up_vs_default"] <= w4_split.LEAN_UP_TOL
    assert c["lean_up_u1_vs_default"] == c["lean_up_vs_default"]  # unrolling does not reorder the sums
    assert set(c["lean"]) == {"us", "noise", "saved_us", "up_saved_us", "up_u1_saved_us", "down_saved_us",
                              "significant", "down_only"}
    assert doc["lean"] is True and c["tiles"]["lean"]["up"]["block_k"] == 64  # 32 groups, steps of 8: whole
    for key in ("bench_us", "both_us", "up_us", "down_us", "overlap_us", "down_share_us", "up_floor_us",
                "down_floor_us", "verdict", "bench_i32_us", "bench_i32_vs_bench"):
        assert key in c, key
    assert c["tiles"]["pdl"] is False  # PDL is a GPU launch option
    assert c["tiles"]["fused_warps"] == 16 and set(c["fused"]) == {"us", "noise", "saved_us", "vs_up_us", "significant"}
    # the tiny shape's I / 32 = 1 group: no second lane set to split it over, said in the report and the log
    assert set(c["tiles"]["fused_refused"]) == {"fused_dks2", "fused_dks4"} and "no fused, down over 2 lane sets" in proc.stdout
    assert c["bench"]["impl"] == "moebench.gemm.triton_moe.w4_mma" and c["bench"]["config"]["path"] == "w4_mma"
    assert set(c["launch"]) == {"launch_us", "launch_noise", "up_over_launch_us", "down_over_launch_us", "both_over_two_us"}
    assert "tiny M=1 one empty launch in the graph: " in proc.stdout
    for step in ("building", "checking", "timing bench", "timing bench on int32 ids", "timing one empty launch",
                 "timing up alone", "timing down alone", "timing both",
                 "timing fused (one launch)", "timing fused, second down chunk after the wait",
                 "timing up alone, version 9", "timing down alone, version 9", "timing both, version 9"):
        assert f"tiny M=1: {step}" in proc.stdout, step
    assert c["verdict"] is None and "M = 1 rule" not in proc.stdout  # the rule reads GPU graph times only


def test_the_down_experts_variants_launch_the_backends_up_then_the_expert_major_down_and_sum(monkeypatch):
    """--down-experts' both_dx is the backend's own up launch, then the expert-major kernel's down launch at its
    tiles (experts_config) on that up's activations, then the top-k sum; down_dx is the same down and sum on the
    activations kept from a real up run."""
    from moebench.gemm.triton_moe import w4_experts

    case = GemmCase("tiny", 8, "fused", 2, "int4-g32", "decode", "triton")
    wl = Workload(GemmCase("tiny", 8, "fused", 2, "int4-g32", "decode", "-"), "cpu", 1)
    bench = BACKENDS["triton"].build(case, wl)
    mma, experts, sums = _Recorder(), _Recorder(), []
    monkeypatch.setattr(w4_mma, "moebench_w4_mma", mma)
    monkeypatch.setattr(w4_experts, "moebench_w4_experts", experts)
    monkeypatch.setattr(w4_experts, "moe_sum_kernel", type("Sum", (), {
        "__getitem__": lambda self, grid: lambda *a, **k: sums.append((grid, a[0].data_ptr(), a[1].shape))})())
    tiles, builds, activations = w4_split.split_builds(wl, down_experts=True)
    dx = w4_experts.experts_config(wl.M, wl.K, wl.I, wl.E, wl.topk)[1]
    assert tiles["down_experts"] == dx.__dict__
    mma.launches.clear()
    bench.calls[0]()
    backend_up = mma.launches[0]
    mma.launches.clear()
    builds["both_dx"].calls[0]()
    (up,) = mma.launches
    (down,) = experts.launches
    assert up == backend_up  # the backend's up launch, unchanged
    assert down["kwargs"]["UP_ROWS"] == 0 and down["kwargs"]["WEIGHTED"] is True
    # the activations as the kernels read them: bf16 pairs in int32 words
    assert down["kwargs"]["num_warps"] == dx.num_warps and down["a"] == ((wl.M * wl.topk, wl.I // 2), torch.int32)
    (grid, y_ptr, out_shape), = sums
    assert grid[0] == wl.M and y_ptr == experts.pointers[0][1] and tuple(out_shape) == (wl.M, wl.K)
    experts.launches.clear()
    experts.pointers.clear()
    builds["down_dx"].calls[0]()
    (alone,) = experts.launches
    assert alone["kwargs"] == down["kwargs"] and experts.pointers[0][0] == activations[0].data_ptr()


def test_the_prefetch_variants_launch_the_backends_launches_with_the_prefetch_alone_added(monkeypatch):
    """--prefetch-down's up launch is the backend's up launch plus PREFETCH_DOWN and the down launch's own weight
    and scale stacks; its down launch is the backend's down launch."""
    case = GemmCase("tiny", 8, "fused", 2, "int4-g32", "decode", "triton")
    wl = Workload(GemmCase("tiny", 8, "fused", 2, "int4-g32", "decode", "-"), "cpu", 1)
    bench = BACKENDS["triton"].build(case, wl)
    rec = _Recorder()
    monkeypatch.setattr(w4_mma, "moebench_w4_mma", rec)
    _, builds, _ = w4_split.split_builds(wl, ("l2", "evict_last"))
    rec.launches.clear()
    bench.calls[0]()
    (up, down) = rec.launches
    for mode, value in (("l2", 1), ("evict_last", 2)):
        rec.launches.clear()
        builds[f"up_pf_{mode}"].calls[0]()
        builds[f"both_pf_{mode}"].calls[0]()
        up_pf, up_pf2, down_pf = rec.launches
        assert up_pf == up_pf2 and down_pf == down
        extra = {k: up_pf["kwargs"].pop(k) for k in ("PREFETCH_DOWN", "w2_ptr", "s2_ptr")}
        assert up_pf == up and extra == {"PREFETCH_DOWN": value, "w2_ptr": down["storage"][0],
                                         "s2_ptr": down["storage"][1]}, mode
    assert "PREFETCH_DOWN" not in up["kwargs"]  # the backend's launch leaves it at its default, off


def test_the_lean_variants_launch_the_backends_launches_with_version_9s_loop_at_its_tiles(monkeypatch):
    """--lean's launches are the backend's, but for LEAN = 1, UNROLL as w4_mma.lean_unroll says, and block_k as
    w4_mma.lean_config says (here the tiny shape's 32 up groups over a table entry's 4 lane sets x 4 groups: two
    steps, so no halving and no unrolling; down's 4 groups over 2 lane sets x 4 halve to steps of 2 x 2); down_lean
    reads the kept activations; both_lean_down launches the backend's up unchanged, then version 9's down."""
    table = {"up": {"block_n": 16, "block_k": 128, "num_warps": 4},
             "down": {"block_n": 32, "block_k": 128, "num_warps": 4}}
    monkeypatch.setattr(w4_mma, "table_entry", lambda key: table if key.startswith("w4mma|1024|") else None)
    case = GemmCase("tiny", 8, "fused", 2, "int4-g32", "decode", "triton")
    wl = Workload(GemmCase("tiny", 8, "fused", 2, "int4-g32", "decode", "-"), "cpu", 1)
    bench = BACKENDS["triton"].build(case, wl)
    rec = _Recorder()
    monkeypatch.setattr(w4_mma, "moebench_w4_mma", rec)
    tiles, builds, activations = w4_split.split_builds(wl, lean=True)
    assert tiles["lean"]["up"]["block_k"] == 128 and tiles["lean"]["down"]["block_k"] == 64
    rec.launches.clear()
    bench.calls[0]()
    up, down = rec.launches
    rec.launches.clear()
    builds["both_lean"].calls[0]()
    builds["up_lean"].calls[0]()
    rec.pointers.clear()
    builds["down_lean"].calls[0]()
    up_l, down_l, up_alone, down_alone = rec.launches
    assert up_l == up_alone and down_l["kwargs"] == down_alone["kwargs"]
    assert rec.pointers[0][0] == activations[0].data_ptr()
    assert {k: up_l["kwargs"].pop(k) for k in ("LEAN", "UNROLL")} == {"LEAN": 1, "UNROLL": 1}
    assert up_l == up  # the backend's up launch, version 9's switch alone added
    extra = {k: down_l["kwargs"].pop(k) for k in ("LEAN", "UNROLL")}
    assert extra == {"LEAN": 1, "UNROLL": 1} and down_l["kwargs"]["GPI"] == 2 and down["kwargs"]["GPI"] == 4
    assert {k: v for k, v in down_l["kwargs"].items() if k != "GPI"} == \
        {k: v for k, v in down["kwargs"].items() if k != "GPI"}
    assert "LEAN" not in up["kwargs"] and "LEAN" not in down["kwargs"]  # the backend's launches leave it off
    rec.launches.clear()
    builds["both_lean_down"].calls[0]()
    up_d, down_d = rec.launches
    assert up_d == up and down_d["kwargs"] == down_l["kwargs"] | {"LEAN": 1, "UNROLL": 1}
    rec.launches.clear()
    builds["up_lean_u1"].calls[0]()
    (up_u1,) = rec.launches
    # lean_unroll's rule gives 1 here too; test_w4_mma's test_up_unroll_* is the one an ignored override fails
    assert up_u1["kwargs"] == up_l["kwargs"] | {"LEAN": 1, "UNROLL": 1}


def test_lean_summary_from_fake_timings():
    times = dict(TIMES, up_lean=T(10.5, 0.002), down_lean=T(5.0, 0.003), both_lean=T(13.9, 0.002),
                 both_lean_down=T(14.08, 0.002), up_lean_u1=T(9.4, 0.002))
    d = rep.lean_summary(times)
    assert d["us"] == 13.9 and d["saved_us"] == pytest.approx(14.07 - 13.9) and d["significant"] is True
    assert d["up_saved_us"] == pytest.approx(9.6 - 10.5) and d["down_saved_us"] == pytest.approx(1.0)
    assert d["up_u1_saved_us"] == pytest.approx(0.2)
    assert d["down_only"]["us"] == 14.08 and d["down_only"]["saved_us"] == pytest.approx(-0.01)
    assert d["down_only"]["significant"] is False  # 0.07% apart: inside the two timings' spread
    assert rep.lean_line("kimi-k2.5", 16, d) == (
        "  kimi-k2.5 M=16 lean (version 9): 13.90 us, 0.17 us faster than both; up alone 0.90 us slower (unrolled "
        "once 0.20 us faster), down alone 1.00 us faster; the default up then version 9's down 14.08 us, 0.01 us slower than both (within the "
        "timings' spread)")


def test_lean_up_must_repeat_itself_exactly_and_stay_near_the_default_activations():
    """check_lean_up: a version 9 up whose sums were only reordered passes (its relative difference returned); one
    off by more than LEAN_UP_TOL, or that changes from one run to the next, fails naming the rotation."""
    from types import SimpleNamespace

    wl = SimpleNamespace(R=2, device="cpu")
    g = torch.Generator().manual_seed(0)
    kept = [torch.randn(8, 64, generator=g).to(torch.bfloat16) for _ in range(2)]
    # a reordered float32 sum moves a few bf16 values by one unit in the last place: here every 100th
    near = [k.clone() for k in kept]
    for n in near:
        n.view(torch.int16).view(-1)[::100] += 1
    rel = w4_split.check_lean_up(Built([lambda t=t: t.clone() for t in near]), kept, wl, "case")
    assert 0 < rel <= w4_split.LEAN_UP_TOL
    assert w4_split.check_lean_up(Built([lambda t=t: t.clone() for t in kept]), kept, wl, "case") == 0.0
    off = [kept[0].clone(), (kept[1].float() * 1.01).to(torch.bfloat16)]
    with pytest.raises(AssertionError, match="case: rotation 1: differs from the default up's activations by"):
        w4_split.check_lean_up(Built([lambda t=t: t.clone() for t in off]), kept, wl, "case")
    runs = iter(range(100))
    with pytest.raises(AssertionError, match="up alone differs from the kept activations"):
        w4_split.check_lean_up(Built([lambda: kept[0] + next(runs), lambda: kept[1].clone()]), kept, wl, "case")
