"""Which part of a decode step a GPU kernel belongs to, from its name (and where it was launched).

The categories answer "where does every millisecond of a decode step go". Names are matched in the
order of `RULES`; the first pattern that matches wins, so the specific ones (the MoE kernels, whose
names also contain "gemm") come before the generic ones. Kernels launched inside the engine's sampler
annotation are `sampling` whatever their names. A name nothing matches is `other`, and the breakdown
lists the largest of those so that a new kernel gets a rule instead of hiding there.

Known limits: the shared expert's GEMMs are plain GEMMs and count as `dense_gemms`, its activation as
`norms_elementwise` (Inductor fuses it); a router gate run as a plain GEMM (vLLM's DeepSeek models use
`router_gemm_kernel`, matched by name) would count as `dense_gemms` too.

The rules are part of what a breakdown metric means: MAP_VERSION goes into the decode case definition,
so a change here makes stored category baselines STALE instead of reading as a regression.
"""

from __future__ import annotations

import re

from moebench.decode.trace import Kernel

# 2: the experts' activation (act_and_mul) and top-k combine (torch.sum) moved to routed_experts.
MAP_VERSION = 2

# Display order: the table, the results and the "moved most" line use these names.
CATEGORIES = ("routed_experts", "router_topk_align", "attention", "dense_gemms", "norms_elementwise",
              "sampling", "communication", "other")
LABELS = {
    "routed_experts": "routed experts", "router_topk_align": "router/top-k/align", "attention": "attention",
    "dense_gemms": "dense GEMMs", "norms_elementwise": "norms and elementwise", "sampling": "sampling",
    "communication": "communication", "other": "other",
}

RULES: tuple[tuple[str, re.Pattern[str]], ...] = tuple((cat, re.compile(pat, re.I)) for cat, pat in (
    # collectives first: NCCL and vLLM's custom allreduce kernels
    ("communication", r"nccl|all_?reduce|cross_device_reduce|allgather|reduce_scatter|one_shot|two_shot"),
    # routing: top-k selection, the grouped / biased top-k of DeepSeek routers, token sorting by expert
    ("router_topk_align", r"topk|top_k|moe_align|align_block|count_and_sort|sort_and_count|grouped_topk|noaux"
                          r"|gating|router"),
    # the routed experts: their GEMMs (Marlin MoE, vLLM's Triton fused_moe, moe_wna16, CUTLASS and FlashInfer
    # MoE, moebench's own Triton kernels), the activation between them and the top-k combine. vLLM calls its
    # act_and_mul kernel explicitly only inside the MoE experts (dense and shared MLPs are compiled by
    # Inductor into triton_poi kernels), and its Marlin path combines with torch.sum (at::native
    # reduce_kernel with sum_functor, once per MoE layer in the H200 trace of the INT4 rank).
    ("routed_experts", r"marlin_moe|moe_wna16|fused_moe|moe_gemm|cutlass_moe|flashinfer.*moe|moe_sum|moebench"
                       r"|grouped_mm|_moe_kernel|expert|act_and_mul|reduce_kernel.*sum_functor"),
    ("attention", r"flash|fmha|mla|attn|attention|concat_and_cache|reshape_and_cache|rotary|rope|merge_states"
                  r"|indexer|paged"),
    ("dense_gemms", r"gemm|gemv|nvjet|cutlass|xmma|cublas|wgmma|matmul|marlin|sm90_|sm100_|splitk|dsv3|Kernel2"),
    # Inductor's fused pointwise / reduction kernels are the norms, residual adds and activations
    ("norms_elementwise", r"norm|elementwise|silu|gelu|act_and_mul|triton_(poi|red|per)_|vectorized|unrolled"
                          r"|copy|cat_|add|mul|fill|index|cast|where|reduce_kernel"),
))


def category(k: Kernel) -> str:
    """The category of one kernel (see the module docstring for the order of the rules)."""
    if k.in_sampler:
        return "sampling"
    if k.kind != "kernel":
        return "other"  # memcpy / memset: data movement the engine chose, kept apart from compute
    for cat, pat in RULES:
        if pat.search(k.name):
            return cat
    return "other"
