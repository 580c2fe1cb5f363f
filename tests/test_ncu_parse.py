"""ncu's raw CSV read from committed fixtures (tests/data/ncu, ncu's format with made-up values): the header
after program output and ==PROF== lines, the units row, thousands separators, unit prefixes, one-line errors;
and the per-kernel view of one call window (sum over launches / calls) with the case total."""

from __future__ import annotations

from pathlib import Path

import pytest

from moebench.core.ncu import NcuFormatError, normalise, parse_raw_csv, short_name
from moebench.core.ncu_kernels import NCU_METRICS, case_total, counter_metrics, metric_name, per_kernel

DATA = Path(__file__).parent / "data" / "ncu"
MMA, ALIGN = "fused_moe_w4_mma", "moe_align_block_size_kernel"


def launches(name: str = "raw_base_units.csv"):
    return parse_raw_csv((DATA / name).read_text(), NCU_METRICS, source=name)


def test_the_table_starts_at_its_header_after_program_output_and_prof_lines():
    got = launches()
    assert [x.id for x in got] == [0, 1, 2, 3, 4, 5]
    assert short_name(got[0].kernel) == ALIGN and got[1].kernel == MMA
    # thousands separators read as such, not as field breaks or decimals
    assert got[1].values["dram__bytes_read.sum"] == 16_515_072
    assert got[1].values["sm__inst_executed.sum"] == 1_480_000
    assert got[1].units["gpu__time_duration.sum"] == "second" and got[1].values["gpu__time_duration.sum"] == 9856e-9
    assert got[1].values["launch__registers_per_thread"] == 168 and got[1].units["dram__bytes_read.sum"] == "byte"


def test_ncu_lines_after_the_table_are_not_rows():
    # ncu may print its own lines after the table too ("==PROF== Disconnected", warnings)
    text = (DATA / "raw_base_units.csv").read_text() + "==PROF== Disconnected from process 41873\n==WARNING== x\n"
    assert len(parse_raw_csv(text, NCU_METRICS)) == 6


def test_a_row_of_the_wrong_width_names_its_line():
    text = (DATA / "raw_base_units.csv").read_text() + "program output after the table\n"
    with pytest.raises(NcuFormatError, match=r"^f\.csv: line 14: 1 fields, the header has 17$"):
        parse_raw_csv(text, NCU_METRICS, source="f.csv")


def test_prefixed_units_read_as_base_units():
    auto, base = launches("raw_auto_units.csv"), launches()
    mma_auto = auto[1].values
    assert mma_auto["dram__bytes_read.sum"] == pytest.approx(16.52e6)  # "16.52" Mbyte
    assert mma_auto["dram__bytes_write.sum"] == pytest.approx(65.54e3)  # "65.54" Kbyte
    assert mma_auto["gpu__time_duration.sum"] == pytest.approx(9.86e-6)  # "9.86" usecond
    assert mma_auto["dram__bytes_read.sum"] == pytest.approx(base[1].values["dram__bytes_read.sum"], rel=1e-3)


@pytest.mark.parametrize("value, unit, want", [
    (24.8, "Mbyte", (24.8e6, "byte")), (3.0, "Gbyte", (3e9, "byte")), (2.5, "Kbyte", (2500.0, "byte")),
    (7.0, "byte", (7.0, "byte")), (1.5, "Minst", (1.5e6, "inst")), (12.0, "inst", (12.0, "inst")),
    (2.0, "usecond", (2e-6, "second")), (3.0, "ns", (3e-9, "second")),
    (40.0, "register/thread", (40.0, "register/thread")),
    (56.0, "", (56.0, "")), (80.5, "%", (80.5, "%")),
])
def test_normalise(value, unit, want):
    got = normalise(value, unit)
    assert got[1] == want[1] and got[0] == pytest.approx(want[0])


def test_a_unit_it_does_not_know_is_named_not_guessed():
    text = (DATA / "raw_base_units.csv").read_text().replace('"byte","byte","nsecond"', '"furlong","byte","nsecond"')
    with pytest.raises(NcuFormatError, match=r"^f\.csv: line 7: field 'dram__bytes_read.sum': unknown unit 'furlong'$"):
        parse_raw_csv(text, NCU_METRICS, source="f.csv")


def test_a_missing_metric_column_is_one_line_naming_file_line_and_column():
    with pytest.raises(NcuFormatError, match=r"^f\.csv: line 6: no column 'l2__hits\.sum' in the header$"):
        parse_raw_csv((DATA / "raw_base_units.csv").read_text(), ("l2__hits.sum",), source="f.csv")


def test_no_header_says_so():
    with pytest.raises(NcuFormatError, match="f.csv: no ncu raw CSV header"):
        parse_raw_csv((DATA / "err_nvgpuctrperm.txt").read_text(), NCU_METRICS, source="f.csv")


def test_a_details_page_is_not_taken_for_the_raw_page():
    details = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Section Name",'
               '"Metric Name","Metric Unit","Metric Value"\n'
               '"0","1","p","h","k","1","7","Command line profiler metrics","dram__bytes_read.sum","byte","2,816"\n')
    with pytest.raises(NcuFormatError, match="no column 'dram__bytes_read.sum'"):
        parse_raw_csv(details, ("dram__bytes_read.sum",), source="d.csv")


def test_a_value_that_is_not_a_number_names_line_and_field():
    text = (DATA / "raw_base_units.csv").read_text().replace('"8,257,536"', '"n/a"')
    with pytest.raises(NcuFormatError, match=r"line 10: field 'dram__bytes_read.sum': 'n/a' is not a number "
                                             r"\(metric not supported here\)"):
        parse_raw_csv(text, NCU_METRICS, source="f.csv")


def test_a_missing_units_row_is_refused():
    lines = (DATA / "raw_base_units.csv").read_text().splitlines()
    del lines[6]
    with pytest.raises(NcuFormatError, match="line 7: expected the units row"):
        parse_raw_csv("\n".join(lines), NCU_METRICS, source="f.csv")


@pytest.mark.parametrize("printed, short", [
    ("void vllm::moe::moe_align_block_size_kernel<int>(int const*, int*, unsigned long)", ALIGN),
    ("fused_moe_w4_mma", MMA),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(Params)",
     "Kernel2"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1>>"
     "(int, at::native::FillFunctor<float>, std::array<char*, 1>)", "vectorized_elementwise_kernel"),
])
def test_short_name(printed, short):
    assert short_name(printed) == short


def test_per_kernel_sums_a_window_over_its_launches_and_divides_by_its_calls():
    view = per_kernel(launches(), calls=2)
    assert list(view) == [ALIGN, MMA]
    mma = view[MMA]
    assert mma.launches_per_call == 2
    assert mma.values["dram_read_bytes"] == (16_515_072 + 8_257_536 + 16_777_216 + 8_388_608) / 2
    assert mma.values["inst_executed"] == (1_480_000 + 640_000 + 1_520_000 + 650_000) / 2
    # launch properties are per launch: the mean, not a sum
    assert mma.values["grid_size"] == (128 + 56 + 144 + 56) / 4 and mma.values["registers_per_thread"] == 168
    assert mma.seconds_per_call == pytest.approx((9856 + 5120 + 10112 + 5216) * 1e-9 / 2)
    total = case_total(view)
    assert total["dram_read_bytes"] == mma.values["dram_read_bytes"] + view[ALIGN].values["dram_read_bytes"]
    assert total["dram_write_bytes"] == (65_536 + 14_336) + 2_048 and "grid_size" not in total


def test_counter_metrics_name_kernels_gate_work_and_report_throughput_of_the_read_ceiling():
    view = per_kernel(launches(), calls=2)
    ms = counter_metrics(view, read_ceiling=4.0e12)
    read = ms[metric_name("dram_read_bytes", MMA)]
    assert read.gated and read.kind == "device_counter" and read.rel_tol == 0.01 and read.unit == "B"
    assert ms[metric_name("dram_read_bytes")].value == case_total(view)["dram_read_bytes"]
    assert not ms[metric_name("grid_size", MMA)].gated
    moved = view[MMA].values["dram_read_bytes"] + view[MMA].values["dram_write_bytes"]
    pct = ms[metric_name("dram_pct_of_read_ceiling", MMA)]
    assert not pct.gated and pct.value == pytest.approx(100 * moved / view[MMA].seconds_per_call / 4.0e12)


def test_a_counter_of_zero_is_recorded_but_not_gated():
    # a stored metric must be > 0 (the schema refuses the file otherwise); a kernel that writes nothing is 0
    text = (DATA / "raw_base_units.csv").read_text().replace('"2,048"', '"0"')
    view = per_kernel(parse_raw_csv(text, NCU_METRICS), calls=2)
    m = counter_metrics(view, None)[metric_name("dram_write_bytes", ALIGN)]
    assert m.value == 0 and not m.gated


def test_a_window_has_calls():
    with pytest.raises(ValueError, match="at least one call"):
        per_kernel([], calls=0)
