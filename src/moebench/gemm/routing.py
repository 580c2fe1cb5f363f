"""Seeded routings: which experts each token picks, and with what weights."""

from __future__ import annotations

ROUTINGS = ("decode", "balanced", "zipf")


def make_routing(kind: str, m: int, experts: int, topk: int, seed: int):
    """topk_ids int32 [m, topk] (distinct experts within a token) and topk_weights float32 [m, topk]
    (softmax-like, summing to 1), on CPU.

    decode: each token draws topk distinct experts uniformly (what a trained router looks like at one
      decode step: few tokens, little overlap).
    balanced: tokens take experts round-robin, so every expert gets the same load (±1).
    zipf: expert popularity follows Zipf(s=1.2); hot experts get most tokens (skewed serving traffic).
    """
    import torch

    if kind not in ROUTINGS:
        raise ValueError(f"unknown routing {kind!r} (known: {', '.join(ROUTINGS)})")
    g = torch.Generator().manual_seed(seed)
    if kind == "decode":
        ids = torch.stack([torch.randperm(experts, generator=g)[:topk] for _ in range(m)])
    elif kind == "balanced":
        start = int(torch.randint(experts, (1,), generator=g))
        flat = (torch.arange(m * topk) + start) % experts
        ids = flat.view(m, topk)
        if topk > experts:
            raise ValueError("topk > experts")
    else:
        p = 1.0 / torch.arange(1, experts + 1, dtype=torch.float64) ** 1.2
        perm = torch.randperm(experts, generator=g)  # which experts are hot is random too
        ids = torch.stack([perm[torch.multinomial(p, topk, replacement=False, generator=g)] for _ in range(m)])
    logits = torch.randn(m, topk, generator=g)
    weights = torch.softmax(logits, dim=-1).float()
    return ids.to(torch.int32), weights
