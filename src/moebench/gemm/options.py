"""Command-line options of the gemm family (registered through moebench.suite.family_options)."""

from __future__ import annotations


def add_gemm_options(group) -> None:
    """Register the gemm family's options on the moebench option group (called from pytest_addoption)."""
    group.addoption("--counters", action="store_true", default=False,
                    help="gemm: also run each case once more under Nsight Compute (ncu) and record, per kernel "
                         "and in sum, DRAM bytes read and written, instructions, grid size, registers per "
                         "thread and DRAM throughput; bytes and instructions gate at 1%% (docs/counters.md). "
                         "Without a usable ncu the counters are skipped with the reason and the case still times")
