"""The memory ceilings a session measures on its own device: what every % of floor divides by.

Two kinds, both over a buffer far larger than the last-level cache (1 GiB on a GPU, 256 MiB on a CPU):

- copy: a device-to-device copy of N bytes, counted as read + write (2N bytes moved). The selfcheck's
  copy case is gated against this figure.
- read: a reduction over N bytes (reads N bytes, writes one number). Work that streams its inputs and
  writes little is read-dominated: the MoE expert GEMMs (the weights of the routed experts, the output
  a few KB) and a decode step (its weights and KV cache). Their floor is bytes / the read ceiling. A copy
  shares the bus between reads and writes, so HBM moves fewer bytes per second than a pure read: against
  the copy ceiling an H200's Triton fused MoE read 101-103.5% of its floor (Kimi-K2.5 bf16 M = 4, 16),
  which a floor must never allow.

Never a datasheet number: a ceiling is what this device moves now, measured once per session
(`moebench.ceiling(device, kind)`) or by a tool that needs one (the Triton MoE config sweep).
"""

from __future__ import annotations

import statistics
from typing import Callable, Sequence

from moebench.core.timing import StopRule, cpu_timer, eager_timer

KINDS = {"copy": "large copy, read + write", "read": "large read-only reduction"}
# Far past any last-level cache (H200 L2 50 MB, RTX PRO 6000 ~128 MB; CPU L3 tens of MB), small enough
# to measure in a second or two.
SIZES = {"cuda": 1 << 30, "cpu": 1 << 28}
RULE = StopRule(min_samples=10, max_seconds=2.0)


def _rate(calls: Sequence[Callable[[], object]], moved: int, device: str, rule: StopRule) -> tuple[float, list[float]]:
    """(bytes moved per second at the median sample, sorted per-call samples in seconds). Eager on a GPU:
    a memcpy captured in a CUDA graph runs on the copy engines, slower than the SM copy a kernel does."""
    samples = sorted(cpu_timer(calls, rule) if device == "cpu" else eager_timer(calls, rule))
    return moved / statistics.median(samples), samples


def copy_bandwidth(nbytes: int = SIZES["cuda"], *, device: str = "cuda", rule: StopRule = RULE) -> tuple[float, list[float]]:
    """A device-to-device copy of nbytes, counted as read + write. Returns (median bytes/s, per-copy
    samples in seconds). On device='cpu' it copies host memory."""
    import torch

    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return _rate([lambda: dst.copy_(src)], 2 * nbytes, device, rule)


def read_bandwidth(nbytes: int = SIZES["cuda"], *, device: str = "cuda", rule: StopRule = RULE) -> tuple[float, list[float]]:
    """A float32 sum over nbytes of ones: nbytes read, one number written. Returns (median bytes/s,
    per-sum samples in seconds). The sum is checked first, so a reduction that skipped its input (or
    read zeros) cannot pass for a fast one."""
    import torch

    n = nbytes // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    got = float(src.sum())
    # float32 partial sums of ones stay exact up to 2^24; a tree of them drifts by far less than 1e-3.
    if abs(got - n) > 1e-3 * n:
        raise RuntimeError(f"read ceiling: the sum of {n} ones read {got}: the reduction is wrong")
    return _rate([lambda: src.sum()], n * 4, device, rule)


def measure_ceiling(device: str, kind: str = "copy") -> float:
    """The ceiling of `kind` ("copy" or "read", see KINDS) on `device` ("cuda" or "cpu") in bytes/s, at
    the size SIZES gives the device."""
    if kind not in KINDS:
        raise ValueError(f"unknown ceiling kind {kind!r} (known: {', '.join(KINDS)})")
    nbytes = SIZES["cpu" if device == "cpu" else "cuda"]
    return (read_bandwidth if kind == "read" else copy_bandwidth)(nbytes, device=device)[0]


def session_key(device: str, kind: str = "copy") -> str:
    """How a session files a ceiling (results' memory_ceiling_bytes_per_s): the copy ceiling under the
    device's name, as results always had it; another kind as device-kind ("cuda-read")."""
    return device if kind == "copy" else f"{device}-{kind}"
