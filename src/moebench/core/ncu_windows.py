"""One ncu launch list holding several windows (one per case), split at boundary-marker launches.

A child that profiles many cases in one process launches, inside the profiled range and right before each
case's window, one launch of a marker kernel whose name nothing else uses. Its grid says whose window
follows: the marker of the case at position i of the child's arguments runs on a grid of i + 1 blocks (ncu's
Grid Size column "(i + 1, 1, 1)"), so a marker is matched to its case by what ncu printed, never by order
alone, by the CSV's Stream column or by counting launches. The marker rows themselves are dropped: they are
not the case's work. With --cache-control all ncu flushes the caches before every profiled kernel, so a
marker (it writes one int) does not change what the kernel after it reads from DRAM.

Generic: it knows kernels and markers, no family. Errors are NcuFormatError, one line naming the case.
"""

from __future__ import annotations

from typing import Sequence

from moebench.core.ncu import Launch, NcuFormatError, short_name


def marker_index(launch: Launch) -> int | None:
    """The argument position a marker launch names (its grid's x - 1), None when its grid does not read as
    (n, 1, 1) with n >= 1."""
    grid = launch.grid
    if len(grid) == 3 and grid[0] >= 1 and grid[1:] == (1, 1):
        return grid[0] - 1
    return None


def split_at_markers(launches: Sequence[Launch], marker: str, cases: Sequence[tuple[int, str]],
                     source: str = "ncu output") -> dict[str, list[Launch]]:
    """Each case's window: the launches after its marker up to the next marker (or the end), markers
    dropped. `cases` are (argument position, case id) of the cases the child profiled, in the order it
    profiled them; `marker` is the marker kernel's short name. Raises NcuFormatError, naming `source` and
    the case, when the markers do not match `cases` one for one (a missing, extra or misplaced marker, a
    marker whose grid names no position), when launches come before the first marker, or when a case's
    window holds no launch."""
    starts = [i for i, launch in enumerate(launches) if short_name(launch.kernel) == marker]
    for k, (pos, case_id) in enumerate(cases):
        if k >= len(starts):
            raise NcuFormatError(f"{source}: case {case_id}: no {marker} launch before its window "
                                 f"({len(starts)} markers for {len(cases)} profiled cases)")
        launch = launches[starts[k]]
        got = marker_index(launch)
        if got != pos:
            said = f"position {got}" if got is not None else f"no position (grid {launch.grid or 'unreadable'})"
            raise NcuFormatError(f"{source}: case {case_id}: the {marker} launch before its window (ID "
                                 f"{launch.id}) names {said}, the case is at position {pos}")
    if len(starts) > len(cases):
        extra = launches[starts[len(cases)]]
        after = f"after case {cases[-1][1]}'s window" if cases else "and no case was profiled"
        raise NcuFormatError(f"{source}: an extra {marker} launch (ID {extra.id}, position "
                             f"{marker_index(extra)}) {after} ({len(starts)} markers for {len(cases)} profiled cases)")
    if cases and starts[0] > 0:
        raise NcuFormatError(f"{source}: case {cases[0][1]}: {starts[0]} launches before its {marker} launch, "
                             f"outside every case's window")
    if not cases and launches:
        raise NcuFormatError(f"{source}: {len(launches)} launches and no case was profiled")
    out: dict[str, list[Launch]] = {}
    for k, (_, case_id) in enumerate(cases):
        end = starts[k + 1] if k + 1 < len(starts) else len(launches)
        window = list(launches[starts[k] + 1:end])
        if not window:
            raise NcuFormatError(f"{source}: case {case_id}: no launch in its window (its {marker} launch, ID "
                                 f"{launches[starts[k]].id}, is followed by "
                                 + ("the next case's)" if end < len(launches) else "the end of the output)"))
        out[case_id] = window
    return out
