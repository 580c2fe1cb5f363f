"""The tuned-config lookup vLLM's fused_experts does, mirrored for the record (which config file a case
would read), Marlin's block size, and the BLOCK_SIZE_K workaround for vLLM 0.21's int4 group-32 crash."""

from __future__ import annotations

_INT4_GROUP = {"int4-g32": 32, "int4-g128": 128}


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
