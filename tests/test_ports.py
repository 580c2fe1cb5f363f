"""The ports the harness gives its servers (engines, allreduce's rendezvous store), and the health poll
that waits for one: no TCP self-connect.

An SGLang start on an H200 failed 210 s into its JIT build with `BadStatusLine: GET /health HTTP/1.1`:
the poll's own request came back as the answer. Connecting to a local port that nothing listens on yet
can succeed when the kernel picks that very port as the connection's source port (the port was in the
ephemeral range), and the socket then talks to itself.
"""

from __future__ import annotations

import http.client
import socket

import pytest

from moebench.decode import openai_stream
from moebench.core.ports import ephemeral_range, free_port


def test_ports_are_drawn_outside_the_kernels_ephemeral_range():
    for below, ephemeral in ((None, (32768, 60999)), (55536, (32768, 60999)), (None, (20000, 50000)), (55536, (40000, 45000))):
        low, high = ephemeral
        ports = {free_port(below=below, ephemeral=ephemeral) for _ in range(300)}
        assert not any(low <= p <= high for p in ports), (below, ephemeral)
        assert all(20000 <= p < (below or 65536) for p in ports) and len(ports) > 100


def test_a_range_that_covers_every_port_still_gives_one_under_the_bound():
    ports = {free_port(below=55536, ephemeral=(1024, 65535)) for _ in range(50)}
    assert all(20000 <= p < 55536 for p in ports)


def test_the_ephemeral_range_is_read_from_the_kernel_and_defaults_when_unreadable(tmp_path):
    f = tmp_path / "ip_local_port_range"
    f.write_text("40000\t50000\n")
    assert ephemeral_range(f) == (40000, 50000)
    f.write_text("garbage\n")
    assert ephemeral_range(f) == (32768, 60999)
    assert ephemeral_range(tmp_path / "absent") == (32768, 60999)


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_poll_that_reaches_itself_is_told_the_port_is_not_listening(monkeypatch):
    """The self-connect made on purpose (source port = the port asked for): `get` raises an OSError, which
    the start loop reads as "not listening yet", never an HTTP error that fails the case."""
    port = _unused_port()

    class SelfConnecting(http.client.HTTPConnection):
        def __init__(self, host, p, timeout):
            super().__init__(host, p, timeout=timeout, source_address=("127.0.0.1", p))

    monkeypatch.setattr(http.client, "HTTPConnection", SelfConnecting)
    with pytest.raises(ConnectionRefusedError, match="reached itself"):
        openai_stream.get(f"http://127.0.0.1:{port}", "/health", timeout=2.0)
