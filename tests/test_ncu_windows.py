"""One ncu output holding several cases' windows, split at the boundary markers (core.ncu_windows).

The outputs are built from the real H200 fixture's rows (tests/ncu_batch_fixtures.py): same header, columns,
units and quoting. The marker rows are written from the real format: a real launch's row with only the Kernel
Name, the ID and the grid changed; the last two tests read a real chunk and hold the written markers to its. Three cases cut from the real window:
"both" (up and down, 16 calls), "up" and "down" (16 launches each)."""

from __future__ import annotations

import pytest

from moebench.core.ncu import NcuFormatError, parse_raw_csv
from moebench.core.ncu_kernels import NCU_METRICS, case_total, per_kernel
from moebench.core.ncu_windows import marker_index, split_at_markers
from ncu_batch_fixtures import DATA, MARKER, REAL, batch_csv, real_windows

W = real_windows()
CASES = [(0, "both"), (1, "up"), (2, "down")]


def launches(windows, **kw):
    return parse_raw_csv(batch_csv(windows, **kw), NCU_METRICS, source="chunk.csv")


def split(windows, cases=CASES, **kw):
    return split_at_markers(launches(windows, **kw), MARKER, cases, source="chunk.csv")


def test_three_cases_split_at_their_markers_and_each_counts_what_it_counts_alone():
    got = split([(0, W["both"]), (1, W["up"]), (2, W["down"])])
    assert list(got) == ["both", "up", "down"]
    assert [len(w) for w in got.values()] == [32, 16, 16]
    assert not [x for w in got.values() for x in w if x.kernel == MARKER]  # the markers are dropped
    alone = per_kernel(parse_raw_csv(batch_csv([(None, W["both"])]), NCU_METRICS), 16)
    both = per_kernel(got["both"], 16)
    # the marker rows copy a real down launch: one left in would add its bytes and instructions to a case
    assert case_total(both) == case_total(alone)
    assert both["moebench_w4_mma#2"].values["inst_executed"] == 1_556_128
    up, down = per_kernel(got["up"], 16), per_kernel(got["down"], 16)
    assert up["moebench_w4_mma"].values["inst_executed"] == 3_197_184
    assert down["moebench_w4_mma"].values["inst_executed"] == 1_556_128
    assert case_total(up)["dram_read_bytes"] + case_total(down)["dram_read_bytes"] == pytest.approx(
        case_total(both)["dram_read_bytes"], rel=1e-12)


def test_two_cases_the_marker_grid_names_the_position_not_the_order():
    # the child counted positions 0 and 2 (position 1 failed its check and launched nothing)
    got = split([(0, W["up"]), (2, W["down"])], cases=[(0, "up"), (2, "down")])
    assert [len(got["up"]), len(got["down"])] == [16, 16]
    assert {x.config for x in got["down"]} == {"block (128, 1, 1) grid (1, 224, 1)"}


def test_the_marker_reads_its_position_from_its_grid():
    rows = launches([(4, W["up"])])
    assert rows[0].kernel == MARKER and rows[0].grid == (5, 1, 1) and marker_index(rows[0]) == 4
    assert rows[1].grid == (8, 16, 1) and marker_index(rows[1]) is None  # a 2-D grid names no position


def test_a_missing_marker_is_refused_naming_the_case():
    # up's marker is missing: the marker found before up's window is down's
    with pytest.raises(NcuFormatError, match=r"^chunk\.csv: case up: the moebench_case_boundary launch before its "
                                             r"window \(ID 49\) names position 2, the case is at position 1$"):
        split([(0, W["both"]), (None, W["up"]), (2, W["down"])])
    with pytest.raises(NcuFormatError, match=r"^chunk\.csv: case down: no moebench_case_boundary launch before its "
                                             r"window \(2 markers for 3 profiled cases\)$"):
        split([(0, W["both"]), (1, W["up"]), (None, W["down"])])


def test_an_extra_marker_is_refused_naming_the_case_before_it():
    with pytest.raises(NcuFormatError, match=r"^chunk\.csv: an extra moebench_case_boundary launch \(ID 67, "
                                             r"position 3\) after case down's window \(4 markers for 3 profiled "
                                             r"cases\)$"):
        split([(0, W["both"]), (1, W["up"]), (2, W["down"])], extra_markers=[3])
    # a case the report calls failed must not have launched a marker
    with pytest.raises(NcuFormatError, match=r"^chunk\.csv: case down: .* names position 1, the case is at "
                                             r"position 2$"):
        split([(0, W["both"]), (1, W["up"]), (2, W["down"])], cases=[(0, "both"), (2, "down")])


def test_a_window_without_launches_is_refused_naming_the_case():
    with pytest.raises(NcuFormatError, match=r"^chunk\.csv: case up: no launch in its window \(its "
                                             r"moebench_case_boundary launch, ID 33, is followed by the next "
                                             r"case's\)$"):
        split([(0, W["both"]), (1, []), (2, W["down"])])
    with pytest.raises(NcuFormatError, match=r"^chunk\.csv: case down: no launch in its window .*the end of the "
                                             r"output\)$"):
        split([(0, W["both"]), (1, W["up"]), (2, [])])


def test_launches_before_the_first_marker_belong_to_no_case_and_are_refused():
    with pytest.raises(NcuFormatError, match=r"^chunk\.csv: case up: 16 launches before its "
                                             r"moebench_case_boundary launch"):
        split([(None, W["down"]), (0, W["up"])], cases=[(0, "up")])


def test_a_marker_whose_grid_names_no_position_is_refused():
    text = batch_csv([(0, W["up"])]).replace('"moebench_case_boundary","1","7","(128, 1, 1)","(1, 1, 1)"',
                                             '"moebench_case_boundary","1","7","(128, 1, 1)","(1, 2, 1)"')
    with pytest.raises(NcuFormatError, match=r"case up: .* names no position \(grid \(1, 2, 1\)\)"):
        split_at_markers(parse_raw_csv(text, NCU_METRICS), MARKER, [(0, "up")], source="chunk.csv")


def test_the_built_output_is_the_real_format():
    # same preamble, header and units row as the real fixture; only rows were added
    real = (DATA / REAL).read_text().splitlines()
    built = batch_csv([(0, W["both"])]).splitlines()
    at = next(i for i, ln in enumerate(real) if ln.startswith('"ID",'))
    assert built[:at + 2] == real[:at + 2]
    assert built[at + 3:] == [ln.replace(ln.split(",")[0], f'"{i + 1}"', 1) for i, ln in enumerate(real[at + 2:])]


# A real chunk (tests/data/ncu/h200-chunk-kimi-deepseek-m1-int4-triton.csv): ncu 2025.3.1.0 on a second H200
# (GPU-05ab4a4c, session 17), one counter child of four cases, of which the file keeps the preamble, the
# header, the units row and the windows of positions 0 (Kimi-K2.5 M = 1) and 2 (DeepSeek-V3 M = 1), each after
# the marker ncu printed for it: what a chunk whose position 1 failed before its window prints.
REAL_CHUNK = "h200-chunk-kimi-deepseek-m1-int4-triton.csv"


def test_a_real_chunk_splits_into_its_cases_and_each_counts_what_another_machine_counted_alone():
    text = (DATA / REAL_CHUNK).read_text()
    got = split_at_markers(parse_raw_csv(text, NCU_METRICS, source=REAL_CHUNK), MARKER,
                           [(0, "kimi"), (2, "deepseek")], source=REAL_CHUNK)
    assert [len(got["kimi"]), len(got["deepseek"])] == [32, 32]
    alone = case_total(per_kernel(parse_raw_csv((DATA / REAL).read_text(), NCU_METRICS), 16))
    for case in ("kimi", "deepseek"):
        view = per_kernel(got[case], 16)
        assert [view[k].values["inst_executed"] for k in ("moebench_w4_mma#1", "moebench_w4_mma#2")] == [
            3_197_184, 1_556_128]  # the SASS is the machine's: the same count on another H200
        # DRAM bytes: the same weights read once, within the 0.02% the runs of one machine spread
        assert case_total(view)["dram_read_bytes"] == pytest.approx(alone["dram_read_bytes"], rel=2e-4)


def test_the_written_marker_rows_match_the_rows_ncu_printed():
    real = [x for x in parse_raw_csv((DATA / REAL_CHUNK).read_text(), NCU_METRICS) if x.kernel == MARKER]
    written = [x for x in launches([(0, W["up"]), (2, W["down"])]) if x.kernel == MARKER]
    assert [(x.config, x.grid, marker_index(x)) for x in written] == [
        (x.config, x.grid, marker_index(x)) for x in real] == [
        ("block (128, 1, 1) grid (1, 1, 1)", (1, 1, 1), 0), ("block (128, 1, 1) grid (3, 1, 1)", (3, 1, 1), 2)]
