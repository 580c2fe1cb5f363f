"""What one allreduce benchmark case does in its test: skip, fail, or record through `moebench`."""

from __future__ import annotations

import pytest

from moebench.allreduce.cases import AllreduceCase
from moebench.allreduce.requirements import skip_reason
from moebench.allreduce.runner import AllreduceRunner, CaseOutcome


def _fail_if_bad(o: CaseOutcome) -> None:
    if o.error:
        pytest.fail(o.error, pytrace=False)
    if o.wrong:
        pytest.fail(f"{o.case.key}: {o.wrong} of {o.checked} result elements wrong across {o.case.world} ranks "
                    f"(exact sums expected; checked before timing)", pytrace=False)


def run_case(case: AllreduceCase, runner: AllreduceRunner, moebench) -> None:
    """Skip when the case cannot run here; fail on a rank failure or a wrong result; else record
    latency (gated), algbw and busbw with the topology and what ran in info."""
    reason = skip_reason(case)
    if reason:
        pytest.skip(reason)
    first = runner.outcome(case)
    if first.unsupported:
        pytest.skip(first.unsupported)
    _fail_if_bad(first)
    calls = 0

    def measure():
        # First call: the group's shared launch. Again (a suspected regression): a fresh launch.
        nonlocal calls
        calls += 1
        o = first if calls == 1 else runner.remeasure(case)
        if o.unsupported:
            pytest.fail(f"{case.key}: the re-measure's ranks declined the case: {o.unsupported}", pytrace=False)
        _fail_if_bad(o)
        return o.metrics()

    moebench.record(case.key, "allreduce", case.definition(), measure, info=first.info, primary="latency_us",
                    group=case.bench_group)
