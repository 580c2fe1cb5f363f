"""The session's allreduce results: one launch per group, computed on the first case that needs it.

A group is (backend, world size, env variant). Its launch measures every selected case of the group
in one go; each case's test then reads its own outcome. A launch that fails keeps the results of the
jobs every rank finished before the failure; the job in flight and those after it carry the error.
A re-measure (the gate suspects a regression) launches the group again for that one case.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from moebench.allreduce.bandwidth import algbw_gbps, busbw_gbps
from moebench.allreduce.cases import AllreduceCase, latency_kind, latency_rel_tol
from moebench.allreduce.launcher import Deadlines, GroupRun, port_taken, run_group
from moebench.allreduce.protocol import Fault, GroupSpec
from moebench.allreduce.requirements import ranks_topology, skip_reason, topo_matrix
from moebench.allreduce.transport import chosen, contradiction
from moebench.core.metrics import Metric

Launch = Callable[[GroupSpec, Deadlines], GroupRun]


@dataclass
class CaseOutcome:
    """One case's share of a launch: per-rank samples (us per op) and the correctness count, or why
    there are none (error: a failure; unsupported: the backend declined the case, a skip)."""

    case: AllreduceCase
    error: str | None = None
    unsupported: str | None = None
    wrong: int = 0
    checked: int = 0
    rank_samples_us: list[list[float]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def rank_medians_us(self) -> list[float]:
        return [statistics.median(s) for s in self.rank_samples_us]

    @property
    def slowest_rank(self) -> int:
        """The rank whose median latency is highest: an allreduce is done when its last rank is."""
        medians = self.rank_medians_us
        return max(range(len(medians)), key=medians.__getitem__)

    def metrics(self) -> dict[str, Metric]:
        """latency_us (gated: the slowest rank's samples), algbw / busbw (GB/s) and wrong_elements."""
        c = self.case
        lat = Metric.from_samples(self.rank_samples_us[self.slowest_rank], "us", "lower", rel_tol=latency_rel_tol(c),
                                  kind=latency_kind(c))
        seconds = lat.value * 1e-6
        return {
            "latency_us": lat,
            "algbw_GBps": lat.derived(algbw_gbps(c.nbytes, seconds), "GB/s", "higher"),
            "busbw_GBps": lat.derived(busbw_gbps(c.nbytes, seconds, c.world), "GB/s", "higher"),
            "wrong_elements": Metric(float(self.wrong), "elements", "lower", gated=False),
        }


def _nccl_env() -> dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(("NCCL_", "TORCH_NCCL_", "VLLM_"))}


def outcomes(run: GroupRun, fp: dict[str, Any] | None = None) -> dict[AllreduceCase, CaseOutcome]:
    """Split a launch into per-case outcomes (with what ran, the topology and the launch's notes)."""
    spec = run.spec
    nccl = chosen(run.rank0_log) if spec.backend == "nccl" else None
    common = {
        "group": spec.cases[0].group if spec.cases else f"{spec.backend}-w{spec.world}",
        "cases_in_launch": len(spec.cases), "launch_s": round(run.elapsed_s, 2),
        "ranks": [m.get("info", {}) for m in run.ready], "inherited_env": _nccl_env(),
        "topology": ranks_topology(spec.world, fp) if spec.backend != "gloo" else {"interconnect": "host (gloo)"},
        "launch_notes": list(run.notes),
        **({"nccl_chosen": nccl, "topo_matrix": topo_matrix()} if nccl is not None else {}),
    }
    out: dict[AllreduceCase, CaseOutcome] = {}
    for j, case in enumerate(spec.cases):
        o = CaseOutcome(case, info={**common, "env": case.env, "transport": case.transport})
        per_rank = run.results.get(j)
        wrong_path = contradiction(case.transport, nccl["summary"]) if nccl else None
        if wrong_path and per_rank is not None:
            o.error = f"{case.key}: {wrong_path} (NCCL: {', '.join(nccl['via'])})"
        elif per_rank is None:
            o.error = run.error or f"launch of {common['group']} ended without a result for {case.id}"
        elif any(r.get("unsupported") for r in per_rank):
            o.unsupported = next(r["unsupported"] for r in per_rank if r.get("unsupported"))
        else:
            o.wrong = sum(r["wrong"] for r in per_rank)
            o.checked = sum(r["checked"] for r in per_rank)
            o.rank_samples_us = [r["samples_us"] for r in per_rank]
            if not all(o.rank_samples_us):
                o.error = f"{case.id}: a rank returned no samples"
            else:
                o.info.update(slowest_rank=o.slowest_rank,
                              rank_medians_us=[round(m, 3) for m in o.rank_medians_us],
                              samples_per_rank=len(o.rank_samples_us[0]), ops_per_sample=per_rank[0]["ops_per_sample"])
        out[case] = o
    return out


class AllreduceRunner:
    """Lazily launches each group once, for all of its selected cases, and hands out outcomes.

    selected: the cases this session will ask for (those that cannot run here are left out of
    launches). fault: a test hook, applied to every launch of the group it names (Fault + group name).
    """

    def __init__(self, selected: Iterable[AllreduceCase], *, deadlines: Deadlines = Deadlines(),
                 faults: dict[str, Fault] | None = None, launch: Launch = run_group,
                 fp: dict[str, Any] | None = None) -> None:
        self.deadlines = deadlines
        self.faults = dict(faults or {})
        self._launch = launch
        self._fp = fp
        self._selected: dict[str, list[AllreduceCase]] = {}
        for c in selected:
            if skip_reason(c, fp) is None and c not in self._selected.get(c.group, []):
                self._selected.setdefault(c.group, []).append(c)
        self._done: dict[AllreduceCase, CaseOutcome] = {}
        self.runs: list[GroupRun] = []

    def _run(self, cases: list[AllreduceCase]) -> dict[AllreduceCase, CaseOutcome]:
        first = cases[0]
        spec = GroupSpec(first.backend, first.world, first.variant, tuple(cases),
                         collective_timeout_s=self.deadlines.stall_s, fault=self.faults.get(first.group))
        run = self._launch(spec, self.deadlines)
        if port_taken(run):  # someone took the free port between our check and rank 0's bind
            run = self._launch(spec, self.deadlines)
        self.runs.append(run)
        return outcomes(run, self._fp)

    def outcome(self, case: AllreduceCase) -> CaseOutcome:
        """This case's outcome, launching its group (for all its selected cases) on first need."""
        if case not in self._done:
            cases = [c for c in self._selected.get(case.group, []) if c not in self._done]
            if case not in cases:
                cases.append(case)
            self._done.update(self._run(cases))
        return self._done[case]

    def remeasure(self, case: AllreduceCase) -> CaseOutcome:
        """A fresh launch for this one case (the gate's second look at a suspected regression)."""
        o = self._run([case])[case]
        o.info["remeasured"] = True
        return o
