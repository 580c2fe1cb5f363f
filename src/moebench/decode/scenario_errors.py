"""A TOML syntax error in a scenario file as one line naming the file, the scenario and the field.

tomllib says only "Invalid value (at line 45, column 10)"; the other scenario errors read
`FILE: scenario 'NAME': FIELD: what`, so this one does too: the scenario is the [[scenario]] table the
line falls in (by its name, else its position), the field the key on that line.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

_AT_LINE = re.compile(r"\(at line (\d+), column \d+\)")
_HEADER = re.compile(r"^\s*\[\[\s*scenario\s*\]\]")
_TABLE = re.compile(r"^\s*\[")
_NAME = re.compile(r"""^\s*name\s*=\s*["']([^"']*)["']""")
_KEY = re.compile(r"^\s*([A-Za-z0-9_.-]+)\s*=")


def toml_error(path: Path, text: str, err: tomllib.TOMLDecodeError) -> str:
    """`FILE: scenario 'NAME': FIELD: invalid TOML: ...` (scenario and field where the line has them)."""
    where = str(path)
    m = _AT_LINE.search(str(err))
    if m:
        lines = text.splitlines()
        n = int(m.group(1))
        where += _scenario_at(lines, n) + _field_at(lines, n)
    return f"{where}: invalid TOML: {err}"


def _scenario_at(lines: list[str], n: int) -> str:
    """': scenario NAME' for the [[scenario]] table holding line n (1-based), or '' outside one."""
    headers = [i for i, ln in enumerate(lines[:n]) if _HEADER.match(ln)]
    if not headers:
        return ""
    start = headers[-1]
    end = next((i for i in range(start + 1, len(lines)) if _TABLE.match(lines[i])), len(lines))
    name = next((m.group(1) for ln in lines[start + 1:end] if (m := _NAME.match(ln))), None)
    return f": scenario {name!r}" if name else f": scenario #{len(headers)}"


def _field_at(lines: list[str], n: int) -> str:
    """': FIELD' for the key set on line n, or ''."""
    m = _KEY.match(lines[n - 1]) if 0 < n <= len(lines) else None
    return f": {m.group(1)}" if m else ""
