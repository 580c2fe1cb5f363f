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
          "metrics": {"<name>": {"value", "unit", "direction", "rel_tol", "noise", "n"}},
          "provenance": {"kind": "measured", "commit", "date", "versions": {...}}
                      | {"kind": "external", "source": "<where the figure came from>", "date"}
        }
      }
    }

Validation errors name the file and the dotted path of the field, on one line.
"""

from __future__ import annotations

import math
from typing import Any

from moebench.metrics import DIRECTIONS, Metric

SCHEMA_VERSION = 1
FAMILIES = ("gemm", "allreduce", "decode", "selfcheck")
PROVENANCE_KINDS = ("measured", "external")


class BaselineError(ValueError):
    """A baseline file that cannot be used; the message is one line naming the file and field."""


def _need(cond: bool, where: str, field: str, what: str) -> None:
    if not cond:
        raise BaselineError(f"{where}: {field}: {what}")


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def validate_metric(m: Any, where: str, path: str) -> Metric:
    """Check one stored metric object and return it as a Metric."""
    _need(isinstance(m, dict), where, path, "must be an object")
    for key in ("value", "unit", "direction", "rel_tol", "noise", "n"):
        _need(key in m, where, f"{path}.{key}", "missing")
    _need(_is_number(m["value"]), where, f"{path}.value", f"must be a finite number, got {m['value']!r}")
    _need(isinstance(m["unit"], str), where, f"{path}.unit", "must be a string")
    _need(m["direction"] in DIRECTIONS, where, f"{path}.direction",
          f"must be 'lower' or 'higher', got {m['direction']!r}")
    _need(_is_number(m["rel_tol"]) and 0 <= m["rel_tol"] < 10, where, f"{path}.rel_tol",
          f"must be a number in [0, 10), got {m['rel_tol']!r}")
    _need(_is_number(m["noise"]) and m["noise"] >= 0, where, f"{path}.noise",
          f"must be a number >= 0, got {m['noise']!r}")
    _need(isinstance(m["n"], int) and not isinstance(m["n"], bool) and m["n"] >= 1, where, f"{path}.n",
          f"must be an integer >= 1, got {m['n']!r}")
    return Metric(float(m["value"]), m["unit"], m["direction"], float(m["noise"]), m["n"], float(m["rel_tol"]))


def validate_provenance(p: Any, where: str, path: str) -> None:
    """Measured entries say commit, date and versions; external ones say where the figure came from."""
    _need(isinstance(p, dict), where, path, "must be an object")
    _need(p.get("kind") in PROVENANCE_KINDS, where, f"{path}.kind",
          f"must be one of {PROVENANCE_KINDS}, got {p.get('kind')!r}")
    _need(isinstance(p.get("date"), str) and p["date"], where, f"{path}.date", "missing")
    if p["kind"] == "measured":
        _need(isinstance(p.get("commit"), str) and p["commit"], where, f"{path}.commit", "missing")
        _need(isinstance(p.get("versions"), dict), where, f"{path}.versions", "must be an object")
    else:
        _need(isinstance(p.get("source"), str) and p["source"], where, f"{path}.source",
              "an external figure must say where it came from")


def validate_file(doc: Any, where: str, *, hardware_key: str | None = None, family: str | None = None) -> dict:
    """Validate a whole baseline document; returns it unchanged. `where` is the file name for messages."""
    _need(isinstance(doc, dict), where, "(top level)", "must be a JSON object")
    _need("schema_version" in doc, where, "schema_version", "missing")
    # type() check: `true == 1` and `1.0 == 1` in Python, and neither is a version this code wrote.
    _need(type(doc["schema_version"]) is int and doc["schema_version"] == SCHEMA_VERSION, where, "schema_version",
          f"this moebench reads version {SCHEMA_VERSION}, got {doc['schema_version']!r}")
    _need(isinstance(doc.get("hardware_key"), str), where, "hardware_key", "missing")
    if hardware_key is not None:
        _need(doc["hardware_key"] == hardware_key, where, "hardware_key",
              f"file is in the folder of {hardware_key!r} but says {doc['hardware_key']!r}")
    _need(doc.get("family") in FAMILIES, where, "family", f"must be one of {FAMILIES}, got {doc.get('family')!r}")
    if family is not None:
        _need(doc["family"] == family, where, "family", f"file name says {family!r}, content says {doc['family']!r}")
    _need(isinstance(doc.get("fingerprint"), dict), where, "fingerprint", "must be an object")
    _need(isinstance(doc.get("entries"), dict), where, "entries", "must be an object")
    for key, entry in doc["entries"].items():
        path = f"entries[{key!r}]"
        _need(isinstance(entry, dict), where, path, "must be an object")
        _need(isinstance(entry.get("definition_hash"), str), where, f"{path}.definition_hash", "missing")
        metrics = entry.get("metrics")
        _need(isinstance(metrics, dict) and metrics, where, f"{path}.metrics", "must be a non-empty object")
        for name, m in metrics.items():
            validate_metric(m, where, f"{path}.metrics.{name}")
        validate_provenance(entry.get("provenance"), where, f"{path}.provenance")
    return doc
