"""What every `moebench` command shares: exit codes, the bad-input error, and --case patterns.

moebench.cli.main (the parser and most commands) and moebench.cli.baselines (`moebench baselines ...`) both
import from here; neither imports the other's helpers.
"""

from __future__ import annotations

import fnmatch
from typing import Callable, Sequence

EXIT_OK, EXIT_FOUND, EXIT_USAGE = 0, 1, 2


class CliError(Exception):
    """Bad input: printed as one line, exit code 2."""


def glob_match(key: str, pattern: str) -> bool:
    """Shell-style `*` and `?`; brackets are literal, since case keys contain them: 'gemm[kimi-*]'."""
    literal = "".join({"[": "[[]", "]": "[]]"}.get(ch, ch) for ch in pattern)
    return key == pattern or fnmatch.fnmatchcase(key, literal)


def matcher(patterns: Sequence[str] | None) -> Callable[[str], bool] | None:
    """A test of a case key against any of the --case patterns; None when no pattern was given (all)."""
    if not patterns:
        return None
    return lambda key: any(glob_match(key, p) for p in patterns)


def check_patterns(patterns: Sequence[str] | None, keys: Sequence[str], where: str) -> None:
    """Every --case pattern must name at least one case: a typo is an error, not an empty result."""
    for p in patterns or ():
        if not any(glob_match(k, p) for k in keys):
            near = [k for k in keys if p.strip("*[]").lower() in k.lower()][:3]
            hint = f" (did you mean {', '.join(near)}?)" if near else ""
            raise CliError(f"--case {p!r}: no such case in {where}{hint}")
