"""The tables the families add under a run's verdict table, in one list: the registry of renderers.

A renderer takes the cases of a results document (moebench.results.document.CaseDoc) and returns report.Table
records for those it knows (decode: the step breakdown of each profiled case). The report layer lays
tables out without knowing any family, and the run's closing summary (plugin) and `moebench report`
(plots) both ask this module, so a family's table reads the same in both. A family adds its table by
adding its renderer to RENDERERS.
"""

from __future__ import annotations

from typing import Callable, Iterable

from moebench.decode.breakdown_report import breakdown_tables
from moebench.outputs.report import Table
from moebench.results.document import CaseDoc

Renderer = Callable[[list[CaseDoc]], list[Table]]

RENDERERS: tuple[Renderer, ...] = (breakdown_tables,)


def family_tables(cases: Iterable[CaseDoc]) -> list[Table]:
    """Every registered renderer's tables for these cases, renderer by renderer, each in case order."""
    cases = list(cases)
    return [t for render in RENDERERS for t in render(cases)]
