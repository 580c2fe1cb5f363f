"""Decode scenarios: the shipped file, validation messages, keys and markers, command-line overrides,
and the engine command lines built from a case."""

from __future__ import annotations

import argparse
import re
import json
import subprocess
import sys
from pathlib import Path

import pytest

from moebench.decode import commands, models
from moebench.decode.options import Override, _split, apply_overrides
from moebench.decode.scenarios import DecodeCase, ScenarioError, cases_of, load_scenarios, parse_scenario

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "benchmarks" / "decode_scenarios.toml"


def _load(tmp_path: Path, text: str):
    p = tmp_path / "s.toml"
    p.write_text(text)
    return load_scenarios(p)


MINIMAL = '[[scenario]]\nname = "a"\nengine = "vllm"\nmodel = "tiny"\nmoe_backend = "triton"\n'


def test_shipped_scenarios_parse_and_cover_the_brief():
    cases = cases_of(load_scenarios(SHIPPED))
    by_name = {}
    for c in cases:
        by_name.setdefault(c.scenario.name, []).append(c.engine_kind)
    assert by_name["tiny-cpu"] == ["vllm", "vllm-server"]
    assert by_name["tiny"] == ["vllm", "vllm-server"]
    assert by_name["kimi-k2.5-shard"] == ["vllm", "vllm-server"]
    assert by_name["glm-5-nvfp4-tp8-sglang"] == ["sglang-server"]
    assert len({c.key for c in cases}) == len(cases)


def test_shipped_configs_have_the_mla_dims_the_kernels_support():
    for name, folder in models.shipped_models().items():
        cfg = models.read_config(folder)
        assert cfg["architectures"] == ["DeepseekV3ForCausalLM"], name
        assert cfg["kv_lora_rank"] == 512 and cfg["qk_rope_head_dim"] == 64, name
    kimi = models.read_config(models.shipped_models()["kimi-k2.5-shard"])
    assert (kimi["hidden_size"], kimi["n_routed_experts"], kimi["moe_intermediate_size"]) == (7168, 384, 256)
    assert (kimi["num_attention_heads"], kimi["vocab_size"], kimi["num_hidden_layers"]) == (8, 163840 // 8, 8)
    glm = models.read_config(models.shipped_models()["glm-5-shard"])
    assert (glm["hidden_size"], glm["n_routed_experts"], glm["moe_intermediate_size"]) == (6144, 256, 256)


def test_markers_select_family_engine_backend_and_hardware():
    cases = {(c.scenario.name, c.engine_kind): c for c in cases_of(load_scenarios(SHIPPED))}
    names = lambda c: {m for m, _ in c.markers()}  # noqa: E731
    assert names(cases["tiny-cpu", "vllm"]) == {"decode", "vllm", "tiny"}
    assert names(cases["kimi-k2.5-shard", "vllm-server"]) == {"decode", "vllm", "vllm_triton", "gpu", "full"}
    # "auto" with the kernel the engine must report: the kernel's marker selects it; in the default set
    assert names(cases["kimi-k2.5-int4-rank", "vllm"]) == {"decode", "vllm", "vllm_marlin", "gpu"}
    # only_on: no GPU marker, so the row can read ENV_MISMATCH instead of a plain skip at setup
    assert names(cases["glm-5-nvfp4-tp8-sglang", "sglang-server"]) == {"decode", "sglang", "flashinfer_cutlass"}
    assert ("full", ()) in cases["glm-5-shard", "vllm"].markers()


def test_markers_used_are_registered():
    import tomllib

    registered = {m.split(":")[0].split("(")[0] for m in
                  tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]}
    used = {m for c in cases_of(load_scenarios(SHIPPED)) for m, _ in c.markers()}
    assert used <= registered, used - registered


def test_key_is_rendered_from_axes():
    [s] = load_scenarios(SHIPPED)[:1]
    assert DecodeCase(s, "vllm-server").key == "decode[tiny-vllm-server-cpu-tp1-bf16-moe_auto-attn_cpu_mla-eager-p64-o128]"
    assert DecodeCase(s, "http://box:8000").key.startswith("decode[tiny-openai-cpu-")


def test_definition_ignores_trials_but_not_backends(tmp_path):
    [a] = _load(tmp_path, MINIMAL)
    [b] = _load(tmp_path, MINIMAL + "trials = 9\nwarmup_trials = 2\n")
    [c] = _load(tmp_path, MINIMAL.replace("triton", "marlin"))
    d = lambda s: DecodeCase(s, "vllm").definition()  # noqa: E731
    assert d(a) == d(b) and d(a) != d(c)
    assert d(a)["config_sha256"]  # dummy weights: the config is the model


@pytest.mark.parametrize("extra, needle", [
    ('tps = 1\n', "unknown field(s) tps"),
    ('tp = 0\n', "tp: must be an integer >= 1, got 0"),
    ('device = "tpu"\n', "device: must be one of cuda, cpu"),
    ('cuda_graphs = "yes"\n', "cuda_graphs: must be true or false"),
])
def test_bad_fields_are_one_line_naming_the_field(tmp_path, extra, needle):
    with pytest.raises(ScenarioError) as e:
        _load(tmp_path, MINIMAL + extra)
    assert needle in str(e.value) and "scenario 'a'" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("text, needle", [
    (MINIMAL.replace('moe_backend = "triton"\n', ""), "moe_backend: missing"),
    (MINIMAL.replace('"triton"', '"auto"'), "moe_backend: must be pinned"),
    (MINIMAL.replace('"vllm"', '"trt"'), "engine: must be one of vllm, vllm-server, sglang-server or an http(s):// URL"),
    (MINIMAL.replace('"tiny"', '"no-such-config"'), "neither a shipped config"),
    (MINIMAL + MINIMAL, "name used twice"),
    ("[[scenario]\n", "invalid TOML"),
])
def test_bad_files_are_one_line(tmp_path, text, needle):
    with pytest.raises(ScenarioError) as e:
        _load(tmp_path, text)
    assert needle in str(e.value), str(e.value)


def test_overrides_by_name_and_for_all(tmp_path):
    scen = _load(tmp_path, MINIMAL + MINIMAL.replace('"a"', '"b"'))
    out = apply_overrides(scen, [Override("--decode-trials", "a", 7), Override("--decode-engine", None, "vllm-server")])
    assert [s.trials for s in out] == [7, 3]
    assert [s.engines for s in out] == [("vllm-server",), ("vllm-server",)]


def test_override_of_unknown_scenario_names_the_option(tmp_path):
    with pytest.raises(ScenarioError) as e:
        apply_overrides(_load(tmp_path, MINIMAL), [Override("--decode-tp", "nope", 2)])
    assert str(e.value) == "--decode-tp: unknown scenario 'nope' (known: a)"


def test_override_that_breaks_a_rule_names_the_option(tmp_path):
    with pytest.raises(ScenarioError) as e:
        apply_overrides(_load(tmp_path, MINIMAL), [Override("--decode-moe-backend", None, "auto")])
    assert str(e.value).startswith("--decode-moe-backend: scenario 'a': moe_backend: must be pinned")


def test_decode_model_points_a_scenario_at_a_folder(tmp_path):
    folder = tmp_path / "My-Kimi"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"vocab_size": 10}))
    [s] = apply_overrides(_load(tmp_path, MINIMAL), [_split("--decode-model", f"a={folder}", str, need_name=True)])
    assert s.model == str(folder) and s.weights == "dummy" and s.model_tag == "my-kimi"
    (folder / "model-00001.safetensors").write_bytes(b"")
    [s] = apply_overrides(_load(tmp_path, MINIMAL), [Override("--decode-model", "a", str(folder))])
    assert s.weights == "checkpoint"


def test_url_values_are_not_read_as_name_value():
    o = _split("--decode-engine", "http://box:8000/v1?x=1", str)
    assert o.scenario is None and o.value == "http://box:8000/v1?x=1"
    o = _split("--decode-engine", "tiny=http://box:8000", str)
    assert o.scenario == "tiny" and o.value == "http://box:8000"
    with pytest.raises(argparse.ArgumentTypeError):
        _split("--decode-model", "/some/path", str, need_name=True)


def _collect(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", str(REPO / "benchmarks" / "test_decode.py"), "--collect-only",
                           "-q", *args], cwd=REPO, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args, needle", [
    (["--decode-trials", "nope=3"], "--decode-trials: unknown scenario 'nope' (known: tiny-cpu, kimi-k2.5-int4-rank,"),
    (["--decode-trials", "abc"], "argument --decode-trials: 'abc' is not a positive integer"),
    (["--decode-model", "tiny=/no/such/folder"], "argument --decode-model: /no/such/folder: no such model folder"),
    (["--decode-engine", "trt"], "argument --decode-engine: 'trt': expected one of vllm, vllm-server, sglang-server"),
])
def test_bad_command_line_is_one_clear_line(args, needle):
    r = _collect(*args)
    assert r.returncode != 0
    assert needle in r.stdout + r.stderr, r.stdout + r.stderr


def test_vllm_server_command_pins_everything():
    [s] = [x for x in load_scenarios(SHIPPED) if x.name == "kimi-k2.5-shard"]
    case = DecodeCase(s, "vllm-server")
    cmd = commands.server_command(case, s.model_dir, 8123, python="python3")
    assert cmd[:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    joined = " ".join(cmd)
    for part in ("--moe-backend triton", "--load-format dummy", "--skip-tokenizer-init", "--no-enable-prefix-caching",
                 "--port 8123", "--max-num-seqs 1", "--tensor-parallel-size 1"):
        assert part in joined, part
    assert "--enforce-eager" not in cmd and "--attention-backend" not in cmd
    kw = commands.llm_kwargs(case, s.model_dir)
    assert kw["moe_backend"] == "triton" and kw["load_format"] == "dummy" and kw["enforce_eager"] is False
    assert kw["skip_tokenizer_init"] is True and kw["enable_prefix_caching"] is False


def test_sglang_command_uses_moe_runner_backend():
    s = [x for x in load_scenarios(SHIPPED) if x.name == "glm-5-nvfp4-tp8-sglang"][0]
    cmd = commands.server_command(DecodeCase(s, "sglang-server"), Path("/ckpt"), 30000, python="python3")
    joined = " ".join(cmd)
    assert cmd[:3] == ["python3", "-m", "sglang.launch_server"]
    for part in ("--moe-runner-backend flashinfer_cutlass", "--tensor-parallel-size 8", "--quantization modelopt_fp4",
                 "--attention-backend flashinfer", "--disable-radix-cache", "--disable-shared-experts-fusion"):
        assert part in joined, part


def test_prompts_differ_per_trial_and_stay_in_the_vocab():
    [s] = load_scenarios(SHIPPED)[:1]
    case = DecodeCase(s, "vllm")
    a, b = commands.prompt_ids(case, 0, 2048), commands.prompt_ids(case, 1, 2048)
    assert a != b and len(a) == s.prompt_tokens and all(10 <= t < 2048 for t in a + b)
    assert a == commands.prompt_ids(case, 0, 2048)


def test_engine_env_defaults_and_pythonpath():
    [s] = load_scenarios(SHIPPED)[:1]
    env = commands.engine_env(DecodeCase(s, "vllm"), base={"PATH": "/bin"})
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert env["PYTHONPATH"].split(":")[0] == str(REPO / "src")
    env = commands.engine_env(DecodeCase(s, "vllm"), base={"VLLM_CPU_KVCACHE_SPACE": "4"})
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "4"


def _scenario(**kw):
    base = {"name": "x", "engine": "vllm", "model": "tiny", "moe_backend": "triton"}
    return parse_scenario(base | kw, "f.toml")


def test_auto_moe_on_a_gpu_needs_the_kernel_the_engine_must_report():
    with pytest.raises(ScenarioError, match="moe_backend: must be pinned .* or name the kernel .* expect_moe"):
        _scenario(moe_backend="auto")
    s = _scenario(moe_backend="auto", expect_moe="marlin")
    assert ("vllm_marlin", ()) in DecodeCase(s, "vllm").markers()


def test_gated_categories_must_exist_and_need_a_profiled_trial():
    with pytest.raises(ScenarioError, match="gate_categories: unknown experts"):
        _scenario(gate_categories=["experts"], profile_steps=8)
    with pytest.raises(ScenarioError, match="gate_categories: gating breakdown categories needs a profiled trial"):
        _scenario(gate_categories=["attention"])
    assert _scenario(gate_categories=["attention"], profile_steps=8).gate_categories == ("attention",)


@pytest.mark.parametrize("kw, choices, error", [
    ({}, {"moe": ["TRITON (Unquantized MoE)"], "lines": []}, None),
    ({"moe_backend": "auto", "expect_moe": "marlin"}, {"moe": ["Marlin (WNA16 MoE)"]}, None),
    # the INT4 run of the past: pinned triton, the engine ran Marlin; now a failure quoting the engine
    ({}, {"moe": ["Marlin (WNA16 MoE)"],
          "lines": ["Using Marlin backend for WNA16 MoE (group_size=32, num_bits=4)"]},
     "MoE kernel: the scenario pins 'triton' but the engine used Marlin (WNA16 MoE) "
     "(engine: 'Using Marlin backend for WNA16 MoE (group_size=32, num_bits=4)')"),
    ({"attention_backend": "FLASH_ATTN_MLA"}, {"moe": ["TRITON (Unquantized MoE)"], "attention": ["TRITON_MLA"]},
     "attention backend: the scenario pins 'FLASH_ATTN_MLA' but the engine used TRITON_MLA"),
])
def test_a_pin_the_engine_did_not_honour_fails_the_case(kw, choices, error):
    from moebench.decode.procs import EngineError
    from moebench.decode.runner import check_choices

    case = DecodeCase(_scenario(**kw), "vllm")
    if error is None:
        assert check_choices(case, choices) == ""
    else:
        with pytest.raises(EngineError) as e:
            check_choices(case, choices)
        assert e.value.summary == error


def test_a_pin_the_log_does_not_mention_is_recorded_as_unchecked():
    from moebench.decode.runner import check_choices

    assert check_choices(DecodeCase(_scenario(), "vllm"), {}) == "MoE kernel 'triton': not in the engine's log"


@pytest.mark.parametrize("hook, marker", [("moebench_w4", "triton_rows4"), ("moebench_mma", "triton")])
def test_an_engine_hook_scenario_is_its_own_case_with_its_own_marker(hook, marker):
    hooked = _scenario(moe_backend="auto", moe_hook=hook, expect_moe=hook)
    plain = _scenario(moe_backend="auto", expect_moe="marlin")
    h, p = DecodeCase(hooked, "vllm"), DecodeCase(plain, "vllm")
    assert f"-moe_{hook}-" in h.key and "-moe_auto-" in p.key
    assert (marker, ()) in h.markers() and ("vllm_marlin", ()) in p.markers()
    assert h.definition()["moe_hook"] == hook
    # a scenario without a hook keeps the definition it had before the field existed (stored entries stay valid)
    assert "moe_hook" not in p.definition()


@pytest.mark.parametrize("kw, needle", [
    ({"moe_hook": "nope", "expect_moe": "nope"}, "moe_hook: must be one of moebench_w4, moebench_mma, got 'nope'"),
    ({"moe_hook": "moebench_w4", "expect_moe": "marlin"}, "expect_moe: must be 'moebench_w4' with moe_hook"),
    ({"moe_hook": "moebench_w4", "expect_moe": "moebench_w4", "engine": "sglang-server"}, "moe_hook: is a vLLM plugin"),
])
def test_bad_engine_hooks_are_one_line_naming_the_field(kw, needle):
    with pytest.raises(ScenarioError) as e:
        _scenario(moe_backend="auto", **kw)
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("hook", ["moebench_w4", "moebench_mma"])
def test_the_hook_scenario_puts_the_plugin_on_the_engines_path_and_others_never_get_it(hook):
    from moebench.decode import vllm_moe_hook

    hooked = DecodeCase(_scenario(moe_backend="auto", moe_hook=hook, expect_moe=hook), "vllm")
    env = commands.engine_env(hooked, base={"PYTHONPATH": "/x", vllm_moe_hook.ENV: "moebench_w4"})
    assert env[vllm_moe_hook.ENV] == hook  # the scenario's hook, whatever the caller had set
    assert env["PYTHONPATH"].split(":")[1] == vllm_moe_hook.hook_path() and env["PYTHONPATH"].endswith(":/x")
    plain = DecodeCase(_scenario(moe_backend="auto", expect_moe="marlin"), "vllm")
    env = commands.engine_env(plain, base={vllm_moe_hook.ENV: hook})  # a stray variable from the caller
    assert vllm_moe_hook.ENV not in env and vllm_moe_hook.hook_path() not in env["PYTHONPATH"]


def test_a_hook_that_did_not_take_over_fails_the_case():
    from moebench.decode.procs import EngineError
    from moebench.decode.runner import check_choices

    case = DecodeCase(_scenario(moe_backend="auto", moe_hook="moebench_w4", expect_moe="moebench_w4"), "vllm")
    assert check_choices(case, {"moe": ["Marlin (WNA16 MoE)", "moebench_w4 (WNA16 MoE)"]}) == ""
    with pytest.raises(EngineError, match="pins 'moebench_w4' but the engine used Marlin"):
        check_choices(case, {"moe": ["Marlin (WNA16 MoE)"], "lines": []})
    # the other hook's kernel is not this one (the check matches names by containment: neither contains the other)
    with pytest.raises(EngineError, match="pins 'moebench_w4' but the engine used Marlin .*, moebench_mma"):
        check_choices(case, {"moe": ["Marlin (WNA16 MoE)", "moebench_mma (WNA16 MoE)"], "lines": []})
    mma = DecodeCase(_scenario(moe_backend="auto", moe_hook="moebench_mma", expect_moe="moebench_mma"), "vllm")
    with pytest.raises(EngineError, match="pins 'moebench_mma' but the engine used"):
        check_choices(mma, {"moe": ["Marlin (WNA16 MoE)", "moebench_w4 (WNA16 MoE)"], "lines": []})


def test_a_category_can_carry_its_own_tolerance():
    s = _scenario(gate_categories=["attention", "norms_elementwise"], profile_steps=8,
                  rel_tol_categories={"norms_elementwise": 0.2})
    assert dict(s.rel_tol_categories) == {"norms_elementwise": 0.2} and s.rel_tol_category == 0.05
    for bad, needle in (({"experts": 0.2}, "unknown experts"), ({"attention": 2}, "tolerances must be numbers in (0, 1]"),
                        ("0.2", "must be a table")):
        with pytest.raises(ScenarioError, match=re.escape(needle)):
            _scenario(rel_tol_categories=bad)


def test_the_category_map_version_is_part_of_a_gated_breakdowns_definition(monkeypatch):
    # a change of the category rules makes stored category baselines STALE instead of a regression
    from moebench.decode import scenarios
    from moebench.core.provenance import definition_hash

    case = DecodeCase(_scenario(gate_categories=["routed_experts"], profile_steps=8), "vllm")
    before = definition_hash(case.definition())
    monkeypatch.setattr(scenarios, "MAP_VERSION", scenarios.MAP_VERSION + 1)
    assert definition_hash(case.definition()) != before
    plain = DecodeCase(_scenario(), "vllm")  # no gated category: its definition does not move with the map
    assert "breakdown_map" not in plain.definition()  # so the stored entries of such cases stay valid


@pytest.mark.parametrize("used", [["moebench_w4 (WNA16 MoE)", "Marlin (WNA16 MoE)"],
                                  ["Marlin (WNA16 MoE)", "moebench_w4 (WNA16 MoE)", "TRITON (Unquantized MoE)"]])
def test_the_expected_kernel_may_be_any_moe_line_of_the_log_not_only_the_last(used):
    from moebench.decode.runner import check_choices

    case = DecodeCase(_scenario(moe_backend="auto", moe_hook="moebench_w4", expect_moe="moebench_w4"), "vllm")
    assert check_choices(case, {"moe": used, "lines": []}) == ""


@pytest.mark.parametrize("pin, used", [("FLASH_ATTN_MLA", "flash-attn mla"), ("flash attn mla", "FLASH_ATTN_MLA"),
                                       ("TRITON-MLA", "triton_mla")])
def test_backend_names_match_whatever_their_case_and_separators(pin, used):
    from moebench.decode.runner import check_choices

    case = DecodeCase(_scenario(attention_backend=pin), "vllm")
    assert check_choices(case, {"moe": ["TRITON (Unquantized MoE)"], "attention": [used], "lines": []}) == ""
