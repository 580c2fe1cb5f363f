"""Bandwidth arithmetic for allreduce, as nccl-tests defines it.

algbw = bytes / time: what the caller sees. busbw = algbw * 2(n-1)/n: a ring allreduce moves every
byte 2(n-1)/n times over each rank's link, so busbw is comparable across world sizes and against the
link's own bandwidth.
"""

from __future__ import annotations


def bus_factor(world: int) -> float:
    """2(n-1)/n: how many times each byte crosses a rank's link in an allreduce of n ranks."""
    if world < 1:
        raise ValueError(f"world size must be at least 1, got {world}")
    return 2.0 * (world - 1) / world


def algbw_gbps(nbytes: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (1e9 bytes per second) of one allreduce of nbytes."""
    if seconds <= 0:
        raise ValueError(f"time must be positive, got {seconds}")
    return nbytes / seconds / 1e9


def busbw_gbps(nbytes: int, seconds: float, world: int) -> float:
    """Bus bandwidth in GB/s: algbw * 2(n-1)/n."""
    return algbw_gbps(nbytes, seconds) * bus_factor(world)
