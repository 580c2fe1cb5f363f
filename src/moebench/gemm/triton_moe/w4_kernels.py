"""Our int4 W4A16 (group 32) decode kernels by name, and the one the `triton` backend runs.

    mma    w4_mma.py: 16-row weight tiles decoded into tensor-core (mma.sync) fragments; the default:
           the `triton` backend's int4-g32 decode cases and the `moebench_mma` engine hook run it
           (version 5 in docs/triton-moe-notes.md)
    rows4  w4.py: four rows per 16-byte load, decoded and multiplied on CUDA cores; the
           `triton_rows4` backend and the `moebench_w4` engine hook run it (version 4 in the notes)
    mma_lean  w4_mma.py with version 9's K loop in both launches (LEAN: the same sums in fewer instructions;
           opt-in, issue 32's experiment): w4_tune sweeps its tiles as a kernel of its own. Session 27 (an
           H100): its up slower at every M (160 registers at M = 4-16, halved block_k at M = 1), its down faster
    mma_lean_down  mma's up with version 9's down (w4_mma.plan_call(lean="down"); opt-in, the candidate that
           session 27's split points to), its own table `w4mma9d`. Session 28 (two H100s): 3.5% under mma at
           M = 1, 5.4-6.5% at M = 4-16; not the default until an H200 reads the same (the notes' next call)
    mma_experts  w4_experts.py: mma's weights and decode, one program per expert and row tile with up to 8 of
           the expert's tokens as mma's 8 columns; the `triton_experts` backend runs it at every M, and `triton`
           above M = 16, where tokens share experts (session 20's measurement: version 6 in the notes)

Each entry packs weights from the generic int4 layout (quant.py) or from vLLM's compressed-tensors
tensors, runs the fused MoE (fused_moe semantics) and picks tiles (its configs.json table, written by
w4_tune.py). Why mma is the default: measured beside rows4 and Marlin in one suite run on a fresh H200
(2026-12-01, 733d5c3, graph time per call, 16 routings) it was faster than rows4 at every M <= 16 on
Kimi-K2.5 and DeepSeek-V3 (Kimi M = 1: 14.3 against 16.1 us, Marlin 34.8; M = 16: 126.5 against 151.0,
Marlin 152.0), and inside the engine (5.59 against 5.73 ms/token, Marlin 6.88). The committed H200
baselines re-measure both (docs/baseline-runs.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from . import w4, w4_experts, w4_mma


@dataclass(frozen=True)
class W4Kernel:
    name: str
    pack: Callable            # (data uint8 [E, N, K/2], scale [E, N, K/32]) -> packed weight
    from_compressed_tensors: Callable  # (int32 [E, K/8, N], scale [E, K/32, N]) -> packed weight
    fused_moe: Callable       # (x, w1, w2, topk_weights, topk_ids, *, config=None, pdl=None) -> [M, K]
    config: Callable          # (M, K, I, E, topk) -> (up, down) KernelConfigs
    table_prefix: str         # its configs.json keys: PREFIX|K|I|E|topk|M-bucket


KERNELS = {
    "mma": W4Kernel("mma", w4_mma.pack_tiles16, w4_mma.tiles16_from_compressed_tensors, w4_mma.fused_moe_w4_mma,
                    w4_mma.mma_config, "w4mma"),
    "mma_lean": W4Kernel("mma_lean", w4_mma.pack_tiles16, w4_mma.tiles16_from_compressed_tensors,
                         w4_mma.fused_moe_w4_mma_lean, w4_mma.lean_mma_config, "w4mma9"),
    "mma_lean_down": W4Kernel("mma_lean_down", w4_mma.pack_tiles16, w4_mma.tiles16_from_compressed_tensors,
                              w4_mma.fused_moe_w4_mma_lean_down, w4_mma.lean_down_mma_config, "w4mma9d"),
    "rows4": W4Kernel("rows4", w4.pack_rows4, w4.from_compressed_tensors, w4.fused_moe_w4, w4.w4_config, "w4"),
    "mma_experts": W4Kernel("mma_experts", w4_mma.pack_tiles16, w4_mma.tiles16_from_compressed_tensors,
                            w4_experts.fused_moe_w4_experts, w4_experts.experts_config, "w4mmax"),
}
DEFAULT = "mma"


def get(name: str | None = None) -> W4Kernel:
    """The kernel called `name` (default DEFAULT); ValueError naming the known ones otherwise."""
    name = name or DEFAULT
    if name not in KERNELS:
        raise ValueError(f"int4 decode kernel {name!r}: not one of {', '.join(KERNELS)}")
    return KERNELS[name]
