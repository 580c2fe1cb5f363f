"""A session's counts: the gemm cases it will count, in chunks, each chunk counted by ONE ncu child on demand.

A child of its own for every case cost 12-14 s a case on an H200 (process start, torch and vLLM imports,
CUDA init, ncu's start), nearly all of it the same for every case; one child now counts a chunk of up to
CHUNK_CASES cases one after another (moebench.gemm.counter_child), so those seconds are paid once a chunk.
The first case of a chunk that is asked for runs the chunk; its other cases read their part from the cache.
Chunks keep one crash or timeout to one chunk's cases and show progress between them; the timeout grows
with the chunk (TIMEOUT_START_S + TIMEOUT_PER_CASE_S a case).

The child's output is split by case without guessing (core.ncu_windows): its boundary marker before each
window says which case follows, and the child's report (counter_protocol) says which cases it counted and
why it did not count the others. A case that failed its check or could not be built is failed alone; an ncu
failure, a timeout, a report or table that does not add up fails the chunk's cases, each with the line; an
ncu that may not read the counters (ERR_NVGPUCTRPERM) skips them, and no later chunk is launched.

Generic over how a child runs (`run`, ncu_launch.run_under_ncu's signature): the tests pass a fake.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from moebench.core.ncu import Launch, NcuFormatError
from moebench.core.ncu_kernels import NCU_METRICS
from moebench.core.ncu_launch import NcuFailed, NcuTool, NcuUnavailable, keep_path, run_under_ncu, why_unavailable
from moebench.core.ncu_windows import split_at_markers
from moebench.gemm.cases import ROTATIONS
from moebench.gemm.counter_protocol import (BOUNDARY_KERNEL, CHILD, ReportError, child_args, finished_so_far,
                                            read_report)

CHUNK_CASES = 32
# ncu's start, the child's imports (torch, vLLM) and CUDA init: about 10 s of the 12-14 s a case cost alone
TIMEOUT_START_S = 120.0
# a case in a chunk: build, check, warm-up (a Triton compile where the cache is cold) and its window under ncu,
# expected to take a few seconds
TIMEOUT_PER_CASE_S = 30.0
KEEP_PREFIX = "counters-chunk"  # MOEBENCH_NCU_KEEP's files: counters-chunk01.csv, .err and .json (the report)

Runner = Callable[..., list[Launch]]
Progress = Callable[[str], None]


@dataclass(frozen=True)
class CaseCount:
    """One case's share of its chunk: the launches of its window (boundary marker dropped) and the chunk
    that counted it; or, with no launches, why not: {"skipped": reason} or {"failed": line}."""

    launches: tuple[Launch, ...] = ()
    reason: Mapping[str, str] | None = None
    chunk: str = ""


def chunk_timeout_s(cases: int) -> float:
    """How long one child may take for a chunk of `cases` cases."""
    return TIMEOUT_START_S + TIMEOUT_PER_CASE_S * cases


class CounterBatch:
    """The counts of one session. `planned`: the ids of every case the session will count, in the order it
    runs them (split into chunks of `chunk_cases`); a case asked for that is not planned is counted in a
    chunk of its own. Nothing runs until a case is asked for (count)."""

    def __init__(self, planned: Sequence[str], tool: NcuTool, *, calls: int = ROTATIONS,
                 chunk_cases: int = CHUNK_CASES, run: Runner | None = None) -> None:
        if chunk_cases < 1:
            raise ValueError(f"a chunk holds at least one case, got {chunk_cases}")
        ids = list(dict.fromkeys(planned))
        self.tool, self.calls = tool, calls
        self.chunks: list[list[str]] = [ids[i:i + chunk_cases] for i in range(0, len(ids), chunk_cases)]
        self._run = run or run_under_ncu
        self._counted: dict[str, CaseCount] = {}
        self._skip = why_unavailable(tool)  # set later too, when ncu turns out not to be allowed to count

    def count(self, case_id: str, progress: Progress = lambda s: None) -> CaseCount:
        """The case's share, running its chunk's child first if no case of the chunk was asked for yet."""
        if case_id in self._counted:
            return self._counted[case_id]
        if self._skip:
            return CaseCount(reason={"skipped": self._skip})
        k = next((i for i, chunk in enumerate(self.chunks) if case_id in chunk), None)
        if k is None:
            self.chunks.append([case_id])
            k = len(self.chunks) - 1
        self._count_chunk(k, progress)
        return self._counted[case_id]

    def _count_chunk(self, k: int, progress: Progress) -> None:
        ids, name = self.chunks[k], f"{KEEP_PREFIX}{k + 1:02d}"
        keep = keep_path(name)
        timeout = chunk_timeout_s(len(ids))
        progress(f"counters: chunk {k + 1} of {len(self.chunks)} ({name}): {len(ids)} cases in one ncu child, "
                 f"first {ids[0]} (at most {timeout:.0f} s)")
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="moebench-counters-") as tmp:
            report = os.path.splitext(keep)[0] + ".json" if keep else os.path.join(tmp, "report.json")
            if keep:
                os.makedirs(os.path.dirname(report) or ".", exist_ok=True)  # the child writes the report there
                if os.path.exists(report):
                    os.remove(report)  # an earlier session's report must not answer for this child
            shares = self._shares(ids, name, report, timeout, keep)
        self._counted.update(shares)
        done = sum(1 for s in shares.values() if s.launches)
        progress(f"counters: chunk {k + 1} of {len(self.chunks)}: {done} of {len(ids)} cases counted in "
                 f"{time.monotonic() - t0:.0f} s")

    def _shares(self, ids: list[str], name: str, report: str, timeout: float, keep: str | None) -> dict[str, CaseCount]:
        where = f"{name} ({len(ids)} case{'s' if len(ids) > 1 else ''} in one ncu child)"
        no_table = None
        try:
            launches = self._run(self.tool.path, NCU_METRICS, CHILD, child_args(ids, self.calls, report),
                                 timeout_s=timeout, keep=keep)
        except NcuUnavailable as e:
            self._skip = str(e)
            return {cid: CaseCount(reason={"skipped": self._skip}) for cid in ids}
        except NcuFailed as e:
            n = finished_so_far(report)
            stopped = f"; the child had finished {n} of them and stopped in {ids[n]}" if n < len(ids) else ""
            return {cid: CaseCount(reason={"failed": f"{where}: {e}{stopped}"}, chunk=name) for cid in ids}
        except NcuFormatError as e:  # also what ncu prints when it profiled nothing: no table at all
            launches, no_table = [], e
        try:
            reports = read_report(report, ids)
            counted = [(r.position, r.case) for r in reports if r.counted]
            if no_table is not None and counted:
                raise no_table
            # a chunk whose every case failed before its window profiled nothing: each case keeps its own reason
            windows = split_at_markers(launches, BOUNDARY_KERNEL, counted, source=f"ncu output of {name}")
        except (NcuFormatError, ReportError) as e:
            # ncu's output not being the table says more than the report that then went missing
            return {cid: CaseCount(reason={"failed": f"{where}: {no_table or e}"}, chunk=name) for cid in ids}
        return {r.case: CaseCount(tuple(windows[r.case]), chunk=name) if r.counted else
                CaseCount(reason={"failed": f"the counter child did not count it ({name}): {r.failed}"}, chunk=name)
                for r in reports}
