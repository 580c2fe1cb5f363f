"""Run state shared by the plugin's hooks and the `moebench` fixture: baselines, results, updates."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping

from moebench.core import hardware, provenance
from moebench.baselines.compare import (SEVERITY, Comparison, Verdict, case_verdict, compare_case,
                                        failing, recorded_changes)
from moebench.baselines.schema import FAMILIES
from moebench.baselines.store import BaselineSet, other_hardware_entries
from moebench.core.metrics import Metric
from moebench.outputs.report import fmt_changes, fmt_pct, machine_phrase, new_metrics_phrase, one_line
from moebench.results.document import CaseDoc, MetricDoc, ResultsDoc, Row, entries_by_family


@dataclass
class Measurement:
    """What one run of a case's measure() produced."""

    metrics: dict[str, Metric]
    clocks: dict = field(default_factory=dict)
    throttled: bool = False


@dataclass
class CaseResult:
    """A case's outcome: what was measured, what it was compared with, the verdict."""

    key: str
    family: str
    nodeid: str
    definition: dict
    definition_hash: str
    measurement: Measurement
    comparisons: dict[str, Comparison]
    verdict: Verdict
    info: dict = field(default_factory=dict)
    primary: str | None = None
    remeasured_from: Measurement | None = None
    note: str = ""
    group: str | None = None
    explanation: str = ""  # what moved (decode: the category that grew most) and what ran differently
    recorded: dict = field(default_factory=dict)  # what ran, stored with a baseline (decode: the engine's backends)
    independent_runs: int = 1  # engine instances its values are medians of (decode --decode-instances)
    gpu: dict | None = None  # the one GPU it ran on (hardware.own_gpu); None: no GPU, or all of the box's

    def doc(self) -> CaseDoc:
        """The case as the results document holds it."""
        return CaseDoc(self.key, self.family, self.verdict.value, self.primary,
                       {n: MetricDoc(m, self.comparisons.get(n)) for n, m in self.measurement.metrics.items()},
                       self.info, self.group, self.definition_hash, self.measurement.throttled, self.nodeid,
                       self.definition, self.measurement.clocks, self.note, self.explanation, self.recorded,
                       self.remeasured_from.metrics if self.remeasured_from is not None else None,
                       self.independent_runs, self.gpu)


class RunState:
    """Everything the run knows; one per pytest session (config.stash)."""

    def __init__(self, *, baseline_dir: Path, hardware_key: str, fingerprint: dict, strict: bool,
                 update: bool, baselines: BaselineSet, key_forced: bool):
        self.baseline_dir = baseline_dir
        self.hardware_key = hardware_key
        self.fingerprint = fingerprint
        self.strict = strict
        self.update = update
        self.baselines = baselines
        self.key_forced = key_forced
        self.results: list[CaseResult] = []
        self.merged: list[CaseDoc] = []  # cases that -n workers measured (moebench.xdist_merge), in report order
        self.rows: list[Row] = []
        self.durations: dict[str, float] = {}  # nodeid -> seconds of its setup, call and teardown
        self.started = hardware.now_iso()
        self._ceilings: dict[str, float] = {}

    # --- comparing -----------------------------------------------------------------------------
    def env_mismatch(self, family: str, key: str) -> tuple[bool, str]:
        """A stored entry recorded on other hardware than this (possible only with --hardware-key)."""
        if not self.key_forced:
            return True, ""
        return hardware.same_hardware(self.baselines.fingerprint(family, key), self.fingerprint)

    def compare(self, family: str, key: str, def_hash: str, m: Measurement,
                gpu: dict | None = None) -> tuple[dict[str, Comparison], Verdict, str]:
        """Compare every gated metric of a measurement with the stored entry: with the spread on the
        recording machine when this is one of the machines that recorded that metric (and `gpu`, the GPU
        the case ran on, one of the GPUs that did), else with the spread between machines of the kind. A
        CPU other than the recording one is named (host-bound numbers follow it), and so is a GPU other
        than the recording one, whatever the verdict."""
        same, why = self.env_mismatch(family, key)
        entry = self.baselines.entry(family, key)
        notes = []
        if entry is None:
            others = other_hardware_entries(self.baseline_dir, self.hardware_key, family, key)
            if others:
                notes.append("baseline exists only for " + ", ".join(sorted(others)) + " (not compared)")
        elif not same:
            notes.append(why)
        else:
            notes.append(hardware.cpu_change(self.baselines.fingerprint(family, key), self.fingerprint))
        machine = self.fingerprint.get("machine_id", "unknown")
        other = bool(entry) and not entry.measured_on(machine)
        moved = entry.other_gpu(gpu) if entry and same and not other else ""
        # per metric: a counter counted on one of the entry's machines is another machine's on the others
        comps = compare_case(m.metrics, entry.metrics if entry else None,
                             stale=bool(entry and entry.definition_hash != def_hash), env_mismatch=not same,
                             throttled=m.throttled, other_machine=other, other_gpu=moved,
                             machines=len(entry.machines) if entry else 0,
                             recorders=entry.recorders(machine) if entry else None)
        verdict = case_verdict(comps)
        if moved:  # said on every row: a moved case's PASS was judged against the wider spread
            notes.append(f"ran on GPU {gpu['index']}, baseline from GPU {moved}: gated as another machine")
        elif verdict not in (Verdict.PASS, Verdict.NEW):  # where the spread it was judged against came from
            notes.append(next((machine_phrase(c) for c in comps.values() if c.verdict is verdict and c.other_machine), ""))
        elif verdict is Verdict.NEW:  # an entry that lacks some metrics: say how the others compared
            notes.append(new_metrics_phrase(comps))
        return comps, verdict, "; ".join(n for n in notes if n)

    def record(self, *, nodeid: str, key: str, family: str, definition: dict, measure: Callable[[], Mapping[str, Metric]],
               info: dict | None = None, primary: str | None = None, group: str | None = None,
               doubt: str = "", progress: Callable[[str], None] = lambda s: None,
               explain: Callable[[Mapping[str, Comparison], Mapping[str, Metric]], str] | None = None,
               recorded: Callable[[], dict] | None = None, independent_runs: int = 1,
               gpu: dict | None = None) -> CaseResult:
        """Measure, compare, re-measure once on a suspected regression, and keep the result. A `doubt`
        (why this machine cannot vouch for the measurement) makes a PASS or NEW case AMBIGUOUS, noted.
        `explain` (comparisons, metrics) -> a phrase saying what moved, shown with a verdict other than
        PASS/NEW; `recorded()` -> what ran (read after measuring), stored with a baseline and compared with
        the stored one whatever the verdict. independent_runs: how many separate engine instances or
        processes measure() combined (its values are their medians); gpu: the one GPU the case runs on
        (hardware.own_gpu; None for a case on all of the box's GPUs or on none)."""
        if family not in FAMILIES:
            # Checked before measuring: an unknown family used to be measured and, under
            # --baseline-update, written to <family>.json, which the schema then refused on every
            # later run (a usage error for the whole suite, caused by the harness's own write).
            raise ValueError(f"{key}: family must be one of {FAMILIES}, got {family!r}")
        def_hash = provenance.definition_hash(definition)
        first = self._measure(measure)
        comps, verdict, note = self.compare(family, key, def_hash, first, gpu)
        remeasured_from = None
        if verdict is Verdict.REGRESSION:
            progress(f"{key}: suspected regression, measuring once more")
            remeasured_from = first
            second = self._measure(measure)
            comps, verdict, note = self.compare(family, key, def_hash, second, gpu)
            first = second
        if doubt and SEVERITY[verdict] < SEVERITY[Verdict.AMBIGUOUS]:
            verdict, note = Verdict.AMBIGUOUS, doubt
        if primary is None:
            primary = next((n for n, mm in first.metrics.items() if mm.gated), next(iter(first.metrics), None))
        ran = dict(recorded() if recorded else {})
        entry = self.baselines.entry(family, key)
        why = [explain(comps, first.metrics) if explain and verdict not in (Verdict.PASS, Verdict.NEW) else "",
               fmt_changes(recorded_changes(entry.recorded, ran)) if entry else ""]
        result = CaseResult(key, family, nodeid, definition, def_hash, first, comps, verdict, dict(info or {}),
                            primary, remeasured_from, note, group, "; ".join(w for w in why if w), ran,
                            independent_runs, gpu)
        self.results.append(result)
        self.rows.append(self._row(result))
        return result

    @staticmethod
    def _measure(measure: Callable[[], Mapping[str, Metric]]) -> Measurement:
        with hardware.clock_monitor() as clocks:
            metrics = dict(measure())
        return Measurement(metrics, clocks.to_json(), clocks.throttled)

    @staticmethod
    def _row(r: CaseResult) -> Row:
        # From the results document's case, as the report's index reads it back: one tally for both.
        return r.doc().row()

    def failure_line(self, r: CaseResult) -> str | None:
        """The one line a failing case reports, or None when the case passes the gate. Under
        --baseline-update nothing fails on its verdict: the run is accepting its numbers, and the verdict
        table and the printed change lines are what a reviewer reads."""
        if self.update or not failing(r.verdict, strict=self.strict):
            return None
        for name, c in r.comparisons.items():
            if c.verdict is r.verdict:
                line = one_line(r.key, name, c, r.measurement.metrics[name].unit)
                # every other metric with the same verdict is named too: the first is not always the one
                # that explains the failure (a noisy TTFT beside a slower kernel category)
                also = [f"{n} {fmt_pct(oc.delta_pct, signed=True)}" for n, oc in r.comparisons.items()
                        if n != name and oc.verdict is r.verdict and oc.delta_pct is not None]
                if also:
                    line += f"; also {r.verdict.value}: {', '.join(also)}"
                return f"{line}; {r.explanation}" if r.explanation else line
        return f"{r.verdict.value} {r.key}"

    def add_row(self, row: Row) -> None:
        """A test that ended without a measurement (skip, error) still gets its line in the table."""
        self.rows.append(row)

    def add_doc(self, doc: CaseDoc) -> None:
        """A case an -n worker measured and gated (its report carried it here): kept, with its row."""
        self.merged.append(doc)
        self.rows.append(doc.row())

    def docs(self) -> list[CaseDoc]:
        """Every measured case as the results document holds it, this process's and the workers', each
        with its test's wall time."""
        return [replace(d, wall_s=self.durations.get(d.nodeid, d.wall_s))
                for d in [r.doc() for r in self.results] + self.merged]

    def gate_failed(self, nodeid: str) -> bool:
        """Whether the gate failed this test itself (REGRESSION, or NEW/STALE when strict): its row says why."""
        if any(r.nodeid == nodeid and self.failure_line(r) is not None for r in self.results):
            return True
        return not self.update and any(d.nodeid == nodeid and failing(Verdict(d.verdict), strict=self.strict)
                                       for d in self.merged)

    # --- shared measurements -------------------------------------------------------------------
    def ceiling(self, device: str, measure: Callable[[], float]) -> float:
        """The session's memory ceiling (bytes/s) for a device, measured once on first use."""
        if device not in self._ceilings:
            self._ceilings[device] = measure()
        return self._ceilings[device]

    @property
    def ceilings(self) -> dict[str, float]:
        return dict(self._ceilings)

    def merge_ceilings(self, ceilings: dict[str, float], gpu: str = "") -> None:
        """A worker's ceilings: each also under `<kind>@<gpu>` (its GPU's own), the first one seen plain."""
        for k, v in ceilings.items():
            self._ceilings.setdefault(k, v)
            if gpu:
                self._ceilings[f"{k}@{gpu}"] = v

    # --- baseline updates ----------------------------------------------------------------------
    def entries_by_family(self) -> dict[str, dict[str, dict]]:
        """Baseline entries for the measured cases (gated metrics only), grouped by family."""
        return entries_by_family(self.docs(), provenance.measured(self.fingerprint),
                                 machine=self.fingerprint.get("machine_id", "unknown"))

    def results_doc(self) -> ResultsDoc:
        """The results document: every case with metrics, verdict, baseline, delta, noise; the fingerprint."""
        from moebench import __version__

        return ResultsDoc(self.hardware_key, self.started, hardware.now_iso(), provenance.git_commit(), self.fingerprint,
                          {d.key: d for d in self.docs()}, [row for row in self.rows if row.value is None],
                          __version__, self.ceilings)
