"""Allreduce cases: a frozen record of named axes, its id / baseline key / definition, and the selection.

Pure Python (no torch): imported at collection time and by the spawned ranks alike.

A case is one (backend, world size, env variant, hidden, tokens, dtype, mode, transport). Cases that
share (backend, world size, env variant, transport) form a *group*: one set of spawned ranks measures all
the selected cases of a group in one go, because starting NCCL ranks costs seconds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterator

from moebench.allreduce.transport import TRANSPORTS
from moebench.core.kinds import DEVICE_COLLECTIVE, HOST_BOUND
from moebench.core.timing import StopRule

# --- axes -----------------------------------------------------------------------------------------
BACKENDS = ("nccl", "vllm_custom_ar", "gloo")
WORLDS = (2, 4, 8)
GLOO_WORLDS = (2,)  # gloo is the CPU family that runs in CI: two ranks on a 2-core box
HIDDENS = (7168, 6144)  # Kimi-K2.5 / DeepSeek-V3, GLM-5
DECODE_TOKENS = (1, 2, 4, 8, 16, 32, 64)
PREFILL_TOKENS = (512, 4096, 8192)
TOKENS = DECODE_TOKENS + PREFILL_TOKENS
DTYPES = {"bf16": 2, "fp32": 4}  # name -> bytes per element
MODES = ("graph", "eager")

# Env variants of NCCL (one launch each: NCCL reads its environment once, at init). "" is NCCL's own
# choice. Names are single tokens so ids stay split-able on "-".
VARIANTS: dict[str, dict[str, str]] = {
    "": {},
    "protoLL": {"NCCL_PROTO": "LL"},
    "protoLL128": {"NCCL_PROTO": "LL128"},
    "protoSimple": {"NCCL_PROTO": "Simple"},
}  # (NCCL_P2P_DISABLE is the `pcie` transport: moebench.allreduce.transport)

# Always in every rank's environment: NVLink multicast (NVLS) can take a shared host's GPUs out of
# service, so it stays off whatever the case (shared/gpu/README.md).
SAFETY_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

# vLLM's CustomAllreduce default max_size (8 MiB): should_custom_ar() is false at or above it and
# vLLM falls back to NCCL there, so those sizes are not custom-allreduce cases.
VLLM_CUSTOM_AR_MAX_BYTES = 8192 * 1024

# How a sample is taken. K allreduces on K distinct buffers per sample (per graph replay in graph
# mode); per-op latency = sample time / K. Large messages use fewer buffers: launch overhead no longer
# matters there, and K copies of a 235 MB message (plus the pristine source) would be a lot of memory.
OPS_PER_SAMPLE = 10
OPS_PER_SAMPLE_LARGE = 2
LARGE_BYTES = 16 << 20
GPU_RULE = StopRule(min_samples=50, max_samples=400, max_seconds=2.0, target_noise=0.01)
CPU_RULE = StopRule(min_samples=10, max_samples=40, max_seconds=0.5, target_noise=0.02)
WARMUP_ROUNDS = 3
# Gate tolerances, from two runs of the same code on two H200s (NVLink) a few minutes apart: decode-size
# messages (<= 1 MiB) moved -30%..+41% between runs (each run's own spread 5-40%), prefill sizes +6..+11%.
# Each spawned process group sets NCCL up anew (channels, protocol choice), which small messages feel.
# Eager decode sizes are host-bound (K launches from each rank's Python loop inside the timed region):
# a second pair of runs on another H200 host (2026-11-30) moved NCCL eager decode sizes by +10..+98%
# (27 -> 53 us at 28 KB) while graph mode, the way engines run them, stayed inside -21..+38%.
# gloo runs on the host's CPU cores over loopback TCP, beside whatever else the box runs: on the H200
# hosts its latency moved by up to +42% between runs (1 token, sessions 2-3) and +29.5% at 64 tokens fp32
# (1049 -> 1358 us, session 3), whatever the size.
DECODE_SIZE_BYTES = 1 << 20
LATENCY_REL_TOL_GLOO = 0.50
LATENCY_REL_TOL_DECODE = 0.50
LATENCY_REL_TOL_DECODE_EAGER = 1.00
LATENCY_REL_TOL_PREFILL = 0.15


def latency_kind(case: "AllreduceCase") -> str:
    """What a case's latency is bound by (moebench.core.kinds): gloo (CPU) and decode sizes are host-bound
    (eager +10..+98%, graph mode -21..+38% between two H200 hosts, above); prefill sizes a device collective."""
    if case.backend == "gloo" or case.nbytes <= DECODE_SIZE_BYTES:
        return HOST_BOUND
    return DEVICE_COLLECTIVE


def latency_rel_tol(case: "AllreduceCase") -> float:
    """The stored tolerance for a case's latency: looser for decode sizes, loosest for eager ones, and
    gloo's (CPU) at its own measured spread (see above)."""
    if case.backend == "gloo":
        return LATENCY_REL_TOL_GLOO
    if case.nbytes > DECODE_SIZE_BYTES:
        return LATENCY_REL_TOL_PREFILL
    return LATENCY_REL_TOL_DECODE_EAGER if case.mode == "eager" else LATENCY_REL_TOL_DECODE


PATTERN = "v[i] = ((7*i + 3*rank) % 13) + 1, exact sums; result compared element by element"


@dataclass(frozen=True)
class AllreduceCase:
    """One allreduce measurement: backend, world size, env variant, message shape, dtype, mode, and the
    transport NCCL is steered to (moebench.allreduce.transport)."""

    backend: str
    world: int
    variant: str
    dtype: str
    hidden: int
    tokens: int
    mode: str
    transport: str = "auto"

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r} (known: {BACKENDS})")
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r} (known: {tuple(DTYPES)})")
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r} (known: {MODES})")
        if self.variant not in VARIANTS:
            raise ValueError(f"unknown env variant {self.variant!r} (known: {tuple(VARIANTS)})")
        if self.variant and self.backend != "nccl":
            raise ValueError("env variants are NCCL settings: only the nccl backend has them")
        if self.transport not in TRANSPORTS:
            raise ValueError(f"unknown transport {self.transport!r} (known: {tuple(TRANSPORTS)})")
        if self.transport != "auto" and self.backend != "nccl":
            raise ValueError("transports steer NCCL: only the nccl backend has them")
        if self.backend == "gloo" and self.mode != "eager":
            raise ValueError("gloo runs on CPU: eager only (no CUDA graphs)")
        if self.world < 2:
            raise ValueError("an allreduce needs at least 2 ranks")

    # --- shape ------------------------------------------------------------------------------
    @property
    def numel(self) -> int:
        """Elements per rank: tokens x hidden."""
        return self.tokens * self.hidden

    @property
    def nbytes(self) -> int:
        """Message size per rank in bytes."""
        return self.numel * DTYPES[self.dtype]

    @property
    def ops_per_sample(self) -> int:
        """K: allreduces (on K distinct buffers) per timed sample."""
        return OPS_PER_SAMPLE_LARGE if self.nbytes > LARGE_BYTES else OPS_PER_SAMPLE

    @property
    def on_gpu(self) -> bool:
        return self.backend != "gloo"

    @property
    def rule(self) -> StopRule:
        """The stopping rule every rank applies (the ranks stop together: see sampling.py)."""
        return GPU_RULE if self.on_gpu else CPU_RULE

    @property
    def env(self) -> dict[str, str]:
        """Environment this case's ranks run with, beyond the inherited one."""
        extra = {}
        if self.backend == "vllm_custom_ar":
            # vLLM's own P2P test needs vLLM's world group, which a bare CustomAllreduce does not have;
            # with this set it trusts the driver's P2P report (torch.cuda.can_device_access_peer).
            extra["VLLM_SKIP_P2P_CHECK"] = "1"
        return {**SAFETY_ENV, **VARIANTS[self.variant], **TRANSPORTS[self.transport], **extra}

    # --- names ------------------------------------------------------------------------------
    @property
    def group(self) -> str:
        """The launch this case belongs to: one set of ranks per (backend, world size, env variant,
        transport)."""
        return group_name(self.backend, self.world, self.variant, self.transport)

    @property
    def id(self) -> str:
        """Test id, e.g. 'nccl-w2-h7168-t1-bf16-graph' (variant and transport appended when not NCCL's
        default: 'nccl-w2-h7168-t1-bf16-graph-pcie')."""
        parts = [self.backend, f"w{self.world}", f"h{self.hidden}", f"t{self.tokens}", self.dtype, self.mode]
        if self.variant:
            parts.append(self.variant)
        if self.transport != "auto":
            parts.append(self.transport)
        return "-".join(parts)

    @property
    def key(self) -> str:
        """Baseline key, e.g. 'allreduce[nccl-w2-h7168-t1-bf16-graph]'."""
        return f"allreduce[{self.id}]"

    @property
    def bench_group(self) -> str:
        """pytest-benchmark group: one table per launch and mode."""
        return f"allreduce {self.group} {self.mode}"

    def definition(self) -> dict:
        """Everything that shapes the measurement; its hash changing makes a stored entry STALE."""
        r = self.rule
        return {
            "op": "allreduce", "reduce_op": "sum", "backend": self.backend, "world": self.world,
            "variant": self.variant or "default", "env": self.env, "hidden": self.hidden, "tokens": self.tokens,
            "dtype": self.dtype, "bytes": self.nbytes, "mode": self.mode,
            "ops_per_sample": self.ops_per_sample, "distinct_buffers": self.ops_per_sample,
            "timer": "cuda-events" if self.on_gpu else "perf_counter",
            "timed_region": "one replay of a torch.cuda.graph holding K allreduces, per-op = time / K"
                            if self.mode == "graph" else "K eager allreduce calls, per-op = time / K",
            "sync": "ranks stop on a MIN vote each sample; " + (
                "a tiny allreduce enqueued before the start event aligns the ranks on the GPU" if self.on_gpu
                else "the vote (a blocking collective) aligns the ranks"),
            "refill": "K buffers refilled from a pristine copy before each sample, outside the timed region",
            "stop_rule": {"min_samples": r.min_samples, "max_samples": r.max_samples,
                          "max_seconds": r.max_seconds, "target_noise": r.target_noise},
            "warmup_rounds": WARMUP_ROUNDS, "statistic": "median of the slowest rank",
            "check": PATTERN,
            # Named only when steered: the cases recorded before the transport axis existed were NCCL's
            # own choice, and their stored definitions stay valid.
            **({"transport": self.transport} if self.transport != "auto" else {}),
        }

    def to_json(self) -> dict:
        """Axes only (what a rank needs to rebuild the case)."""
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "AllreduceCase":
        return cls(**d)


def group_name(backend: str, world: int, variant: str = "", transport: str = "auto") -> str:
    """'nccl-w2', 'nccl-w2-protoLL', 'nccl-w2-pcie', 'gloo-w2'."""
    return f"{backend}-w{world}" + (f"-{variant}" if variant else "") + (f"-{transport}" if transport != "auto" else "")


def in_default_selection(c: AllreduceCase) -> bool:
    """The default (un-`full`) selection: small enough for every nightly run.

    nccl: hidden 7168 bf16 at every token count in both modes, on every transport, plus fp32 and hidden
    6144 at 1 and 64 tokens (graph, NCCL's own transport). vllm_custom_ar: hidden 7168 bf16 at the sizes
    vLLM takes, both modes. gloo: three bf16 and two fp32 decode sizes (the CPU family that runs in CI).
    """
    if c.variant:
        return False
    if c.transport != "auto":
        return c.hidden == 7168 and c.dtype == "bf16"
    if c.backend == "gloo":
        return c.hidden == 7168 and ((c.dtype == "bf16" and c.tokens in (1, 8, 64))
                                     or (c.dtype == "fp32" and c.tokens in (1, 64)))
    if c.hidden == 7168 and c.dtype == "bf16":
        return c.backend == "nccl" or c.nbytes < VLLM_CUSTOM_AR_MAX_BYTES
    if c.backend == "nccl" and c.mode == "graph" and c.tokens in (1, 64):
        return (c.hidden == 6144 and c.dtype == "bf16") or (c.hidden == 7168 and c.dtype == "fp32")
    return False


def _axes(backend: str) -> Iterator[AllreduceCase]:
    worlds = GLOO_WORLDS if backend == "gloo" else WORLDS
    modes = ("eager",) if backend == "gloo" else MODES
    variants = tuple(VARIANTS) if backend == "nccl" else ("",)
    transports = tuple(TRANSPORTS) if backend == "nccl" else ("auto",)
    for world in worlds:
        for transport in transports:
            for variant in variants:
                for dtype in DTYPES:
                    # Protocol variants and steered transports matter for the decode-size latency they
                    # were made for, on NCCL's own path: bf16 only, one at a time.
                    if (variant or transport != "auto") and dtype != "bf16" or (variant and transport != "auto"):
                        continue
                    for hidden in HIDDENS:
                        for tokens in TOKENS:
                            for mode in modes:
                                yield AllreduceCase(backend, world, variant, dtype, hidden, tokens, mode, transport)


def all_cases() -> list[AllreduceCase]:
    """Every case of the family, ordered so that each group's cases are consecutive."""
    cases = [c for b in BACKENDS for c in _axes(b)]
    order = {b: i for i, b in enumerate(BACKENDS)}
    transports = list(TRANSPORTS)
    return sorted(cases, key=lambda c: (order[c.backend], c.world, transports.index(c.transport), c.variant, c.dtype,
                                        -c.hidden, c.tokens, MODES.index(c.mode)))
