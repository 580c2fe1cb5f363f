"""The decode step breakdown as a table: per category ms/step, share, baseline, delta and % of floor.

Reads cases as the results JSON holds them (CaseResult.to_json), so the terminal summary, the markdown
summary and `moebench report` render the same table from the same data.
"""

from __future__ import annotations

from typing import Iterable

from moebench.decode.breakdown import PREFIX
from moebench.decode.categories import CATEGORIES, LABELS

HEADER = ["category", "ms/step", "share", "baseline", "delta", "% of floor"]


def _num(x, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


def breakdown_tables(cases: Iterable[dict]) -> list[tuple[str, list[list[str]]]]:
    """(title, rows) for every case that carries a breakdown (info.breakdown), in the given order."""
    out = []
    for case in cases:
        bd = (case.get("info") or {}).get("breakdown")
        if not bd:
            continue
        metrics = case.get("metrics") or {}
        rows = []
        for c in CATEGORIES:
            m = metrics.get(f"{PREFIX}{c}_ms") or {}
            share = bd["categories"].get(c, {}).get("share")
            if not m.get("value") and not m.get("baseline"):
                continue  # a category with no kernel in this step (communication on one GPU)
            floor = (metrics.get(f"pct_of_floor_{c}") or {}).get("value")
            delta = m.get("delta_pct")
            rows.append([LABELS[c] + (" (gated)" if m.get("gated") else ""), _num(m.get("value")),
                         _num(None if share is None else 100 * share, ".1f") + ("%" if share is not None else ""),
                         _num(m.get("baseline")), "-" if delta is None else f"{delta:+.1f}%",
                         "-" if floor is None else f"{floor:.1f}%"])
        busy = (metrics.get(f"{PREFIX}gpu_busy_ms") or {}).get("value")
        gap = (metrics.get(f"{PREFIX}host_gap_ms") or {}).get("value")
        rows.append(["GPU busy", _num(busy), "", "", "", ""])
        rows.append(["host gap (step - GPU busy)", _num(gap), "", "", "", ""])
        steady = (metrics.get("ms_per_token") or {}).get("value")
        title = (f"decode step breakdown: {case.get('key')} ({bd.get('steps')} profiled steps, {bd.get('source')}; "
                 f"steady {_num(steady)} ms/token)")
        out.append((title, rows))
    return out
