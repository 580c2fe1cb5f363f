"""ci/planted: the vLLM and SGLang plugin that slows the routed experts on purpose, to prove the decode gate
fails. Checked here with stand-ins for vllm._custom_ops and SGLang's fused_marlin_moe module: the right share
of extra Marlin calls, results untouched, discoverable as a plugin of each engine, and inert unless asked for."""

from __future__ import annotations

import importlib
import sys
import types
from importlib import metadata
from pathlib import Path

import pytest

PLANTED = Path(__file__).resolve().parents[1] / "ci" / "planted"


@pytest.fixture
def fake_ops(monkeypatch):
    calls = []

    def gemm(inp, output, *rest, **kw):
        calls.append(output)
        return ("result", inp)

    ops = types.ModuleType("vllm._custom_ops")
    ops.moe_wna16_marlin_gemm = gemm
    vllm = types.ModuleType("vllm")
    vllm._custom_ops = ops
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm._custom_ops", ops)
    monkeypatch.syspath_prepend(str(PLANTED))
    monkeypatch.delitem(sys.modules, "moebench_planted", raising=False)
    return ops, calls


def test_every_tenth_moe_layer_runs_its_two_gemms_twice_into_scratch(fake_ops, monkeypatch):
    ops, calls = fake_ops
    monkeypatch.setenv("MOEBENCH_PLANT_EXPERTS", "0.10")
    importlib.import_module("moebench_planted").register()
    outs = [ops.moe_wna16_marlin_gemm(f"x{i}", f"buf{i}", "w") for i in range(120)]  # 60 layers x 2 GEMMs
    assert outs == [("result", f"x{i}") for i in range(120)]  # every layer's result as before
    assert len(calls) == 120 + 12  # 6 of 60 layers (10%) twice
    assert calls.count(None) == 12  # the extra calls write to a fresh scratch output
    importlib.import_module("moebench_planted").register()  # loaded twice: still one wrapper
    ops.moe_wna16_marlin_gemm("y", "b", "w")
    assert len(calls) == 134


def test_unset_it_does_nothing(fake_ops, monkeypatch):
    ops, calls = fake_ops
    monkeypatch.delenv("MOEBENCH_PLANT_EXPERTS", raising=False)
    before = ops.moe_wna16_marlin_gemm
    importlib.import_module("moebench_planted").register()
    assert ops.moe_wna16_marlin_gemm is before


def test_it_is_a_vllm_general_plugin_on_pythonpath():
    found = metadata.entry_points(group="vllm.general_plugins")
    assert "moebench_planted" not in {e.name for e in found}  # never active without the path
    dist = metadata.PathDistribution(PLANTED / "moebench_planted-0.1.dist-info")
    [ep] = [e for e in dist.entry_points if e.group == "vllm.general_plugins"]
    assert ep.value == "moebench_planted:register"


def test_sglang_gets_the_same_plant_on_its_fused_marlin_moe_module(monkeypatch):
    calls = []

    def gemm(a, c_or_none, *rest, **kw):  # SGLang 0.5.15: the output buffer is the second positional argument
        calls.append(c_or_none)
        return ("result", a)

    names = ["sglang", "sglang.srt", "sglang.srt.layers", "sglang.srt.layers.moe", "sglang.srt.layers.moe.fused_moe_triton"]
    mods = {n: types.ModuleType(n) for n in names + [names[-1] + ".fused_marlin_moe"]}
    for parent, child in zip(list(mods)[:-1], list(mods)[1:]):
        setattr(mods[parent], child.rsplit(".", 1)[1], mods[child])
    marlin = mods[names[-1] + ".fused_marlin_moe"]
    marlin.moe_wna16_marlin_gemm = gemm
    for n, m in mods.items():
        monkeypatch.setitem(sys.modules, n, m)
    monkeypatch.syspath_prepend(str(PLANTED))
    monkeypatch.delitem(sys.modules, "moebench_planted", raising=False)
    monkeypatch.setenv("MOEBENCH_PLANT_EXPERTS", "0.25")
    importlib.import_module("moebench_planted").register_sglang()
    outs = [marlin.moe_wna16_marlin_gemm(f"x{i}", f"buf{i}", "w", moe_block_size=16) for i in range(16)]  # 8 layers
    assert outs == [("result", f"x{i}") for i in range(16)] and len(calls) == 16 + 4 and calls.count(None) == 4
    dist = metadata.PathDistribution(PLANTED / "moebench_planted-0.1.dist-info")
    [ep] = [e for e in dist.entry_points if e.group == "sglang.srt.plugins"]
    assert ep.value == "moebench_planted:register_sglang"


def _engine_module_not_imported_yet(tmp_path: Path, monkeypatch, dotted: str, code: str):
    """A fake engine module `dotted` (its packages made, none imported yet), the engine's real package kept
    out of sys.modules, and moebench_planted importable afresh; returns that plugin module."""
    *packages, name = dotted.split(".")
    pkg = tmp_path.joinpath(*packages)
    pkg.mkdir(parents=True)
    for d in [pkg, *pkg.parents][:len(packages)]:
        (d / "__init__.py").write_text("")
    (pkg / f"{name}.py").write_text(code)
    for n in [m for m in sys.modules if m == packages[0] or m.startswith(packages[0] + ".")]:
        monkeypatch.delitem(sys.modules, n)
    for i in range(1, len(packages) + 2):  # the fake modules go again afterwards, where none was before
        n = ".".join([*packages, name][:i])
        if n not in sys.modules:
            monkeypatch.setitem(sys.modules, n, None)
            del sys.modules[n]
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(PLANTED))
    monkeypatch.delitem(sys.modules, "moebench_planted", raising=False)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    return importlib.import_module("moebench_planted")


def test_sglangs_marlin_module_is_planted_when_sglang_imports_it_not_before(tmp_path, monkeypatch):
    """The plugin runs first in SGLang's launcher; importing the MoE module from there failed on the H200
    (FlashInfer's comm package needs cuda.tile). It must wait for SGLang's own import, then plant."""
    monkeypatch.setenv("MOEBENCH_PLANT_EXPERTS", "0.5")
    planted = _engine_module_not_imported_yet(tmp_path, monkeypatch, "sglang.srt.layers.moe.fused_moe_triton.fused_marlin_moe",
                                              "CALLS = []\n\ndef moe_wna16_marlin_gemm(a, c, *rest, **kw):\n"
                                              "    CALLS.append(c)\n    return a\n")
    planted.register_sglang()
    assert planted.SGLANG_MARLIN not in sys.modules  # nothing imported by the plugin itself
    marlin = importlib.import_module(planted.SGLANG_MARLIN)
    assert [marlin.moe_wna16_marlin_gemm(i, f"buf{i}") for i in range(4)] == [0, 1, 2, 3]
    assert marlin.CALLS == ["buf0", None, "buf1", None, "buf2", "buf3"]  # layer 0 (calls 0-1) twice, layer 1 once
    assert not any(isinstance(f, planted._PlantOnImport) for f in sys.meta_path)


def test_one_mla_decode_attention_call_in_every_round_1_over_f_runs_twice_when_vllm_imports_it(tmp_path, monkeypatch):
    """MOEBENCH_PLANT_ATTENTION=F: vLLM's FlashAttnMLAImpl.forward_mqa runs a second time for one call in
    round(1/F), its first result returned; planted when vLLM imports the backend, not by the plugin."""
    monkeypatch.delenv("MOEBENCH_PLANT_EXPERTS", raising=False)
    monkeypatch.setenv("MOEBENCH_PLANT_ATTENTION", "0.25")
    planted = _engine_module_not_imported_yet(tmp_path, monkeypatch, "vllm.v1.attention.backends.mla.flashattn_mla",
                                              "CALLS = []\n\nclass FlashAttnMLAImpl:\n"
                                              "    def forward_mqa(self, q, cache, meta, layer):\n"
                                              "        CALLS.append(q)\n        return (q * 2, None)\n")
    planted.register()
    assert planted.VLLM_FA_MLA not in sys.modules  # nothing imported by the plugin itself
    fa = importlib.import_module(planted.VLLM_FA_MLA)
    impl = fa.FlashAttnMLAImpl()
    assert [impl.forward_mqa(i, "kv", "meta", "layer") for i in range(8)] == [(2 * i, None) for i in range(8)]
    assert fa.CALLS == [0, 0, 1, 2, 3, 4, 4, 5, 6, 7]  # calls 0 and 4 (one in 4) twice
