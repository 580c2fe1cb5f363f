"""The baseline file schema (versioned) and its validation.

A file `baselines/<hardware-key>/<family>.json`:

    {
      "schema_version": 1,
      "hardware_key": "nvidia-h200-x1",
      "family": "gemm",
      "fingerprint": {...},            # the machine at the last recording (moebench.hardware)
      "created": "2026-11-29T...Z", "updated": "...",
      "entries": {
        "<case key>": {
          "definition_hash": "<sha256 prefix of the case definition>",   # STALE when it changes
          "metrics": {"<name>": {"value", "unit", "direction", "rel_tol", "noise", "n",
                                 "noise_machines"?, "gate"?: "cliff"}},
          "machines": ["gpu-<12 hex>", ...],  # which machines measured it (hardware.machine_id)
          "independent_runs": 3,              # processes or engine instances its values are medians of
          "provenance": {"kind": "measured", "commit", "date", "versions": {...}}
                      | {"kind": "external", "source": "<where the figure came from>", "date"}
        }
      }
    }

Values must be physically possible: every stored metric is a time or a rate (us, ms, GB/s, tokens/s),
so its value is > 0; rel_tol is a fraction in (0, 1] (0.05 is 5%); noise >= 0; n >= 1.

`noise` is the spread that applies on the recording machine(s): the larger of the spread inside a run
and between its independent runs. `noise_machines` (only for entries recorded on two or more machines)
is the spread between machines of the kind, which the gate uses on any other machine. Entries recorded
before `machines` existed name none: every machine is "another machine" for them.

Validation reports every problem of a file at once: each on its own line naming the file and the dotted
path of the entry and field; several problems come as one block under a line that counts them.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

from moebench.hardware import KEY_RULE, is_key
from moebench.metrics import DIRECTIONS, Metric

SCHEMA_VERSION = 1
FAMILIES = ("gemm", "allreduce", "decode", "selfcheck")
PROVENANCE_KINDS = ("measured", "external")
METRIC_FIELDS = ("value", "unit", "direction", "rel_tol", "noise", "n")  # required; OPTIONAL_METRIC_RULES may follow
GATES = ("tolerance", "cliff")


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


# A stored metric's fields: name -> (the test a value passes, what a good value is). A results file holds
# the same record (Metric.to_json), so moebench.results checks direction, noise and n by these rules
# too; value, unit and rel_tol it checks its own way: a baseline stores only gated times and rates (> 0,
# with a reviewed tolerance), a results file informational metrics as well (a 0 ms host gap, a NaN % of
# an unknown floor).
Rule = tuple[Callable[[Any], bool], str]
METRIC_RULES: dict[str, Rule] = {
    "value": (lambda x: _is_number(x) and x > 0, "must be a finite number > 0 (a time or a rate)"),
    "unit": (lambda x: isinstance(x, str) and bool(x), "must be a non-empty string"),
    "direction": (lambda x: x in DIRECTIONS, "must be 'lower' or 'higher'"),
    "rel_tol": (lambda x: _is_number(x) and 0 < x <= 1, "must be a fraction in (0, 1] (0.05 is 5%)"),
    "noise": (lambda x: _is_number(x) and x >= 0, "must be a number >= 0"),
    "n": (lambda x: isinstance(x, int) and not isinstance(x, bool) and x >= 1, "must be an integer >= 1"),
    "noise_machines": (lambda x: _is_number(x) and x >= 0, "must be a number >= 0"),
    "gate": (lambda x: x in GATES, f"must be one of {GATES}"),
}


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
    check_fields(m, METRIC_RULES, path, p.need)
    return len(p.lines) == before


def validate_metric(m: Any, where: str, path: str) -> Metric:
    """Check one stored metric object and return it as a Metric."""
    p = _Problems(where)
    _check_metric(p, m, path)
    p.raise_if_any()
    between = m.get("noise_machines")
    return Metric(float(m["value"]), m["unit"], m["direction"], float(m["noise"]), m["n"], float(m["rel_tol"]),
                  noise_machines=float(between) if between is not None else None, cliff=m.get("gate") == "cliff")


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


def _check_entry(p: _Problems, entry: Any, path: str) -> None:
    if not p.need(isinstance(entry, dict), path, "must be an object"):
        return
    p.need(isinstance(entry.get("definition_hash"), str), f"{path}.definition_hash", "missing")
    metrics = entry.get("metrics")
    if p.need(isinstance(metrics, dict) and bool(metrics), f"{path}.metrics", "must be a non-empty object"):
        for name, m in metrics.items():
            _check_metric(p, m, f"{path}.metrics.{name}")
    _check_provenance(p, entry.get("provenance"), f"{path}.provenance")
    if "machines" in entry:
        p.need(isinstance(entry["machines"], list) and bool(entry["machines"])
               and all(isinstance(x, str) and x for x in entry["machines"]), f"{path}.machines",
               f"must be a non-empty list of machine ids, got {entry['machines']!r}")
    if "independent_runs" in entry:
        runs = entry["independent_runs"]
        p.need(isinstance(runs, int) and not isinstance(runs, bool) and runs >= 1, f"{path}.independent_runs",
               f"must be an integer >= 1, got {runs!r}")


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
    p.need(type(doc["schema_version"]) is int and doc["schema_version"] == SCHEMA_VERSION, "schema_version",
           f"this moebench reads version {SCHEMA_VERSION}, got {doc['schema_version']!r}")
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
    entries = doc.get("entries")
    if p.need(isinstance(entries, dict), "entries", "must be an object"):
        for key, entry in entries.items():
            _check_entry(p, entry, f"entries[{key!r}]")
    p.raise_if_any()
    return doc
