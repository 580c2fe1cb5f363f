"""What a MoE backend is: a small record of what it needs and a build() that returns the work to time."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Callable

from moebench.gemm.cases import GemmCase


@dataclass
class Built:
    """A backend built for one case on one workload.

    calls: one callable per rotation r (R in all); calls[r]() runs the backend on rotation r's inputs and
      returns the output tensor, shaped like Workload.reference(r).
    out_buffers: preallocated outputs the calls write into (poisoned with NaN before the correctness
      check); empty for backends that allocate their output.
    info: what actually ran (kernel, config, library versions) for the results.
    rel_tol: the gate tolerance of the primary time where this build's measured spread exceeds the
      family's default (None: the default); the reason goes in info["gate"].
    """

    calls: list[Callable[[], object]]
    out_buffers: list = field(default_factory=list)
    info: dict = field(default_factory=dict)
    rel_tol: float | None = None


@dataclass(frozen=True)
class Backend:
    """A MoE backend. `name` is also its pytest marker. Heavy imports happen inside build()."""

    name: str
    ops: frozenset[str]
    dtypes: frozenset[str]
    build: Callable[[GemmCase, object], Built]
    description: str
    min_cc: tuple[int, int] | None = None   # None: runs on CPU too
    max_cc: tuple[int, int] | None = None
    modules: tuple[str, ...] = ()           # importable modules it needs
    gpu_only: bool = True
    dtype_min_cc: dict = field(default_factory=dict)  # dtype -> (major, minor) for native formats
    # dtype -> relative error bound, where the backend's own arithmetic is coarser than the dtype's
    # default bound (runner.ERROR_BOUND); each override says why where it is set.
    error_bounds: dict = field(default_factory=dict)
    max_m: int | None = None                # a decode-only kernel's largest M (None: any)
    # (case) -> why this machine's GPU is too small for the case (it reads the GPU's properties), or None; for a
    # kernel whose whole grid must be resident at once (None: every GPU that passes the checks above)
    gpu_fit: Callable[[GemmCase], str | None] | None = None

    def supports(self, case: GemmCase) -> bool:
        """Static capability: the op, dtype and M are ones this backend implements at all."""
        return case.op in self.ops and case.dtype in self.dtypes and (self.max_m is None or case.m <= self.max_m)

    def unavailable(self, case: GemmCase, device: str, cc: tuple[int, int] | None) -> str | None:
        """Why this backend cannot run the case on this machine, or None. Names what is missing."""
        if not self.supports(case):
            if self.max_m is not None and case.m > self.max_m:
                return f"{self.name} is a decode kernel for M <= {self.max_m}, the case has M = {case.m}"
            return f"{self.name} does not implement op {case.op} with {case.dtype}"
        for mod in self.modules:
            if importlib.util.find_spec(mod.split(".")[0]) is None or (
                    "." in mod and _missing_submodule(mod)):
                return f"{self.name} needs the Python package {mod.split('.')[0]!r} ({mod}), not importable here"
        if device == "cpu":
            return f"{self.name} needs a CUDA GPU; this machine has none" if self.gpu_only else None
        need = self.dtype_min_cc.get(case.dtype, self.min_cc)
        if need and cc and cc < need:
            return f"{self.name} with {case.dtype} needs compute capability >= {need[0]}.{need[1]}, GPU has {cc[0]}.{cc[1]}"
        if self.max_cc and cc and cc > self.max_cc:
            return f"{self.name} supports compute capability <= {self.max_cc[0]}.{self.max_cc[1]}, GPU has {cc[0]}.{cc[1]}"
        return self.gpu_fit(case) if self.gpu_fit else None


def _missing_submodule(mod: str) -> bool:
    try:
        return importlib.util.find_spec(mod) is None
    except (ImportError, ValueError):
        return True
