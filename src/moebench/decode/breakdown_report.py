"""The decode step breakdown as a table: per category its kernel time, its share of the GPU busy time,
the kernel time's baseline and delta, and % of floor.

Kernels on two streams overlap (a shared expert beside the routed ones), so the kernel times add up to
more than the busy time; the busy column splits each busy microsecond among the kernels running in it,
and adds up to the GPU busy row, the overlap row saying by how much the kernel times exceed it.

Reads cases as the results document holds them (moebench.results.document.CaseDoc), so the terminal summary, the
markdown summary and `moebench report` render the same table from the same data. breakdown_tables is
the decode family's renderer, registered in moebench.outputs.family_tables.RENDERERS.
"""

from __future__ import annotations

from typing import Iterable

from moebench.decode.breakdown import PREFIX
from moebench.decode.categories import CATEGORIES, LABELS
from moebench.outputs.report import Table, fmt_fixed, fmt_pct
from moebench.results.document import CaseDoc

HEADER = ["category", "kernel ms/step", "busy ms/step", "busy share", "baseline", "delta", "% of floor"]


def breakdown_tables(cases: Iterable[CaseDoc]) -> list[Table]:
    """A table for every case that carries a breakdown (info.breakdown), in the given order."""
    out = []
    for case in cases:
        bd = case.info.get("breakdown")
        if not bd:
            continue

        def value(name: str) -> float | None:
            m = case.metrics.get(name)
            return m.metric.value if m is not None else None

        busy = value(f"{PREFIX}gpu_busy_ms")
        rows = []
        for c in CATEGORIES:
            m = case.metrics.get(f"{PREFIX}{c}_ms")
            if m is None or (not m.metric.value and not m.baseline):
                continue  # a category with no kernel in this step (communication on one GPU)
            busy_ms = bd["categories"].get(c, {}).get("busy_share_ms_per_step")  # absent in older results
            share = 100 * busy_ms / busy if busy_ms is not None and busy else None
            rows.append([LABELS[c] + (" (gated)" if m.gated else ""), fmt_fixed(m.metric.value), fmt_fixed(busy_ms),
                         fmt_pct(share), fmt_fixed(m.baseline), fmt_pct(m.delta_pct, signed=True),
                         fmt_pct(value(f"pct_of_floor_{c}"))])
        rows.append(["overlap (kernel time - GPU busy)", fmt_fixed(bd.get("overlap_ms_per_step")), "", "", "", "", ""])
        rows.append(["GPU busy", "", fmt_fixed(busy), fmt_pct(100.0 if busy else None), "", "", ""])
        rows.append(["host gap (step - GPU busy)", fmt_fixed(value(f"{PREFIX}host_gap_ms")), "", "", "", "", ""])
        title = (f"decode step breakdown: {case.key} ({bd.get('steps')} profiled steps, {bd.get('source')}; "
                 f"steady {fmt_fixed(value('ms_per_token'))} ms/token)")
        out.append(Table(title, HEADER, rows))
    return out
