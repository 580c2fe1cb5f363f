"""Results files (the `--results-json` of a run): loading them strictly, and comparing runs.

A results file is `RunState.results_doc()` (src/moebench/session.py). The fields read here:

- top level: `hardware_key`, `started`, `finished`, `commit`, `fingerprint`, `cases`, `not_measured`
- each case: `key`, `family`, `verdict`, `primary`, `definition_hash`, `info`, `metrics`
- each metric: `value`, `unit`, `direction`, `noise`, `n`, `rel_tol`, `gated`, and when the run compared
  it with a baseline: `baseline`, `delta_pct`, `verdict`
- for `moebench backends`: `info["backend"]` (the backend axis), and the group that puts backends of
  one shape side by side: the case's `group`, else `info["group"]`, else `info["shape"]`, else the key
  with the backend token removed.

Every problem is a RunsError whose message is one line naming the file and the field.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable

from moebench.baselines.compare import Comparison, Outcome, case_verdict, compare_case, deciding_metric
from moebench.metrics import DIRECTIONS, Metric

_GZIP_MAGIC = b"\x1f\x8b"


# The results document's version (`results_version`): written by session.RunState.results_doc, checked
# here. Files from before the field existed (no `results_version`) read as version 1.
RESULTS_VERSION = 1


class RunsError(ValueError):
    """A results file that cannot be used; the message is one line naming the file and the field."""


@dataclass(frozen=True)
class StoredMetric:
    """One metric of a case as a results file stores it, with the run's own comparison when it had one."""

    metric: Metric
    gated: bool
    verdict: str | None = None
    baseline: float | None = None
    delta_pct: float | None = None


@dataclass
class CaseRecord:
    """One measured case of a run."""

    key: str
    family: str
    verdict: str
    primary: str | None
    metrics: dict[str, StoredMetric]
    info: dict = field(default_factory=dict)
    group: str | None = None
    definition_hash: str = ""
    throttled: bool = False

    @property
    def backend(self) -> str | None:
        """The backend axis of the case (`info["backend"]`), when the family records one."""
        b = self.info.get("backend")
        return str(b) if b is not None else None

    def shape_group(self) -> str:
        """What the backends of one shape share: the recorded group, else the key without its backend."""
        for g in (self.group, self.info.get("group"), self.info.get("shape")):
            if g not in (None, ""):
                return g if isinstance(g, str) else json.dumps(g, sort_keys=True)
        return key_without(self.key, self.backend) if self.backend else self.key


@dataclass
class Run:
    """One results file."""

    path: str
    hardware_key: str
    started: str
    finished: str
    commit: str
    fingerprint: dict
    cases: dict[str, CaseRecord]
    not_measured: list[dict] = field(default_factory=list)

    @property
    def label(self) -> str:
        """'2026-11-29 22:04 10e9d2c' for tables and plot annotations."""
        return f"{self.started[:16].replace('T', ' ')} {self.commit[:7]}".strip()


def key_without(key: str, token: str | None) -> str:
    """The case key with one dash-separated token removed: gemm[x-m1-bf16-triton] -> gemm[x-m1-bf16]."""
    if not token:
        return key
    m = re.fullmatch(r"(?P<fam>[^\[]*)\[(?P<axes>.*)\]", key)
    head, axes = (m["fam"], m["axes"]) if m else ("", key)
    parts = [p for p in axes.split("-") if p != token]
    return f"{head}[{'-'.join(parts)}]" if m else "-".join(parts)


def fmt_value(x: float | None, unit: str = "") -> str:
    """4 significant digits, without an exponent in the range benchmarks live in (46870 us, 0.0123 ms)."""
    if x is None:
        return "-"
    if x == 0 or not math.isfinite(x) or not 1e-3 <= abs(x) < 1e7:
        text = f"{x:.4g}"
    else:
        text = f"{x:.{max(0, 3 - math.floor(math.log10(abs(x))))}f}"
    return f"{text} {unit}".strip()


# --- loading --------------------------------------------------------------------------------------

def _need(cond: bool, where: str, path: str, what: str) -> None:
    if not cond:
        raise RunsError(f"{where}: {path}: {what}")


def _iso(s: str) -> bool:
    try:
        datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        return False
    return True


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _metric(d: Any, where: str, path: str) -> StoredMetric:
    _need(isinstance(d, dict), where, path, "must be an object")
    for k in ("value", "unit", "direction"):
        _need(k in d, where, f"{path}.{k}", "missing")
    _need(_number(d["value"]), where, f"{path}.value", f"must be a number, got {d['value']!r}")
    _need(isinstance(d["unit"], str), where, f"{path}.unit", "must be a string")
    _need(d["direction"] in DIRECTIONS, where, f"{path}.direction",
          f"must be 'lower' or 'higher', got {d['direction']!r}")
    noise, rel_tol, n = d.get("noise", 0.0), d.get("rel_tol", 0.05), d.get("n", 1)
    _need(_number(noise) and noise >= 0, where, f"{path}.noise", f"must be a number >= 0, got {noise!r}")
    _need(_number(rel_tol) and rel_tol >= 0, where, f"{path}.rel_tol", f"must be a number >= 0, got {rel_tol!r}")
    _need(isinstance(n, int) and not isinstance(n, bool) and n >= 1, where, f"{path}.n",
          f"must be an integer >= 1, got {n!r}")
    baseline = d.get("baseline")
    _need(baseline is None or _number(baseline), where, f"{path}.baseline", f"must be a number, got {baseline!r}")
    delta = d.get("delta_pct")
    return StoredMetric(Metric(float(d["value"]), d["unit"], d["direction"], float(noise), n, float(rel_tol)),
                        bool(d.get("gated", True)), d.get("verdict"),
                        float(baseline) if baseline is not None else None,
                        float(delta) if _number(delta) else None)


def _case(c: Any, where: str, path: str) -> CaseRecord:
    _need(isinstance(c, dict), where, path, "must be an object")
    _need(isinstance(c.get("key"), str) and c["key"], where, f"{path}.key", "missing")
    path = f"cases[{c['key']!r}]"
    _need(isinstance(c.get("metrics"), dict), where, f"{path}.metrics", "must be an object")
    _need(isinstance(c.get("verdict"), str), where, f"{path}.verdict", "missing")
    info = c.get("info", {})
    _need(isinstance(info, dict), where, f"{path}.info", "must be an object")
    metrics = {name: _metric(m, where, f"{path}.metrics.{name}") for name, m in c["metrics"].items()}
    primary = c.get("primary")
    _need(primary is None or primary in metrics, where, f"{path}.primary",
          f"names {primary!r}, which is not among its metrics")
    return CaseRecord(c["key"], str(c.get("family", "")), c["verdict"], primary, metrics, info,
                      c.get("group"), str(c.get("definition_hash", "")), bool(c.get("throttled", False)))


def parse_run(doc: Any, where: str) -> Run:
    """Validate a results document (already parsed from JSON) and return it as a Run."""
    _need(isinstance(doc, dict), where, "(top level)", "must be a JSON object (a moebench --results-json file)")
    for k in ("hardware_key", "started", "cases"):
        _need(k in doc, where, k, "missing (is this a moebench --results-json file?)")
    version = doc.get("results_version", 1)
    _need(type(version) is int and 1 <= version <= RESULTS_VERSION, where, "results_version",
          f"this moebench reads versions 1..{RESULTS_VERSION}, got {version!r} (a newer moebench wrote it)")
    _need(isinstance(doc["hardware_key"], str), where, "hardware_key", "must be a string")
    _need(isinstance(doc["started"], str) and _iso(doc["started"]), where, "started",
          f"must be an ISO date like 2026-11-29T22:04:32Z, got {doc['started']!r}")
    _need(isinstance(doc["cases"], list), where, "cases", "must be a list")
    cases: dict[str, CaseRecord] = {}
    for i, c in enumerate(doc["cases"]):
        rec = _case(c, where, f"cases[{i}]")
        _need(rec.key not in cases, where, f"cases[{rec.key!r}]", "appears twice")
        cases[rec.key] = rec
    fp = doc.get("fingerprint") or {}
    _need(isinstance(fp, dict), where, "fingerprint", "must be an object")
    nm = doc.get("not_measured") or []
    _need(isinstance(nm, list), where, "not_measured", "must be a list")
    return Run(where, doc["hardware_key"], doc["started"], str(doc.get("finished") or doc["started"]),
               str(doc.get("commit") or "unknown"), fp, cases, [r for r in nm if isinstance(r, dict)])


def read_json(path: str | Path) -> Any:
    """The parsed JSON of a file, plain or gzip-compressed (lent-machine runs keep results as `.json.gz`;
    told apart by the gzip magic bytes, not the name). Raises RunsError in one line."""
    where = str(path)
    try:
        data = Path(path).read_bytes()
        if data[:2] == _GZIP_MAGIC:
            data = gzip.decompress(data)
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise RunsError(f"{where}: no such file") from None
    except (OSError, EOFError, UnicodeDecodeError) as e:  # gzip.BadGzipFile is an OSError; a cut-off one, EOFError
        raise RunsError(f"{where}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise RunsError(f"{where}: line {e.lineno} column {e.colno}: invalid JSON: {e.msg}") from None


def load_run(path: str | Path) -> Run:
    """Read (plain or `.json.gz`) and validate one results file. Raises RunsError with a one-line message."""
    return parse_run(read_json(path), str(path))


def load_runs(paths: Iterable[str | Path]) -> list[Run]:
    """Several results files, oldest first (by their `started` date)."""
    return sorted((load_run(p) for p in paths), key=lambda r: (r.started, r.path))


def latest_runs(runs: list[Run]) -> dict[tuple[str, str], Run]:
    """The newest run (of `runs`, oldest first) that measured each family on each hardware key:
    {(hardware key, family): run}. There is no one latest run across families (an allreduce run after a
    gemm run does not make every gemm case MISSING), nor across machines, which measure different cases."""
    out: dict[tuple[str, str], Run] = {}
    for r in runs:
        for c in r.cases.values():
            out[r.hardware_key, c.family] = r
    return out


def baseline_entries(run: Run) -> dict[str, dict[str, dict]]:
    """The run's cases as baseline entries ({family: {key: entry}}), gated metrics only, with the run's
    commit, finish date and versions as provenance: what `moebench baselines promote` writes."""
    from moebench import provenance

    prov = provenance.measured(run.fingerprint)
    prov.update(commit=run.commit, date=run.finished)
    out: dict[str, dict[str, dict]] = {}
    for c in run.cases.values():
        metrics = {n: sm.metric.to_json() for n, sm in c.metrics.items() if sm.gated}
        if not metrics:
            continue
        _need(bool(c.family), run.path, f"cases[{c.key!r}].family", "missing")
        _need(bool(c.definition_hash), run.path, f"cases[{c.key!r}].definition_hash", "missing")
        out.setdefault(c.family, {})[c.key] = {"definition_hash": c.definition_hash, "metrics": metrics,
                                               "provenance": dict(prov)}
    return out


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


def compare_runs(a: Run, b: Run, *, ignore_hardware: bool = False) -> list[CaseDelta]:
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


def backend_matrix(run: Run, *, reference: str | None, metric: str | None = None, floor_metric: str = "pct_of_floor",
                   family: str | None = None) -> tuple[list[str], dict[str, dict[str, BackendCell]], str]:
    """Backends of a run side by side per shape group.

    Returns (backends in first-seen order, {group: {backend: cell}}, the metric name used). The metric is
    `metric` or each case's primary. Speedup is how many times faster than `reference` on the same group
    (reference time / time for a lower-is-better metric, value / reference value for a higher-is-better
    one); None where the group has no reference case. Raises RunsError when nothing fits.
    """
    cases = [c for c in run.cases.values() if c.backend and (family is None or c.family == family)]
    if not cases:
        where = f"family {family!r}" if family else "any case"
        raise RunsError(f"{run.path}: cases[*].info.backend: no backend recorded for {where} "
                        f"(moebench backends needs cases whose info names their backend)")
    backends = list(dict.fromkeys(c.backend for c in cases))
    if reference is not None and reference not in backends:
        raise RunsError(f"--reference {reference!r}: no such backend in {run.path} (it has: {', '.join(backends)})")
    groups: dict[str, dict[str, CaseRecord]] = {}
    for c in sorted(cases, key=lambda c: c.key):
        groups.setdefault(c.shape_group(), {})[c.backend] = c
    used = metric
    out: dict[str, dict[str, BackendCell]] = {}
    for g, by_backend in groups.items():
        row: dict[str, BackendCell] = {}
        ref = by_backend.get(reference) if reference else None
        for b, c in by_backend.items():
            name = metric or c.primary
            if name is None or name not in c.metrics:
                if metric is not None:
                    raise RunsError(f"{run.path}: cases[{c.key!r}].metrics.{metric}: missing "
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
