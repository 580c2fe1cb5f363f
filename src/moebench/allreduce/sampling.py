"""Rank side: one job = check the case's allreduce for correctness, warm it up, then time it.

The data: rank r's element i is ((7*i + 3*r) % 13) + 1, small integers whose sums (at most 8 ranks x
13) are exact in bf16 and fp32, so the result is checked element by element, not within a tolerance.
Every rank's other ranks contribute at least 1 to each element, so an allreduce that did nothing
leaves every element wrong; out-of-place outputs are poisoned with NaN before the checked run.

The timing loop, per sample:
  refill the K buffers from a pristine copy (outside the timed region: each sample starts from the
  same values, so repeated in-place sums never overflow to inf and are never timed on garbage)
  vote: every rank says whether its stopping rule is met; sampling stops when all say so (MIN), so
  every rank takes the same number of samples (they must: each sample is a collective)
  align: a tiny allreduce enqueued just before the start mark (GPU), so the ranks start together
  time the K allreduces (one graph replay, or K eager calls); per-op latency = time / K
"""

from __future__ import annotations

import time
from typing import Any, Callable

from moebench.allreduce.cases import WARMUP_ROUNDS, AllreduceCase
from moebench.allreduce.collectives import Collective


def pattern(torch, numel: int, rank: int, dtype, device):
    """This rank's input: ((7*i + 3*rank) % 13) + 1."""
    i = torch.arange(numel, dtype=torch.int64, device=device)
    return ((7 * i + 3 * rank) % 13 + 1).to(dtype)


def expected(torch, numel: int, world: int, dtype, device):
    """The exact allreduce-sum of every rank's pattern."""
    i = torch.arange(numel, dtype=torch.int64, device=device)
    total = torch.zeros(numel, dtype=torch.int64, device=device)
    for r in range(world):
        total += (7 * i + 3 * r) % 13 + 1
    return total.to(dtype)


def count_wrong(torch, results: list, want) -> int:
    """Elements of the results that differ from the expected sum (NaN always differs)."""
    return int(sum(int((r != want).sum()) for r in results))


def measure_case(coll: Collective, case: AllreduceCase, beat: Callable[[], None]) -> dict[str, Any]:
    """Check, warm up and time one case on this rank; returns the fields of its result message."""
    reason = coll.unsupported(case)
    if reason:
        return {"unsupported": reason}
    torch = coll.torch
    dtype = coll.dtype(case)
    pristine = pattern(torch, case.numel, coll.rank, dtype, coll.device)
    want = expected(torch, case.numel, coll.world, dtype, coll.device)
    bufs = coll.buffers(case)
    calls, results = coll.calls(bufs)

    def refill() -> None:
        for b in bufs:
            b.copy_(pristine)

    def eager() -> None:
        for c in calls:
            c()

    # Correct first, on the very first execution (eager) or the first replay (graph).
    refill()
    if case.mode == "graph":
        graph = coll.capture(calls)
        refill()
        if not coll.in_place:
            for out in results():
                out.fill_(float("nan"))
        run_once = graph.replay
    else:
        graph = None
        run_once = eager
    run_once()
    coll.sync()
    wrong = count_wrong(torch, results(), want)
    checked = case.numel * len(bufs)
    beat()

    for _ in range(WARMUP_ROUNDS):
        refill()
        run_once()
    coll.sync()

    samples: list[float] = []
    rule = case.rule
    t0 = time.perf_counter()
    while True:
        refill()
        if coll.vote(rule.done(samples, time.perf_counter() - t0)):
            break
        coll.align()
        samples.append(coll.elapsed(run_once, graph=graph is not None) / case.ops_per_sample * 1e6)
        beat()
    del graph
    return {"wrong": wrong, "checked": checked, "samples_us": samples, "ops_per_sample": case.ops_per_sample}
