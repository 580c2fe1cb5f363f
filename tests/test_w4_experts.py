"""The expert-major int4 kernel (triton_moe/w4_experts.py) on CPU: Triton's interpreter runs the plain-Triton
lane formula against the float32 reference, with tokens sharing experts, an expert holding more than one chunk
of 8 pairs, one chunk exactly full, unused experts, K not a multiple of a step and row tiles past N. The inline PTX itself:
test_w4_experts_asm.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import moebench.gemm.triton_moe as tm  # noqa: E402
from moebench.gemm.triton_moe import w4_experts, w4_mma  # noqa: E402
from moebench.gemm.triton_moe.config import KernelConfig  # noqa: E402

E = 8


def _routing(M, topk, crowd, g):
    """topk distinct experts per token; crowd: every token's first slot on expert 3 (M pairs on one expert)."""
    ids = torch.stack([torch.randperm(E, generator=g)[:topk] for _ in range(M)])
    if crowd:
        for m in range(M):
            row = ids[m][ids[m] != 3][: topk - 1]
            ids[m] = torch.cat([torch.tensor([3]), row])
    return ids.int()


def _problem(M, K, I, topk, crowd, seed):
    """(x, packed w1, packed w2, topk weights, ids, float32 reference) of one int4 MoE call."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(M, K, generator=g) * 3).bfloat16()
    w1, w2 = torch.randn(E, 2 * I, K, generator=g) / K ** 0.5, torch.randn(E, K, I, generator=g) / I ** 0.5
    ids = _routing(M, topk, crowd, g)
    tw = torch.softmax(torch.randn(M, topk, generator=g), -1)
    d1, d2, q = tm.quantize_moe(w1, w2, "int4_w4a16", 32)
    ref = tm.fused_moe_ref(x, tm.dequantize_weight(d1, q, 0), tm.dequantize_weight(d2, q, 1), tw, ids)
    return x, w4_mma.pack_tiles16(d1, q.scales[0]), w4_mma.pack_tiles16(d2, q.scales[1]), tw, ids, ref


def _fused_err(M, K, I, topk, up, down, crowd, seed=0):
    x, w1, w2, tw, ids, ref = _problem(M, K, I, topk, crowd, seed)
    out = w4_experts.fused_moe_w4_experts(x, w1, w2, tw, ids, config=(KernelConfig(*up), KernelConfig(*down)),
                                          pdl=False)
    assert out.shape == (M, K) and out.dtype == torch.bfloat16 and not torch.isnan(out).any()
    return ((out.float() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("M, K, I, topk, up, down, crowd", [
    (1, 64, 32, 2, (16, 32, 1), (16, 32, 1), False),    # one pair an expert, 6 of 8 experts unused
    (5, 256, 32, 4, (16, 64, 2), (32, 32, 2), False),   # 8 groups over 2 lane sets x 2 a step; 2 row tiles
    (11, 96, 64, 2, (32, 64, 4), (64, 64, 4), True),    # 11 pairs on expert 3: two chunks; the last step masked
    (8, 64, 32, 2, (16, 32, 1), (16, 32, 1), True),     # exactly 8 pairs on expert 3: one full chunk
    (3, 160, 32, 3, (16, 32, 4), (64, 32, 4), False),   # 10 down tiles in programs of 4: the last runs past N
])
def test_fused_moe_w4_experts_matches_the_float32_reference(interp, M, K, I, topk, up, down, crowd):
    assert interp(_fused_err, M, K, I, topk, up, down, crowd) < 1e-2


def test_bad_tiles_are_refused_before_any_launch():
    d, s = tm.quantize_weight(torch.randn(2, 64, 64), "int4_w4a16", 32)[:2]
    w1 = w4_mma.pack_tiles16(d, s)
    w2 = w4_mma.pack_tiles16(*tm.quantize_weight(torch.randn(2, 64, 32), "int4_w4a16", 32)[:2])
    x = torch.zeros(1, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="16-row int4 tiles need"):
        w4_experts.fused_moe_w4_experts(x, w1, w2, torch.ones(1, 1), torch.zeros(1, 1, dtype=torch.int32),
                                        config=(KernelConfig(16, 32, 1), KernelConfig(24, 32, 1)))


def test_the_heuristic_tiles_lay_out_on_the_real_shapes():
    for K, I in ((7168, 256), (7168, 512)):
        up, down = w4_experts.experts_config(64, K, I, 384, 8)
        assert w4_mma.lane_sets(up) and w4_mma.lane_sets(down)


def test_the_measured_tiles_are_found_and_lay_out():
    """Every `w4mmax|...` entry of configs.json (w4_tune --kernel mma_experts on the H200) is a pair of tiles the
    kernel can lay out, and experts_config returns it for its shape and M bucket: Kimi-K2.5 TP8 at M = 64
    runs the sweep's winner, not the heuristic."""
    import json
    from importlib import resources

    table = json.loads(resources.files("moebench.gemm.triton_moe").joinpath("configs.json").read_text())
    entries = {k: v for k, v in table.items() if k.startswith("w4mmax|")}
    assert len(entries) >= 10, sorted(entries)
    for key, cfg in entries.items():
        _, K, I, E_, topk, bucket = key.split("|")
        up, down = w4_experts.experts_config(int(bucket), int(K), int(I), int(E_), int(topk))
        assert (up, down) == (KernelConfig(**cfg["up"]), KernelConfig(**cfg["down"])), key
        assert w4_mma.lane_sets(up) and w4_mma.lane_sets(down)
    kimi64 = entries["w4mmax|7168|256|384|8|64"]
    assert w4_experts.experts_config(64, 7168, 256, 384, 8) == (KernelConfig(**kimi64["up"]),
                                                                 KernelConfig(**kimi64["down"]))


@pytest.mark.parametrize("m, path", [(16, "w4_mma"), (17, "w4_mma_experts"), (64, "w4_mma_experts")])
def test_triton_int4_runs_pair_major_up_to_16_and_expert_major_above(m, path):
    """The `triton` backend's int4-g32 fused cases: the pair-major tensor-core kernel up to GEMV_MAX_M, the
    expert-major one above it (session 20: 1.8-2.3x the grouped path it replaced at M = 32-128)."""
    from moebench.gemm.backends import BACKENDS
    from moebench.gemm.cases import GemmCase
    from moebench.gemm.triton_moe.config import GEMV_MAX_M
    from moebench.gemm.workload import Workload

    assert GEMV_MAX_M == 16
    wl = Workload(GemmCase("tiny", 8, "fused", m, "int4-g32", "decode", "-"), "cpu")
    built = BACKENDS["triton"].build(GemmCase("tiny", 8, "fused", m, "int4-g32", "decode", "triton"), wl)
    assert built.info["config"]["path"] == path


@pytest.mark.parametrize("m", [1, 64])
def test_the_experts_backend_builds_the_expert_major_kernel_at_every_m(m):
    """What triton_experts' cases time, at a decode M and past the pair-major kernel's 16; its packed tiles are
    the very tensors `triton` packs for the pair-major kernel (one copy of the weights, not two)."""
    from moebench.gemm.backends import BACKENDS
    from moebench.gemm.backends.triton_backend import w4_operands
    from moebench.gemm.cases import ROTATIONS, GemmCase
    from moebench.gemm.workload import Workload

    wl = Workload(GemmCase("tiny", 8, "fused", m, "int4-g32", "decode", "-"), "cpu")
    case = GemmCase("tiny", 8, "fused", m, "int4-g32", "decode", "triton_experts")
    built = BACKENDS["triton_experts"].build(case, wl)
    assert (built.info["impl"], built.info["config"]["path"]) == ("moebench.gemm.triton_moe.w4_experts",
                                                                  "w4_mma_experts")
    assert len(built.calls) == ROTATIONS
    assert BACKENDS["triton_experts"].supports(GemmCase("kimi-k2.5", 8, "fused", 128, "int4-g32", "decode",
                                                        "triton_experts"))
    assert w4_operands(wl, kernel="mma_experts")[1] is w4_operands(wl, kernel="mma")[1]


def _pair_up_expert_down_err(M, K, I, topk, down, crowd, seed=1):
    """w4_mma's pair-major up launch, then w4_experts.down_launch on its activations (w4_split --down-experts)."""
    x, w1, w2, tw, ids, ref = _problem(M, K, I, topk, crowd, seed)
    c = w4_mma.plan_call(x, w1, w2, tw, ids, config=(KernelConfig(16, 32, 1), KernelConfig(*down)), pdl=False)
    out = w4_experts.down_launch(c, w4_mma.up_launch(c))
    assert out.shape == (M, K) and not torch.isnan(out).any()
    return ((out.float() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("M, K, I, topk, down, crowd", [
    (3, 64, 32, 2, (32, 32, 2), False),   # pairs spread over the experts
    (9, 96, 64, 2, (64, 64, 4), True),    # 9 pairs on expert 3: two chunks of its down
])
def test_the_expert_major_down_on_the_pair_major_ups_activations_matches_the_reference(interp, M, K, I, topk, down,
                                                                                        crowd):
    """Both up launches write one activation row a (token, slot) pair, so the split can time v5's up with v6's
    down: the pair must compute the MoE."""
    assert interp(_pair_up_expert_down_err, M, K, I, topk, down, crowd) < 1e-2
