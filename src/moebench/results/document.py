"""The results document (`--results-json`): one typed model, written by the run and read by every command.

The session builds a ResultsDoc (`RunState.results_doc()`) and the plugin writes its `to_json()`;
`moebench compare|backends|report|predict|baselines promote` read files back through
`ResultsDoc.from_json` (`runs.load_run` for a path). The document:

- top level: `results_version`, `moebench_version`, `commit`, `hardware_key`, `fingerprint`, `started`,
  `finished`, `memory_ceiling_bytes_per_s`, `cases` (CaseDoc), `not_measured` (Row: the tests that ended
  without a measurement: skips, failures, errors)
- a case: `key`, `family`, `nodeid`, `verdict`, `definition`, `definition_hash`, `primary`, `metrics`
  (MetricDoc), `clocks`, `throttled`, `info`, `note`, `group`; `explanation` and `recorded` when set;
  `gpu` ({index, uuid, name}: the GPU a single-GPU case ran on) and `wall_s` (the test's setup, call and
  teardown time) when known;
  `samples` (the primary metric's); `first_measurement` when a suspected regression was measured again
- a metric: `Metric.to_json()` (`value`, `unit`, `direction`, `noise`, `n`, `rel_tol`) and `gated`; when
  the run compared it with a baseline also `verdict`, `baseline`, `delta_pct`, `noise_band`, `reason`,
  `baseline_rel_tol`; compared on a machine that did not record the baseline, `other_machine`,
  `machine_spread` (measured, widened for a machine beyond the recorders: `measured_machine_spread` over
  `recorded_machines`) or `assumed_machine_spread` with `compared_kind` (moebench.core.kinds); a metric's
  `kind` and `gate` where set

Older files load: a file without `results_version` is version 1, and a field a file does not have reads
as its default. A newer version is refused. Every problem is a ResultsError whose message is one line
naming the file and the field.
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable

from moebench.baselines.compare import Comparison, Outcome, Verdict, deciding_metric
from moebench.core.files import json_error
from moebench.core.metrics import Metric
from moebench.results.fields import ResultsError, get_field, is_number, metric_from, need, outcome, positive

# The document's version: 1 is the first (files from before the field existed read as 1). A change that
# an older reader would misread raises it; from_json refuses versions above it.
RESULTS_VERSION = 1
_GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True)
class MetricDoc:
    """A metric of a case: what was measured, and the run's own comparison of it with its baseline (None:
    not compared: informational, or the run had no comparison to make). A comparison read back has no
    `worse` (the file does not hold it); its delta_pct is computed as when it was written."""

    metric: Metric
    comparison: Comparison | None = None

    @property
    def gated(self) -> bool:
        """Whether the metric is compared with a baseline (not derived or informational)."""
        return self.metric.gated

    @property
    def verdict(self) -> str | None:
        """The run's verdict for this metric (a Verdict's value), None when not compared."""
        return self.comparison.verdict.value if self.comparison else None

    @property
    def baseline(self) -> float | None:
        """The baseline value the run compared with."""
        return self.comparison.baseline if self.comparison else None

    @property
    def delta_pct(self) -> float | None:
        """The change against that baseline, in percent."""
        return self.comparison.delta_pct if self.comparison else None

    def to_json(self) -> dict:
        """The metric as the results file holds it."""
        d = self.metric.to_json() | {"gated": self.metric.gated}
        c = self.comparison
        if c is not None:
            d.update(verdict=c.verdict.value, baseline=c.baseline, delta_pct=c.delta_pct, noise_band=c.noise,
                     reason=c.reason, baseline_rel_tol=c.rel_tol)
            if c.other_machine:  # which spread between machines the band holds: measured, or the kind's assumed
                d.update(other_machine=True, machine_spread=c.machine_spread, assumed_machine_spread=c.assumed_spread,
                         compared_kind=c.kind)
                if c.measured_machine_spread is not None:
                    d.update(measured_machine_spread=c.measured_machine_spread, recorded_machines=c.machines)
        return d

    @classmethod
    def from_json(cls, d: Any, where: str, path: str, samples: tuple[float, ...] = ()) -> MetricDoc:
        """Read one metric; ResultsError names the field at fault."""
        need(isinstance(d, dict), where, path, "must be an object")
        metric = metric_from(d, where, path, get_field(d, "gated", bool, True, where, path), samples)
        get_field(d, "delta_pct", float, None, where, path)  # checked, not kept: computed from value and baseline
        if d.get("verdict") is None:
            return cls(metric)
        verdict = Verdict(outcome(d["verdict"], Verdict, where, f"{path}.verdict"))
        baseline, rel_tol, noise = (get_field(d, k, float, None, where, path)
                                    for k in ("baseline", "baseline_rel_tol", "noise_band"))
        between, assumed, measured = (get_field(d, k, float, None, where, path)
                                      for k in ("machine_spread", "assumed_machine_spread", "measured_machine_spread"))
        return cls(metric, Comparison(verdict, metric.value, baseline, None, rel_tol, noise,
                                      get_field(d, "reason", str, "", where, path),
                                      get_field(d, "other_machine", bool, False, where, path), between,
                                      get_field(d, "compared_kind", str, None, where, path), assumed,
                                      measured_machine_spread=measured,
                                      machines=get_field(d, "recorded_machines", int, 0, where, path)))


@dataclass
class CaseDoc:
    """One measured case of a run."""

    key: str
    family: str
    verdict: str  # a Verdict's value
    primary: str | None
    metrics: dict[str, MetricDoc]
    info: dict = field(default_factory=dict)
    group: str | None = None
    definition_hash: str = ""
    throttled: bool = False
    nodeid: str = ""
    definition: dict = field(default_factory=dict)
    clocks: dict = field(default_factory=dict)
    note: str = ""
    explanation: str = ""  # what moved (decode: the category that grew most) and what ran differently
    recorded: dict = field(default_factory=dict)  # what ran (decode: the engine's backends)
    first_measurement: dict[str, Metric] | None = None  # the measurement a suspected regression replaced
    independent_runs: int = 1  # engine instances (decode --decode-instances) its values are medians of
    gpu: dict | None = None  # {index, uuid, name}: the one GPU it ran on (None: no GPU, or all of the box's)
    wall_s: float | None = None  # the test's wall time, setup to teardown (what a night of cases adds up to)

    @property
    def backend(self) -> str | None:
        """The backend axis of the case (`info["backend"]`), when the family records one."""
        b = self.info.get("backend")
        return str(b) if b is not None else None

    def to_json(self) -> dict:
        """The case as the results file holds it."""
        out = {"key": self.key, "family": self.family, "nodeid": self.nodeid, "verdict": self.verdict,
               "definition": self.definition, "definition_hash": self.definition_hash, "primary": self.primary,
               "metrics": {n: m.to_json() for n, m in self.metrics.items()}, "clocks": self.clocks,
               "throttled": self.throttled, "info": self.info, "note": self.note, "group": self.group}
        if self.explanation:
            out["explanation"] = self.explanation
        if self.recorded:
            out["recorded"] = self.recorded
        if self.primary and self.primary in self.metrics:
            out["samples"] = list(self.metrics[self.primary].metric.samples)
        if self.first_measurement is not None:
            out["first_measurement"] = {n: m.to_json() for n, m in self.first_measurement.items()}
        if self.independent_runs != 1:
            out["independent_runs"] = self.independent_runs
        if self.gpu:
            out["gpu"] = self.gpu
        if self.wall_s is not None:
            out["wall_s"] = round(self.wall_s, 3)
        return out

    @classmethod
    def from_json(cls, c: Any, where: str, path: str) -> CaseDoc:
        """Read one case (`path` names it until its key is known); ResultsError names the field at fault."""
        need(isinstance(c, dict), where, path, "must be an object")
        need(isinstance(c.get("key"), str) and bool(c["key"]), where, f"{path}.key", "missing")
        path = f"cases[{c['key']!r}]"
        need(isinstance(c.get("metrics"), dict), where, f"{path}.metrics", "must be an object")
        verdict = outcome(c.get("verdict"), Verdict, where, f"{path}.verdict")
        primary = get_field(c, "primary", str, None, where, path)
        need(primary is None or primary in c["metrics"], where, f"{path}.primary",
             f"names {primary!r}, which is not among its metrics")
        samples = get_field(c, "samples", list, [], where, path)
        need(all(is_number(s) and math.isfinite(s) for s in samples), where, f"{path}.samples",
             "must be finite numbers")
        metrics = {n: MetricDoc.from_json(m, where, f"{path}.metrics.{n}", tuple(samples) if n == primary else ())
                   for n, m in c["metrics"].items()}
        first = get_field(c, "first_measurement", dict, None, where, path)
        if first is not None:  # stored without `gated`: read as informational, so a NaN % does not refuse it
            first = {n: metric_from(m, where, f"{path}.first_measurement.{n}", False) for n, m in first.items()}

        def get(name: str, kind: type, default: Any) -> Any:
            return get_field(c, name, kind, default, where, path)

        return cls(c["key"], get("family", str, ""), verdict, primary, metrics, get("info", dict, {}),
                   get("group", str, None), get("definition_hash", str, ""), get("throttled", bool, False),
                   get("nodeid", str, ""), get("definition", dict, {}), get("clocks", dict, {}), get("note", str, ""),
                   get("explanation", str, ""), get("recorded", dict, {}), first,
                   positive(get("independent_runs", int, 1), where, f"{path}.independent_runs"),
                   get("gpu", dict, None), get("wall_s", float, None))

    def row(self) -> Row:
        """The case's line in the closing table, summary.md and the report's index (one function, so their
        tallies agree): the metric that decided its verdict (else the primary), its value, baseline and
        delta, and the note (what moved and the case's note, else the comparison's reason)."""
        comps = {n: m.comparison for n, m in self.metrics.items() if m.comparison is not None}
        name = deciding_metric(comps, Verdict(self.verdict), self.primary)
        m = self.metrics.get(name) if name else None
        c = comps.get(name) if name else None
        return Row(self.nodeid, self.key, self.verdict, name or "", m.metric.value if m else None,
                   m.metric.unit if m else "", c.baseline if c else None, c.delta_pct if c else None,
                   "; ".join(x for x in (self.explanation, self.note) if x) or (c.reason if c else ""))

    def baseline_entry(self, provenance: dict, machine: str = "unknown") -> dict | None:
        """The case as a baseline entry (gated metrics only, with `provenance`, the machine and GPU that
        measured it and how many independent runs its values are medians of), None when it has no gated
        metric: what --baseline-update and `moebench baselines promote` store."""
        metrics = {n: m.metric.to_json() for n, m in self.metrics.items() if m.gated}
        if not metrics:
            return None
        entry = {"definition_hash": self.definition_hash, "metrics": metrics, "provenance": dict(provenance),
                 "machines": [machine], "independent_runs": self.independent_runs}
        if self.recorded:
            entry["recorded"] = self.recorded
        if self.gpu and self.gpu.get("uuid"):
            entry["gpus"] = [{"index": self.gpu.get("index"), "uuid": self.gpu["uuid"]}]
        return entry


@dataclass
class Row:
    """One line of the closing table: a measured case (the metric that decided its verdict), or a test
    that produced no measurement (an Outcome: SKIP, FAIL, ERROR, or an ENV_MISMATCH figure of other
    hardware). The rows without a value are the document's `not_measured`."""

    nodeid: str
    key: str
    verdict: str  # an Outcome's value
    metric: str = ""
    value: float | None = None
    unit: str = ""
    baseline: float | None = None
    delta_pct: float | None = None
    note: str = ""

    def to_json(self) -> dict:
        """The row as `not_measured` holds it."""
        return asdict(self)

    @classmethod
    def from_json(cls, r: Any, where: str, path: str) -> Row:
        """Read one row; ResultsError names the field at fault."""
        need(isinstance(r, dict), where, path, "must be an object")
        kinds = {f.name: float if f.name in ("value", "baseline", "delta_pct") else str for f in fields(cls)}
        values = {n: get_field(r, n, k, None if k is float else "", where, path) for n, k in kinds.items()}
        return cls(**values | {"verdict": outcome(r.get("verdict"), Outcome, where, f"{path}.verdict")})


@dataclass
class ResultsDoc:
    """One run's results document. `path` is where it was read from (messages name it); it is not part
    of the document."""

    hardware_key: str
    started: str
    finished: str
    commit: str
    fingerprint: dict
    cases: dict[str, CaseDoc]
    not_measured: list[Row] = field(default_factory=list)
    moebench_version: str = ""
    memory_ceiling_bytes_per_s: dict[str, float] = field(default_factory=dict)
    path: str = ""

    @property
    def label(self) -> str:
        """'2026-11-29 22:04 10e9d2c' for tables and plot annotations."""
        return f"{self.started[:16].replace('T', ' ')} {self.commit[:7]}".strip()

    def to_json(self) -> dict:
        """The document as the results file holds it, at this moebench's RESULTS_VERSION."""
        return {"results_version": RESULTS_VERSION, "moebench_version": self.moebench_version, "commit": self.commit,
                "hardware_key": self.hardware_key, "fingerprint": self.fingerprint, "started": self.started,
                "finished": self.finished, "memory_ceiling_bytes_per_s": self.memory_ceiling_bytes_per_s,
                "cases": [c.to_json() for c in self.cases.values()],
                "not_measured": [r.to_json() for r in self.not_measured]}

    @classmethod
    def from_json(cls, doc: Any, where: str) -> ResultsDoc:
        """Validate a results document (already parsed from JSON); `where` names the file in messages."""
        need(isinstance(doc, dict), where, "(top level)", "must be a JSON object (a moebench --results-json file)")
        for k in ("hardware_key", "started", "cases"):
            need(k in doc, where, k, "missing (is this a moebench --results-json file?)")
        version = doc.get("results_version", 1)
        need(type(version) is int and 1 <= version <= RESULTS_VERSION, where, "results_version",
             f"this moebench reads versions 1..{RESULTS_VERSION}, got {version!r} (a newer moebench wrote it)")
        need(isinstance(doc["hardware_key"], str), where, "hardware_key", "must be a string")
        need(isinstance(doc["started"], str) and _iso(doc["started"]), where, "started",
             f"must be an ISO date like 2026-11-29T22:04:32Z, got {doc['started']!r}")
        need(isinstance(doc["cases"], list), where, "cases", "must be a list")
        cases: dict[str, CaseDoc] = {}
        for i, c in enumerate(doc["cases"]):
            case = CaseDoc.from_json(c, where, f"cases[{i}]")
            need(case.key not in cases, where, f"cases[{case.key!r}]", "appears twice")
            cases[case.key] = case
        rows = [Row.from_json(r, where, f"not_measured[{i}]")
                for i, r in enumerate(get_field(doc, "not_measured", list, [], where, ""))]
        # An older file may lack `finished` or `commit`: the start and "unknown" stand in.
        return cls(doc["hardware_key"], doc["started"], str(doc.get("finished") or doc["started"]),
                   str(doc.get("commit") or "unknown"), get_field(doc, "fingerprint", dict, {}, where, ""), cases, rows,
                   str(doc.get("moebench_version") or ""),
                   get_field(doc, "memory_ceiling_bytes_per_s", dict, {}, where, ""), where)


def _iso(s: str) -> bool:
    try:
        datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        return False
    return True


def entries_by_family(cases: Iterable[CaseDoc], provenance: dict, where: str = "",
                      machine: str = "unknown") -> dict[str, dict[str, dict]]:
    """Cases as baseline entries, {family: {key: entry}} (see CaseDoc.baseline_entry), measured on
    `machine`; a case with gated metrics but no family or definition hash (an older file) is a
    ResultsError naming `where`."""
    out: dict[str, dict[str, dict]] = {}
    for c in cases:
        entry = c.baseline_entry(provenance, machine)
        if entry is None:
            continue
        need(bool(c.family), where, f"cases[{c.key!r}].family", "missing")
        need(bool(c.definition_hash), where, f"cases[{c.key!r}].definition_hash", "missing")
        out.setdefault(c.family, {})[c.key] = entry
    return out


def read_json(path: str | Path) -> Any:
    """The parsed JSON of a file, plain or gzip-compressed (lent-machine runs keep results as `.json.gz`;
    told apart by the gzip magic bytes, not the name). Raises ResultsError in one line."""
    where = str(path)
    try:
        data = Path(path).read_bytes()
        if data[:2] == _GZIP_MAGIC:
            data = gzip.decompress(data)
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise ResultsError(f"{where}: no such file") from None
    except (OSError, EOFError, UnicodeDecodeError) as e:  # gzip.BadGzipFile is an OSError; a cut-off one, EOFError
        raise ResultsError(f"{where}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ResultsError(f"{where}: {json_error(e)}") from None
