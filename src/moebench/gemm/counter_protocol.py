"""What the counter child (moebench.gemm.counter_child) and its parent (moebench.gemm.counter_batch) agree on:
the child's command line, the boundary marker's kernel name, and the report in which the child says, per case,
whether it profiled the case's window or why not.

The report is a small JSON file at a path the parent passes (--report): not stdout, where ncu writes its
table. The child rewrites it atomically after every case (a reader never sees half a file; a child that dies
mid-chunk leaves the cases it finished), then once more with "done": true:

    {"done": true, "cases": [{"case": "<id>", "position": 0, "counted": true},
                             {"case": "<id>", "position": 1, "failed": "<one line>"}]}

"position" is the case's place in the child's arguments, which its boundary marker's grid says
(core.ncu_windows). A "failed" case launched no marker and nothing inside the profiled range.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Sequence

# The boundary marker's kernel name: what ncu prints for it, and what nothing else launches.
BOUNDARY_KERNEL = "moebench_case_boundary"
CHILD = "moebench.gemm.counter_child"


class ReportError(ValueError):
    """A report that is missing, unreadable or does not answer for the cases asked: one line naming the file."""


@dataclass(frozen=True)
class CaseReport:
    """The child's word on one case: counted (its marker and window were launched) or failed, with why."""

    case: str
    position: int
    failed: str | None = None

    @property
    def counted(self) -> bool:
        return self.failed is None

    def to_json(self) -> dict:
        return {"case": self.case, "position": self.position,
                **({"failed": self.failed} if self.failed else {"counted": True})}


def child_args(case_ids: Sequence[str], calls: int, report: str) -> list[str]:
    """The child's arguments (after `python -m CHILD`): every case, in the order it profiles them."""
    return [a for cid in case_ids for a in ("--case", cid)] + ["--calls", str(calls), "--report", report]


def write_report(path: str, cases: Sequence[CaseReport], done: bool) -> None:
    """Write the report atomically (a temporary file beside it, then a rename)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({"done": done, "cases": [c.to_json() for c in cases]}, f, indent=1)
    os.replace(tmp, path)


def read_report(path: str, asked: Sequence[str]) -> list[CaseReport]:
    """The child's finished report for the cases `asked` (in their order). Raises ReportError naming the file
    when it is missing, not JSON, not done, or does not answer for exactly the cases asked, each at its
    position."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise ReportError(f"{path}: the counter child wrote no report") from None
    except (OSError, ValueError) as e:
        raise ReportError(f"{path}: the counter child's report cannot be read: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("cases"), list):
        raise ReportError(f"{path}: the counter child's report has no list of cases")
    try:
        got = [CaseReport(str(c["case"]), int(c["position"]), None if c.get("counted") is True else str(c["failed"]))
               for c in doc["cases"]]
    except (KeyError, TypeError, ValueError) as e:
        raise ReportError(f"{path}: a case in the counter child's report lacks {e}") from None
    if doc.get("done") is not True:
        last = f" (it stopped after {got[-1].case})" if got else ""
        raise ReportError(f"{path}: the counter child did not finish its report{last}")
    if [(c.case, c.position) for c in got] != [(cid, i) for i, cid in enumerate(asked)]:
        raise ReportError(f"{path}: the counter child reported on {[c.case for c in got]}, "
                          f"asked for {list(asked)}")
    return got


def finished_so_far(path: str) -> int:
    """How many cases a report written so far answers for (a child that died or hung mid-chunk leaves
    them); 0 when there is no readable report."""
    try:
        with open(path) as f:
            cases = json.load(f).get("cases")
    except (OSError, ValueError, AttributeError):
        return 0
    return len(cases) if isinstance(cases, list) else 0
