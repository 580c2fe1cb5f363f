"""SGLang decode on CPU, from committed synthetic fixtures in SGLang 0.5.15's formats: the server command
line, what its log says it chose, the /generate stream, the profiled trial and its trace's steps."""

from __future__ import annotations

import json
import shutil
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from moebench.decode import commands, engine_log
from moebench.decode.breakdown import breakdown_metrics
from moebench.decode.openai_stream import StreamBroken, StreamResult
from moebench.decode.procs import EngineError
from moebench.decode.runner import check_choices, run_engine
from moebench.decode.scenarios import DecodeCase, load_scenarios, parse_scenario
from moebench.decode.sglang_engine import (SGLangServerEngine, generate_payload, profile_request, read_breakdown,
                                           stream_generate, take_event)
from moebench.core.ports import free_port
from moebench.decode.sglang_trace import find_decode_trace, sglang_category, split_by_graph_launches
from moebench.decode.trace import Kernel, TraceError, load_events

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
LOG = DATA / "sglang-0.5.15-server-synthetic.log"
STREAM = DATA / "sglang-generate-stream-synthetic.txt"
TRACE = DATA / "sglang-decode-trace-synthetic.json"


def _case(name: str = "kimi-k2.5-int4-rank-sglang") -> DecodeCase:
    [s] = [s for s in load_scenarios(REPO / "benchmarks" / "decode_scenarios.toml") if s.name == name]
    return DecodeCase(s, "sglang-server")


# --- the command line --------------------------------------------------------------------------------------
def test_the_shipped_rank_runs_through_sglang_with_token_ids_and_dummy_weights():
    case = _case()
    cmd = commands.server_command(case, case.scenario.model_dir, 30123, python="python3")
    joined = " ".join(cmd)
    assert cmd[:3] == ["python3", "-m", "sglang.launch_server"]
    for part in ("--skip-tokenizer-init", "--load-format dummy", "--moe-runner-backend auto", "--grammar-backend none",
                 "--disable-radix-cache", "--max-running-requests 1", "--port 30123", "--tensor-parallel-size 1",
                 "--context-length 256", "--served-model-name moebench", "--max-total-tokens 4096"):
        assert part in joined, part
    assert "--attention-backend" not in cmd and "--quantization" not in cmd  # SGLang's own choice; the config's method
    assert "--disable-cuda-graph" not in cmd
    assert case.key == "decode[kimi-k2.5-int4-rank-sglang-server-tp1-int4-g32-moe_auto-attn_auto-graph-p64-o128]"
    assert {m for m, _ in case.markers()} == {"decode", "sglang", "gpu"}
    assert {m for m, _ in _case("glm-5-int4-rank-sglang").markers()} == {"decode", "sglang", "gpu", "full"}
    assert case.definition()["breakdown_map"] == "2+sglang2"


def test_an_sglang_server_gets_a_port_its_grpc_offset_keeps_in_range(monkeypatch):
    """SGLang refuses --port p when p + 10000 > 65535 (a start on the H200 failed so): every port moebench
    gives it stays under 55536, drawn at random and free; a vLLM server has no such bound."""
    from moebench.decode import runner

    asked = []
    monkeypatch.setattr(runner, "free_port", lambda below=None: asked.append(below) or 30123)
    runner.make_engine(_case(), Path("/tmp/unused.log"))
    [rank] = [x for x in load_scenarios(REPO / "benchmarks" / "decode_scenarios.toml") if x.name == "kimi-k2.5-int4-rank"]
    runner.make_engine(DecodeCase(rank, "vllm-server"), Path("/tmp/unused.log"))  # the vLLM server of the same rank
    assert asked == [55536, None] and commands.SGLANG_PORT_BELOW + 10000 == 65536
    ports = [free_port(below=55536, ephemeral=(56000, 60999)) for _ in range(200)]
    assert all(20000 <= p < 55536 for p in ports) and len(set(ports)) > 100


def test_a_checkpoint_with_a_tokenizer_starts_without_skip_tokenizer_init(tmp_path):
    shutil.copy(_case().scenario.model_dir / "config.json", tmp_path)
    (tmp_path / "tokenizer.json").write_text("{}")
    assert "--skip-tokenizer-init" not in commands.server_command(_case(), tmp_path, 1)


def test_the_users_checkpoint_case_keeps_its_definition_without_a_breakdown_map():
    users = _case("glm-5-nvfp4-tp8-sglang")
    assert "breakdown_map" not in users.definition()  # its stored external entry stays comparable


def test_sglangs_own_site_goes_first_on_its_path_only_with_the_folders_its_pth_files_add(tmp_path):
    from moebench.decode.runner import why_not_here

    site = tmp_path / "site-sglang"
    (site / "nvidia_cutlass_dsl" / "python_packages").mkdir(parents=True)
    (site / "nvidia_cutlass_dsl.pth").write_text("nvidia_cutlass_dsl/python_packages\n")
    base = {"PYTHONPATH": "/tmp/site", commands.SGLANG_SITE_ENV: str(site)}
    path = commands.engine_env(_case(), base=base)["PYTHONPATH"].split(":")
    assert path[1:] == [str(site), str(site / "nvidia_cutlass_dsl" / "python_packages"), "/tmp/site"]
    [vllm] = [s for s in load_scenarios(REPO / "benchmarks" / "decode_scenarios.toml") if s.name == "kimi-k2.5-int4-rank"]
    assert str(site) not in commands.engine_env(DecodeCase(vllm, "vllm"), base=base)["PYTHONPATH"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(commands.SGLANG_SITE_ENV, str(site))
        assert why_not_here(_case(), "nvidia-h200-x1") == f"needs SGLang: {commands.SGLANG_SITE_ENV}={site} holds no `sglang` package"
        (site / "sglang").mkdir()
        assert why_not_here(_case(), "nvidia-h200-x1") is None


# --- the log -------------------------------------------------------------------------------------------------
def test_the_log_names_the_marlin_moe_method_and_the_default_attention_backend():
    ch = engine_log.choices(LOG)
    assert ch["moe"] == ["marlin (CompressedTensorsWNA16MarlinMoEMethod)"]  # 'auto' in server_args is no kernel
    assert ch["attention"] == ["fa3"]
    assert any("Using CompressedTensorsWNA16MarlinMoEMethod" in line for line in ch["lines"])
    assert check_choices(_case(), ch) == ""


def test_a_run_whose_experts_went_to_triton_fails_naming_what_sglang_said(tmp_path):
    log = tmp_path / "engine.log"
    log.write_text(LOG.read_text().replace("Using CompressedTensorsWNA16MarlinMoEMethod",
                                           "Using CompressedTensorsWNA16TritonMoE (moe_runner_backend=triton)"))
    ch = engine_log.choices(log)
    assert ch["moe"] == ["triton (CompressedTensorsWNA16TritonMoE)"]
    with pytest.raises(EngineError) as e:
        check_choices(_case(), ch)
    assert e.value.summary.startswith("MoE kernel: the scenario pins 'marlin' but the engine used triton "
                                      "(CompressedTensorsWNA16TritonMoE) (engine: '[2026-12-01 10:00:10 TP0] Using")


def test_a_pinned_attention_backend_is_read_from_the_server_args_dump(tmp_path):
    log = tmp_path / "engine.log"
    log.write_text(LOG.read_text().replace("Attention backend not specified. Use fa3 backend by default.\n", "")
                   .replace("attention_backend=None", "attention_backend='triton'"))
    assert engine_log.choices(log)["attention"] == ["triton"]


# --- the stream ----------------------------------------------------------------------------------------------
class _Server:
    """A stand-in SGLang server on 127.0.0.1: /generate streams `events`, /start_profile records its body and
    (on the next /generate) writes `trace` where it was told to."""

    def __init__(self, events: list[bytes], trace: Path | None = None, profile_status: int = 200):
        self.events, self.trace, self.profile_status, self.bodies = events, trace, profile_status, []
        self.profile_dir: str | None = None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.bodies.append((self.path, body))
                if self.path == "/start_profile":
                    outer.profile_dir = body["output_dir"]
                    self.send_response(outer.profile_status)
                    self.end_headers()
                    self.wfile.write(b"Start profiling.\n" if outer.profile_status == 200 else b"Internal Server Error")
                    return
                # The profiler stops inside the request (it asks for 8 tokens past the profiled steps), so the
                # trace lands before the stream ends. Written after the last event, it raced the client's wait
                # loop: two writers of one file, and a torn trace of the full size read as complete.
                if outer.profile_dir and outer.trace:
                    shutil.copy(outer.trace, Path(outer.profile_dir) / "moebench-TP-0-DECODE.trace.json.gz")
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for line in outer.events:
                    self.wfile.write(line)
                    self.wfile.flush()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _events(incremental: bool = False) -> list[bytes]:
    out, before = [], 0
    for line in STREAM.read_text().splitlines(keepends=True):
        if incremental and line.startswith("data: {"):
            obj = json.loads(line[5:])
            n = obj["meta_info"]["completion_tokens"]
            obj["output_ids"] = obj["output_ids"][before:]
            before = n
            line = "data: " + json.dumps(obj) + "\n"
        out.append(line.encode())
    return out


@pytest.mark.parametrize("incremental", [False, True])
def test_the_generate_stream_is_timed_per_event_with_every_token_counted(incremental):
    server = _Server(_events(incremental))
    try:
        res = stream_generate(server.url, generate_payload([11, 12, 13, 14], 6), read_timeout=5, deadline=1e12)
    finally:
        server.close()
    assert [n for _, n in res.chunks] == [1, 1, 3, 1]  # the third event carries three merged steps
    assert res.token_ids == [5021, 88, 88, 17, 3, 940] and res.usage_tokens == 6
    assert all(t2 >= t1 for (t1, _), (t2, _) in zip(res.chunks, res.chunks[1:]))
    [(path, body)] = server.bodies
    assert path == "/generate" and body["input_ids"] == [11, 12, 13, 14] and body["stream"] is True
    # min_new_tokens needs the tokenizer's EOS id: refused by SGLang under --skip-tokenizer-init
    assert body["sampling_params"] == {"max_new_tokens": 6, "ignore_eos": True, "temperature": 0.0}


@pytest.mark.parametrize("event, needle", [
    ({"error": {"message": "boom"}}, "the server sent an error mid-stream"),
    ({"output_ids": [1, 2]}, "without meta_info.completion_tokens"),
    ({"output_ids": [1, 2, 3], "meta_info": {"completion_tokens": 2}}, "an event with 3 output ids for 2 new tokens"),
])
def test_a_broken_event_breaks_the_stream_with_one_line(event, needle):
    with pytest.raises(StreamBroken, match=needle):
        take_event(StreamResult(), event, 0.1)


def test_an_event_that_adds_no_token_is_not_a_chunk_and_a_count_going_back_is_an_error():
    res = StreamResult()
    take_event(res, {"output_ids": [7, 8], "meta_info": {"completion_tokens": 2}}, 0.1)
    take_event(res, {"output_ids": [7, 8], "meta_info": {"completion_tokens": 2}}, 0.2)
    assert res.chunks == [(0.1, 2)] and res.token_ids == [7, 8]
    with pytest.raises(StreamBroken, match="went back from 2 to 1"):
        take_event(res, {"output_ids": [7], "meta_info": {"completion_tokens": 1}}, 0.3)


# --- the profiled trial and its trace ------------------------------------------------------------------------
def test_graph_launches_tell_the_steps_apart_and_sglang_names_sort_into_categories():
    steps = split_by_graph_launches(load_events(TRACE), 4, str(TRACE))
    assert steps.count == 3 and steps.source == "graph launches"  # the step after the last launch may be cut
    names = [k.name for k in steps.kernels[0]]
    assert len(names) == 10 and "ArgMaxOps" in names[-2] and names[-1].startswith("Memcpy")  # eager, after the graph
    cats = {k.name.split("<")[0]: sglang_category(k) for k in steps.kernels[0]}
    assert cats["void marlin_moe_wna16::Marlin"] == "routed_experts" and cats["moe_sum_reduce_kernel"] == "routed_experts"
    assert cats["moe_align_block_size_kernel"] == "router_topk_align"
    assert cats["void sglang::act_and_mul_kernel"] == "norms_elementwise"  # not the experts': one kernel for every MLP
    assert cats["void flash::FlashAttnFwdSm90"] == "attention" and cats["nvjet_tst_64x8_64x16_4x1_v_bz_TNT"] == "dense_gemms"


def test_the_breakdown_of_an_sglang_trace_gates_its_categories():
    b = read_breakdown(TRACE, 4)
    # two Marlin GEMMs (60 + 40 us) + the sum (4) per step, each kernel 1 us longer per step
    assert b.per_step_ms["routed_experts"] == pytest.approx([0.104, 0.107, 0.110])
    m = breakdown_metrics(b, 0.3, ("routed_experts", "attention"), 0.05)
    assert m["step_routed_experts_ms"].gated and m["step_attention_ms"].gated
    assert not m["step_dense_gemms_ms"].gated and m["step_routed_experts_ms"].noise > 0


def test_without_graph_launches_the_window_is_one_pool_and_not_gated():
    events = [e for e in load_events(TRACE) if e.get("name") != "cudaGraphLaunch"]
    steps = split_by_graph_launches(events, 4)
    assert steps.source.startswith("assumed 4 steps") and steps.count == 4
    with pytest.raises(TraceError, match="no GPU kernel"):
        split_by_graph_launches([e for e in events if e.get("cat") != "kernel" and e.get("cat") != "gpu_memcpy"], 4)


# The largest kernels of each category on the first H200 traces (SGLang 0.5.15, the Kimi and GLM-5 INT4 ranks), as their
# results files named them (cut at 120 characters as the breakdown keeps them), with the category each belongs to.
H200_KERNELS = {
    "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::CollectiveMainloopFwdSm90<2, cute":
        "attention",
    "kernel_cutlass_kernel_flashinfernormkernelsfused_add_rmsnormFusedAddRMSNormKernel_object_at__tensorptrbf16gmemalign128o7":
        "norms_elementwise",
    "kernel_cutlass_kernel_flashinfernormkernelsrmsnormRMSNormKernel_object_at__tensorptrbf16gmemalign128o153615361_tensorptr":
        "norms_elementwise",
    "void flash::prepare_varlen_num_blocks_kernel<1, true>(int, int, int, int const*, int const*, int const*, int const*, int":
        "attention",
    "void (anonymous namespace)::fused_rope_kernel<false, 64l, true, __nv_bfloat16, long, 8u>((anonymous namespace)::FusedRop":
        "attention",
    "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT": "dense_gemms",
    "void (anonymous namespace)::fused_a_gemm_kernel<1, 2112, 7168, 16, 8, 256, 16>(__nv_bfloat16*, __nv_bfloat16 const*, __n":
        "dense_gemms",
    "void (anonymous namespace)::act_and_mul_kernel<__nv_bfloat16, ((anonymous namespace)::ActivationKind)0, true, false>((an":
        "norms_elementwise",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, long, 4, ":
        "norms_elementwise",
    "void device::marlin_moe::Marlin<__nv_bfloat16, 1125899907892224l, 1125899906909960l, 128, 1, 8, 4, true, 4, 2, false>(in":
        "routed_experts",
    "void moe_sum_reduce_kernel<c10::BFloat16, 8>(c10::BFloat16 const*, c10::BFloat16*, long, long, long, long, long, at::OpM":
        "routed_experts",
    "_router_triton_kernel": "router_topk_align",
    "void (anonymous namespace)::router_gemm_kernel<__nv_bfloat16, float, 128, 8, 1, 384, 7168, true>(float*, __nv_bfloat16 c":
        "router_topk_align",
    "void count_and_sort_expert_tokens_kernel<int>(int const*, int*, int*, unsigned long)": "router_topk_align",
    # the GLM-5 rank's router: torch.topk over 256 experts (0.60 ms/step of `other` under version 1)
    "void at::native::bitonicSortKVInPlace<-2, -1, 16, 16, float, long, at::native::GTOp<float, true>, unsigned int>(at::cuda":
        "router_topk_align",
    "_fused_metadata_kernel_ps1_no_swa": "other",  # what stays `other`: 0.002 ms/step
}


@pytest.mark.parametrize("name", sorted(H200_KERNELS))
def test_each_kernel_of_the_first_h200_trace_sorts_into_its_category(name):
    assert sglang_category(Kernel(name, 0, 1, "kernel")) == H200_KERNELS[name]


def test_sglangs_rules_leave_the_sampler_and_copies_to_the_shared_map():
    assert sglang_category(Kernel("act_and_mul_kernel", 0, 1, "kernel", in_sampler=True)) == "sampling"
    assert sglang_category(Kernel("act_and_mul copy", 0, 1, "gpu_memcpy")) == "other"


def test_the_profiled_trial_asks_for_decode_steps_by_stage_and_finds_the_trace(tmp_path):
    server = _Server(_events(), trace=TRACE)
    engine = SGLangServerEngine(server.url, start_timeout=5, trial_timeout=5, profile_dir=tmp_path / "prof")
    try:
        trace = engine.profile(4, [11, 12], 4, timeout=5, sleep=lambda s: None)
    finally:
        server.close()
    assert trace == tmp_path / "prof" / "moebench-TP-0-DECODE.trace.json.gz"
    (p1, start), (p2, gen) = server.bodies
    assert (p1, p2) == ("/start_profile", "/generate")
    assert start == profile_request(tmp_path / "prof", 4) and start["profile_by_stage"] and start["num_steps"] == 4
    assert gen["sampling_params"]["max_new_tokens"] == 4 + 8  # past the profiled steps: the profiler stops inside
    assert find_decode_trace(tmp_path / "prof") == trace


def test_a_trace_still_being_written_is_waited_for(tmp_path):
    half = tmp_path / "half.json"
    half.write_bytes(TRACE.read_bytes()[:2000])  # what the scheduler has written when the request ends
    server = _Server(_events(), trace=half)
    engine = SGLangServerEngine(server.url, start_timeout=5, trial_timeout=5, profile_dir=tmp_path / "prof")
    sleeps = []

    def sleep(s):  # the scheduler finishes the file while we wait
        sleeps.append(s)
        shutil.copy(TRACE, tmp_path / "prof" / "moebench-TP-0-DECODE.trace.json.gz")

    try:
        trace = engine.profile(4, [11], 4, timeout=5, sleep=sleep)
    finally:
        server.close()
    assert len(sleeps) >= 2 and read_breakdown(trace, 4).steps == 3


def test_a_profiler_that_refuses_or_writes_nothing_fails_the_trial_with_one_line(tmp_path):
    server = _Server(_events(), profile_status=500)
    engine = SGLangServerEngine(server.url, start_timeout=5, trial_timeout=5, profile_dir=tmp_path / "prof")
    try:
        with pytest.raises(EngineError, match="POST /start_profile answered HTTP 500: Internal Server Error"):
            engine.profile(4, [11], 4, timeout=5)
        server.profile_status = 200
        with pytest.raises(EngineError, match=r"SGLang wrote no \*-DECODE.trace.json\* file after 0 s"):
            engine.profile(4, [11], 4, timeout=0.0, sleep=lambda s: None)
    finally:
        server.close()


# --- the whole engine run, against a stand-in SGLang process -------------------------------------------------
def test_run_engine_drives_an_sglang_server_through_trials_and_a_profiled_trial(tmp_path):
    raw = {"name": "fake-sglang", "engine": "sglang-server", "model": "kimi-k2.5-int4-rank", "moe_backend": "auto",
           "expect_moe": "marlin", "prompt_tokens": 4, "output_tokens": 6, "trials": 1, "warmup_trials": 1,
           "profile_steps": 4, "gate_categories": ["routed_experts"], "start_timeout_s": 20, "trial_timeout_s": 10,
           "server_command": ["{python}", str(Path(__file__).resolve()), "--port", "{port}"]}
    case = DecodeCase(parse_scenario(raw, "fake.toml"), "sglang-server")
    said = []
    run = run_engine(case, tmp_path / "engine-1-0.log", said.append)
    assert [t.tokens for t in run.trials] == [6, 6] and [t.warmup for t in run.trials] == [True, False]
    assert run.choices["moe"] == ["marlin (CompressedTensorsWNA16MarlinMoEMethod)"] and run.choices["attention"] == ["fa3"]
    assert run.breakdown is not None and run.breakdown.steps == 3 and run.breakdown.source == "graph launches"
    assert (tmp_path / "engine-1-0-profile" / "moebench-TP-0-DECODE.trace.json.gz").is_file()
    assert any("profiled trial: 4 decode steps" in line for line in said)


def _fake_sglang(port: int) -> None:
    """A stand-in `python -m sglang.launch_server`: SGLang's log lines, /health, /v1/models, /generate and
    /start_profile (the trace is the committed fixture, written after the next request)."""
    print("[2026-12-01 10:00:00] Attention backend not specified. Use fa3 backend by default.", flush=True)
    print("[2026-12-01 10:00:10 TP0] Using CompressedTensorsWNA16MarlinMoEMethod", flush=True)
    profile = {}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            body = json.dumps({"data": [{"id": "moebench"}]} if self.path == "/v1/models" else {}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.end_headers()
            if self.path == "/start_profile":
                profile["dir"] = req["output_dir"]
                self.wfile.write(b"Start profiling.\n")
                return
            n = req["sampling_params"]["max_new_tokens"]
            for i in range(1, n + 1):
                event = {"output_ids": [100 + j for j in range(i)], "meta_info": {"completion_tokens": i}}
                self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            if profile.get("dir"):
                shutil.copy(TRACE, Path(profile.pop("dir")) / "moebench-TP-0-DECODE.trace.json.gz")

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    _fake_sglang(int(sys.argv[sys.argv.index("--port") + 1]))
