"""The memory floor of one decode step: the weight bytes a single stream reads per output token.

At batch 1 a decode step is bound by reading the weights once: every attention projection, the dense
MLPs, the router, the top-k routed experts and the shared experts of each MoE layer, the final norm and
the LM head (plus one embedding row). Divided by the memory ceiling measured in the same session
(`moebench.ceiling(device)`), that gives the fastest ms/token the hardware allows; the measured ms/token
over that floor is the engine's efficiency. KV-cache reads are left out: at the short contexts of
these scenarios they are under 1% of the weights.

With tensor parallelism each rank reads 1/tp of the bytes (MLA's low-rank A projections are in fact
replicated; the error is under 2% for the shapes here).
"""

from __future__ import annotations

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

    attention: float
    dense_mlp: float
    moe: float
    head: float

    @property
    def total(self) -> float:
        """All bytes one rank reads per token."""
        return self.attention + self.dense_mlp + self.moe + self.head

    def floor_ms(self, ceiling_bytes_per_s: float) -> float:
        """The fastest ms/token this many bytes allow at the given memory ceiling."""
        return 1e3 * self.total / ceiling_bytes_per_s


def _mla_params(c: Mapping[str, Any]) -> int:
    h, heads = c["hidden_size"], c["num_attention_heads"]
    nope, rope, v = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    q_rank, kv_rank = c.get("q_lora_rank"), c["kv_lora_rank"]
    q = (h * q_rank + q_rank + q_rank * heads * (nope + rope)) if q_rank else h * heads * (nope + rope)
    kv = h * (kv_rank + rope) + kv_rank + kv_rank * heads * (nope + v)
    o = heads * v * h
    return q + kv + o + 2 * h  # + the two RMSNorms around attention and MLP


def weight_bytes_per_token(config: Mapping[str, Any], dtype: str = "bfloat16", quantization: str | None = None,
                           tp: int = 1) -> WeightBytes:
    """Bytes one rank reads per decoded token for a DeepseekV3-family config (MLA + MoE).

    quantization applies to the expert and dense-MLP weights (as in the NVFP4 and INT4 checkpoints
    our users run); attention, router, embeddings and the LM head stay in dtype.
    """
    if "kv_lora_rank" not in config or "n_routed_experts" not in config:
        raise FloorUnknown("not a DeepseekV3-family config (no kv_lora_rank / n_routed_experts)")
    if dtype not in DTYPE_BYTES:
        raise FloorUnknown(f"dtype {dtype!r} has no byte size here")
    if quantization and quantization not in QUANT_BYTES:
        raise FloorUnknown(f"quantization {quantization!r} has no byte size here")
    b = DTYPE_BYTES[dtype]
    wq = QUANT_BYTES[quantization] if quantization else b
    h, layers = config["hidden_size"], config["num_hidden_layers"]
    dense_layers = min(config.get("first_k_dense_replace", 0), layers)
    moe_layers = layers - dense_layers
    inter, moe_inter = config["intermediate_size"], config["moe_intermediate_size"]
    experts, top_k = config["n_routed_experts"], config["num_experts_per_tok"]
    shared = config.get("n_shared_experts") or 0

    attention = layers * _mla_params(config) * b
    dense = dense_layers * 3 * h * inter * wq
    # Per MoE layer: the router (experts x hidden, plus the fp32 score-correction bias), then gate, up
    # and down of the top-k routed and the shared experts.
    moe = moe_layers * ((experts * h) * b + experts * 4 + (top_k + shared) * 3 * h * moe_inter * wq)
    head = (config["vocab_size"] * h + h + h) * b  # LM head, final norm, one embedding row
    return WeightBytes(attention / tp, dense / tp, moe / tp, head / tp)
