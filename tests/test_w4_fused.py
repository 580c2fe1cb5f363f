"""The int4 decode in one launch (triton_moe/w4_fused.py) on CPU: in Triton's interpreter the call is its two
phases (up, then down and the finish), checked against the float32 reference and the two-launch kernel; the
workspace and counters it leaves for the next call; the calls it refuses. The one-launch wait itself runs only
on a GPU (w4_split --fused checks it there against the reference before timing)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from int4_problems import int4_problem, rel_error  # noqa: E402
from moebench.gemm.triton_moe import w4_fused, w4_mma  # noqa: E402
from moebench.gemm.triton_moe.config import KernelConfig  # noqa: E402

E = 8


def _call(M, K, I, topk, up, seed=0):
    pb = int4_problem(M, K, I, topk, E, seed)
    c = w4_mma.plan_call(pb.x, w4_mma.pack_tiles16(pb.d1, pb.q.scales[0]), w4_mma.pack_tiles16(pb.d2, pb.q.scales[1]),
                         pb.tw, pb.ids, config=(KernelConfig(*up), KernelConfig(16, 32, 1)), pdl=False)
    return c, pb.reference()


def _run_twice(M, K, I, topk, up, dks=1):
    """(error of call 1, error of call 2, error of the two-launch kernel, sync and workspace left zero)."""
    c, ref = _call(M, K, I, topk, up)
    fc = w4_fused.plan_fused(c, down_lane_sets=dks)
    errs = []
    for _ in range(2):  # the second call starts from what the first left
        errs.append(rel_error(w4_fused.fused_launch(fc), ref))
    errs.append(rel_error(w4_mma.down_launch(c, w4_mma.up_launch(c)), ref))
    return errs, bool((fc.sync == 0).all()) and bool((fc.ws == 0).all()), w4_fused.wait_failed(fc)


@pytest.mark.parametrize("M, K, I, topk, up, dks", [
    (1, 64, 32, 2, (16, 32, 1), 1),     # 2 down tiles a program in chunks of 1: both chunks full
    (3, 256, 64, 4, (16, 64, 2), 1),    # 4 tiles, chunks of 2; 3 tokens, one expert shared
    (2, 160, 32, 2, (16, 32, 4), 1),    # 5 tiles in chunks of 4: the second chunk is 1 tile and 3 masked
    (1, 256, 32, 2, (16, 64, 1), 1),    # 8 tiles: up's 1 warp raised to 4 (K over 4 lane sets of 2 groups)
    (2, 384, 64, 2, (16, 64, 4), 2),    # 6 tiles in chunks of 4 over 2 lane sets (1 group each), 2 slots
    (1, 512, 128, 2, (16, 64, 4), 4),   # 4 tiles, one chunk of 4: 4 lane sets of 1 group, 4 slots of 1 tile
])
def test_one_launch_matches_the_reference_and_leaves_zeros_for_the_next_call(interp, M, K, I, topk, up, dks):
    (first, second, two), zeros, failed = interp(_run_twice, M, K, I, topk, up, dks)
    assert first < 1e-2 and second < 1e-2, (first, second)
    # the same products as the two-launch kernel; only the sum over slots is rounded once instead of per slot
    assert abs(first - two) < 2e-3, (first, two)
    assert zeros and not failed


def _refused(M, K, I, topk, up, dks):
    c, _ = _call(M, K, I, topk, up)
    with pytest.raises(ValueError) as e:
        w4_fused.plan_fused(c, down_lane_sets=dks)
    return str(e.value)


@pytest.mark.parametrize("up, K, I, dks, needle", [
    ((32, 32, 2), 64, 32, 1, "tiles of 16 rows"),          # two row tiles a program
    ((16, 32, 1), 96, 64, 1, "must be a multiple"),         # 6 down tiles over 4 programs
    ((16, 32, 1), 4096, 32, 1, "more than a program has"),  # 128 down tiles a program: 64 warps
    ((16, 32, 4), 128, 32, 2, "down_lane_sets"),            # I / 32 = 1 group: no second lane set
    ((16, 32, 4), 256, 64, 3, "down_lane_sets"),            # not a power of two
])
def test_calls_the_one_launch_kernel_cannot_take_are_refused_in_one_line(up, K, I, dks, needle):
    msg = _refused(1, K, I, 2, up, dks)
    assert needle in msg and "\n" not in msg


@pytest.mark.parametrize("M, I, topk, sms, fits", [
    (1, 256, 8, 132, True),    # Kimi-K2.5 / DeepSeek-V3 TP8 at M = 1 on an H100 SXM or H200: 128 programs
    (1, 256, 8, 114, False),   # the same on an H100 PCIe (114 SMs)
    (2, 256, 8, 132, False),   # M = 2: 256 programs
    (1, 128, 4, 32, True),     # exactly one program an SM
    (1, 128, 4, 31, False),
])
def test_the_grid_must_fit_the_gpus_sms_one_program_each(M, I, topk, sms, fits):
    why = w4_fused.grid_too_large(M, I, topk, sms)
    assert (why is None) == fits
    if not fits:
        assert f"{M * topk} x {I // 16} = {M * topk * I // 16} programs" in why and f"{sms} SMs" in why


def _backend_check(m):
    """The triton_fused backend's calls on the tiny preset, checked as the suite checks them (runner.check)."""
    from moebench.gemm import runner
    from moebench.gemm.backends import BACKENDS
    from moebench.gemm.cases import GemmCase
    from moebench.gemm.workload import Workload

    wl = Workload(GemmCase("tiny", 8, "fused", m, "int4-g32", "decode", "-"), "cpu")
    built = BACKENDS["triton_fused"].build(GemmCase("tiny", 8, "fused", m, "int4-g32", "decode", "triton_fused"), wl)
    return built.info, len(built.calls), runner.check(built, wl, key="triton_fused")["rel_error"]


def test_the_fused_backend_runs_the_one_launch_kernel_and_passes_the_suites_check(interp):
    from moebench.gemm.cases import ROTATIONS

    info, n, err = interp(_backend_check, 1)
    assert (info["impl"], info["config"]["path"]) == ("moebench.gemm.triton_moe.w4_fused", "w4_mma_fused")
    assert n == ROTATIONS and err < 1e-2


def test_the_fused_backend_skips_a_gpu_too_small_and_stays_out_of_the_default_selection(monkeypatch):
    from moebench.gemm.backends import BACKENDS
    from moebench.gemm.cases import GemmCase, is_default

    fused = BACKENDS["triton_fused"]
    case = lambda m: GemmCase("kimi-k2.5", 8, "fused", m, "int4-g32", "decode", "triton_fused")  # noqa: E731
    assert fused.supports(case(1)) and not fused.supports(case(2))

    class Props:
        multi_processor_count = 114

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _: Props)
    assert "this GPU has 114 SMs" in fused.unavailable(case(1), "cuda", (9, 0))
    Props.multi_processor_count = 132
    assert fused.unavailable(case(1), "cuda", (9, 0)) is None
    assert fused.unavailable(case(1), "cpu", None) == "triton_fused needs a CUDA GPU; this machine has none"
    assert not is_default(case(1))


def test_the_activations_start_as_nan_so_a_wait_given_up_fails_the_first_check():
    """A program that read its pair's activations before they were written would read NaN, not leftovers of an
    earlier kernel that may equal them: the first call's reference check fails then."""
    c, _ = _call(1, 64, 32, 2, (16, 32, 1))
    fc = w4_fused.plan_fused(c)
    assert torch.isnan(fc.h).all() and not fc.ws.any() and not fc.sync.any()
