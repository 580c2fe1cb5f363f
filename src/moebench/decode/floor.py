"""The memory floor of one decode step: the weight bytes a single stream reads per output token.

At batch 1 a decode step is bound by reading the weights once: every attention projection, the dense
MLPs, the router, the top-k routed experts and the shared experts of each MoE layer, the final norm and
the LM head (plus one embedding row). Divided by the memory read ceiling measured in the same session
(`moebench.ceiling(device, "read")`), that gives the fastest ms/token the hardware allows; the measured
ms/token over that floor is the engine's efficiency. KV-cache reads are left out: at the short contexts of
these scenarios they are under 1% of the weights.

With tensor parallelism each rank reads 1/tp of the bytes (MLA's low-rank A projections are in fact
replicated; the error is under 2% for the shapes here).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

# Bytes per weight element. Quantized figures include the scales: NVFP4 has one fp8 scale per 16
# elements (0.5 + 1/16), int4 weight-only (w4a16, group 32, bf16 scales) 0.5 + 2/32.
DTYPE_BYTES = {"bfloat16": 2.0, "float16": 2.0, "float32": 4.0}
QUANT_BYTES = {"fp8": 1.0, "modelopt_fp4": 0.5625, "nvfp4": 0.5625, "int4": 0.5625,
               "compressed-tensors": 0.5625, "awq": 0.5625, "gptq": 0.5625}


class FloorUnknown(ValueError):
    """The config or quantization is not one this module can count bytes for."""


@dataclass(frozen=True)
class WeightBytes:
    """Weight bytes read per output token, by part (bytes, for one rank)."""

    attention: float  # MLA projections and the two RMSNorms of every layer
    dense_mlp: float  # the dense layers' MLPs
    router: float  # every MoE layer's gate (experts x hidden, bf16) and its fp32 bias
    routed_experts: float  # top-k routed experts' gate, up and down
    shared_experts: float
    head: float  # LM head, final norm, one embedding row

    @property
    def moe(self) -> float:
        """The MoE layers' bytes: router, routed and shared experts."""
        return self.router + self.routed_experts + self.shared_experts

    @property
    def total(self) -> float:
        """All bytes one rank reads per token."""
        return self.attention + self.dense_mlp + self.moe + self.head

    def floor_ms(self, ceiling_bytes_per_s: float) -> float:
        """The fastest ms/token this many bytes allow at the given memory ceiling."""
        return 1e3 * self.total / ceiling_bytes_per_s

    def by_category(self, kv_cache: float = 0.0) -> dict[str, float]:
        """Bytes per step for the breakdown's categories (moebench.decode.categories), by which kernels
        read them: MLA's projections, the dense and shared MLPs and the LM head are GEMMs (dense_gemms);
        the router's gate is read by the router kernel; the attention kernels read only the KV cache
        (`kv_cache` bytes, see kv_cache_bytes)."""
        return {"routed_experts": self.routed_experts, "router_topk_align": self.router,
                "dense_gemms": self.attention + self.dense_mlp + self.shared_experts + self.head,
                "attention": kv_cache}


def kv_cache_bytes(config: Mapping[str, Any], context_tokens: float, dtype: str = "bfloat16") -> float:
    """Bytes the attention of one decode step reads from an MLA KV cache of `context_tokens` tokens:
    every layer's compressed latent and rope key (kv_lora_rank + qk_rope_head_dim) per token."""
    per_token = config["kv_lora_rank"] + config["qk_rope_head_dim"]
    return config["num_hidden_layers"] * per_token * DTYPE_BYTES[dtype] * context_tokens


def _mla_params(c: Mapping[str, Any]) -> int:
    h, heads = c["hidden_size"], c["num_attention_heads"]
    nope, rope, v = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    q_rank, kv_rank = c.get("q_lora_rank"), c["kv_lora_rank"]
    q = (h * q_rank + q_rank + q_rank * heads * (nope + rope)) if q_rank else h * heads * (nope + rope)
    kv = h * (kv_rank + rope) + kv_rank + kv_rank * heads * (nope + v)
    o = heads * v * h
    return q + kv + o + 2 * h  # + the two RMSNorms around attention and MLP


# One module name of each part, as vLLM names them in a DeepseekV3 model: matched against a
# compressed-tensors config's `ignore` list to learn which parts the checkpoint quantized.
_MODULE_OF = {"attention": "model.layers.1.self_attn.kv_a_proj_with_mqa",
              "dense_mlp": "model.layers.0.mlp.gate_proj",
              "routed_experts": "model.layers.1.mlp.experts.0.gate_proj",
              "shared_experts": "model.layers.1.mlp.shared_experts.gate_proj",
              "head": "lm_head"}


def _ignored(module: str, patterns: list[str]) -> bool:
    for p in patterns:
        if p.startswith("re:"):
            if re.match(p[3:], module):
                return True
        elif module == p or module.endswith("." + p) or p == module.rsplit(".", 1)[-1]:
            return True
    return False


def config_quantization(config: Mapping[str, Any]) -> tuple[float, set[str]] | None:
    """(bytes per weight, quantized parts) from a compressed-tensors `quantization_config` (weight-only
    integer groups with bf16 scales, as the Kimi-K2.5 INT4 checkpoint), or None when the config has none.
    Raises FloorUnknown for a quantization_config of another kind."""
    q = config.get("quantization_config")
    if not q:
        return None
    if q.get("quant_method") != "compressed-tensors":
        raise FloorUnknown(f"quantization_config of method {q.get('quant_method')!r} has no byte count here")
    groups = list((q.get("config_groups") or {}).values())
    w = groups[0].get("weights") if len(groups) == 1 else None
    if not w or w.get("type") != "int" or w.get("strategy") != "group" or not w.get("group_size"):
        raise FloorUnknown("compressed-tensors: only one group of weight-only int, group-wise quantization is counted")
    per_weight = w["num_bits"] / 8 + 2 / w["group_size"] + (0 if w.get("symmetric", True) else 0.5 / w["group_size"])
    parts = {part for part, module in _MODULE_OF.items() if not _ignored(module, list(q.get("ignore") or []))}
    return per_weight, parts


def weight_bytes_per_token(config: Mapping[str, Any], dtype: str = "bfloat16", quantization: str | None = None,
                           tp: int = 1) -> WeightBytes:
    """Bytes one rank reads per decoded token for a DeepseekV3-family config (MLA + MoE).

    A config's own compressed-tensors `quantization_config` says which parts are quantized and how
    (the Kimi-K2.5 INT4 rank: routed experts only). Otherwise `quantization` (the engine's flag, as in
    the NVFP4 checkpoints our users run) applies to the expert and dense-MLP weights, and attention,
    router, embeddings and the LM head stay in dtype.
    """
    if "kv_lora_rank" not in config or "n_routed_experts" not in config:
        raise FloorUnknown("not a DeepseekV3-family config (no kv_lora_rank / n_routed_experts)")
    if dtype not in DTYPE_BYTES:
        raise FloorUnknown(f"dtype {dtype!r} has no byte size here")
    b = DTYPE_BYTES[dtype]
    from_config = config_quantization(config)
    if from_config is not None:
        wq, parts = from_config
    elif quantization:
        if quantization not in QUANT_BYTES:
            raise FloorUnknown(f"quantization {quantization!r} has no byte size here")
        wq, parts = QUANT_BYTES[quantization], {"dense_mlp", "routed_experts", "shared_experts"}
    else:
        wq, parts = b, set()

    def per(part: str) -> float:
        return wq if part in parts else b

    h, layers = config["hidden_size"], config["num_hidden_layers"]
    dense_layers = min(config.get("first_k_dense_replace", 0), layers)
    moe_layers = layers - dense_layers
    inter, moe_inter = config["intermediate_size"], config["moe_intermediate_size"]
    experts, top_k = config["n_routed_experts"], config["num_experts_per_tok"]
    shared = config.get("n_shared_experts") or 0
    expert = 3 * h * moe_inter  # gate, up and down of one expert

    attention = layers * _mla_params(config) * per("attention")
    dense = dense_layers * 3 * h * inter * per("dense_mlp")
    router = moe_layers * (experts * h * b + experts * 4)  # the gate, and the fp32 score-correction bias
    routed = moe_layers * top_k * expert * per("routed_experts")
    shared_b = moe_layers * shared * expert * per("shared_experts")
    head = (config["vocab_size"] * h + h + h) * per("head")  # LM head, final norm, one embedding row
    return WeightBytes(attention / tp, dense / tp, router / tp, routed / tp, shared_b / tp, head / tp)
