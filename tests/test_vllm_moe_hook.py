"""The vLLM engine hook (decode/vllm_moe_hook.py) on a stand-in for vLLM's compressed-tensors W4A16 Marlin
MoE method, with each hook's int4 kernel (vllm_moe_hook.HOOKS) run by Triton's interpreter: repack from the engine's own tensors,
route apply() to our kernel, check against the engine's kernel on the first forward (and fail on a wrong
answer), free the engine's copy; plus the plugin's entry point and the scenario wiring."""

from __future__ import annotations

import importlib.metadata

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from moebench.decode import vllm_moe_hook  # noqa: E402

E, K, I, TOPK = 8, 64, 32, 2


class Layer:
    pass


def _method_class(off: float = 1.0):
    """A stand-in with the interface the hook patches. Its 'Marlin' repack stashes the dequantized
    weights; its apply is the float32 reference on them, times `off` (1.06: an engine kernel 6% away from
    ours, which the first-forward check must refuse; a zero output would read ~1e30 and test no bound)."""
    from moebench.gemm.triton_moe.reference import fused_moe_ref

    class FakeMarlinMethod:
        num_bits, group_size, actorder, kernel_backend, marlin_input_dtype = 4, 32, None, "Marlin", None

        def process_weights_after_loading(self, layer):
            layer.ref = tuple(_dequant(getattr(layer, f"{n}_weight_packed").data, getattr(layer, f"{n}_weight_scale").data)
                              for n in ("w13", "w2"))
            for n in ("w13_weight_packed", "w2_weight_packed"):  # Marlin's own layout replaces the loaded one
                setattr(layer, n, torch.nn.Parameter(getattr(layer, n).data.flip(1).clone(), requires_grad=False))

        def apply(self, layer, x, topk_weights, topk_ids, shared_experts_input=None):
            out = fused_moe_ref(x, layer.ref[0], layer.ref[1], topk_weights, topk_ids).to(x.dtype)
            return out * off

    return FakeMarlinMethod


def _dequant(packed, scale):
    """compressed-tensors int32 [E, K/8, N] (nibble j = k 8w + j, stored q + 8) + scales [E, K/32, N] -> [E, N, K]."""
    q = torch.stack([(packed >> (4 * j)) & 15 for j in range(8)], dim=2)  # [E, K/8, 8, N]
    w = (q.reshape(packed.shape[0], -1, packed.shape[2]).float() - 8) * scale.float().repeat_interleave(32, dim=1)
    return w.transpose(1, 2).contiguous()


def _layer(seed):
    g = torch.Generator().manual_seed(seed)
    layer = Layer()
    for n, (rows, cols) in {"w13": (2 * I, K), "w2": (K, I)}.items():
        packed = torch.randint(-2**31, 2**31 - 1, (E, cols // 8, rows), generator=g, dtype=torch.int64).to(torch.int32)
        scale = (torch.rand(E, cols // 32, rows, generator=g) * 0.02 + 0.005).bfloat16()
        setattr(layer, f"{n}_weight_packed", torch.nn.Parameter(packed, requires_grad=False))
        setattr(layer, f"{n}_weight_scale", torch.nn.Parameter(scale, requires_grad=False))
    return layer


def _run_hook(off: float, hook: str = "moebench_w4"):
    """In the interpreter worker: install `hook` on a stand-in, load two layers, run both on one batch."""
    cls = _method_class(off)
    vllm_moe_hook.install(cls, hook)
    method, layers = cls(), [_layer(1), _layer(2)]
    for layer in layers:
        method.process_weights_after_loading(layer)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, K, generator=g).bfloat16()
    ids = torch.stack([torch.randperm(E, generator=g)[:TOPK] for _ in range(3)]).int()
    tw = torch.softmax(torch.randn(3, TOPK, generator=g), -1)
    try:
        outs = [method.apply(layer=layer, x=x, topk_weights=tw, topk_ids=ids, shared_experts_input=None) for layer in layers]
    except RuntimeError as e:
        return {"error": str(e)}
    errs = [((o.float() - layer.ref_out).norm() / layer.ref_out.norm()).item()
            for o, layer in zip(outs, [_with_ref(layer, x, tw, ids) for layer in layers])]
    return {"errs": errs, "freed": [layer.w13_weight_packed.numel() == 0 for layer in layers],
            "packed": type(layers[0]._moebench_w4[0]).__module__,
            "checked": [getattr(layer, "_moebench_check", None) for layer in layers]}


def _with_ref(layer, x, tw, ids):
    from moebench.gemm.triton_moe.reference import fused_moe_ref

    layer.ref_out = fused_moe_ref(x, layer.ref[0], layer.ref[1], tw, ids)
    return layer


@pytest.mark.parametrize("hook, layout", [("moebench_w4", "moebench.gemm.triton_moe.w4"), ("moebench_mma", "moebench.gemm.triton_moe.w4_mma")])
def test_the_hook_runs_our_kernel_on_the_engines_weights_and_checks_the_first_forward(interp, hook, layout):
    r = interp(_run_hook, 1.0, hook)
    assert "error" not in r, r
    assert r["packed"] == layout, r           # the layout of the hook's own kernel (W4Weight, W4Tiles)
    assert max(r["errs"]) < 1e-2, r          # our kernel on the repacked engine tensors: the right answer
    assert r["freed"] == [True, True], r      # the engine's copy is gone once checked (first) / at load (rest)
    assert r["checked"] == [False, None], r   # the first layer was checked, once


@pytest.mark.parametrize("hook", ["moebench_w4", "moebench_mma"])
def test_a_kernel_that_disagrees_with_the_engine_fails_the_first_forward(interp, hook):
    r = interp(_run_hook, 1.06, hook)  # 6% apart: a few times the bound, far under a garbage kernel's ~1
    assert f"{hook} differs from Marlin on the first forward" in r.get("error", ""), r
    err = float(r["error"].split("relative error ")[1].split(" ")[0])
    assert 0.04 < err < 0.08, r


class _FixedKernel:
    """Stands in for our Triton kernel with a fixed output, so that the first-forward check runs alone
    (no interpreter): our output against the stand-in engine's."""

    name = "fixed"

    def __init__(self, out):
        self.out = out

    def from_compressed_tensors(self, packed, scale):
        return packed

    def fused_moe(self, x, w1, w2, topk_weights, topk_ids, pdl=False):
        return self.out


ENGINE_OUT = torch.linspace(1.0, 2.0, 12).reshape(3, 4)
NAN = float("nan")


@pytest.mark.parametrize("ours, engine, passes", [
    (ENGINE_OUT * 1.015, ENGINE_OUT, True),   # 1.5% apart: under CHECK_BOUND (2e-2)
    (ENGINE_OUT * 1.03, ENGINE_OUT, False),   # 3% apart: over it
    (ENGINE_OUT * NAN, ENGINE_OUT, False),    # NaN never passes, from either side
    (ENGINE_OUT, ENGINE_OUT * NAN, False),
])
def test_the_first_forward_check_refuses_an_error_over_its_bound_and_nan(monkeypatch, ours, engine, passes):
    from moebench.gemm.triton_moe import w4_kernels

    monkeypatch.setattr(w4_kernels, "get", lambda name: _FixedKernel(ours))

    class Method:
        num_bits, group_size, actorder, kernel_backend, marlin_input_dtype = 4, 32, None, "Marlin", None

        def process_weights_after_loading(self, layer):
            pass

        def apply(self, layer, x, topk_weights, topk_ids, shared_experts_input=None):
            return engine

    vllm_moe_hook.install(Method, "moebench_w4")
    layer = Layer()
    for n in ("w13_weight_packed", "w2_weight_packed", "w13_weight_scale", "w2_weight_scale"):
        setattr(layer, n, torch.nn.Parameter(torch.zeros(2, 4, 16), requires_grad=False))
    Method().process_weights_after_loading(layer)
    if passes:
        assert Method().apply(layer, torch.zeros(3, 8), None, None) is ours
    else:
        with pytest.raises(RuntimeError, match="moebench_w4 differs from Marlin on the first forward"):
            Method().apply(layer, torch.zeros(3, 8), None, None)


def test_an_unknown_hook_is_refused_by_name():
    with pytest.raises(ValueError, match="'moebench_nope': not one of moebench_w4, moebench_mma"):
        vllm_moe_hook.install(_method_class(), "moebench_nope")


def test_layers_the_kernel_does_not_cover_keep_the_engine_kernel():
    m = type("M", (), dict(num_bits=4, group_size=128, actorder=None, kernel_backend="Marlin", marlin_input_dtype=None))()
    assert "group 128" in vllm_moe_hook.unsupported(m, Layer())
    m.group_size, m.actorder = 32, "group"
    assert "act-order" in vllm_moe_hook.unsupported(m, Layer())
    m.actorder = None
    layer = Layer()
    layer.activation = "gelu"
    assert "gelu" in vllm_moe_hook.unsupported(m, layer)
    assert vllm_moe_hook.unsupported(m, Layer()) == ""
    layer = Layer()  # int32 [E, K/8, N]: 2I = 40 rows do not fill 16-row tiles
    layer.w13_weight_packed, layer.w2_weight_packed = torch.zeros(2, 8, 40), torch.zeros(2, 4, 64)
    assert "w13_weight_packed (2, 8, 40)" in vllm_moe_hook.unsupported(m, layer)
    layer.w13_weight_packed = torch.zeros(2, 6, 64)  # K = 8 x 6 = 48: not whole groups of 32
    assert "w13_weight_packed (2, 6, 64)" in vllm_moe_hook.unsupported(m, layer)
    layer.w13_weight_packed = torch.zeros(2, 8, 64)
    assert vllm_moe_hook.unsupported(m, layer) == ""


def test_the_plugin_folder_declares_register_as_a_vllm_general_plugin(monkeypatch):
    # what vLLM does in each of its processes: list the group's entry points on its path, load them
    monkeypatch.syspath_prepend(vllm_moe_hook.hook_path())
    found = [ep for ep in importlib.metadata.entry_points(group="vllm.general_plugins")
             if ep.value.startswith("moebench.")]
    assert [(ep.name, ep.value) for ep in found] == [("moebench_moe_hook", "moebench.decode.vllm_moe_hook:register")]
    assert found[0].load() is vllm_moe_hook.register


def _fake_vllm(monkeypatch) -> list:
    """vLLM's compressed-tensors Marlin MoE module as register() imports it, and install() recording
    its calls instead of patching."""
    import sys
    import types

    calls: list = []
    method = type("CompressedTensorsWNA16MarlinMoEMethod", (), {})
    module = types.ModuleType("compressed_tensors_moe")
    module.compressed_tensors_moe_wna16_marlin = types.SimpleNamespace(CompressedTensorsWNA16MarlinMoEMethod=method)
    monkeypatch.setitem(sys.modules, "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe",
                        module)
    monkeypatch.setattr(vllm_moe_hook, "install", lambda cls, hook: calls.append((cls.__name__, hook)))
    return calls


def test_register_does_nothing_without_the_variable(monkeypatch, capsys):
    calls = _fake_vllm(monkeypatch)
    monkeypatch.delenv(vllm_moe_hook.ENV, raising=False)
    vllm_moe_hook.register()
    assert calls == [] and capsys.readouterr().err == ""
    monkeypatch.setenv(vllm_moe_hook.ENV, "moebench_mma")  # and with it, it installs the named hook
    vllm_moe_hook.register()
    assert calls == [("CompressedTensorsWNA16MarlinMoEMethod", "moebench_mma")]


def test_register_with_a_name_it_does_not_know_says_so_and_changes_nothing(monkeypatch, capsys):
    calls = _fake_vllm(monkeypatch)
    monkeypatch.setenv(vllm_moe_hook.ENV, "w4")  # the variable's value before hooks had names
    vllm_moe_hook.register()
    assert "MOEBENCH_VLLM_MOE='w4': not one of moebench_w4, moebench_mma" in capsys.readouterr().err
    assert calls == []


def test_no_hook_name_contains_another():
    """The engine check accepts a used kernel whose name contains the expected one (vLLM maps pins to
    longer class names): a hook named inside another would let one hook's case pass on the other's kernel."""
    from moebench.decode.runner import _norm

    names = [_norm(h) for h in vllm_moe_hook.HOOKS]
    assert not [(a, b) for a in names for b in names if a != b and a in b]
