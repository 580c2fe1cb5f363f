"""The baseline file schema (versioned) and its validation.

A file `baselines/<hardware-key>/<family>.json`:

    {
      "schema_version": 2,             # 1 is read too (see SCHEMA_VERSIONS)
      "hardware_key": "nvidia-h200-x1",
      "family": "gemm",
      "fingerprint": {...},            # the machine of the entries that name none of their own (below)
      "fingerprints": {"<id>": {...}}, # every machine an entry names (optional; moebench.core.hardware)
      "created": "2026-11-29T...Z", "updated": "...",
      "entries": {
        "<case key>": {
          "definition_hash": "<sha256 prefix of the case definition>",   # STALE when it changes
          "metrics": {"<name>": {"value", "unit", "direction", "rel_tol", "noise", "n",
                                 "noise_machines"?, "gate"?: "cliff" | "none", "kind"?,
                                 "tol_rule"?: "tight", "by_machine"?: {"gpu-<12 hex>": {"value", "runs"}},
                                 "machines"?: [...], "independent_runs"?: 3}},  # its own, see below
          "fingerprint": "<id>",       # the machine state it was recorded with, a key of "fingerprints" (optional)
          "machines": ["gpu-<12 hex>", ...],  # which machines measured it (hardware.machine_id; optional)
          "gpus": [{"index": 3, "uuid": "GPU-..."}],  # which GPUs of them ran a single-GPU case (optional)
          "independent_runs": 3,              # processes or engine instances its values are medians of
          "provenance": {"kind": "measured", "commit", "date", "versions": {...}}
                      | {"kind": "external", "source": "<where the figure came from>", "date"}
        }
      }
    }

Each entry written by this code names the machine it was recorded on (`fingerprint`, the id of one of
the header's `fingerprints`, see fingerprint_id). The header's own `fingerprint` describes only the
entries that name none (written before entries carried theirs) and no write changes it: a run filed
under another hardware key (--baseline-other-hardware) once rewrote it, and the file then said that all
179 H200 entries were recorded on a CPU. A file made by this code starts with `{}` there.

Values must be physically possible: every stored metric is a time or a rate (us, ms, GB/s, tokens/s),
so its value is > 0; n >= 1; rel_tol and noise are bounded by what a measurement can justify
(REL_TOL_MAX, NOISE_MAX).

`noise` is the spread that applies on the recording machine(s): the larger of the spread inside a run
and between its independent runs. `noise_machines` (only for entries recorded on two or more machines)
is the spread between machines of the kind, which the gate uses on any other machine. Entries recorded
before `machines` existed name none: every machine is "another machine" for them. `kind` (moebench.core.kinds)
says what the number is bound by, and so which spread between machines the gate assumes where none was
measured. A metric measured on fewer machines or runs than its entry (counters counted on one machine,
promoted beside a time entry of four: moebench.baselines.combine) names its own `machines` (each one of the
entry's) and `independent_runs` (at most the entry's); the gate then reads it as recorded on those machines
alone, and a metric that names none as recorded on all of its entry's. `gate`: "cliff" (host-bound: fails
only when it doubles; rel_tol then reads 1.0, what the gate applies) or "none" (its noise was too wide to
gate: the value is kept and always compares AMBIGUOUS; only such a metric may store a noise over NOISE_MAX).

Version 2 (this code) added `kind`, `gate: "none"`, a bound on noise_machines, and reads a rate's
tolerance as a ratio (compare.slowdown). A version 1 file reads as version 2 (every version 1 file is a
valid version 2 one); a file this code writes says 2, so an older moebench refuses it instead of
misreading a "none" gate (needs_v2; a file with neither keeps saying 1 and its bytes).

Validation reports every problem of a file at once: each on its own line naming the file and the dotted
path of the entry and field; several problems come as one block under a line that counts them.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, Callable, Mapping

from moebench.baselines.compare import NOISE_FACTOR
from moebench.core.files import json_error
from moebench.core.hardware import KEY_RULE, is_key
from moebench.core.kinds import KINDS
from moebench.core.metrics import DIRECTIONS, Metric

SCHEMA_VERSION = 2
SCHEMA_VERSIONS = (1, 2)  # what this code reads
FAMILIES = ("gemm", "allreduce", "decode", "selfcheck")
PROVENANCE_KINDS = ("measured", "external")
METRIC_FIELDS = ("value", "unit", "direction", "rel_tol", "noise", "n")  # required; OPTIONAL_METRIC_RULES may follow
GATES = ("tolerance", "cliff", "none")


class BaselineError(ValueError):
    """A baseline file that cannot be used. The message names the file and field: one line for one
    problem, a block of such lines under a count line for several."""


class _Problems:
    """The problems found in one file, collected so that a reviewer sees all of them in one pass."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.lines: list[str] = []

    def need(self, cond: bool, field: str, what: str) -> bool:
        """Record `what` against `field` unless `cond`; returns `cond` so callers can skip dependent checks."""
        if not cond:
            self.lines.append(f"{self.where}: {field}: {what}")
        return cond

    def raise_if_any(self) -> None:
        if len(self.lines) == 1:
            raise BaselineError(self.lines[0])
        if self.lines:
            raise BaselineError(f"{self.where}: {len(self.lines)} errors\n" + "\n".join(f"  {line}" for line in self.lines))


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _is_count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1


# The largest tolerance a reviewer may store: the value doubling (or a rate halving), a cliff. The widest
# the measurements here have needed: eager NCCL allreduce at decode sizes, host-bound, moved +10..+98%
# between two H200 hosts (allreduce/cases.py, stored at 1.00); TTFT, a 64-token eager prefill, read 90-147
# ms over 12 engine instances on two H200 machines (decode_scenarios.toml, stored at 0.60). Anything wider
# lets a 2x slowdown read PASS, which no measured spread justifies.
REL_TOL_MAX = 1.0
# The largest stored noise (a relative spread, moebench.core.metrics.relative_spread): the one whose noise band
# (NOISE_FACTOR x noise, compare.py) reaches REL_TOL_MAX, so that no stored spread can hide a doubling (a
# stored noise of 50 made a 2x slowdown read AMBIGUOUS). The widest the committed baselines hold is 0.45
# (a two-rank custom allreduce at 2 tokens); a noisier case needs more samples, not a wider band.
NOISE_MAX = REL_TOL_MAX / NOISE_FACTOR


# A stored metric's fields: name -> (the test a value passes, what a good value is). A results file holds
# the same record (Metric.to_json), so moebench.results.document checks direction, noise and n by these rules
# too; value, unit and rel_tol it checks its own way: a baseline stores only gated times and rates (> 0,
# with a reviewed tolerance), a results file informational metrics as well (a 0 ms host gap, a NaN % of
# an unknown floor).
Rule = tuple[Callable[[Any], bool], str]
METRIC_RULES: dict[str, Rule] = {
    "value": (lambda x: _is_number(x) and x > 0, "must be a finite number > 0 (a time or a rate)"),
    "unit": (lambda x: isinstance(x, str) and bool(x), "must be a non-empty string"),
    "direction": (lambda x: x in DIRECTIONS, "must be 'lower' or 'higher'"),
    "rel_tol": (lambda x: _is_number(x) and 0 < x <= REL_TOL_MAX,
                f"must be a fraction in (0, {REL_TOL_MAX:g}] (0.05 is 5%; {REL_TOL_MAX:g}: the value doubling)"),
    "noise": (lambda x: _is_number(x) and 0 <= x <= NOISE_MAX,
              f"must be a relative spread in [0, {NOISE_MAX:g}] (a wider one would hide a doubling)"),
    "n": (lambda x: isinstance(x, int) and not isinstance(x, bool) and x >= 1, "must be an integer >= 1"),
    # bounded as noise is: a stored 50 made a -90% regression AMBIGUOUS on every other machine
    "noise_machines": (lambda x: _is_number(x) and 0 <= x <= NOISE_MAX,
                       f"must be a relative spread in [0, {NOISE_MAX:g}] (a wider one would hide a doubling)"),
    "gate": (lambda x: x in GATES, f"must be one of {GATES}"),
    "kind": (lambda x: x in KINDS, f"must be one of {tuple(KINDS)} (moebench.core.kinds)"),
    # the rel_tol was set by the tight rule (moebench.baselines.record), not by a reviewer
    "tol_rule": (lambda x: x == "tight", "must be 'tight' (the rel_tol the 3-machine rule set) or absent"),
    # each machine's median and runs (moebench.baselines.combine), for the next promotion to weigh them one by one
    "by_machine": (lambda x: isinstance(x, dict) and len(x) >= 2 and all(_machine_median(k, v) for k, v in x.items()),
                   "must map two or more machines to {\"value\": a number > 0, \"runs\": an integer >= 1}"),
}


def _machine_median(machine: Any, v: Any) -> bool:
    """One `by_machine` item: a machine (or a "+"-joined group of them) to its median and run count."""
    return (isinstance(machine, str) and bool(machine) and isinstance(v, dict) and set(v) == {"value", "runs"}
            and _is_number(v["value"]) and v["value"] > 0
            and isinstance(v["runs"], int) and not isinstance(v["runs"], bool) and v["runs"] >= 1)


# A metric stored as not gating (gate "none") keeps the noise it measured, however wide: that is the
# reason it does not gate, and it compares AMBIGUOUS whatever its band.
_UNGATED_NOISE: Rule = (lambda x: _is_number(x) and x >= 0, "must be a number >= 0")


def check_fields(m: Mapping[str, Any], rules: Mapping[str, Rule], path: str,
                 need: Callable[[bool, str, str], object]) -> None:
    """Test each field of `m` that `rules` names: need(passed, "<path>.<field>", "<what>, got <value>")."""
    for key, (ok, what) in rules.items():
        if key in m:
            need(ok(m[key]), f"{path}.{key}", f"{what}, got {m[key]!r}")


def _check_metric(p: _Problems, m: Any, path: str) -> bool:
    """Record every problem of one stored metric; True when there is none."""
    if not p.need(isinstance(m, dict), path, "must be an object"):
        return False
    before = len(p.lines)
    for key in METRIC_FIELDS:
        p.need(key in m, f"{path}.{key}", "missing")
    rules = {**METRIC_RULES, "noise": _UNGATED_NOISE} if m.get("gate") == "none" else METRIC_RULES
    check_fields(m, rules, path, p.need)
    return len(p.lines) == before


def validate_metric(m: Any, where: str, path: str) -> Metric:
    """Check one stored metric object and return it as a Metric."""
    p = _Problems(where)
    _check_metric(p, m, path)
    p.raise_if_any()
    between = m.get("noise_machines")
    return Metric(float(m["value"]), m["unit"], m["direction"], float(m["noise"]), m["n"], float(m["rel_tol"]),
                  noise_machines=float(between) if between is not None else None, cliff=m.get("gate") == "cliff",
                  kind=m.get("kind"), gate_off=m.get("gate") == "none")


def _check_provenance(p: _Problems, prov: Any, path: str) -> None:
    """Measured entries say commit, date and versions; external ones say where the figure came from."""
    if not p.need(isinstance(prov, dict), path, "must be an object"):
        return
    kind_ok = p.need(prov.get("kind") in PROVENANCE_KINDS, f"{path}.kind",
                     f"must be one of {PROVENANCE_KINDS}, got {prov.get('kind')!r}")
    p.need(isinstance(prov.get("date"), str) and bool(prov["date"]), f"{path}.date", "missing")
    if not kind_ok:
        return
    if prov["kind"] == "measured":
        p.need(isinstance(prov.get("commit"), str) and bool(prov["commit"]), f"{path}.commit", "missing")
        p.need(isinstance(prov.get("versions"), dict), f"{path}.versions", "must be an object")
    else:
        p.need(isinstance(prov.get("source"), str) and bool(prov["source"]), f"{path}.source",
               "an external figure must say where it came from")


def fingerprint_id(fingerprint: Mapping[str, Any]) -> str:
    """The id an entry names its machine by: a sha256 prefix of the fingerprint's canonical JSON, so one
    machine state has one id and a hand-edited fingerprint no longer matches its id."""
    text = json.dumps(fingerprint, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _check_fingerprints(p: _Problems, doc: dict) -> set[str]:
    """The header's `fingerprints` (optional): id -> fingerprint, each id that fingerprint's own. Returns
    the ids an entry may name."""
    table = doc.get("fingerprints", {})
    if not p.need(isinstance(table, dict), "fingerprints", "must be an object (id -> fingerprint)"):
        return set()
    for fid, fp in table.items():
        if p.need(isinstance(fp, dict), f"fingerprints[{fid!r}]", "must be an object"):
            p.need(fingerprint_id(fp) == fid, f"fingerprints[{fid!r}]",
                   f"does not match its id (it hashes to {fingerprint_id(fp)!r}): edited by hand?")
    return set(table)


def _check_entry(p: _Problems, entry: Any, path: str, machines: set[str]) -> None:
    if not p.need(isinstance(entry, dict), path, "must be an object"):
        return
    p.need(isinstance(entry.get("definition_hash"), str), f"{path}.definition_hash", "missing")
    if "fingerprint" in entry:
        p.need(entry["fingerprint"] in machines, f"{path}.fingerprint",
               f"{entry['fingerprint']!r} is not one of the header's fingerprints")
    metrics = entry.get("metrics")
    if p.need(isinstance(metrics, dict) and bool(metrics), f"{path}.metrics", "must be a non-empty object"):
        for name, m in metrics.items():
            _check_metric(p, m, f"{path}.metrics.{name}")
    _check_provenance(p, entry.get("provenance"), f"{path}.provenance")
    if "machines" in entry:
        p.need(isinstance(entry["machines"], list) and bool(entry["machines"])
               and all(isinstance(x, str) and x for x in entry["machines"]), f"{path}.machines",
               f"must be a non-empty list of machine ids, got {entry['machines']!r}")
    if "gpus" in entry:
        p.need(isinstance(entry["gpus"], list) and bool(entry["gpus"])
               and all(isinstance(g, dict) and isinstance(g.get("uuid"), str) and g["uuid"]
                       and (g.get("index") is None or (isinstance(g["index"], int) and not isinstance(g["index"], bool)))
                       for g in entry["gpus"]), f"{path}.gpus",
               f"must be a non-empty list of {{index, uuid}} objects, got {entry['gpus']!r}")
    if "independent_runs" in entry:
        runs = entry["independent_runs"]
        p.need(_is_count(runs), f"{path}.independent_runs", f"must be an integer >= 1, got {runs!r}")
    if isinstance(metrics, dict):
        for name, m in metrics.items():
            if isinstance(m, dict):
                _check_metric_recorders(p, m, entry, f"{path}.metrics.{name}")


def _check_metric_recorders(p: _Problems, m: dict, entry: dict, path: str) -> None:
    """A metric's own `machines` and `independent_runs` (a metric measured on fewer than its entry): machines
    its entry names (the gate counts a recording machine by them), runs no more than the entry's."""
    if "machines" in m:
        own = m["machines"]
        named = entry.get("machines") if isinstance(entry.get("machines"), list) else []
        if p.need(isinstance(own, list) and bool(own) and all(isinstance(x, str) and x for x in own),
                  f"{path}.machines", f"must be a non-empty list of machine ids, got {own!r}"):
            strangers = [x for x in own if x not in named]
            p.need(not strangers, f"{path}.machines",
                   f"names {', '.join(map(repr, strangers))}, not one of the entry's machines ({named!r})")
    if "independent_runs" in m:
        runs, whole = m["independent_runs"], entry.get("independent_runs")
        if p.need(_is_count(runs), f"{path}.independent_runs", f"must be an integer >= 1, got {runs!r}") \
                and _is_count(whole):
            p.need(runs <= whole, f"{path}.independent_runs",
                   f"{runs} is more than the entry's independent_runs ({whole})")


def needs_v2(doc: Mapping[str, Any]) -> bool:
    """Whether a document holds what version 1 cannot say (a metric's `kind`, a "none" gate): written,
    it says version 2, so an older moebench refuses it instead of misreading it."""
    return any("kind" in m or m.get("gate") == "none"
               for e in doc.get("entries", {}).values() for m in (e.get("metrics") or {}).values()
               if isinstance(m, dict))


def entry_problems(entry: Any, where: str, key: str) -> list[str]:
    """Every problem of one entry about to be written (its machine is checked when it is merged, so a
    `fingerprint` it carries is left out here): one line each, naming `where` and the entry's key. The
    writer refuses that entry alone and writes the others."""
    p = _Problems(where)
    body = {f: v for f, v in entry.items() if f != "fingerprint"} if isinstance(entry, dict) else entry
    _check_entry(p, body, f"entries[{key!r}]", set())
    return p.lines


def parse_document(text: str, where: str) -> Any:
    """JSON text to a document, refusing a key named twice in one object: Python's json keeps the last
    silently, so a `"noise": 50.0` after the measured one used to switch the gate off unseen in review."""
    def refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict:
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                raise BaselineError(f"{where}: duplicate key {key!r} in one object (JSON would keep the last one "
                                    "silently; remove one)")
            seen[key] = value
        return seen

    try:
        return json.loads(text, object_pairs_hook=refuse_duplicates)
    except json.JSONDecodeError as e:
        raise BaselineError(f"{where}: {json_error(e)}") from None


def validate_file(doc: Any, where: str, *, hardware_key: str | None = None, family: str | None = None) -> dict:
    """Validate a whole baseline document; returns it unchanged. `where` is the file name for messages.
    Every problem is reported (see BaselineError), except that a document that is not an object or not
    of this schema version is not looked into further."""
    p = _Problems(where)
    p.need(isinstance(doc, dict), "(top level)", "must be a JSON object")
    p.raise_if_any()
    p.need("schema_version" in doc, "schema_version", "missing")
    p.raise_if_any()
    # type() check: `true == 1` and `1.0 == 1` in Python, and neither is a version this code wrote.
    p.need(type(doc["schema_version"]) is int and doc["schema_version"] in SCHEMA_VERSIONS, "schema_version",
           f"this moebench reads versions {', '.join(map(str, SCHEMA_VERSIONS))}, got {doc['schema_version']!r}")
    p.raise_if_any()
    key = doc.get("hardware_key")
    if p.need(isinstance(key, str), "hardware_key", "missing") and \
            p.need(is_key(key), "hardware_key", f"{key!r} is not a hardware key ({KEY_RULE})") and \
            hardware_key is not None:
        p.need(key == hardware_key, "hardware_key", f"file is in the folder of {hardware_key!r} but says {key!r}")
    if p.need(doc.get("family") in FAMILIES, "family", f"must be one of {FAMILIES}, got {doc.get('family')!r}") \
            and family is not None:
        p.need(doc["family"] == family, "family", f"file name says {family!r}, content says {doc['family']!r}")
    p.need(isinstance(doc.get("fingerprint"), dict), "fingerprint", "must be an object")
    machines = _check_fingerprints(p, doc)
    entries = doc.get("entries")
    if p.need(isinstance(entries, dict), "entries", "must be an object"):
        for key, entry in entries.items():
            _check_entry(p, entry, f"entries[{key!r}]", machines)
    p.raise_if_any()
    return doc
