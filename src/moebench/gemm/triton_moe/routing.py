"""Sort (token, slot) pairs into per-expert blocks for the grouped path, without host syncs.

Same layout as vLLM's moe_align_block_size, built from fixed-shape torch ops so it can be captured in
a CUDA graph: the outputs are sized for the worst case, never for the routing at hand.
"""

import torch


def max_blocks(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Upper bound on the BLOCK_M-row blocks any routing of num_pairs pairs needs: every expert
    used adds at most one partly filled block."""
    return -(-num_pairs // block_m) + min(num_experts, num_pairs)


def align_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (sorted_pairs, block_expert).

    sorted_pairs int32 [max_blocks * block_m]: pair indices (token * topk + slot) grouped by expert,
      each expert's run padded to a multiple of block_m with the sentinel num_pairs.
    block_expert int32 [max_blocks]: the expert of each block, -1 past the last used block.
    """
    flat = topk_ids.reshape(-1).to(torch.int64)
    num_pairs = flat.numel()
    nblocks = max_blocks(num_pairs, num_experts, block_m)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    first = torch.cumsum(counts, 0) - counts           # first sorted position of each expert
    expert_sorted, order = torch.sort(flat, stable=True)
    rank = torch.arange(num_pairs, device=flat.device) - first[expert_sorted]
    dest = padded_end[expert_sorted] - padded[expert_sorted] + rank
    sorted_pairs = torch.full((nblocks * block_m,), num_pairs, dtype=torch.int32, device=flat.device)
    sorted_pairs.scatter_(0, dest, order.to(torch.int32))
    block_start = torch.arange(nblocks, device=flat.device) * block_m
    block_expert = torch.searchsorted(padded_end, block_start, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1).to(torch.int32)
    return sorted_pairs, block_expert
