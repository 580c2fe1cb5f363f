"""The tensor-core int4 decode kernel (triton_moe/w4_mma.py) on CPU: its 16-row tile layout from both
sources it is packed from, bad tiles and weights refused, and the kernel (Triton's interpreter, the
plain-Triton lane formula) against the float32 reference. The inline PTX itself: test_w4_mma_asm.py."""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import moebench.gemm.triton_moe as tm  # noqa: E402
from moebench.gemm.triton_moe import w4_kernels, w4_mma  # noqa: E402
from moebench.gemm.triton_moe.config import KernelConfig  # noqa: E402
from int4_problems import int4_problem, rel_error  # noqa: E402

E = 8


def _quantized(E, N, K, seed=0):
    g = torch.Generator().manual_seed(seed)
    data, scale, _ = tm.quantize_weight(torch.randn(E, N, K, generator=g), "int4_w4a16", 32)
    return data, scale


def _nibbles(data):
    """uint8 [E, N, K/2] (low nibble = even k) -> [E, N, K] stored values."""
    return torch.stack((data & 15, data >> 4), dim=-1).reshape(*data.shape[:2], -1)


def test_each_word_nibble_holds_the_row_and_k_the_layout_promises():
    data, scale = _quantized(2, 32, 64)
    p = w4_mma.pack_tiles16(data, scale)
    nib = _nibbles(data)
    assert p.words.shape == (2, 2, 2, 32, 2) and p.scales.shape == (2, 2, 2, 8) and (p.E, p.N, p.K) == (2, 32, 64)
    for T, grp, lane, t, j in [(0, 0, 0, 0, 0), (1, 1, 31, 1, 7), (0, 1, 13, 0, 5), (1, 0, 6, 1, 2), (0, 0, 22, 1, 3)]:
        g, c = lane // 4, lane % 4
        row = 16 * T + g + 8 * (j & 1)
        k = 32 * grp + 8 * c + 4 * t + 2 * ((j >> 1) & 1) + (j >> 2)
        word = int(p.words[1, T, grp, lane, t]) & 0xFFFFFFFF
        assert (word >> (4 * j)) & 15 == int(nib[1, row, k]), (T, grp, lane, t, j)
    # scale word g: bf16 of row g (low half) and row g + 8 (high half)
    pair = p.scales[1, 1, 1].view(torch.bfloat16).reshape(8, 2)
    assert torch.equal(pair[:, 0], scale[1, 16:24, 1].bfloat16()) and torch.equal(pair[:, 1], scale[1, 24:32, 1].bfloat16())


def test_compressed_tensors_tensors_pack_to_the_same_tiles():
    data, scale = _quantized(3, 32, 64)
    # vLLM's loaded compressed-tensors tensors for Marlin: int32 [E, K/8, N], scales [E, K/32, N]
    ct = w4_mma.tiles16_from_compressed_tensors(data.view(torch.int32).transpose(1, 2).contiguous(),
                                                scale.transpose(1, 2).contiguous())
    ref = w4_mma.pack_tiles16(data, scale)
    assert torch.equal(ct.words, ref.words) and torch.equal(ct.scales, ref.scales)


def test_packing_in_expert_chunks_changes_nothing(monkeypatch):
    data, scale = _quantized(5, 16, 32)
    whole = w4_mma.pack_tiles16(data, scale)
    monkeypatch.setattr(w4_mma, "EXPERTS_PER_PACK", 2)  # 5 experts in chunks of 2, 2, 1
    chunked = w4_mma.pack_tiles16(data, scale)
    assert torch.equal(whole.words, chunked.words) and torch.equal(whole.scales, chunked.scales)


@pytest.mark.parametrize("bad, needle", [
    (lambda d, s: (d[:, :24], s[:, :24]), "N % 16 == 0"),
    (lambda d, s: (d, s[:, :, :1]), "scales must be [E, N, K/32]"),
    (lambda d, s: (d.to(torch.int32), s), "must be uint8"),
])
def test_bad_weights_are_refused_in_one_line(bad, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        w4_mma.pack_tiles16(*bad(*_quantized(2, 32, 64)))


@pytest.mark.parametrize("up", [(24, 64, 4), (16, 48, 4), (32, 64, 1), (16, 64, 6)])
def test_tiles_the_kernel_cannot_lay_out_are_refused_before_launch(up):
    d, s = _quantized(2, 64, 64)
    w1 = w4_mma.pack_tiles16(d, s)
    w2 = w4_mma.pack_tiles16(*_quantized(2, 64, 32))
    x = torch.zeros(1, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="16-row int4 tiles need"):
        w4_mma.fused_moe_w4_mma(x, w1, w2, torch.ones(1, 1), torch.zeros(1, 1, dtype=torch.int32),
                                config=(KernelConfig(*up), KernelConfig(16, 32, 4)), pdl=False)


def _fused_err(M, K, I, topk, up, down, seed=0):
    pb = int4_problem(M, K, I, topk, E, seed)
    out = w4_mma.fused_moe_w4_mma(pb.x, w4_mma.pack_tiles16(pb.d1, pb.q.scales[0]), w4_mma.pack_tiles16(pb.d2, pb.q.scales[1]), pb.tw, pb.ids,
               config=(KernelConfig(*up), KernelConfig(*down)), pdl=False)
    return rel_error(out, pb.reference())


@pytest.mark.parametrize("M, K, I, topk, up, down", [
    (1, 64, 32, 2, (16, 32, 1), (16, 32, 1)),      # one group per step, one lane set
    (3, 256, 32, 4, (16, 64, 2), (32, 32, 2)),     # 8 groups over 2 lane sets x 2 per step; 2 row tiles
    (2, 96, 64, 2, (32, 64, 4), (64, 64, 4)),      # 3 groups: the last step's second group is masked
    (2, 160, 32, 2, (16, 32, 4), (64, 32, 4)),     # 10 down tiles in programs of 4: the last runs past N
])
def test_fused_moe_w4_mma_matches_the_float32_reference(interp, M, K, I, topk, up, down):
    assert interp(_fused_err, M, K, I, topk, up, down) < 1e-2


def test_the_default_int4_kernel_is_known_and_unknown_names_are_refused():
    # mma is the default since a suite run measured it beside rows4 and Marlin (w4_kernels.py)
    assert w4_kernels.get().name == w4_kernels.DEFAULT == "mma"
    with pytest.raises(ValueError, match="'nope': not one of mma, mma_lean, mma_lean_down, rows4"):
        w4_kernels.get("nope")


@pytest.mark.parametrize("backend, impl, path", [("triton", "w4_mma", "w4_mma"), ("triton_rows4", "w4", "w4_rows4")])
def test_each_triton_backend_builds_its_own_int4_decode_kernel(backend, impl, path):
    """What each backend's cases time (the kernels themselves meet the float32 reference above and in
    test_w4.py; the suite's runner.check runs before every timing)."""
    from moebench.gemm.backends import BACKENDS
    from moebench.gemm.cases import ROTATIONS, GemmCase
    from moebench.gemm.workload import Workload

    case = GemmCase("tiny", 8, "fused", 1, "int4-g32", "decode", backend)
    built = BACKENDS[backend].build(case, Workload(GemmCase("tiny", 8, "fused", 1, "int4-g32", "decode", "-"), "cpu"))
    assert (built.info["impl"], built.info["config"]["path"]) == (f"moebench.gemm.triton_moe.{impl}", path)
    assert len(built.calls) == ROTATIONS  # one per rotation


def test_the_rows4_backend_is_a_decode_kernel_for_int4_g32_fused_only():
    from moebench.gemm.backends import BACKENDS
    from moebench.gemm.cases import GemmCase

    mma = BACKENDS["triton_rows4"]
    case = lambda m, dtype="int4-g32", op="fused": GemmCase("kimi-k2.5", 8, op, m, dtype, "decode", "triton_rows4")  # noqa: E731
    assert mma.supports(case(1)) and mma.supports(case(16))
    assert not mma.supports(case(32)) and not mma.supports(case(1, "bf16")) and not mma.supports(case(1, op="gemm1"))
    assert mma.unavailable(case(32), "cuda", (9, 0)) == "triton_rows4 is a decode kernel for M <= 16, the case has M = 32"
    assert mma.unavailable(case(1), "cuda", (7, 5)).startswith("triton_rows4 with int4-g32 needs compute capability >= 8.0")


# ---- version 9 (`lean`): the same sums in fewer instructions -------------------------------------------

def _lean_pair(M, K, I, topk, up, down, seed=0):
    """The call's output with version 9's K loop (at lean_config's tiles), with the default loop at those same
    tiles, and with the default loop at the tiles asked for; and the first's error against the reference."""
    pb = int4_problem(M, K, I, topk, E, seed)
    w1, w2 = w4_mma.pack_tiles16(pb.d1, pb.q.scales[0]), w4_mma.pack_tiles16(pb.d2, pb.q.scales[1])

    def run(config, lean):
        c = w4_mma.plan_call(pb.x, w1, w2, pb.tw, pb.ids, config=config, pdl=False, lean=lean)
        return w4_mma.down_launch(c, w4_mma.up_launch(c)), (c.up, c.down)

    lean_out, tiles = run((KernelConfig(*up), KernelConfig(*down)), "both")
    down_only, down_tiles = run((KernelConfig(*up), KernelConfig(*down)), "down")
    return {"lean": (lean_out, tiles), "default_same_tiles": run(tiles, "")[0],
            "default": run((KernelConfig(*up), KernelConfig(*down)), "")[0],
            "down_only": (down_only, down_tiles), "default_down_tiles": run(down_tiles, "")[0]}, \
        rel_error(lean_out, pb.reference())


@pytest.mark.parametrize("M, K, I, topk, up, down, lean_k", [
    (1, 256, 32, 2, (16, 64, 2), (16, 32, 1), (64, 32)),     # 8 groups, 2 lane sets x 2: 2 steps, unmasked
    (2, 512, 64, 4, (16, 32, 2), (32, 64, 2), (32, 64)),     # 16 groups, 8 steps: the loop unrolled twice
    (1, 192, 64, 2, (16, 64, 4), (16, 64, 2), (32, 32)),     # 6 groups over 4 lane sets, 2 over 2: halved
    (3, 96, 32, 2, (32, 64, 2), (32, 32, 2), (32, 32)),      # 3 groups: block_k halved, 2 row tiles a program
])
def test_lean_gives_the_default_kernels_result_bit_for_bit_at_the_same_tiles(interp, M, K, I, topk, up, down,
                                                                             lean_k):
    """Version 9 changes how the loads are addressed, masked and unrolled, not the sums or their order: at the
    tiles lean_config chose (block_k halved until the steps cover K's groups) its output equals the default
    loop's exactly. Where it halved block_k, the groups fall to other lane sets: against the default at the tiles
    asked for, only the reference's bound holds. lean="down" keeps the up tiles asked for and gives the default's
    result at its own tiles too."""
    outs, err = interp(_lean_pair, M, K, I, topk, up, down)
    lean_out, (lean_up, lean_down) = outs["lean"]
    assert (lean_up.block_k, lean_down.block_k) == lean_k
    assert torch.equal(lean_out, outs["default_same_tiles"])
    assert err < 1e-2
    if lean_k == (up[1], down[1]):
        assert torch.equal(lean_out, outs["default"])
    down_only, (d_up, d_down) = outs["down_only"]
    assert (d_up.block_k, d_down.block_k) == (up[1], lean_k[1])
    assert torch.equal(down_only, outs["default_down_tiles"])


def test_lean_config_makes_every_step_whole_and_unrolls_loops_of_two_trips_or_more():
    kimi = 7168 // 32  # 224 groups
    assert w4_mma.lean_config(KernelConfig(16, 128, 4), 7168) == KernelConfig(16, 128, 4)  # 4 x 4: 14 steps
    assert w4_mma.lean_config(KernelConfig(16, 128, 16), 7168) == KernelConfig(16, 64, 16)  # 16 x 4 = 64 ∤ 224
    assert w4_mma.lean_config(KernelConfig(32, 128, 4), 256) == KernelConfig(32, 128, 4)    # down: one step
    assert w4_mma.lean_config(KernelConfig(16, 128, 4), 96) == KernelConfig(16, 32, 4)      # 3 groups, 4 lane sets
    assert kimi % (16 * 2) == 0
    assert w4_mma.lean_unroll(KernelConfig(16, 128, 4), 7168) == 2
    assert w4_mma.lean_unroll(KernelConfig(32, 128, 4), 256) == 1  # no loop
    assert w4_mma.lean_unroll(KernelConfig(16, 64, 2), 256) == 1   # 8 groups, steps of 4: one trip
    assert w4_mma.lean_unroll(KernelConfig(16, 32, 2), 256) == 2   # steps of 2: three trips


def test_lean_and_the_l2_prefetch_are_refused_together():
    """Version 9's loop has no prefetch of down's weights: asking for both is an error, not a silent drop."""
    pb = int4_problem(1, 64, 32, 2, E, 0)
    w1, w2 = w4_mma.pack_tiles16(pb.d1, pb.q.scales[0]), w4_mma.pack_tiles16(pb.d2, pb.q.scales[1])
    with pytest.raises(ValueError, match="lean .* and prefetch_down .* do not combine"):
        w4_mma.plan_call(pb.x, w1, w2, pb.tw, pb.ids, pdl=False, lean="both", prefetch_down=1)


@pytest.mark.parametrize("lean", [True, "all", "Down"])
def test_plan_call_names_the_lean_values_it_takes(lean):
    """lean says which launches run version 9 (w4_mma.LEAN_LAUNCHES); anything else, the boolean it once was
    included, is refused with the values it takes rather than read as on or off."""
    pb = int4_problem(1, 64, 32, 2, E, 0)
    w1, w2 = w4_mma.pack_tiles16(pb.d1, pb.q.scales[0]), w4_mma.pack_tiles16(pb.d2, pb.q.scales[1])
    with pytest.raises(ValueError, match=f"lean must be one of '', 'up', 'down', 'both', got {lean!r}"):
        w4_mma.plan_call(pb.x, w1, w2, pb.tw, pb.ids, pdl=False, lean=lean)


def test_lean_refuses_row_tiles_that_do_not_fill_their_programs():
    """Version 9 drops the row-tile mask, so 10 tiles in programs of 4 must be refused, not read past N."""
    pb = int4_problem(2, 160, 32, 2, E, 0)
    w1, w2 = w4_mma.pack_tiles16(pb.d1, pb.q.scales[0]), w4_mma.pack_tiles16(pb.d2, pb.q.scales[1])
    c = w4_mma.plan_call(pb.x, w1, w2, pb.tw, pb.ids, config=(KernelConfig(16, 32, 4), KernelConfig(64, 32, 4)),
                         pdl=False, lean="both")
    with pytest.raises(ValueError, match="lean: 10 row tiles do not split into programs of 4"):
        w4_mma.down_launch(c, torch.zeros(4, 32, dtype=torch.bfloat16))


def test_mma_lean_is_a_kernel_w4_tune_can_sweep_and_it_launches_version_9(monkeypatch):
    """w4_kernels' `mma_lean` is fused_moe_w4_mma with LEAN on in both launches, at its own table's tiles (the
    `w4mma9` keys w4_tune writes for it), else mma's."""
    from moebench.gemm.triton_moe import w4_tune

    k = w4_kernels.get("mma_lean")
    assert k.config is w4_mma.lean_mma_config and k.table_prefix == "w4mma9"
    assert w4_tune.UP_TILES["mma_lean"] == w4_tune.UP_TILES["mma"]
    assert k.config(1, 7168, 256, 384, 8) == w4_mma.mma_config(1, 7168, 256, 384, 8)  # no w4mma9 entry yet
    own = {"up": {"block_n": 16, "block_k": 64, "num_warps": 16}, "down": {"block_n": 16, "block_k": 128, "num_warps": 2}}
    monkeypatch.setattr(w4_mma, "table_entry", lambda key: own if key == "w4mma9|7168|256|384|8|1" else None)
    assert k.config(1, 7168, 256, 384, 8) == (KernelConfig(16, 64, 16), KernelConfig(16, 128, 2))
    monkeypatch.undo()
    launches = []
    monkeypatch.setattr(w4_mma, "moebench_w4_mma", type("Rec", (), {
        "__getitem__": lambda self, grid: lambda *a, **kw: launches.append(kw)})())
    pb = int4_problem(1, 256, 32, 2, E, 0)
    w1, w2 = w4_mma.pack_tiles16(pb.d1, pb.q.scales[0]), w4_mma.pack_tiles16(pb.d2, pb.q.scales[1])
    k.fused_moe(pb.x, w1, w2, pb.tw, pb.ids, pdl=False)
    assert [kw.get("LEAN") for kw in launches] == [1, 1]
    launches.clear()
    w4_kernels.get("mma").fused_moe(pb.x, w1, w2, pb.tw, pb.ids, pdl=False)
    assert [kw.get("LEAN") for kw in launches] == [None, None]
    launches.clear()
    w4_kernels.get("mma_lean_down").fused_moe(pb.x, w1, w2, pb.tw, pb.ids, pdl=False)
    assert [kw.get("LEAN") for kw in launches] == [None, 1]  # mma's up, version 9's down


def test_mma_lean_down_reads_its_own_table_then_mmas(monkeypatch):
    from moebench.gemm.triton_moe import w4_tune

    k = w4_kernels.get("mma_lean_down")
    assert k.config is w4_mma.lean_down_mma_config and k.table_prefix == "w4mma9d"
    assert w4_tune.DOWN_TILES["mma_lean_down"] == w4_tune.DOWN_TILES["mma"]
    assert k.config(16, 7168, 256, 384, 8) == w4_mma.mma_config(16, 7168, 256, 384, 8)
    own = {"up": {"block_n": 16, "block_k": 128, "num_warps": 4}, "down": {"block_n": 16, "block_k": 128, "num_warps": 2}}
    monkeypatch.setattr(w4_mma, "table_entry", lambda key: own if key == "w4mma9d|7168|256|384|8|16" else None)
    assert k.config(16, 7168, 256, 384, 8) == (KernelConfig(16, 128, 4), KernelConfig(16, 128, 2))
    assert k.config(1, 7168, 256, 384, 8) == w4_mma.mma_config(1, 7168, 256, 384, 8)  # not mma_lean's w4mma9


def test_up_unroll_overrides_lean_unrolls_rule_in_the_up_launch_only(monkeypatch):
    """MmaCall.up_unroll (w4_split's up_lean_u1) sets version 9's UNROLL in the up launch, where lean_unroll's rule
    would unroll twice (16 groups in steps of 2: 8 trips); 0 keeps the rule."""
    from dataclasses import replace

    launches = []
    monkeypatch.setattr(w4_mma, "moebench_w4_mma", type("Rec", (), {
        "__getitem__": lambda self, grid: lambda *a, **kw: launches.append(kw)})())
    pb = int4_problem(1, 512, 32, 2, E, 0)
    w1, w2 = w4_mma.pack_tiles16(pb.d1, pb.q.scales[0]), w4_mma.pack_tiles16(pb.d2, pb.q.scales[1])
    c = w4_mma.plan_call(pb.x, w1, w2, pb.tw, pb.ids, config=(KernelConfig(16, 32, 2), KernelConfig(16, 32, 1)),
                         pdl=False, lean="both")
    w4_mma.up_launch(c)
    w4_mma.up_launch(replace(c, up_unroll=1))
    assert [kw["UNROLL"] for kw in launches] == [2, 1]
