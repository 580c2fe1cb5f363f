"""Decode metrics from timelines, the weight-bytes floor, and reading back what the engine chose."""

from __future__ import annotations

from pathlib import Path

import pytest

from moebench.decode import engine_log, floor, models
from moebench.decode.scenarios import load_scenarios
from moebench.decode.stats import Trial, _pct, check_trial, decode_metrics, implausible, per_trial_summary


SHIPPED = Path(__file__).resolve().parents[1] / "benchmarks" / "decode_scenarios.toml"


def _trial(ttft_ms: float, itl_ms: float, n: int, warmup: bool = False) -> Trial:
    return Trial(warmup, [((ttft_ms + i * itl_ms) / 1e3, 1) for i in range(n)], list(range(n)))


def test_steady_state_is_the_median_windowed_rate_of_measured_trials_only():
    trials = [_trial(900, 192, 40, warmup=True), _trial(50, 97, 40), _trial(60, 99, 40)]
    m = decode_metrics(trials)
    assert m["ms_per_token"].value == pytest.approx(98, abs=1.01)  # windows of 97 and of 99 -> 98
    assert m["ms_per_token"].n == 2 * (39 - 16) and m["ms_per_token"].gated and m["ms_per_token"].rel_tol == 0.10
    assert m["ttft_ms"].value == pytest.approx(55) and m["ttft_ms"].gated and m["ttft_ms"].rel_tol == 0.20
    # the warm-up trial is reported apart, never mixed in, never gated
    assert m["warmup_ms_per_token"].value == pytest.approx(192) and not m["warmup_ms_per_token"].gated
    assert m["warmup_ttft_ms"].value == pytest.approx(900)
    assert all(not m[k].gated for k in m if k not in ("ms_per_token", "ttft_ms"))


def test_percentiles_tokens_per_second_and_e2e():
    t = Trial(False, [(0.010, 1)] + [(0.010 + 0.001 * i, 1) for i in range(1, 100)] + [(0.199, 1)], [])
    m = decode_metrics([t])
    assert m["itl_p90_ms"].value == pytest.approx(1.0)
    assert m["itl_p99_ms"].value > 1.0  # the one 90 ms gap sits at the top
    assert m["ms_per_token"].value == pytest.approx(1.0)  # a stall moves a few windows, not their median
    assert m["tokens_per_s"].value == pytest.approx(101 / 0.199)
    assert m["e2e_ms_per_token"].value == pytest.approx(199 / 101)


SQUARES = [float(i * i) for i in range(11)]  # unevenly spaced: a wrong rank cannot interpolate back to the answer


@pytest.mark.parametrize("xs, q, expected", [
    ([7.0], 0.99, 7.0),
    ([1.0, 2.0, 4.0, 8.0], 0.0, 1.0),
    ([1.0, 2.0, 4.0, 8.0], 0.5, 3.0),
    ([1.0, 2.0, 4.0, 8.0], 1.0, 8.0),
    ([8.0, 1.0, 4.0, 2.0], 0.5, 3.0),  # unsorted input
    (SQUARES, 0.9, 81.0),              # an exact rank: the 10th of 11
    (SQUARES, 0.95, 90.5),             # halfway between the 10th and the 11th
])
def test_percentile_interpolates_between_closest_ranks(xs, q, expected):
    assert _pct(xs, q) == pytest.approx(expected)


def test_itl_percentiles_of_known_gaps():
    # 101 tokens whose 100 gaps are 1, 2, ..., 100 ms: p90 = 90.1 ms, p99 = 99.01 ms (p95 would be 95.05).
    times = [sum(range(i + 1)) / 1e3 for i in range(101)]
    m = decode_metrics([Trial(False, [(t, 1) for t in times], [])])
    assert m["itl_p90_ms"].value == pytest.approx(90.1)
    assert m["itl_p99_ms"].value == pytest.approx(99.01)
    assert m["itl_p90_ms"].n == m["itl_p99_ms"].n == 100


def test_every_metric_says_which_direction_is_better():
    m = decode_metrics([_trial(900, 192, 40, warmup=True), _trial(50, 97, 40)])
    higher = {"tokens_per_s"}
    assert {k: v.direction for k, v in m.items()} == {k: "higher" if k in higher else "lower" for k in m}
    assert {"ms_per_token", "ttft_ms", "itl_p90_ms", "itl_p99_ms", "tpot_ms", "e2e_ms_per_token"} <= set(m)


def test_several_tokens_per_stream_chunk_keep_the_steady_rate_right():
    # 128 tokens at 4 ms each, delivered by a loaded server in chunks of 1 to 8 tokens: the per-chunk
    # split used to read 0.016 ms/token here; the windowed rate reads the true 4 ms.
    chunks, t, i = [(0.010, 1)], 0.010, 1
    sizes = [1, 8, 2, 7, 3, 5, 8, 1]
    while i < 128:
        k = min(sizes[len(chunks) % len(sizes)], 128 - i)
        t += 0.004 * k
        chunks.append((t, k))
        i += k
    bursty_trial = Trial(False, chunks, [])
    m = decode_metrics([bursty_trial])
    assert m["ms_per_token"].value == pytest.approx(4.0, rel=0.15)
    assert implausible(m) is None


def test_tokens_arriving_in_bursts_are_flagged():
    smooth = decode_metrics([_trial(10, 4, 33)])
    assert smooth["tpot_ms"].value == pytest.approx(4) and implausible(smooth) is None
    # 4 bursts of 8 tokens, 30 ms apart: every 16-token window spans two waits, so the rate is right
    times = [0.010 + 0.030 * (i // 8) + 0.00001 * (i % 8) for i in range(32)]
    m = decode_metrics([Trial(False, [(t, 1) for t in times], [])])
    assert m["ms_per_token"].value == pytest.approx(3.75, rel=0.01) and implausible(m) is None
    # 100 tokens flushed 0.01 ms apart, then a 500 ms wait: most windows read "fast", far under the
    # stream's own rate; no steady state can be read from that, and it says so with both numbers
    times = [0.010 + 0.00001 * i for i in range(100)] + [0.510 + 0.001 * i for i in range(8)]
    m = decode_metrics([Trial(False, [(t, 1) for t in times], [])])
    assert m["ms_per_token"].value < 0.5 * m["tpot_ms"].value
    assert "arrived in bursts" in implausible(m)


@pytest.mark.parametrize("tokens, readable", [(32, False), ("tiny-cpu", True)])
def test_the_cpu_scenarios_trials_outlast_a_stall_of_the_box(tokens, readable):
    # A token every 5 ms (the tiny model on this box's CPU), and a client or server process that is not
    # scheduled for the first 250 ms: what was made meanwhile arrives at once. The 16-token windows'
    # median reads through that only if most windows lie after the stall, i.e. in a long enough trial.
    if tokens == "tiny-cpu":
        [s] = [x for x in load_scenarios(SHIPPED) if x.name == "tiny-cpu"]
        tokens = s.output_tokens
    times = [max(0.005 * (i + 1), 0.250 + 0.00001 * i) for i in range(tokens)]
    m = decode_metrics([Trial(False, [(t, 1) for t in times], [])] * 2)
    tiny_floor_ms = 0.63  # the tiny config's weights over this box's read ceiling (8 GB/s)
    assert (implausible(m, tiny_floor_ms) is None) is readable, implausible(m, tiny_floor_ms)
    if readable:
        assert m["ms_per_token"].value == pytest.approx(5.0, rel=0.01)


def test_a_steady_state_under_the_memory_floor_is_refused_with_both_numbers():
    m = decode_metrics([_trial(10, 4, 33)])
    assert implausible(m, floor_ms=3.9) is None
    assert implausible(m, floor_ms=5.0) == ("steady state 4 ms/token is below the memory floor 5 ms/token "
                                            "(the weights cannot be read that fast): the token timeline is wrong")


def test_a_chunk_of_k_tokens_counts_k_inter_token_latencies():
    t = Trial(False, [(0.1, 1), (0.2, 4)], [])
    assert t.tokens == 5 and t.itls_s() == pytest.approx([0.025] * 4)


def test_no_measured_trial_is_an_error():
    with pytest.raises(ValueError):
        decode_metrics([_trial(1, 1, 3, warmup=True)])


def test_trial_checks():
    assert check_trial(_trial(1, 1, 4), 4, 100) is None
    assert check_trial(_trial(1, 1, 3), 4, 100) == "3 output tokens, expected 4"
    assert check_trial(Trial(False), 4, 100) == "no output token"
    bad = Trial(False, [(0.1, 2)], [5, 100])
    assert check_trial(bad, 2, 100) == "token id 100 outside the vocabulary (0..99)"


def test_per_trial_summary_marks_warmup():
    rows = per_trial_summary([_trial(10, 2, 3, warmup=True), _trial(5, 1, 3)])
    assert [r["warmup"] for r in rows] == [True, False] and rows[0]["median_itl_ms"] == pytest.approx(2)


def test_floor_counts_the_tiny_config_by_hand():
    cfg = models.read_config(models.shipped_models()["tiny"])
    wb = floor.weight_bytes_per_token(cfg, "bfloat16")
    h, heads, q, kv, nope, rope, v = 256, 4, 256, 512, 64, 64, 64
    attn_per_layer = (h * q + q + q * heads * (nope + rope)) + (h * (kv + rope) + kv + kv * heads * (nope + v)) \
        + heads * v * h + 2 * h
    assert wb.attention == 2 * attn_per_layer * 2
    assert wb.dense_mlp == 1 * 3 * h * 512 * 2
    assert wb.moe == 1 * (8 * h * 2 + 8 * 4 + (2 + 1) * 3 * h * 128 * 2)
    assert wb.router == 8 * h * 2 + 8 * 4 and wb.routed_experts == 2 * 3 * h * 128 * 2
    assert wb.head == (2048 * h + 2 * h) * 2
    assert wb.floor_ms(1e9) == pytest.approx(1e3 * wb.total / 1e9)


def test_floor_of_the_kimi_shard():
    cfg = models.read_config(models.shipped_models()["kimi-k2.5-shard"])
    wb = floor.weight_bytes_per_token(cfg, "bfloat16")
    # 7 MoE layers x (router + 9 experts x 3 x 7168 x 256) x 2 bytes = 732 MB of 1.54 GB; with only 8
    # layers the LM head (20480 x 7168) and the replicated MLA A-projections weigh in too.
    assert wb.moe == pytest.approx(7 * (384 * 7168 * 2 + 384 * 4 + 9 * 3 * 7168 * 256 * 2))
    assert wb.total == pytest.approx(1.539e9, rel=1e-3) and 0.45 < wb.moe / wb.total < 0.5
    q = floor.weight_bytes_per_token(cfg, "bfloat16", "int4", tp=2)
    assert q.moe < wb.moe / 2 and q.attention == pytest.approx(wb.attention / 2)


def test_floor_of_the_kimi_int4_rank_counts_only_the_routed_experts_as_int4():
    cfg = models.read_config(models.shipped_models()["kimi-k2.5-int4-rank"])
    per_weight, parts = floor.config_quantization(cfg)
    assert per_weight == 0.5 + 2 / 32 and parts == {"routed_experts"}
    wb = floor.weight_bytes_per_token(cfg, "bfloat16")
    h, i, layers = 7168, 256, 61
    assert wb.routed_experts == pytest.approx((layers - 1) * 8 * 3 * h * i * 0.5625)  # 1.486 GB
    assert wb.shared_experts == pytest.approx((layers - 1) * 3 * h * i * 2)  # bf16
    assert wb.dense_mlp == pytest.approx(3 * h * 2304 * 2)
    kv = floor.kv_cache_bytes(cfg, 128)
    assert kv == 61 * (512 + 64) * 2 * 128
    cats = wb.by_category(kv)
    assert sum(cats.values()) == pytest.approx(wb.total + kv)
    assert cats["routed_experts"] == pytest.approx(1.486e9, rel=1e-3) and cats["router_topk_align"] == wb.router
    # MLA's projections are GEMMs: their 3.16 GB count where the GEMM kernels run, not under attention
    assert cats["dense_gemms"] == pytest.approx(wb.attention + wb.dense_mlp + wb.shared_experts + wb.head)
    assert wb.attention == pytest.approx(3.16e9, rel=1e-3) and cats["attention"] == kv


def test_a_config_quantization_the_floor_cannot_count_is_named():
    with pytest.raises(floor.FloorUnknown, match="'awq'"):
        floor.config_quantization({"quantization_config": {"quant_method": "awq"}})
    assert floor.config_quantization({}) is None


@pytest.mark.parametrize("ignore, quantized", [
    (["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
     {"routed_experts"}),                                             # the shipped INT4 rank's list
    (["kv_a_proj_with_mqa"], {"dense_mlp", "routed_experts", "shared_experts", "head"}),  # a bare leaf name
    (["shared_experts.gate_proj"], {"attention", "dense_mlp", "routed_experts", "head"}),  # a dotted tail
    (["model.layers.0.mlp.gate_proj"], {"attention", "routed_experts", "shared_experts", "head"}),  # a full name
    (["proj", "mlp.experts"], {"attention", "dense_mlp", "routed_experts", "shared_experts", "head"}),  # not a name
])
def test_the_ignore_list_matches_names_leaves_tails_and_patterns(ignore, quantized):
    cfg = models.read_config(models.shipped_models()["kimi-k2.5-int4-rank"])
    cfg["quantization_config"] = dict(cfg["quantization_config"], ignore=ignore)
    assert floor.config_quantization(cfg)[1] == quantized


def test_floor_refuses_what_it_cannot_count():
    with pytest.raises(floor.FloorUnknown):
        floor.weight_bytes_per_token({"hidden_size": 8}, "bfloat16")
    cfg = models.read_config(models.shipped_models()["tiny"])
    with pytest.raises(floor.FloorUnknown):
        floor.weight_bytes_per_token(cfg, "bfloat16", "mystery-quant")


def test_engine_log_choices(tmp_path):
    log = tmp_path / "engine.log"
    log.write_text(
        "(EngineCore pid=1) INFO 11-29 22:05:59 [cuda.py:378] Using FLASHMLA attention backend out of potential backends: ['FLASHMLA'].\n"
        "(Worker_TP0 pid=2) INFO 11-29 22:05:59 [unquantized.py:364] Using TRITON Unquantized MoE backend out of potential backends: ['TRITON'].\n"
        "(Worker_TP1 pid=3) INFO 11-29 22:05:59 [unquantized.py:364] Using TRITON Unquantized MoE backend out of potential backends: ['TRITON'].\n"
        "(Worker pid=2) INFO 11-29 22:05:59 [nvfp4.py:244] Using 'MARLIN' NvFp4 MoE backend out of potential backends: [...]\n"
        "(Worker pid=2) INFO [cpu.py:175] Using CPU_MLA backend.\n"
        "(Worker pid=2) INFO [compressed_tensors_moe_wna16_marlin.py:87] Using Marlin backend for WNA16 MoE (group_size=32, num_bits=4)\n"
        "(EngineCore pid=1) INFO [core.py:133] Initializing a V1 LLM engine with config: quantization=None, backend=x\n"
        "[2026-11-29] server_args=ServerArgs(attention_backend='flashinfer', moe_runner_backend='flashinfer_cutlass', quantization='modelopt_fp4')\n")
    c = engine_log.choices(log)
    assert c["attention"] == ["FLASHMLA", "CPU_MLA", "flashinfer"]
    assert c["moe"] == ["TRITON (Unquantized MoE)", "MARLIN (NvFp4 MoE)", "Marlin (WNA16 MoE)", "flashinfer_cutlass"]
    assert c["other"] == ["modelopt_fp4 (quantization)"]
    assert engine_log.choices(tmp_path / "missing.log")["moe"] == []


def test_a_stream_flushed_in_one_big_burst_reads_its_end_to_end_rate():
    # a starved vllm-server on a 2-core box: the first token, then 30 tokens in one chunk 150 ms later
    # (the engine made them at 5 ms each); 16-token windows inside that chunk used to read 0.01 ms/token
    t = Trial(False, [(0.010, 1), (0.012, 1), (0.160, 30)], [])
    m = decode_metrics([t])
    assert m["ms_per_token"].value == pytest.approx((160 - 12) / 30, rel=1e-6)  # one window: the whole trial
    assert implausible(m, floor_ms=0.24) is None
    # one token per chunk (every GPU stream): the 16-token window as before
    smooth = Trial(False, [(0.010 + 0.004 * i, 1) for i in range(40)], [])
    assert len(smooth.window_rates_s()) == 39 - 16


def test_a_held_back_stream_is_told_from_a_smooth_or_chunked_one():
    from moebench.decode.stats import burst_phrase

    smooth = Trial(False, [(0.02 + 0.005 * i, 1) for i in range(128)])
    chunked = Trial(False, [(0.02 + 0.02 * i, 4) for i in range(32)])  # 4 tokens a chunk, spaced: an engine's stream interval
    half_held = Trial(False, [(0.02 + 0.005 * i, 1) for i in range(64)] + [(0.9 + 1e-6 * i, 1) for i in range(64)])
    warm_burst = Trial(True, [(0.5 + 1e-6 * i, 1) for i in range(128)])
    assert burst_phrase([smooth, chunked, warm_burst]) is None
    assert burst_phrase([smooth, half_held]) == ("trial 2: 63 of the 127 chunks after the first came under 0.07 ms "
                                                 "after the one before, the last 900.1 ms after the request")
