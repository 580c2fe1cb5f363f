"""Runs side by side: loading results files, the latest run per family, comparing two runs with the
gate's own verdict, backends side by side, and a run's cases as baseline entries.

A results file is a moebench.results.document.ResultsDoc (its module says what the document holds and how older
files load). `moebench backends` reads `info["backend"]` (the backend axis) and the group that puts
backends of one shape side by side: the case's `group`, else `info["group"]`, else `info["shape"]`, else
the key with the backend token removed.

Every problem is a ResultsError whose message is one line naming the file and the field.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from moebench.baselines.compare import Comparison, Outcome, case_verdict, compare_case, deciding_metric
from moebench.results.document import CaseDoc, ResultsDoc, ResultsError, entries_by_family, read_json


def shape_group(case: CaseDoc) -> str:
    """What the backends of one shape share: the recorded group, else the key without its backend."""
    for g in (case.group, case.info.get("group"), case.info.get("shape")):
        if g not in (None, ""):
            return g if isinstance(g, str) else json.dumps(g, sort_keys=True)
    return key_without(case.key, case.backend) if case.backend else case.key


def key_without(key: str, token: str | None) -> str:
    """The case key with one dash-separated token removed: gemm[x-m1-bf16-triton] -> gemm[x-m1-bf16]."""
    if not token:
        return key
    m = re.fullmatch(r"(?P<fam>[^\[]*)\[(?P<axes>.*)\]", key)
    head, axes = (m["fam"], m["axes"]) if m else ("", key)
    parts = [p for p in axes.split("-") if p != token]
    return f"{head}[{'-'.join(parts)}]" if m else "-".join(parts)


def load_run(path: str | Path) -> ResultsDoc:
    """Read (plain or `.json.gz`) and validate one results file. Raises ResultsError with a one-line message."""
    return ResultsDoc.from_json(read_json(path), str(path))


def load_runs(paths: Iterable[str | Path]) -> list[ResultsDoc]:
    """Several results files, oldest first (by their `started` date)."""
    return sorted((load_run(p) for p in paths), key=lambda r: (r.started, r.path))


def latest_runs(runs: list[ResultsDoc]) -> dict[tuple[str, str], ResultsDoc]:
    """The newest run (of `runs`, oldest first) that measured each family on each hardware key:
    {(hardware key, family): run}. There is no one latest run across families (an allreduce run after a
    gemm run does not make every gemm case MISSING), nor across machines, which measure different cases."""
    out: dict[tuple[str, str], ResultsDoc] = {}
    for r in runs:
        for c in r.cases.values():
            out[r.hardware_key, c.family] = r
    return out


def baseline_entries(run: ResultsDoc) -> dict[str, dict[str, dict]]:
    """The run's cases as baseline entries ({family: {key: entry}}), gated metrics only, with the run's
    commit, finish date and versions as provenance: what `moebench baselines promote` writes."""
    from moebench.core import provenance

    prov = provenance.measured(run.fingerprint)
    prov.update(commit=run.commit, date=run.finished)
    return entries_by_family(run.cases.values(), prov, run.path, run.fingerprint.get("machine_id", "unknown"))


# --- comparing two runs -------------------------------------------------------------------------

@dataclass(frozen=True)
class CaseDelta:
    """A case of two runs side by side: the metric that decided its verdict, and that verdict."""

    key: str
    verdict: str
    metric: str
    unit: str = ""
    before: float | None = None
    after: float | None = None
    comparison: Comparison | None = None

    @property
    def delta_pct(self) -> float | None:
        return self.comparison.delta_pct if self.comparison else None


def compare_runs(a: ResultsDoc, b: ResultsDoc, *, ignore_hardware: bool = False) -> list[CaseDelta]:
    """Compare run b (the candidate) with run a (the reference), case by case, with the gate's own
    verdict function: a's gated metrics play the baseline (their rel_tol and noise as stored), b's the
    measurement. Runs on different hardware keys are ENV_MISMATCH unless ignore_hardware."""
    mismatch = a.hardware_key != b.hardware_key and not ignore_hardware
    out: list[CaseDelta] = []
    for key in sorted(set(a.cases) | set(b.cases)):
        ca, cb = a.cases.get(key), b.cases.get(key)
        if cb is None:
            name = ca.primary or next(iter(ca.metrics), "")
            m = ca.metrics.get(name)
            # Not a verdict of the gate, but a reviewer must see it: a case that stopped running hides its regressions.
            out.append(CaseDelta(key, Outcome.MISSING.value, name, m.metric.unit if m else "", m.metric.value if m else None))
            continue
        stale = bool(ca and ca.definition_hash and cb.definition_hash and ca.definition_hash != cb.definition_hash)
        # a's gated metrics are the stored entry, as a baseline file holds them
        comps = compare_case({n: sm.metric for n, sm in cb.metrics.items() if sm.gated},
                             {n: sm.metric for n, sm in ca.metrics.items() if sm.gated} if ca else None,
                             stale=stale, env_mismatch=mismatch, throttled=cb.throttled)
        verdict = case_verdict(comps)
        # Show the metric that decided the verdict; for a PASS, the case's primary metric.
        name = deciding_metric(comps, verdict, cb.primary if cb.primary in comps else next(iter(comps), cb.primary or ""))
        c = comps.get(name)
        unit = cb.metrics[name].metric.unit if name in cb.metrics else ""
        before = ca.metrics[name].metric.value if ca and name in ca.metrics else None
        after = cb.metrics[name].metric.value if name in cb.metrics else None
        out.append(CaseDelta(key, verdict.value, name, unit, before, after, c))
    return out


# --- backends side by side -----------------------------------------------------------------------

@dataclass(frozen=True)
class BackendCell:
    """One backend on one shape: the value, its speedup against the reference backend, % of the floor."""

    value: float
    unit: str
    speedup: float | None
    pct_of_floor: float | None
    verdict: str


def engine_column(case: CaseDoc) -> str:
    """A decode case's column when engines sit side by side: its engine and MoE kernel ("sglang-server/marlin")."""
    engine = str(case.info.get("engine") or "?")
    return f"{'openai' if engine.startswith(('http://', 'https://')) else engine}/{case.backend}"


def rank_group(case: CaseDoc) -> str:
    """What the engines of one scenario share: the shape group without the engine token
    (decode[kimi-k2.5-int4-rank-vllm-tp1-...] and decode[kimi-k2.5-int4-rank-sglang-server-tp1-...] meet)."""
    engine = engine_column(case).rsplit("/", 1)[0]
    return shape_group(case).replace(f"-{engine}-", "-", 1)


def merge_runs(runs: list[ResultsDoc]) -> ResultsDoc:
    """Several runs of one hardware key as one (engines measured in separate sessions, side by side); a case
    in two of them is an error naming both files."""
    if len({r.hardware_key for r in runs}) > 1:
        raise ResultsError("runs of different hardware are not put side by side: "
                           + ", ".join(f"{r.path} ({r.hardware_key})" for r in runs))
    first, cases, where = runs[0], {}, {}
    for r in runs:
        for key, c in r.cases.items():
            if key in cases:
                raise ResultsError(f"{r.path}: cases[{key!r}]: also in {where[key]}; give one of the two")
            cases[key], where[key] = c, r.path
    return ResultsDoc(first.hardware_key, first.started, runs[-1].finished, first.commit, first.fingerprint, cases,
                      path=" + ".join(r.path for r in runs))


def resolve_reference(reference: str | None, backends: list[str], where: str) -> str | None:
    """The column `reference` names: itself, or the one engine/kernel column with that engine or kernel."""
    if reference is None or reference in backends:
        return reference
    named = [b for b in backends if reference in b.split("/")]
    if len(named) != 1:
        raise ResultsError(f"--reference {reference!r}: no such backend in {where} (it has: {', '.join(backends)})")
    return named[0]


def backend_matrix(run: ResultsDoc, *, reference: str | None, metric: str | None = None, floor_metric: str = "pct_of_floor",
                   family: str | None = None, by_engine: bool = False,
                   required: bool = True) -> tuple[list[str], dict[str, dict[str, BackendCell]], str]:
    """Backends of a run side by side per shape group (by_engine: engine/kernel columns per scenario's rank).

    Returns (backends in first-seen order, {group: {backend: cell}}, the metric name used). The metric is
    `metric` or each case's primary; a case without it is an error when `required`, else left blank. Speedup
    is how many times faster than `reference` (a column, or the one column with that engine or kernel) on the
    same group (reference time / time for a lower-is-better metric, value / reference value for a
    higher-is-better one); None where the group has no reference case. Raises ResultsError when nothing fits.
    """
    cases = [c for c in run.cases.values() if c.backend and (family is None or c.family == family)]
    if not cases:
        where = f"family {family!r}" if family else "any case"
        raise ResultsError(f"{run.path}: cases[*].info.backend: no backend recorded for {where} "
                        f"(moebench backends needs cases whose info names their backend)")
    column, group_of = (engine_column, rank_group) if by_engine else (lambda c: c.backend, shape_group)
    backends = list(dict.fromkeys(column(c) for c in cases))
    reference = resolve_reference(reference, backends, run.path)
    groups: dict[str, dict[str, CaseDoc]] = {}
    for c in sorted(cases, key=lambda c: c.key):
        groups.setdefault(group_of(c), {})[column(c)] = c
    used = metric
    out: dict[str, dict[str, BackendCell]] = {}
    for g, by_backend in groups.items():
        row: dict[str, BackendCell] = {}
        ref = by_backend.get(reference) if reference else None
        for b, c in by_backend.items():
            name = metric or c.primary
            if name is None or name not in c.metrics:
                if metric is not None and required:
                    raise ResultsError(f"{run.path}: cases[{c.key!r}].metrics.{metric}: missing "
                                    f"(it has: {', '.join(c.metrics)})")
                continue
            used = used or name
            sm = c.metrics[name].metric
            speedup = None
            if ref is not None and name in ref.metrics and sm.value and ref.metrics[name].metric.value:
                r = ref.metrics[name].metric.value
                speedup = r / sm.value if sm.direction == "lower" else sm.value / r
            floor = c.metrics.get(floor_metric)
            pct = floor.metric.value if floor is not None and math.isfinite(floor.metric.value) else None
            row[b] = BackendCell(sm.value, sm.unit, speedup, pct, c.verdict)
        out[g] = row
    return backends, out, used or ""
