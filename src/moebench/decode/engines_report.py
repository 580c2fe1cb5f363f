"""Engines side by side on one rank: where each spends its decode step, and what it chose to run.

`moebench backends vllm.json sglang.json --family decode` prints one table per rank after its metric
tables: a column per engine/kernel, rows for the MoE kernel and attention backend each engine reported
in its log, then each category's share of the GPU busy time in ms/step (the shares add up to the busy
time, so the columns compare like with like although a step's kernels overlap), the host gap, the steady
ms/token, and a last column with the last engine minus the first, so "which is faster, and
where" reads off one table.
"""

from __future__ import annotations

from moebench.decode.breakdown import PREFIX
from moebench.decode.categories import CATEGORIES, LABELS
from moebench.outputs.report import Table, fmt_fixed
from moebench.results.document import CaseDoc, ResultsDoc
from moebench.history.runs import engine_column, rank_group


def _choice(case: CaseDoc, what: str) -> str:
    got = (case.info.get("engine_choices") or {}).get(what) or []
    return ", ".join(str(x) for x in got) if isinstance(got, list) else str(got)


def _busy_share(case: CaseDoc, category: str) -> float | None:
    cats = (case.info.get("breakdown") or {}).get("categories") or {}
    got = (cats.get(category) or {}).get("busy_share_ms_per_step")
    return float(got) if isinstance(got, (int, float)) else None


def _metric(case: CaseDoc, name: str) -> float | None:
    m = case.metrics.get(name)
    return m.metric.value if m is not None else None


def engines_tables(run: ResultsDoc) -> list[Table]:
    """One table per rank measured by two or more engines (decode cases that name an engine)."""
    groups: dict[str, dict[str, CaseDoc]] = {}
    for c in run.cases.values():  # the files' order: the columns of the metric tables above
        if c.family == "decode" and c.backend and c.info.get("engine"):
            groups.setdefault(rank_group(c), {})[engine_column(c)] = c
    out = []
    for group, by_engine in sorted(groups.items()):
        if len(by_engine) < 2:
            continue
        names = list(by_engine)
        cases = [by_engine[n] for n in names]
        rows: list[list[str]] = [["MoE kernel (engine log)"] + [_choice(c, "moe") or "-" for c in cases] + [""],
                                 ["attention (engine log)"] + [_choice(c, "attention") or "-" for c in cases] + [""]]

        def row(label: str, values: list[float | None]) -> list[str]:
            a, b = values[0], values[-1]
            diff = f"{b - a:+.3f}" if a is not None and b is not None else ""
            return [label] + [fmt_fixed(v) if v is not None else "-" for v in values] + [diff]

        for cat in CATEGORIES:
            values = [_busy_share(c, cat) for c in cases]
            if any(v for v in values):
                rows.append(row(f"{LABELS[cat]} (ms/step of GPU busy)", values))
        rows.append(row("GPU busy (ms/step)", [_metric(c, f"{PREFIX}gpu_busy_ms") for c in cases]))
        rows.append(row("host gap (ms/step)", [_metric(c, f"{PREFIX}host_gap_ms") for c in cases]))
        rows.append(row("steady ms/token", [_metric(c, "ms_per_token") for c in cases]))
        title = (f"engines side by side: {group} (categories as shares of the GPU busy time, which add up to it; "
                 f"last column: {names[-1]} - {names[0]})")
        out.append(Table(title, ["", *names, "difference"], rows))
    return out
