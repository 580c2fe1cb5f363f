"""Launch configurations: a table measured on the H200 (configs.json) with heuristics as fallback.

A MoEConfig says which path runs ("gemv" for decode, "grouped" for larger M) and the tile sizes of its
two kernels: `up` (gemm1: w1, or the single GEMM of grouped_gemm) and `down` (gemm2: w2). as_dict()
is the record the harness stores with a result.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from importlib import resources

import triton

M_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
GEMV_MAX_M = 16  # heuristic path switch until the sweep says otherwise


@dataclass(frozen=True)
class KernelConfig:
    """Tiles of one kernel. GEMV ignores block_m; num_stages only matters to the grouped path
    (the GEMV double-buffers by hand)."""

    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 1
    block_m: int = 16
    n_tiles: int = 1  # row tiles one program walks, reusing its activations (the rows-4 down kernel)


@dataclass(frozen=True)
class MoEConfig:
    """path: "gemv" or "grouped". pdl: launch the down kernel with programmatic dependent launch
    (Hopper+), so it starts streaming w2 while the up kernel finishes. source: where it came from
    ("table", "heuristic" or "user")."""

    path: str
    up: KernelConfig
    down: KernelConfig
    pdl: bool = False
    source: str = "user"

    def as_dict(self) -> dict:
        """Plain-JSON record of the configuration."""
        return asdict(self)

    @staticmethod
    def from_dict(d: dict) -> "MoEConfig":
        return MoEConfig(path=d["path"], up=KernelConfig(**d["up"]), down=KernelConfig(**d["down"]),
                         pdl=bool(d.get("pdl", False)), source=d.get("source", "user"))


def m_bucket(M: int) -> int:
    """Smallest table bucket >= M (the largest bucket for bigger M)."""
    return next((b for b in M_BUCKETS if b >= M), M_BUCKETS[-1])


def table_key(op: str, M: int, K: int, N: int, E: int, topk: int, dtype: str) -> str:
    """Key of configs.json: op|K|N|E|topk|dtype|M-bucket, dtype in the gemm family's names ("bf16",
    "int4-g32", ...: moebench.gemm.cases.DTYPES, a Quant's `dtype`)."""
    return f"{op}|{K}|{N}|{E}|{topk}|{dtype}|{m_bucket(M)}"


def _load_table() -> dict:
    text = resources.files(__package__).joinpath("configs.json").read_text()
    return {k: v for k, v in json.loads(text).items() if not k.startswith("_")}


_TABLE = _load_table()


def table_entry(key: str) -> dict | None:
    """The configs.json entry under `key`, or None (other kernels' tables share the file: w4.py)."""
    return _TABLE.get(key)


def config_for(M: int, K: int, N: int, E: int, topk: int, quant=None, *, op: str = "fused",
               pdl: bool = False) -> MoEConfig:
    """Configuration for one call.

    op: "fused" (K = hidden size, N = intermediate size I), "gemm1" or "gemm2" (grouped_gemm: the
    weight is [E, N, K]). quant: a Quant or None (bf16). pdl: allow programmatic dependent launch
    (pass True on Hopper or newer GPUs; the fused path uses it).
    """
    hit = _TABLE.get(table_key(op, M, K, N, E, topk, quant.dtype if quant is not None else "bf16"))
    if hit is not None:
        cfg = replace(MoEConfig.from_dict(hit), source="table")
    else:
        cfg = _heuristic(M, K, N, E, topk, quant, op)
    return replace(cfg, pdl=cfg.pdl and pdl)


def _weight_group(quant) -> int:
    """K granularity the weight format needs a tile to respect."""
    if quant is None:
        return 1
    return 128 if quant.kind == "fp8_w8a8" else quant.group_size


def _heuristic(M, K, N, E, topk, quant, op) -> MoEConfig:
    """Decode (M <= GEMV_MAX_M): GEMV tiles sized to put ~512+ programs on the 132 SMs, each with a
    16 KB+ chunk in flight. Larger M: grouped tl.dot tiles in the style of vLLM's defaults."""
    g = _weight_group(quant)
    pairs = M * topk
    if M <= GEMV_MAX_M:
        # up: rows = pairs, N tiles of the (intermediate) output; K is the long hidden size.
        # <= 32 weight values per thread per chunk (4 warps) keeps registers near 90 (4-6 programs/SM).
        bk = max(512 if quant is None or quant.kind == "fp8_w8a8" else 1024, g)
        bk = min(bk, max(g, triton.next_power_of_2(K)))
        bn = max(2, min(4096 // bk, triton.next_power_of_2(max(1, pairs * N // 512))))
        up = KernelConfig(block_n=bn, block_k=bk, num_warps=4)
        if op == "fused":
            # down: one program per (token, N tile of the hidden size), all top-k slots at once over
            # I; keep slots * block_n * block_k <= 16K elements so the tile stays in 4 warps' registers.
            bk2 = max(triton.next_power_of_2(N), g)
            bn2 = max(1, min(32, 16384 // (triton.next_power_of_2(topk) * bk2)))
            down = KernelConfig(block_n=bn2, block_k=bk2, num_warps=4)
        else:
            down = up
        return MoEConfig("gemv", up, down, pdl=True, source="heuristic")
    bm = 16 if pairs <= 1024 else 32 if pairs <= 4096 else 64
    bk = 128 if quant is not None and quant.kind == "fp8_w8a8" else max(64, g)
    up = KernelConfig(block_n=64, block_k=bk, num_warps=4, num_stages=3, block_m=bm)
    down = KernelConfig(block_n=64, block_k=bk, num_warps=4, num_stages=3, block_m=bm)
    return MoEConfig("grouped", up, down, pdl=False, source="heuristic")
