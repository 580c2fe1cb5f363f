"""Nsight Compute's raw CSV (`ncu --csv --page raw --metrics <list> ...`) read into launches, units normalised.

Generic: it knows counters and kernels, no family. What the format is, and where each claim comes from:

- ncu prints its own lines with a `==PROF==` prefix (`==ERROR==`, `==WARNING==` likewise) and "the other lines are
  output from the application itself" (Nsight Compute CLI user guide, Quickstart:
  https://docs.nvidia.com/nsight-compute/NsightComputeCli/index.html). So the table starts at the first line
  that reads as its header; everything before it, and every `==...==` line after it, is not the table.
- The raw page is one row per profiled launch: the header row names the launch columns ("ID", "Process ID",
  "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size", "Grid Size", "Device", "CC")
  and then one column per metric; the second row holds each column's unit, empty for the launch columns
  ("byte", "Kbyte", "Mbyte", "inst", "register/thread", "nsecond", "%"). Seen in the raw-page samples other
  projects parse (code search for `"Device","CC","dram__bytes_read.sum"`: a units row of 11 empty fields, then
  "byte","byte","%","nsecond"). Older ncu versions add a "Kernel Time" column after the kernel name, so
  columns are found by name, never by position.
- Values are quoted and carry thousands separators ("10,240,000"; the same samples, and ncu's details page
  "1,215,000,000.00"); an unsupported metric reads "n/a". By default (--print-units auto) ncu scales a value
  to a prefixed unit ("24.80" "Mbyte"); --print-units base prints base units. Both are read here.
- Byte prefixes are decimal: ncu reports a 64 KiB shared memory carve-out as "65.54 Kbyte".
- Seen on an H200 (ncu 2025.3.1.0, session 16; tests/data/ncu/h200-kimi-k2.5-m1-int4-triton.csv): with
  --page raw ncu prints every collected launch attribute beside the metrics asked for (277 columns, the
  device__attribute_* and launch__* ones, alphabetical after the 11 launch columns), each metric as .avg, .max,
  .min and .sum; --print-units base prints "byte", "inst", "ns", "register/thread"; the table comes after
  "==PROF== Disconnected from process"; Block Size and Grid Size read "(512, 1, 1)".

Errors are NcuFormatError (a ValueError): one line naming the source, the line number and the field.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, field
from typing import Iterable, Sequence

LAUNCH_COLUMNS = ("ID", "Kernel Name")  # what this reader needs besides the metrics
_PREFIX = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
# units that take an SI prefix, and the base unit each normalises to
_PREFIXED = {"byte": "byte", "inst": "inst", "cycle": "cycle", "sector": "sector", "request": "request",
             "byte/second": "byte/second", "inst/cycle": "inst/cycle", "warp": "warp", "thread": "thread",
             "block": "block"}
# time units: ncu 2019-2022 spells them "nsecond", later versions "ns"; both normalise to seconds
_TIME = {"nsecond": 1e-9, "ns": 1e-9, "usecond": 1e-6, "us": 1e-6, "msecond": 1e-3, "ms": 1e-3,
         "second": 1.0, "s": 1.0}
_PLAIN = {"": "", "%": "%", "register/thread": "register/thread"}
_UNIT = re.compile(r"^([KMGTP]?)(.+)$")
_DIMS = re.compile(r"^\(\s*\d+(\s*,\s*\d+)*\s*\)$")  # "(8, 16, 1)", as the Block/Grid Size columns read


class NcuFormatError(ValueError):
    """ncu output that cannot be read: one line naming the source, line and field."""


@dataclass(frozen=True)
class Launch:
    """One profiled kernel launch: its id in the CSV, the kernel name as ncu printed it, and each requested
    metric's value in its base unit (bytes, instructions, seconds, ...; `units` says which)."""

    id: int
    kernel: str
    values: dict[str, float]
    units: dict[str, str] = field(default_factory=dict)
    # "block (512, 1, 1) grid (8, 16, 1)" from the Block Size and Grid Size columns ("" where the output has
    # none): one Triton function launched twice a call with other constexprs (an up and a down kernel) is one
    # name and two kernels
    config: str = ""
    # the Grid Size column as numbers, (8, 16, 1); () where the output has none or it does not read as one
    grid: tuple[int, ...] = ()


def normalise(value: float, unit: str) -> tuple[float, str]:
    """A value in ncu's unit as (value, base unit): 24.8 Mbyte -> (24.8e6, "byte"), 1.5 usecond -> (1.5e-6,
    "second"). Raises KeyError for a unit this reader does not know (the caller names the field)."""
    if unit in _PLAIN:
        return value, _PLAIN[unit]
    if unit in _TIME:
        return value * _TIME[unit], "second"
    m = _UNIT.match(unit)
    if m and m.group(2) in _PREFIXED:
        return value * _PREFIX[m.group(1)], _PREFIXED[m.group(2)]
    if unit in _PREFIXED:
        return value, _PREFIXED[unit]
    raise KeyError(unit)


def _number(text: str) -> float:
    x = float(text.replace(",", ""))  # thousands separators, as ncu prints them
    if not math.isfinite(x):
        raise ValueError(text)
    return x


def _dims(text: str) -> tuple[int, ...]:
    """"(8, 16, 1)" -> (8, 16, 1); () for anything else (the column is informational unless a caller needs it)."""
    return tuple(int(x) for x in text.strip()[1:-1].split(",")) if _DIMS.match(text.strip()) else ()


def _is_header(fields: Sequence[str]) -> bool:
    return bool(fields) and fields[0] == "ID" and "Kernel Name" in fields


def _rows(text: str) -> Iterable[tuple[int, list[str]]]:
    """(line number, fields) of every line that may be part of the table: not blank, not ncu's own."""
    for no, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("=="):
            continue
        yield no, next(csv.reader([line]))


def parse_raw_csv(text: str, metrics: Sequence[str], source: str = "ncu output") -> list[Launch]:
    """Every launch of `ncu --csv --page raw` output, with each of `metrics` in its base unit. Lines before
    the header (program output, `==PROF==`) are skipped; after it every line but ncu's own must be a row.
    Raises NcuFormatError naming `source`, the line and the field: no header, a missing metric column, a
    missing units row, a row of the wrong width, a value that is not a number ("n/a": the metric is not
    supported on this GPU) or a unit this reader does not know."""
    rows = _rows(text)
    header = None
    for no, fields in rows:
        if _is_header(fields):
            header = (no, fields)
            break
    if header is None:
        raise NcuFormatError(f"{source}: no ncu raw CSV header (a row starting \"ID\" with \"Kernel Name\")")
    hno, names = header
    col = {n: i for i, n in enumerate(names)}
    missing = [m for m in list(LAUNCH_COLUMNS) + list(metrics) if m not in col]
    if missing:
        raise NcuFormatError(f"{source}: line {hno}: no column {missing[0]!r} in the header"
                             + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    units_row = next(rows, None)
    if units_row is None or len(units_row[1]) != len(names) or units_row[1][col["ID"]] != "":
        where = f"line {units_row[0]}" if units_row else "end of output"
        raise NcuFormatError(f"{source}: {where}: expected the units row after the header (an empty \"ID\")")
    uno, unit_fields = units_row
    out: list[Launch] = []
    for no, fields in rows:
        if len(fields) != len(names):
            raise NcuFormatError(f"{source}: line {no}: {len(fields)} fields, the header has {len(names)}")
        values, units = {}, {}
        for m in metrics:
            raw, unit = fields[col[m]], unit_fields[col[m]]
            try:
                values[m], units[m] = normalise(_number(raw), unit)
            except KeyError:
                raise NcuFormatError(f"{source}: line {uno}: field {m!r}: unknown unit {unit!r}") from None
            except ValueError:
                raise NcuFormatError(f"{source}: line {no}: field {m!r}: {raw!r} is not a number"
                                     + (" (metric not supported here)" if raw == "n/a" else "")) from None
        try:
            launch_id = int(_number(fields[col["ID"]]))
        except ValueError:
            raise NcuFormatError(f"{source}: line {no}: field 'ID': {fields[col['ID']]!r} is not a number") from None
        config = " ".join(f"{word} {fields[col[c]]}" for word, c in (("block", "Block Size"), ("grid", "Grid Size"))
                          if c in col and fields[col[c]])
        grid = _dims(fields[col["Grid Size"]]) if "Grid Size" in col else ()
        out.append(Launch(launch_id, fields[col["Kernel Name"]], values, units, config, grid))
    return out


def short_name(kernel: str) -> str:
    """A kernel's name without return type, namespaces, template arguments and parameters, as a line names it:
    "void vllm::moe::marlin<(int)4, 256>(int const*, float*)" -> "marlin"; a Triton kernel's name stays."""
    name, depth, cut = kernel.strip(), 0, []
    for ch in name:  # drop everything inside <...> and (...), keeping the text outside them
        if ch in "<(":
            depth += 1
        elif ch in ">)" and depth:
            depth -= 1
        elif depth == 0:
            cut.append(ch)
    bare = "".join(cut).strip()
    bare = bare.split()[-1] if bare.split() else kernel  # "void f" -> "f"
    return bare.rsplit("::", 1)[-1] or kernel
