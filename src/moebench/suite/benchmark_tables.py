"""pytest-benchmark's terminal tables: off by default (moebench's verdict table says what matters), back
with --benchmark-tables; its JSON, save, compare and histogram options work either way."""

from __future__ import annotations

from typing import Callable

import pytest


class _Discard:
    """Stands in for the terminal reporter: drops everything written to it."""

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


def hide_benchmark_tables(config: pytest.Config) -> None:
    """Keep pytest-benchmark's own result tables off the terminal unless --benchmark-tables asks for them."""
    # pytest-benchmark prints its tables (about 100 lines, 250 columns wide, for a GPU run) from
    # BenchmarkSession.display(terminalreporter), called by its own pytest_terminal_summary (5.2.3 and
    # 5.3.1 alike). The same call writes the --benchmark-histogram files and applies
    # --benchmark-compare-fail, so it still runs, with a reporter that drops the tables; its log lines
    # (saved files, histograms, regressions) go to stderr and stay. --benchmark-quiet would skip the
    # histogram too (it is drawn inside the table code).
    bs = getattr(config, "_benchmarksession", None)
    if bs is None or config.getoption("benchmark_tables"):
        return
    display = bs.display
    bs.display = lambda tr: display(_Discard())
