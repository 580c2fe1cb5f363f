"""Reading the results document's fields: each problem one ResultsError that names the file and the field.
moebench.results.document builds its typed model (ResultsDoc, CaseDoc, MetricDoc) with these."""

from __future__ import annotations

import math
from typing import Any

from moebench.baselines.schema import METRIC_RULES, check_fields
from moebench.core.metrics import Metric


class ResultsError(ValueError):
    """A results file that cannot be used; the message is one line naming the file and the field."""


def need(cond: bool, where: str, path: str, what: str) -> None:
    """Raise ResultsError "<where>: <path>: <what>" unless cond."""
    if not cond:
        raise ResultsError(f"{where}: {path}: {what}")


def is_number(x: Any) -> bool:
    """An int or float, not a bool."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


KINDS = {str: "a string", dict: "an object", list: "a list", bool: "true or false", float: "a number",
         int: "an integer"}


def get_field(d: dict, name: str, kind: type, default: Any, where: str, path: str) -> Any:
    """d[name] when it is of `kind` (float: any number), `default` when absent or null; otherwise a
    ResultsError naming the field."""
    x = d.get(name)
    if x is None:
        return default
    # bool is an int to Python, and `true` is no count
    ok = is_number(x) if kind is float else isinstance(x, kind) and not (kind is int and isinstance(x, bool))
    need(ok, where, f"{path}.{name}" if path else name, f"must be {KINDS[kind]}, got {x!r}")
    return float(x) if kind is float else x


def positive(n: int, where: str, path: str) -> int:
    """n, when at least 1; else a ResultsError naming the field."""
    need(n >= 1, where, path, f"must be at least 1, got {n!r}")
    return n


def outcome(x: Any, allowed: type, where: str, path: str) -> str:
    """An outcome field: one of `allowed`'s values (Verdict for what the gate said, Outcome for a row)."""
    values = [o.value for o in allowed]
    need(x in values, where, path, f"must be one of {', '.join(values)}, got {x!r}")
    return str(x)


# A results file's value, unit, rel_tol and noise rules (see schema.METRIC_RULES for why they differ from a
# baseline's: a run reports the spread it measured, however wide, and a baseline bounds what it stores);
# a gated value must also be finite, which from_json checks with the `gated` field.
RULES = {**METRIC_RULES,
         "value": (is_number, "must be a number"),
         "unit": (lambda x: isinstance(x, str), "must be a string"),
         "rel_tol": (lambda x: is_number(x) and x >= 0, "must be a number >= 0"),
         "noise": (lambda x: is_number(x) and x >= 0, "must be a number >= 0")}


def metric_from(d: Any, where: str, path: str, gated: bool, samples: tuple[float, ...] = ()) -> Metric:
    """A results file's metric object as a Metric, every field checked (RULES)."""
    need(isinstance(d, dict), where, path, "must be an object")
    for k in ("value", "unit", "direction"):
        need(k in d, where, f"{path}.{k}", "missing")
    check_fields(d, RULES, path, lambda ok, p, what: need(ok, where, p, what))
    value = float(d["value"])
    need(math.isfinite(value) or not gated, where, f"{path}.value",
         f"a gated metric must be a finite number, got {value!r}")
    between = d.get("noise_machines")
    return Metric(value, d["unit"], d["direction"], float(d.get("noise", 0.0)), d.get("n", 1),
                  float(d.get("rel_tol", 0.05)), gated, samples,
                  noise_machines=float(between) if between is not None else None, cliff=d.get("gate") == "cliff",
                  kind=d.get("kind"), gate_off=d.get("gate") == "none")
