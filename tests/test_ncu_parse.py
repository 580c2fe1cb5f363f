"""ncu's raw CSV read from committed fixtures (tests/data/ncu, ncu's format with made-up values): the header
after program output and ==PROF== lines, the units row, thousands separators, unit prefixes, one-line errors;
and the per-kernel view of one call window (sum over launches / calls) with the case total."""

from __future__ import annotations

from pathlib import Path

from dataclasses import replace

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
    # the made-up window: 2 calls of align, up (block 128, grid (64|72, 2)) and down (grid (56, 1)); up and
    # down are one Triton function, so its two launches a call are two kernels, named by their place
    view = per_kernel(launches(), calls=2)
    assert list(view) == [ALIGN, f"{MMA}#1", f"{MMA}#2"]
    up, down = view[f"{MMA}#1"], view[f"{MMA}#2"]
    assert up.launches_per_call == down.launches_per_call == 1
    assert up.values["dram_read_bytes"] == (16_515_072 + 16_777_216) / 2
    assert down.values["inst_executed"] == (640_000 + 650_000) / 2
    # launch properties are per launch: the mean, not a sum (the up grid follows the routing here)
    assert up.values["grid_size"] == (128 + 144) / 2 and down.values["registers_per_thread"] == 168
    assert up.seconds_per_call == pytest.approx((9856 + 10112) * 1e-9 / 2)
    total = case_total(view)
    assert total["dram_read_bytes"] == sum(view[k].values["dram_read_bytes"] for k in view)
    assert total["dram_write_bytes"] == (65_536 + 14_336) + 2_048 and "grid_size" not in total


def test_a_name_launched_unevenly_or_with_one_configuration_stays_one_kernel():
    base = launches()
    # one configuration: the same kernel twice a call (a loop over experts) is one kernel, 2 launches a call
    same = [replace(x, config="block (128, 1, 1) grid (56, 1, 1)") if x.kernel == MMA else x for x in base]
    assert list(per_kernel(same, calls=2)) == [ALIGN, MMA] and per_kernel(same, calls=2)[MMA].launches_per_call == 2
    # three launches over two calls cannot be placed in a call: one kernel, 1.5 launches a call
    uneven = per_kernel(base[:-1], calls=2)
    assert list(uneven) == [ALIGN, MMA] and uneven[MMA].launches_per_call == 1.5


def test_counter_metrics_name_kernels_gate_work_and_report_throughput_of_the_read_ceiling():
    view = per_kernel(launches(), calls=2)
    ms = counter_metrics(view, read_ceiling=4.0e12)
    up = f"{MMA}#1"
    read = ms[metric_name("dram_read_bytes", up)]
    assert read.gated and read.kind == "device_counter" and read.rel_tol == 0.01 and read.unit == "B"
    assert ms[metric_name("inst_executed", up)].gated
    assert ms[metric_name("dram_read_bytes")].value == case_total(view)["dram_read_bytes"]
    assert not ms[metric_name("grid_size", up)].gated
    # DRAM writes are L2 evictions whose timing varies between processes: recorded, never gated
    assert not ms[metric_name("dram_write_bytes", up)].gated and not ms[metric_name("dram_write_bytes")].gated
    moved = view[up].values["dram_read_bytes"] + view[up].values["dram_write_bytes"]
    pct = ms[metric_name("dram_pct_of_read_ceiling", up)]
    assert not pct.gated and pct.value == pytest.approx(100 * moved / view[up].seconds_per_call / 4.0e12)


H200 = "h200-kimi-k2.5-m1-int4-triton.csv"  # ncu 2025.3.1.0 on an H200, session 16: the real format


def test_a_real_h200_window_parses_into_the_up_and_the_down_kernel():
    got = launches(H200)
    assert len(got) == 32 and {x.kernel for x in got} == {"moebench_w4_mma"}
    assert got[0].config == "block (512, 1, 1) grid (8, 16, 1)" and got[1].config == "block (128, 1, 1) grid (1, 224, 1)"
    assert (got[0].grid, got[1].grid) == ((8, 16, 1), (1, 224, 1))  # what a boundary marker's position is read from
    view = per_kernel(got, calls=16)
    up, down = view["moebench_w4_mma#1"], view["moebench_w4_mma#2"]
    assert (up.launches_per_call, up.values["grid_size"], up.values["registers_per_thread"]) == (1, 128, 128)
    assert (down.launches_per_call, down.values["grid_size"], down.values["registers_per_thread"]) == (1, 224, 202)
    assert up.values["inst_executed"] == 3_197_184 and down.values["inst_executed"] == 1_556_128
    assert case_total(view)["dram_read_bytes"] == pytest.approx(24_839_952, rel=1e-6)


def test_the_real_window_reads_the_weights_of_its_experts_once():
    # Kimi-K2.5 TP8, M = 1, top-8: 8 experts' int4 weights (half a byte each) and their bf16 group-32 scales
    K, I, E_TOP = 7168, 256, 8
    weights = lambda rows, cols: rows * cols // 2 + rows * cols // 32 * 2  # noqa: E731
    up, down = weights(2 * I, K) * E_TOP, weights(K, I) * E_TOP
    view = per_kernel(launches(H200), calls=16)
    assert view["moebench_w4_mma#1"].values["dram_read_bytes"] == pytest.approx(up, rel=0.005)
    assert view["moebench_w4_mma#2"].values["dram_read_bytes"] == pytest.approx(down, rel=0.005)


def test_a_counter_of_zero_is_recorded_but_not_gated():
    # a stored metric must be > 0 (the schema refuses the file otherwise); a kernel that writes nothing is 0
    text = (DATA / "raw_base_units.csv").read_text().replace('"2,048"', '"0"')
    view = per_kernel(parse_raw_csv(text, NCU_METRICS), calls=2)
    m = counter_metrics(view, None)[metric_name("dram_write_bytes", ALIGN)]
    assert m.value == 0 and not m.gated


def test_a_window_has_calls():
    with pytest.raises(ValueError, match="at least one call"):
        per_kernel([], calls=0)
