"""Rank side: the three backends, each a process group plus the callables that get timed.

Runs inside a spawned rank only (imports torch; vLLM is imported by its backend, in the rank).
Every backend offers the same small surface to sampling.py:

  prepare()         heavy imports, before the rank says hello
  connect()         process group(s) and a warm-up collective, before the rank says ready
  buffers / calls   K input buffers and K callables, one allreduce each; results() -> the K outputs
  capture(calls)    a CUDA graph of the K calls (GPU backends)
  vote(stop)        all ranks agree to stop sampling (MIN of the votes; host-synchronizing)
  align()           a tiny collective right before a timed region, so every rank's start lines up
  elapsed(fn)       seconds fn takes: CUDA events on GPU, perf_counter on CPU
"""

from __future__ import annotations

import logging
import socket
import time
from datetime import timedelta
from typing import Any, Callable

from moebench.allreduce.cases import AllreduceCase
from moebench.allreduce.protocol import GroupSpec

Call = Callable[[], object]
_TORCH_DTYPES = {"bf16": "bfloat16", "fp32": "float32"}


class Collective:
    """Common part: torch.distributed over a TCP rendezvous on 127.0.0.1:spec.port."""

    backend = ""
    on_gpu = False
    in_place = True

    def __init__(self, spec: GroupSpec, rank: int) -> None:
        self.spec = spec
        self.rank = rank
        self.world = spec.world
        self.torch: Any = None
        self.dist: Any = None
        self.device: Any = None

    # --- lifecycle ------------------------------------------------------------------------------
    def prepare(self) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist

    def _init(self, backend: str, **kw: Any) -> None:
        self.dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{self.spec.port}", rank=self.rank,
                                     world_size=self.world,
                                     timeout=timedelta(seconds=self.spec.collective_timeout_s), **kw)

    def connect(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        # Ranks have been seen not to exit after this; the parent kills them after its teardown deadline.
        if self.dist is not None and self.dist.is_initialized():
            self.dist.destroy_process_group()

    def info(self) -> dict[str, Any]:
        """What ran: versions and devices, sent with the ready message."""
        return {"backend": self.backend, "torch": self.torch.__version__, "host": socket.gethostname()}

    def unsupported(self, case: AllreduceCase) -> str | None:
        """Why this rank's backend does not take the case (a skip, not a failure), or None."""
        return None

    # --- the work -------------------------------------------------------------------------------
    def dtype(self, case: AllreduceCase):
        return getattr(self.torch, _TORCH_DTYPES[case.dtype])

    def buffers(self, case: AllreduceCase) -> list:
        """K distinct input buffers of the case's shape on this rank's device."""
        return [self.torch.empty(case.numel, dtype=self.dtype(case), device=self.device)
                for _ in range(case.ops_per_sample)]

    def calls(self, bufs: list) -> tuple[list[Call], Callable[[], list]]:
        """One in-place allreduce per buffer; the results are the buffers themselves."""
        dist = self.dist
        return [lambda b=b: dist.all_reduce(b) for b in bufs], lambda: bufs

    def capture(self, calls: list[Call]):
        from moebench.core.timing import capture_graph

        return capture_graph(self.torch, calls)

    def sync(self) -> None:
        pass

    def vote(self, stop: bool) -> bool:
        """True when every rank votes to stop (so all ranks take the same number of samples)."""
        self._flag.fill_(int(stop))
        self.dist.all_reduce(self._flag, op=self.dist.ReduceOp.MIN)
        return bool(self._flag.item())

    def align(self) -> None:
        pass

    def elapsed(self, fn: Call, *, graph: bool = False) -> float:
        """Seconds fn() takes; graph: fn replays a CUDA graph (GPU ranks then time GPU work only)."""
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0


class Gloo(Collective):
    """CPU ranks over gloo: runs anywhere, the family's CI part. The vote is a blocking collective
    that returns on every rank at about the same moment, so it is also the alignment."""

    backend = "gloo"

    def connect(self) -> None:
        torch = self.torch
        self.device = torch.device("cpu")
        self._init("gloo")
        self._flag = torch.zeros(1, dtype=torch.int32)
        self.dist.all_reduce(torch.ones(8))


class Nccl(Collective):
    """One GPU per rank (rank r uses visible GPU r), NCCL through torch.distributed."""

    backend = "nccl"
    on_gpu = True

    def connect(self) -> None:
        torch = self.torch
        torch.cuda.set_device(self.rank)
        self.device = torch.device("cuda", self.rank)
        self._init("nccl", device_id=self.device)
        self._flag = torch.zeros(1, dtype=torch.int32, device=self.device)
        self._tiny = torch.zeros(1, dtype=torch.float32, device=self.device)
        # The first collective creates the NCCL communicator (seconds); graphs need it to exist.
        self.dist.all_reduce(self._tiny)
        torch.cuda.synchronize()

    def info(self) -> dict[str, Any]:
        torch = self.torch
        nccl = torch.cuda.nccl.version()
        return {**super().info(), "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(self.device),
                "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl),
                "peer_access": {str(o): torch.cuda.can_device_access_peer(self.rank, o)
                                for o in range(self.world) if o != self.rank}}

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def align(self) -> None:
        # Enqueued without a host sync: the timed region starts when this completes on the GPU, which
        # is the same moment on every rank, whatever the hosts' wake-up jitter.
        self.dist.all_reduce(self._tiny)

    def elapsed(self, fn: Call, *, graph: bool = False) -> float:
        from moebench.core.timing import event_time

        # A graph replay is timed from a head start (see event_time), the same on every rank, so the
        # ranks still start together after align(); K eager calls keep their launch cost.
        return event_time(self.torch, fn, head_start=graph)


class _VllmLogTap(logging.Handler):
    """Keeps vLLM's warnings, so a disabled custom allreduce is skipped with vLLM's own reason."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


class VllmCustomAllreduce(Nccl):
    """vLLM's CustomAllreduce (vllm/distributed/device_communicators/custom_all_reduce.py) as vLLM's
    CUDA communicator builds it: on a gloo group of the same ranks, bound to this rank's GPU. Eager
    calls copy into vLLM's registered buffer first; graph capture happens inside ca.capture(), which
    registers the graph's buffers with every rank afterwards (vLLM's own decode-graph path). The NCCL
    world group only carries the stop vote and the alignment."""

    backend = "vllm_custom_ar"
    in_place = False

    def prepare(self) -> None:
        super().prepare()
        import vllm
        from vllm.distributed.device_communicators.custom_all_reduce import CustomAllreduce

        self._vllm_version = getattr(vllm, "__version__", "?")
        self._cls = CustomAllreduce
        self._tap = _VllmLogTap()
        logging.getLogger("vllm").addHandler(self._tap)

    def connect(self) -> None:
        super().connect()
        self.cpu_group = self.dist.new_group(backend="gloo")
        self.ca = self._cls(group=self.cpu_group, device=self.device)
        finalize = getattr(self.ca, "finalize_p2p", None)  # newer vLLM defers its P2P check to this
        if finalize is not None:
            finalize()
        self.disabled_reason = None
        if self.ca.disabled:
            said = [ln for ln in self._tap.lines if "custom allreduce" in ln.lower()]
            self.disabled_reason = ("vLLM disabled its custom allreduce here: " + said[-1]) if said else \
                "vLLM left its custom allreduce disabled (no reason logged; see the rank's stdout)"

    def info(self) -> dict[str, Any]:
        ca = self.ca
        return {**super().info(), "vllm": self._vllm_version, "custom_ar_disabled": ca.disabled,
                "custom_ar_max_size": getattr(ca, "max_size", None),
                "fully_connected": getattr(ca, "fully_connected", None)}

    def unsupported(self, case: AllreduceCase) -> str | None:
        if self.disabled_reason:
            return self.disabled_reason
        probe = self.torch.empty(case.numel, dtype=self.dtype(case), device=self.device)
        if not self.ca.should_custom_ar(probe):
            return (f"vLLM does not put this message through its custom allreduce (should_custom_ar is false "
                    f"for {case.nbytes} bytes; max_size {self.ca.max_size}): vLLM uses NCCL here")
        return None

    def calls(self, bufs: list) -> tuple[list[Call], Callable[[], list]]:
        outs: list = [None] * len(bufs)
        ca = self.ca

        def one(i: int) -> None:
            outs[i] = ca.custom_all_reduce(bufs[i])

        return [lambda i=i: one(i) for i in range(len(bufs))], lambda: outs

    def capture(self, calls: list[Call]):
        with self.ca.capture():
            return super().capture(calls)

    def close(self) -> None:
        ca = getattr(self, "ca", None)
        if ca is not None:
            ca.close()
        super().close()


BACKENDS = {"gloo": Gloo, "nccl": Nccl, "vllm_custom_ar": VllmCustomAllreduce}


def make(spec: GroupSpec, rank: int) -> Collective:
    """The backend object for this group's rank."""
    return BACKENDS[spec.backend](spec, rank)
