"""The `vllm_marlin` backend's build: vLLM's fused_marlin_moe on weights repacked for Marlin (int4 via
gptq_marlin_moe_repack, nvfp4 via prepare_nvfp4_moe_layer_for_marlin); the calls and layouts are described
in moebench.gemm.backends.vllm_backends."""

from __future__ import annotations

import inspect

from moebench.gemm.backends.base import Built
from moebench.gemm.backends.repack import nibbles_to_gptq_int32
from moebench.gemm.quant import pack_int4_uint4b8, pack_nibbles
from moebench.gemm.backends.vllm_common import _cached, _check_inputs, _expect, _kwargs_for, _probe, _vllm_version
from moebench.gemm.backends.vllm_configs import _INT4_GROUP, marlin_block_size_m
from moebench.gemm.cases import GemmCase


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
