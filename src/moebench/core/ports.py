"""Free TCP ports on 127.0.0.1 for the processes the harness starts (engine servers, rendezvous stores)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's range of ports for outgoing connections (Linux's default where it cannot be read)."""
    try:
        low, high = (int(x) for x in path.read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_port(below: int | None = None, tries: int = 200, ephemeral: tuple[int, int] | None = None) -> int:
    """A TCP port free on 127.0.0.1 right now (the server binds it a moment later), drawn at random
    outside the kernel's ephemeral range: a health poll that connects to a port in that range while the
    server is not listening yet can be given that very port as its own source port, and then it talks
    to itself (TCP self-connect: its "answer" is its own request; an SGLang start on an H200 failed so,
    210 s into its JIT build). `below`: the port must also be under this (SGLang derives its gRPC port
    as port + 10000 and refuses one over 65535)."""
    low, high = ephemeral or ephemeral_range()
    top = min(below or 65536, 65536)
    spans = [(lo, hi) for lo, hi in ((20000, min(low, top)), (high + 1, top)) if hi - lo >= 1000]
    if not spans:  # the ephemeral range covers nearly everything: the client's self-connect check remains
        spans = [(20000, top)]
    for _ in range(tries):
        lo, hi = random.choice(spans)
        port = random.randrange(lo, hi)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise OSError(f"no free TCP port in {spans} on 127.0.0.1 after {tries} tries")
