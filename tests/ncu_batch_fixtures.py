"""ncu raw CSV of one counter child that profiled several cases, built from a committed fixture's own rows.

The real fixture (tests/data/ncu/h200-kimi-k2.5-m1-int4-triton.csv: ncu 2025.3.1.0 on an H200, session 16)
is one case's window: 16 calls of the int4 kernel's up (even rows) and down (odd rows) launches. A chunk's
output is that format with several windows, each after its boundary marker launch. The marker rows here are
written from the real format (a real chunk printed by ncu on an H200 in session 17,
h200-chunk-kimi-deepseek-m1-int4-triton.csv, holds them to its own in test_ncu_windows.py):
a copy of a real row (the down launch: block (128, 1, 1), as a default Triton launch reads) with only the
Kernel Name, the ID and the grid changed (the Grid Size column and, where the file has them, the
launch__grid_dim_x/y/z and launch__grid_size columns); its counters stay the copied launch's, so a marker
that was not dropped would add a down launch's bytes and instructions to a case. Everything else (the
preamble, header, units row, quoting, thousands separators) is the fixture's, byte for byte.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Sequence

DATA = Path(__file__).parent / "data" / "ncu"
REAL = "h200-kimi-k2.5-m1-int4-triton.csv"
MARKER = "moebench_case_boundary"


def _write(row: Sequence[str]) -> str:
    buf = io.StringIO()
    csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n").writerow(row)
    return buf.getvalue()


def fixture_parts(name: str = REAL) -> tuple[list[str], list[str], list[str], list[list[str]]]:
    """(lines before the header, header, units row, launch rows) of a committed fixture."""
    lines = (DATA / name).read_text().splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith('"ID",'))
    header, units, *rows = list(csv.reader(lines[at:]))
    # the rows written back must be the file's own lines: the built output is the real format, not a lookalike
    assert [_write(r).rstrip("\n") for r in [header, units, *rows]] == lines[at:]
    return lines[:at], header, units, rows


def marker_row(header: Sequence[str], template: Sequence[str], position: int) -> list[str]:
    """A boundary marker's row: `template` (a real launch) with the marker's name and a grid of
    (position + 1, 1, 1) blocks; the ID is set where the rows are numbered (batch_csv)."""
    col = {n: i for i, n in enumerate(header)}
    row = list(template)
    row[col["Kernel Name"]] = MARKER
    row[col["Grid Size"]] = f"({position + 1}, 1, 1)"
    for name, value in (("launch__grid_dim_x", position + 1), ("launch__grid_dim_y", 1),
                        ("launch__grid_dim_z", 1), ("launch__grid_size", position + 1)):
        if name in col:
            row[col[name]] = f"{value:,}"
    return row


def batch_csv(windows: Sequence[tuple[int | None, Sequence[Sequence[str]]]], name: str = REAL,
              extra_markers: Sequence[int] = ()) -> str:
    """The output of a child that profiled `windows`: (marker position or None for no marker, the window's
    rows) each, in order, then a marker for each of `extra_markers`; IDs renumbered from 0 as ncu numbers
    the launches of one process."""
    before, header, units, rows = fixture_parts(name)
    template = rows[1] if len(rows) > 1 else rows[0]
    out: list[list[str]] = []
    for position, window in windows:
        if position is not None:
            out.append(marker_row(header, template, position))
        out.extend(list(r) for r in window)
    out.extend(marker_row(header, template, p) for p in extra_markers)
    for i, row in enumerate(out):
        row[header.index("ID")] = str(i)
    return "\n".join(before) + "\n" + "".join(_write(r) for r in [header, units, *out])


def real_windows() -> dict[str, list[list[str]]]:
    """Three windows cut from the real one: "both" (all 32 launches: 16 calls of up and down), "up" (the 16
    up launches) and "down" (the 16 down launches), as three cases of one chunk."""
    rows = fixture_parts()[3]
    return {"both": rows, "up": rows[0::2], "down": rows[1::2]}
