"""int4 W4A16 group-32 experts in the 16-row tile layout, and the fused MoE that runs them on tensor cores
(w4_mma_kernel.py).

    pack_tiles16(data, scale) -> W4Tiles          from the generic int4 layout (quant.py): [E, N, K/2]
                                                  bytes (low nibble = even k, stored q + 8), scales [E, N, K/32]
    tiles16_from_compressed_tensors(packed, scale) from vLLM's compressed-tensors tensors as loaded for
                                                  Marlin: int32 [E, K/8, N], scales [E, K/32, N]
    fused_moe_w4_mma(x, w1, w2, topk_weights, topk_ids, config=None) -> [M, K]
    plan_call(...) -> MmaCall; up_launch(call) -> h; down_launch(call, h) -> [M, K]
                                                  its two launches one at a time (w4_split.py times them;
                                                  plan_call(lean="down" or "both"): version 9)

The layout: words int32 [E, N/16, K/32, 32, 2]. Entry [e, T, grp, lane, t] belongs to lane (g, c) =
(lane // 4, lane % 4) of row tile T (rows 16 T .. 16 T + 15) and group grp; its nibble j (bits 4j) holds
row 16 T + g + 8 (j & 1), k 32 grp + 8 c + 4 t + 2 ((j >> 1) & 1) + (j >> 2), stored q + 8. That is the
order in which the kernel's lop3 decode yields mma's A fragment (w4_mma_kernel.py says why). Scales:
int32 [E, N/16, K/32, 8], entry g the bf16 pair (row g low, row g + 8 high). Packing is a one-time cost
at load, done a few experts at a time to bound the temporary memory.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton

from .config import KernelConfig, m_bucket, table_entry
from .w4 import GROUP, use_asm
from .w4_mma_kernel import moebench_w4_mma
from .w4_prefetch import MODES as PREFETCH_MODES

TILE = 16
EXPERTS_PER_PACK = 16  # experts unpacked at once: 16 x 512 x 7168 nibbles = 59 MB of temporaries


@dataclass(frozen=True)
class W4Tiles:
    """One expert weight stack [E, N, K] in the 16-row tile layout."""

    words: torch.Tensor   # int32 [E, N/16, K/32, 32, 2]
    scales: torch.Tensor  # int32 [E, N/16, K/32, 8]: bf16 pairs (row g, row g + 8)

    @property
    def E(self) -> int:
        return self.words.shape[0]

    @property
    def N(self) -> int:
        return TILE * self.words.shape[1]

    @property
    def K(self) -> int:
        return GROUP * self.words.shape[2]


def _check(E: int, N: int, K: int, scale_shape, where: str) -> None:
    if N % TILE or K % GROUP:
        raise ValueError(f"{where}: the 16-row int4 layout needs N % {TILE} == 0 and K % {GROUP} == 0, got N={N}, K={K}")
    if tuple(scale_shape) != (E, N, K // GROUP):
        raise ValueError(f"{where}: scales must be [E, N, K/{GROUP}] = {(E, N, K // GROUP)}, got {tuple(scale_shape)}")


def _tiles(nib: torch.Tensor) -> torch.Tensor:
    """Nibbles [e, N, K] (uint8, 0..15) -> words [e, N/16, K/32, 32, 2] int32."""
    e, N, K = nib.shape
    # row = 16 T + 8 h + g; k = 32 grp + 8 c + 4 t + 2 p + b; nibble j = 4 b + 2 p + h
    v = nib.reshape(e, N // TILE, 2, 8, K // GROUP, 4, 2, 2, 2)            # e T h g grp c t p b
    v = v.permute(0, 1, 4, 3, 5, 6, 8, 7, 2).to(torch.int32)              # e T grp g c t b p h
    v = v.reshape(e, N // TILE, K // GROUP, 32, 2, 8)
    shifts = 4 * torch.arange(8, dtype=torch.int32, device=nib.device)
    # the nibbles' bits do not overlap, so the sum is their OR; int32 wraps like the word's bits
    return (v << shifts).sum(-1, dtype=torch.int32)


def _scales(scale: torch.Tensor) -> torch.Tensor:
    """[e, N, K/32] -> int32 [e, N/16, K/32, 8] of bf16 pairs (row g, row g + 8)."""
    e, N, G = scale.shape
    s = scale.to(torch.bfloat16).reshape(e, N // TILE, 2, 8, G).permute(0, 1, 4, 3, 2)
    return s.contiguous().view(torch.int32).reshape(e, N // TILE, G, 8)


def _pack(nibbles_of, E: int, scale: torch.Tensor) -> W4Tiles:
    """Chunks of experts: nibbles_of(lo, hi) -> [hi - lo, N, K] uint8."""
    words, scales = [], []
    for lo in range(0, E, EXPERTS_PER_PACK):
        hi = min(E, lo + EXPERTS_PER_PACK)
        words.append(_tiles(nibbles_of(lo, hi)))
        scales.append(_scales(scale[lo:hi]))
    return W4Tiles(torch.cat(words), torch.cat(scales))


def pack_tiles16(data: torch.Tensor, scale: torch.Tensor) -> W4Tiles:
    """From the generic int4 layout: data uint8 [E, N, K/2] (low nibble even k), scale [E, N, K/32]."""
    if data.dtype != torch.uint8 or data.dim() != 3:
        raise ValueError(f"int4 data must be uint8 [E, N, K/2], got {data.dtype} {tuple(data.shape)}")
    E, N, K2 = data.shape
    _check(E, N, 2 * K2, scale.shape, "pack_tiles16")

    def nibbles(lo, hi):
        d = data[lo:hi]
        return torch.stack((d & 15, d >> 4), dim=-1).reshape(hi - lo, N, 2 * K2)

    return _pack(nibbles, E, scale)


def tiles16_from_compressed_tensors(packed: torch.Tensor, scale: torch.Tensor) -> W4Tiles:
    """From compressed-tensors W4A16 tensors as vLLM loads them for Marlin: packed int32 [E, K/8, N]
    (value j of a word in bits 4j, stored q + 8: vLLM's uint4b8), scale [E, K/32, N]."""
    if packed.dtype != torch.int32 or packed.dim() != 3:
        raise ValueError(f"packed weights must be int32 [E, K/8, N], got {packed.dtype} {tuple(packed.shape)}")
    E, KW, N = packed.shape
    sc = scale.transpose(1, 2)
    _check(E, N, 8 * KW, sc.shape, "tiles16_from_compressed_tensors")
    shifts = 4 * torch.arange(8, dtype=torch.int32, device=packed.device)

    def nibbles(lo, hi):
        p = packed[lo:hi].transpose(1, 2)                                   # [e, N, K/8]
        return ((p[..., None] >> shifts) & 15).to(torch.uint8).reshape(hi - lo, N, 8 * KW)

    return _pack(nibbles, E, sc)


def mma_config(M: int, K: int, I: int, E: int, topk: int) -> tuple[KernelConfig, KernelConfig]:
    """(up, down) tiles: block_n = rows per program (16 x row tiles), block_k = k per lane set per step
    (32 x groups), num_warps = lane sets x row tiles (the rest split K). The measured table
    (configs.json, `w4mma|K|I|E|topk|M-bucket`, w4_tune.py) first, else a heuristic: up 16 rows over
    4 warps (pairs x I/16 programs), down 16 rows over 4 warps of 2 groups each (I = 256 in one step:
    more steps double-buffer all top-k slots' fragments, 200+ registers)."""
    hit = table_entry(f"w4mma|{K}|{I}|{E}|{topk}|{m_bucket(M)}")
    if hit is not None:
        return KernelConfig(**hit["up"]), KernelConfig(**hit["down"])
    return (KernelConfig(block_n=16, block_k=64, num_warps=4),
            KernelConfig(block_n=16, block_k=64, num_warps=4))


def _own_table_or_mma(prefix: str, M: int, K: int, I: int, E: int, topk: int) -> tuple[KernelConfig, KernelConfig]:
    hit = table_entry(f"{prefix}|{K}|{I}|{E}|{topk}|{m_bucket(M)}")
    if hit is not None:
        return KernelConfig(**hit["up"]), KernelConfig(**hit["down"])
    return mma_config(M, K, I, E, topk)


def lean_mma_config(M: int, K: int, I: int, E: int, topk: int) -> tuple[KernelConfig, KernelConfig]:
    """Version 9's (up, down) tiles: its own measured table (configs.json `w4mma9|K|I|E|topk|M-bucket`, written by
    `w4_tune --kernel mma_lean`) first, else mma_config's; plan_call(lean="both") then applies lean_config."""
    return _own_table_or_mma("w4mma9", M, K, I, E, topk)


def lean_down_mma_config(M: int, K: int, I: int, E: int, topk: int) -> tuple[KernelConfig, KernelConfig]:
    """The tiles of the default up with version 9's down: their own table (configs.json `w4mma9d|...`, written by
    `w4_tune --kernel mma_lean_down`) first, else mma_config's; plan_call(lean="down") applies lean_config to down."""
    return _own_table_or_mma("w4mma9d", M, K, I, E, topk)


def lane_sets(kc: KernelConfig) -> tuple[int, int, int]:
    """(RT, KS, GPI) of a 16-row int4 tile config: row tiles a program takes, lane sets (warps) K is split
    over, groups a lane set walks a step; ValueError for tiles the kernels cannot lay out."""
    rt, gpi = kc.block_n // TILE, kc.block_k // GROUP
    pow2 = lambda v: v >= 1 and v & (v - 1) == 0
    if kc.block_n % TILE or kc.block_k % GROUP or not (pow2(rt) and pow2(gpi) and pow2(kc.num_warps)) \
            or kc.num_warps % rt:
        raise ValueError(f"16-row int4 tiles need block_n = {TILE} x 2^i, block_k = {GROUP} x 2^j and "
                         f"num_warps a power of two multiple of block_n/{TILE}, got {kc}")
    return rt, kc.num_warps // rt, gpi


def lean_config(kc: KernelConfig, K: int) -> KernelConfig:
    """The tiles version 9 (`lean`) runs for kc over K: block_k halved until the lane sets' steps cover K's
    groups exactly (every load then unmasked), down to one group a step; kc itself when it already does."""
    rt, ks, gpi = lane_sets(kc)
    groups = K // GROUP
    while gpi > 1 and groups % (ks * gpi):
        gpi //= 2
    return kc if gpi == kc.block_k // GROUP else replace(kc, block_k=gpi * GROUP)


def lean_unroll(kc: KernelConfig, K: int) -> int:
    """How often version 9 unrolls its K loop at these tiles: twice once the loop has two trips or more (its
    double buffers then swap without register copies), else once."""
    rt, ks, gpi = lane_sets(kc)
    return 2 if K // GROUP // (ks * gpi) >= 3 else 1


def _launch(a, w: W4Tiles, ids, tw, out, *, rows, N, up_rows, slots, a_div, weighted, kc: KernelConfig,
            pdl_wait=False, pdl_trigger=False, prefetch_down=0, down_w: W4Tiles | None = None, lean=False,
            unroll=0):
    rt, ks, gpi = lane_sets(kc)
    av = a.contiguous().view(torch.int32)
    extra = {}
    if lean:
        # version 9 loads without the row-tile mask: every program's tiles must be real rows
        if (N // TILE) % rt:
            raise ValueError(f"lean: {N // TILE} row tiles do not split into programs of {rt}")
        extra.update(LEAN=1, UNROLL=unroll or lean_unroll(kc, w.K))
    if prefetch_down:
        # the kernel addresses expert e's down slice as e x its size: the stacks must be contiguous
        if not (down_w.words.is_contiguous() and down_w.scales.is_contiguous()):
            raise ValueError("prefetch_down needs the down weights' words and scales contiguous")
        extra = dict(w2_ptr=down_w.words, s2_ptr=down_w.scales, PREFETCH_DOWN=prefetch_down)
    moebench_w4_mma[(rows, triton.cdiv(N // TILE, rt))](
        av, w.words, w.scales, ids, tw, out,
        N, av.stride(0), w.words.stride(0), w.words.stride(1), w.scales.stride(0), w.scales.stride(1),
        out.stride(0),
        K=w.K, UP_ROWS=up_rows, SLOTS=slots, SLOTS_P=triton.next_power_of_2(slots), A_DIV=a_div,
        WEIGHTED=weighted, RT=rt, KS=ks, GPI=gpi,
        PDL_WAIT=pdl_wait, PDL_TRIGGER=pdl_trigger, USE_ASM=use_asm(a.device), **extra,
        num_warps=kc.num_warps, num_stages=1, launch_pdl=pdl_wait)


# plan_call's lean: which launches run version 9's K loop (w4_mma_kernel._lean_k_loop). Session 27 measured
# them apart (docs/triton-moe-notes.md, version 9): down's saves time at every M, up's loses it
LEAN_LAUNCHES = {"": (), "up": ("up",), "down": ("down",), "both": ("up", "down")}


@dataclass(frozen=True)
class MmaCall:
    """One fused MoE call resolved for its two launches: the operands as the kernels take them and the
    tiles and PDL choice both launches share. fused_moe_w4_mma runs up_launch then down_launch on it;
    w4_split.py times them apart, so what it times is this call's launches and nothing else."""

    x: torch.Tensor       # bf16 [M, K]
    w1: W4Tiles           # [E, 2I, K]
    w2: W4Tiles           # [E, K, I]
    ids: torch.Tensor     # int32 [M * topk]
    tw: torch.Tensor      # float32 [M * topk]
    topk: int
    up: KernelConfig
    down: KernelConfig
    pdl: bool
    prefetch_down: int = 0  # w4_prefetch.MODES: the up launch prefetches down's weights into L2 (0: off)
    lean: str = ""  # LEAN_LAUNCHES: the launches with version 9's K loop, at lean_config's tiles (plan_call's)
    # how often version 9's up loop is unrolled; 0: lean_unroll's rule. Twice needs 160 registers at Kimi's
    # M = 4-16 tiles (3 programs an SM), once 128 (4): session 27's question whether up's loss is occupancy
    up_unroll: int = 0

    @property
    def lean_up(self) -> bool:
        return "up" in LEAN_LAUNCHES[self.lean]

    @property
    def lean_down(self) -> bool:
        return "down" in LEAN_LAUNCHES[self.lean]

    @property
    def M(self) -> int:
        return self.x.shape[0]

    @property
    def I(self) -> int:
        return self.w1.N // 2


def plan_call(x: torch.Tensor, w1: W4Tiles, w2: W4Tiles, topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
              config: tuple[KernelConfig, KernelConfig] | None = None, pdl: bool | None = None,
              prefetch_down: int = 0, lean: str = "") -> MmaCall:
    """Check the operands and resolve the tiles (default mma_config) and PDL (default: on Hopper or newer)
    of one call; ValueError for a shape or dtype the kernels do not take. prefetch_down: a
    w4_prefetch.MODES value, 0 (off) by default: the up launch prefetches the down launch's weights into L2
    (issue 32's experiment, docs/triton-moe-notes.md). lean: the launches with version 9's K loop
    (w4_mma_kernel._lean_k_loop), a LEAN_LAUNCHES key ("" off, the default; "up", "down" or "both"), each at
    its lean_config tiles (issue 32's experiment)."""
    if lean not in LEAN_LAUNCHES:
        raise ValueError(f"lean must be one of {', '.join(map(repr, LEAN_LAUNCHES))}, got {lean!r}")
    if lean and prefetch_down:
        raise ValueError("plan_call: lean (version 9) and prefetch_down (version 5's L2 prefetch) do not combine")
    if prefetch_down not in PREFETCH_MODES.values():
        raise ValueError(f"prefetch_down must be one of {sorted(PREFETCH_MODES.values())} "
                         f"({', '.join(PREFETCH_MODES)}), got {prefetch_down!r}")
    if x.dtype != torch.bfloat16:
        raise ValueError(f"fused_moe_w4_mma takes bf16 activations, got {x.dtype}")
    M, K = x.shape
    topk = topk_ids.shape[1]
    I = w1.N // 2
    if w1.K != K or w2.N != K or w2.K != I or w1.E != w2.E or I % TILE:
        raise ValueError(f"shape mismatch: x {tuple(x.shape)}, w1 [{w1.E}, {w1.N}, {w1.K}], w2 [{w2.E}, {w2.N}, {w2.K}]")
    up, down = config or mma_config(M, K, I, w1.E, topk)
    if "up" in LEAN_LAUNCHES[lean]:
        up = lean_config(up, K)
    if "down" in LEAN_LAUNCHES[lean]:
        down = lean_config(down, I)
    if pdl is None:
        pdl = x.device.type == "cuda" and torch.cuda.get_device_capability(x.device) >= (9, 0)
    ids = topk_ids.reshape(-1).to(torch.int32).contiguous()
    tw = topk_weights.reshape(-1).to(torch.float32).contiguous()
    return MmaCall(x, w1, w2, ids, tw, topk, up, down, pdl, prefetch_down, lean)


def up_launch(c: MmaCall) -> torch.Tensor:
    """The up launch (gate and up GEMMs, silu(gate) * up), one (token, slot) pair per program row: the
    activations h [M * topk, I]. With PDL it lets the down launch start early (gdc_launch_dependents); with
    c.prefetch_down its programs also prefetch the down weights of their experts into L2."""
    h = torch.empty((c.M * c.topk, c.I), dtype=c.x.dtype, device=c.x.device)
    _launch(c.x, c.w1, c.ids, c.tw, h, rows=c.M * c.topk, N=c.I, up_rows=c.I, slots=1, a_div=c.topk,
            weighted=False, kc=c.up, pdl_trigger=c.pdl, prefetch_down=c.prefetch_down, down_w=c.w2, lean=c.lean_up,
            unroll=c.up_unroll)
    return h


def down_launch(c: MmaCall, h: torch.Tensor) -> torch.Tensor:
    """The down launch on activations h [M * topk, I] (up_launch's), weighted by the top-k weights and
    summed over the slots: out [M, K]. With PDL it streams its weights before waiting for h's writer."""
    out = torch.empty((c.M, c.w2.N), dtype=c.x.dtype, device=c.x.device)
    _launch(h, c.w2, c.ids, c.tw, out, rows=c.M, N=c.w2.N, up_rows=0, slots=c.topk, a_div=1, weighted=True,
            kc=c.down, pdl_wait=c.pdl, lean=c.lean_down)
    return out


def fused_moe_w4_mma(x: torch.Tensor, w1: W4Tiles, w2: W4Tiles, topk_weights: torch.Tensor,
                     topk_ids: torch.Tensor, *, config: tuple[KernelConfig, KernelConfig] | None = None,
                     pdl: bool | None = None, lean: str = "") -> torch.Tensor:
    """fused_moe (api.py) semantics for int4 experts in the 16-row tile layout: x [M, K] bf16,
    w1 [E, 2I, K], w2 [E, K, I]. Two launches (up + silu, then down + top-k sum), one (token, slot)
    pair per up program: for decode M. config: (up, down) KernelConfigs, default mma_config. pdl:
    programmatic dependent launch of the down kernel (default: on Hopper or newer). lean: the launches with
    version 9's K loop (plan_call; "" off). CUDA-graph capturable.
    """
    c = plan_call(x, w1, w2, topk_weights, topk_ids, config=config, pdl=pdl, lean=lean)
    return down_launch(c, up_launch(c))


def fused_moe_w4_mma_lean(x: torch.Tensor, w1: W4Tiles, w2: W4Tiles, topk_weights: torch.Tensor,
                          topk_ids: torch.Tensor, *, config: tuple[KernelConfig, KernelConfig] | None = None,
                          pdl: bool | None = None) -> torch.Tensor:
    """fused_moe_w4_mma with version 9's K loop (w4_kernels' `mma_lean`, which w4_tune sweeps as a kernel), at
    lean_mma_config's tiles by default."""
    if config is None:
        config = lean_mma_config(x.shape[0], x.shape[1], w1.N // 2, w1.E, topk_ids.shape[1])
    return fused_moe_w4_mma(x, w1, w2, topk_weights, topk_ids, config=config, pdl=pdl, lean="both")


def fused_moe_w4_mma_lean_down(x: torch.Tensor, w1: W4Tiles, w2: W4Tiles, topk_weights: torch.Tensor,
                               topk_ids: torch.Tensor, *, config: tuple[KernelConfig, KernelConfig] | None = None,
                               pdl: bool | None = None) -> torch.Tensor:
    """fused_moe_w4_mma with version 9's K loop in the down launch only (w4_kernels' `mma_lean_down`), at
    lean_down_mma_config's tiles by default: session 27 measured version 9's down faster at every M and its up
    slower (docs/triton-moe-notes.md)."""
    if config is None:
        config = lean_down_mma_config(x.shape[0], x.shape[1], w1.N // 2, w1.E, topk_ids.shape[1])
    return fused_moe_w4_mma(x, w1, w2, topk_weights, topk_ids, config=config, pdl=pdl, lean="down")
