"""Workloads that prove the harness on the machine it runs on (the `selfcheck` family)."""

from __future__ import annotations

from dataclasses import dataclass

from moebench.metrics import Metric
from moebench.timing import StopRule, cpu_timer, eager_timer, graph_timer


@dataclass(frozen=True)
class CopyWork:
    """A copy of `nbytes` known bytes; `rotate` distinct buffers so the copy does not come from cache."""

    nbytes: int
    device: str
    rotate: int = 2

    def build(self):
        """Allocate buffers filled with a known pattern; returns (calls, verify)."""
        import torch

        n = self.nbytes
        # A pattern with every byte value, offset per buffer, so a copy from the wrong buffer shows.
        srcs = [((torch.arange(n, dtype=torch.int32, device=self.device) + i) % 251).to(torch.uint8)
                for i in range(self.rotate)]
        dsts = [torch.full((n,), 255, dtype=torch.uint8, device=self.device) for _ in range(self.rotate)]
        calls = [lambda s=s, d=d: d.copy_(s) for s, d in zip(srcs, dsts)]

        def verify() -> None:
            for i, (s, d) in enumerate(zip(srcs, dsts)):
                d.fill_(255)  # poison, then copy once and compare every byte
                calls[i]()
                if not torch.equal(s, d):
                    bad = int((s != d).sum())
                    raise AssertionError(f"copy of {n} bytes into buffer {i}: {bad} bytes wrong")

        return calls, verify

    def time(self, rule: StopRule, *, mode: str = "graph") -> list[float]:
        """Per-copy samples in seconds: on a GPU in graph or eager mode, on CPU by wall clock.

        A device-to-device copy_ is a cudaMemcpyAsync; captured in a CUDA graph it becomes a memcpy node
        that runs on the copy engines, which on an H200 moved 2761 GB/s where the same copy launched
        eagerly (SM copy) moved 4187 GB/s. The ceiling is the eager figure; graph mode is still a fine
        workload for A/A and sensitivity checks of the graph timer.
        """
        calls, verify = self.build()
        verify()
        if self.device == "cpu":
            return cpu_timer(calls, rule)
        return eager_timer(calls, rule) if mode == "eager" else graph_timer(calls, rule)

    def bandwidth_metric(self, samples: list[float], rel_tol: float) -> Metric:
        """GB/s counting read + write, higher is better."""
        return Metric.from_samples([2 * self.nbytes / s / 1e9 for s in samples], "GB/s", "higher", rel_tol=rel_tol)
