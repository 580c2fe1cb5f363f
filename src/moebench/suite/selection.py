"""What a run's -m expression can select, asked before a family's cases exist.

A family whose cases cannot be built (a broken decode scenario file) stops a run that could select one
of its cases with one usage line, and leaves a run that cannot (`-m selfcheck`) alone. The error is
raised after collection, from the plugin: raised while a test module is collected, pytest reports it as
a collection error with a traceback and stops every family.

Whether an expression can select a case of a family is asked of pytest's own -m parser, over the truth
values of the markers the expression names: the family's marker true, the other families' false (a
case belongs to one family), every other marker free.
"""

from __future__ import annotations

import re

import pytest
from _pytest.mark.expression import Expression  # pytest's -m parser (its API is the same in 9.0 to 9.2)

from moebench.baselines.schema import FAMILIES

_LATE_USAGE_ERRORS = pytest.StashKey[list]()
# `gpus(2)`: a positional marker argument, which -m cannot match (it matches keyword arguments only)
_POSITIONAL = re.compile(r"\b(gpus)\(\s*(\d+)\s*\)")


def marker_names_in(expr: str) -> set[str]:
    """Marker names an -m expression mentions (keyword arguments and quoted strings left out)."""
    expr = re.sub(r"\"[^\"]*\"|'[^']*'", "", expr)
    names = set()
    for m in re.finditer(r"[A-Za-z_][A-Za-z0-9_]*", expr):
        rest = expr[m.end():].lstrip()
        if rest.startswith("=") and not rest.startswith("=="):
            continue
        names.add(m.group())
    return names - {"and", "or", "not", "True", "False", "None"}


def can_select(markexpr: str, family: str) -> bool:
    """Whether the -m expression can select a case of `family` (an empty expression selects all; one
    pytest cannot parse is left for pytest to report, and counts as selecting)."""
    if not markexpr.strip():
        return True
    try:
        expr = Expression.compile(markexpr)
    except Exception:  # pytest's own -m check names the problem
        return True
    fixed = {f: f == family for f in FAMILIES}

    def satisfiable(chosen: dict) -> bool:
        free: list = []

        def matcher(name: str, /, **kwargs) -> bool:
            if name in fixed and not kwargs:
                return fixed[name]
            key = (name, tuple(sorted(kwargs.items())))
            if key not in chosen:
                free.append(key)
            return chosen.get(key, False)

        if expr.evaluate(matcher):
            return True
        # False with every undecided marker false: try the first one true, then decided false.
        return bool(free) and (satisfiable({**chosen, free[0]: True}) or satisfiable({**chosen, free[0]: False}))

    return satisfiable({})


def positional_argument_hint(markexpr: str) -> str | None:
    """The usage line for `-m "gpus(2)"` (pytest says only "not a valid python identifier 2"), else None."""
    m = _POSITIONAL.search(markexpr)
    if m is None:
        return None
    return (f"-m {markexpr!r}: write {m.group(1)}(n={m.group(2)}), not {m.group(0)}: "
            "-m matches a marker's arguments by keyword only")


def defer_usage_error(config: pytest.Config, message: str) -> None:
    """Keep a usage error found while a test module is collected, for raise_deferred after collection."""
    config.stash.setdefault(_LATE_USAGE_ERRORS, []).append(message)


def raise_deferred(config: pytest.Config) -> None:
    """Raise the first usage error kept by defer_usage_error (pytest prints it as one line, exit 4)."""
    errors = config.stash.get(_LATE_USAGE_ERRORS, [])
    if errors:
        raise pytest.UsageError(errors[0])
