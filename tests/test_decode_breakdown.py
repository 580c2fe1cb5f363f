"""The decode breakdown: trace parsing, the kernel category map, per-step figures, and the category gate,
on a small committed trace in the format vLLM 0.21's profiler writes (tests/data/decode-trace-small.json:
3 complete decode steps named as vLLM's worker names them, an empty step between two of them, a 5th cut by
the profiler's stop, one kernel launched before the first step, the sampler inside its annotation)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from moebench.baselines.compare import Comparison, Verdict, compare_metric
from moebench.decode import trace
from moebench.decode.breakdown import breakdown, breakdown_metrics, combine_instances, moved_most
from moebench.decode.categories import category
from moebench.decode.trace import Kernel, Steps, TraceError, busy_us, load_events, split_steps
from moebench.core.metrics import Metric

FIXTURE = Path(__file__).parent / "data" / "decode-trace-small.json"
GATED = ("routed_experts", "attention", "dense_gemms")
# Per complete step, by hand from the fixture's kernel list (us).
EXPECTED_US = {"routed_experts": 16 + 8 + 1, "router_topk_align": 3 + 2, "attention": 12 + 2,
               "dense_gemms": 20 + 10, "norms_elementwise": 4 + 2 + 1.5,
               "sampling": 2.5 + 1.0,  # the argmax and the token copy, both launched inside the sampler
               "communication": 0, "other": 0.5}


def _steps(events=None):
    return split_steps(events if events is not None else load_events(FIXTURE))


def test_complete_annotated_steps_only_and_launch_attribution():
    steps = _steps()
    assert steps.count == 3 and steps.source == "annotations"  # the empty and the cut step are left out
    names = [k.name for ks in steps.kernels for k in ks]
    assert not any(n.startswith("void at::native::reduce_kernel<...>") for n in names)  # launched before step 0
    assert all(len(ks) == 15 for ks in steps.kernels)


@pytest.mark.parametrize("name, want", [
    ("void marlin_moe_wna16::Marlin<...>(...)", "routed_experts"),
    ("fused_moe_kernel", "routed_experts"),
    ("moebench_w4_gemv", "routed_experts"),  # our rows-4 int4 kernel, through the engine hook
    ("moebench_w4_mma", "routed_experts"),   # our tensor-core int4 kernel, likewise
    ("void vllm::moe::moe_sum_kernel<...>(...)", "routed_experts"),
    ("void vllm::moe::moe_align_block_size_kernel<...>(...)", "router_topk_align"),
    ("void vllm::moe::grouped_topk_kernel<...>(...)", "router_topk_align"),
    ("void flash::flash_fwd_splitkv_mla_kernel<...>(...)", "attention"),
    ("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", "dense_gemms"),
    ("void marlin::Marlin<...>(...)", "dense_gemms"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "norms_elementwise"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
    # vLLM's custom allreduce (its TP allreduce for decode sizes on NVLink and on two PCIe GPUs)
    ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, ...)", "communication"),
    ("void vllm::cross_device_reduce_2stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, ...)", "communication"),
    ("mystery_kernel_xyz", "other"),
])
def test_category_map(name, want):
    assert category(Kernel(name, 0, 1, "kernel")) == want


def test_the_category_of_every_kernel_of_a_real_h200_decode_step():
    # the distinct kernels of the Kimi-K2.5 INT4 rank's profiled window on an H200 (vLLM 0.21), each
    # with the category a reviewer gave it: a rule change that moves one of them fails here
    doc = json.loads((Path(__file__).parent / "data" / "h200-vllm-0.21-kimi-int4-kernels.json").read_text())
    wrong = [(k["name"][:60], category(Kernel(k["name"], 0, 1, k["kind"], k["in_sampler"])), k["category"])
             for k in doc["kernels"] if category(Kernel(k["name"], 0, 1, k["kind"], k["in_sampler"])) != k["category"]]
    assert wrong == []
    cats = {k["category"] for k in doc["kernels"]}
    assert cats == {"routed_experts", "router_topk_align", "attention", "dense_gemms", "norms_elementwise",
                    "sampling", "other"}


def test_sampler_annotation_and_memcpy_override_the_name():
    assert category(Kernel("void at::native::reduce_kernel<ArgMaxOps>", 0, 1, "kernel", in_sampler=True)) == "sampling"
    assert category(Kernel("void at::native::reduce_kernel<ArgMaxOps>", 0, 1, "kernel")) == "norms_elementwise"
    assert category(Kernel("Memcpy DtoH", 0, 1, "gpu_memcpy")) == "other"
    assert category(Kernel("Memcpy DtoH", 0, 1, "gpu_memcpy", in_sampler=True)) == "sampling"


def test_breakdown_per_step_by_hand():
    b = breakdown(_steps())
    for cat, us in EXPECTED_US.items():
        assert b.mean_ms(cat) == pytest.approx(us / 1e3), cat
    assert b.gpu_busy_ms == pytest.approx(sum(EXPECTED_US.values()) / 1e3)  # no overlap in the fixture
    assert b.top_other == [("mystery_kernel_xyz", pytest.approx(0.0005))]
    doc = b.to_json()
    assert doc["categories"]["routed_experts"]["share"] == pytest.approx(25 / 85.5, abs=1e-4)


def test_busy_time_counts_overlap_once():
    ks = [Kernel("a", 0, 10, "kernel"), Kernel("b", 5, 10, "kernel"), Kernel("c", 30, 1, "kernel")]
    assert busy_us(ks) == 16


def test_metrics_gate_only_the_named_categories_and_host_gap_is_step_minus_busy():
    # communication is named too: it has no kernel in the fixture (one GPU), and 0 ms/step is never gated
    m = breakdown_metrics(breakdown(_steps()), steady_ms=0.2, gated=GATED + ("communication",), rel_tol=0.05)
    assert m["step_communication_ms"].value == 0
    assert {n for n, x in m.items() if x.gated} == {f"step_{c}_ms" for c in GATED}
    assert m["step_routed_experts_ms"].rel_tol == 0.05 and m["step_routed_experts_ms"].noise == 0.0
    assert m["step_host_gap_ms"].value == pytest.approx(0.2 - 0.0855)
    assert not m["step_gpu_busy_ms"].gated and not m["step_communication_ms"].gated  # zero: never gated


def test_a_ten_percent_slower_expert_kernel_regresses_that_category_and_is_named():
    base = breakdown_metrics(breakdown(_steps()), 0.2, GATED, 0.05)
    events = load_events(FIXTURE)
    for e in events:  # the planted regression: the Marlin MoE kernel 10% slower, nothing else
        if "marlin_moe" in e.get("name", ""):
            e["dur"] *= 1.10
    slow = breakdown_metrics(breakdown(_steps(events)), 0.2024, GATED, 0.05)
    verdicts = {n: compare_metric(slow[n], base[n]).verdict for n in slow if slow[n].gated}
    assert verdicts["step_routed_experts_ms"] is Verdict.REGRESSION
    assert {v for n, v in verdicts.items() if n != "step_routed_experts_ms"} == {Verdict.PASS}
    line = moved_most(slow, {n: base[n].value for n in base})
    assert line == "routed experts +9.6%: 0.025 -> 0.0274 ms/step"
    # a 3% drift stays inside the 5% category tolerance
    for e in events:
        if "marlin_moe" in e.get("name", ""):
            e["dur"] *= 1.03 / 1.10
    drift = breakdown_metrics(breakdown(_steps(events)), 0.2, GATED, 0.05)
    assert compare_metric(drift["step_routed_experts_ms"], base["step_routed_experts_ms"]).verdict is Verdict.PASS


def test_forward_annotations_serve_when_the_worker_step_names_are_absent():
    events = [e for e in load_events(FIXTURE) if not str(e.get("name", "")).startswith("execute_context_")]
    steps = split_steps(events)
    # 4 forwards annotated (the empty step has none): 3 complete, and the empty step's kernel now falls
    # into the step before it
    assert steps.count == 3 and steps.source == "annotations"
    assert sum(k.dur for k in steps.kernels[1]) == pytest.approx(sum(EXPECTED_US.values()) + 50.0)


def test_without_annotations_the_window_is_divided_by_the_steps_run_and_nothing_gates():
    events = [e for e in load_events(FIXTURE) if e.get("cat") != "user_annotation"]
    steps = split_steps(events, assumed_steps=4)
    assert steps.count == 4 and steps.source == "assumed 4 steps"
    m = breakdown_metrics(breakdown(steps), 0.2, GATED, 0.05)
    assert not any(x.gated for x in m.values())
    with pytest.raises(TraceError, match="no step count"):
        split_steps(events)


def test_gzip_and_bad_files(tmp_path):
    gz = tmp_path / "w.pt.trace.json.gz"
    gz.write_bytes(gzip.compress(FIXTURE.read_bytes()))
    assert len(load_events(gz)) == len(load_events(FIXTURE))
    assert trace.find_trace(tmp_path) == gz
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(TraceError, match="bad.json: not a readable profiler trace"):
        load_events(bad)
    (tmp_path / "cpu.json").write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm",
                                                                     "ts": 0, "dur": 1}]}))
    with pytest.raises(TraceError, match="no GPU kernel"):
        split_steps(load_events(tmp_path / "cpu.json"), 2)
    with pytest.raises(TraceError, match="wrote no"):
        trace.find_trace(tmp_path / "empty")


def test_instances_combine_to_the_median_with_the_spread_between_them_as_noise():
    runs = [{"ms_per_token": Metric(v, "ms", "lower", noise=0.001, n=100, rel_tol=0.1)} for v in (6.79, 6.94, 6.85)]
    m = combine_instances(runs)["ms_per_token"]
    assert m.value == 6.85 and m.n == 300 and m.gated and m.rel_tol == 0.1
    assert m.noise == pytest.approx(1.4826 * 0.06 / 6.85)  # between instances (MAD), not the 0.1% inside
    two = combine_instances(runs[:2] + [{"ms_per_token": Metric(6.79, "ms", "lower", noise=0.001)}])["ms_per_token"]
    assert two.noise == pytest.approx((6.94 - 6.79) / 2 / 6.79)  # MAD reads 0 with two equal values
    assert combine_instances(runs[:1])["ms_per_token"] is runs[0]["ms_per_token"]


def test_a_metric_that_one_instance_lacks_is_combined_but_not_gated():
    # the second engine instance's profiled trial found no attention kernel: the median of one instance
    # is no A/A figure, so the combined category is reported, not gated; what both have stays gated
    both = {"ms_per_token": Metric(6.8, "ms", "lower", rel_tol=0.1)}
    first = both | {"step_attention_ms": Metric(0.5, "ms", "lower", noise=0.01)}
    out = combine_instances([first, dict(both)])
    assert out["ms_per_token"].gated and not out["step_attention_ms"].gated
    assert out["step_attention_ms"].value == 0.5


def test_the_breakdown_table_shows_each_category_against_its_baseline():
    from moebench.decode.breakdown_report import breakdown_tables
    from moebench.results.document import CaseDoc, MetricDoc

    b = breakdown(_steps())
    measured = breakdown_metrics(b, 0.2, GATED, 0.05)
    metrics = {n: MetricDoc(m) for n, m in measured.items()}
    experts = measured["step_routed_experts_ms"]
    metrics["step_routed_experts_ms"] = MetricDoc(experts, Comparison(Verdict.REGRESSION, experts.value, baseline=0.020))
    metrics["pct_of_floor_routed_experts"] = MetricDoc(Metric(41.0, "%", "higher", gated=False))
    case = CaseDoc("decode[x]", "decode", "REGRESSION", None, metrics, info={"breakdown": b.to_json()})
    [t] = breakdown_tables([case, CaseDoc("decode[no-profile]", "decode", "PASS", None, {})])
    title, rows = t.title, t.rows
    assert t.header[0] == "category" and all(len(r) == len(t.header) for r in rows)
    assert title.startswith("decode step breakdown: decode[x] (3 profiled steps, annotations")
    by_name = {r[0]: r for r in rows}
    # kernel time, its share of the busy time (no overlap in the fixture: the same 25 us, 29.2% of 85.5),
    # then the kernel time's baseline and delta
    assert by_name["routed experts (gated)"] == ["routed experts (gated)", "0.025", "0.025", "29.2%", "0.020",
                                                 "+25.0%", "41.0%"]
    assert by_name["GPU busy"][2:4] == ["0.086", "100.0%"] and by_name["overlap (kernel time - GPU busy)"][1] == "0.000"
    assert "communication" not in {r[0].split(" (")[0] for r in rows}  # no kernel, no row
    assert by_name["host gap (step - GPU busy)"][1] == "0.115"  # 0.2 - 0.0855


def test_a_category_tolerance_overrides_the_scenarios_default_for_that_category_only():
    from moebench.decode.breakdown import Breakdown
    from moebench.decode.categories import CATEGORIES

    b = Breakdown(steps=4, source="annotations", per_step_ms={c: [1.0, 1.0, 1.0, 1.0] for c in CATEGORIES},
                  busy_ms=[5.0] * 4)
    m = breakdown_metrics(b, 6.0, ("attention", "norms_elementwise"), 0.05, {"norms_elementwise": 0.2})
    assert m["step_norms_elementwise_ms"].rel_tol == 0.2 and m["step_attention_ms"].rel_tol == 0.05


def test_overlapping_kernels_share_the_busy_time_and_the_overlap_is_reported():
    # a routed-expert kernel and the shared expert's GEMM on a second stream overlap for 20 of their us:
    # kernel time counts those 20 us twice, the busy shares once (10 each), and add up to the busy time
    ks = [Kernel("moebench_w4_mma", 0.0, 40.0, "kernel"), Kernel("nvjet_tst_64x8", 20.0, 30.0, "kernel"),
          Kernel("triton_poi_fused_add", 60.0, 10.0, "kernel")]
    b = breakdown(Steps([ks, ks], "annotations"))
    doc = b.to_json()
    cats = doc["categories"]
    assert (cats["routed_experts"]["ms_per_step"], cats["dense_gemms"]["ms_per_step"]) == (0.04, 0.03)
    assert (cats["routed_experts"]["busy_share_ms_per_step"], cats["dense_gemms"]["busy_share_ms_per_step"]) == (0.03, 0.02)
    assert doc["gpu_busy_ms_per_step"] == 0.06 and doc["overlap_ms_per_step"] == 0.02
    assert sum(c.get("busy_share_ms_per_step", 0) for c in cats.values()) == pytest.approx(doc["gpu_busy_ms_per_step"])
    assert cats["dense_gemms"]["top_kernels"] == [["nvjet_tst_64x8", 0.03]]


def test_busy_shares_follow_the_engines_own_rules_not_only_the_category_map():
    # an engine's rules put a kernel the map calls `other` into norms: its busy share must go there too
    # (the first SGLang traces on the H200 gave GLM-5's `other` 0.61 ms/step of busy share but 0.007 of kernel time)
    ks = [Kernel("moebench_w4_mma", 0.0, 40.0, "kernel"), Kernel("mystery_kernel_xyz", 50.0, 10.0, "kernel")]

    def engine_rules(k):
        return "norms_elementwise" if k.name == "mystery_kernel_xyz" else category(k)

    doc = breakdown(Steps([ks], "graph launches"), classify=engine_rules).to_json()
    cats = doc["categories"]
    for c, v in cats.items():  # a category's share of the busy time never exceeds its kernel time
        assert v.get("busy_share_ms_per_step", 0) <= v["ms_per_step"] + 1e-9, c
    assert cats["norms_elementwise"]["busy_share_ms_per_step"] == 0.01
