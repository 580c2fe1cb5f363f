"""Our int4 W4A16 (group 32) decode kernels by name, and which one the suite and the engine hook run.

    mma    w4_mma.py: 16-row weight tiles decoded into tensor-core (mma.sync) fragments; the default
    rows4  w4.py: four rows per 16-byte load, decoded and multiplied on CUDA cores

Each entry packs weights from the generic int4 layout (quant.py) or from vLLM's compressed-tensors
tensors, runs the fused MoE (fused_moe semantics) and picks tiles (its configs.json table, written by
w4_tune.py). On an H200 the mma kernel was 5-17% faster than rows4 at M = 1..16 and 10-16% faster than
Marlin at M = 16, where rows4 was 5% slower on DeepSeek-V3 (docs/triton-moe-notes.md, version 5).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from . import w4, w4_mma


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
    "rows4": W4Kernel("rows4", w4.pack_rows4, w4.from_compressed_tensors, w4.fused_moe_w4, w4.w4_config, "w4"),
}
DEFAULT = "mma"


def get(name: str | None = None) -> W4Kernel:
    """The kernel called `name` (default DEFAULT); ValueError naming the known ones otherwise."""
    name = name or DEFAULT
    if name not in KERNELS:
        raise ValueError(f"int4 decode kernel {name!r}: not one of {', '.join(KERNELS)}")
    return KERNELS[name]
