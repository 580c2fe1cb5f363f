"""The torch backends: the naive per-expert loop, gathered-expert bmm, and torch._grouped_mm.

Routing is static per rotation (the workload knows it on the host), so these backends get their
grouping (which rows go to which expert) precomputed at build time: that favours them slightly against
vLLM/Triton backends, which sort tokens inside the call, and is recorded in Built.info.
"""

from __future__ import annotations

from moebench.gemm.backends.base import Backend, Built
from moebench.gemm.cases import GemmCase

_BF16 = frozenset({"bf16"})
_OPS = frozenset({"expert", "gemm1", "gemm2", "fused"})


def _groups(ids_host):
    """[(expert, token_idx, slot_idx)] for every expert the routing touches, on the host."""
    out = []
    for e in ids_host.unique().tolist():
        tok, slot = (ids_host == e).nonzero(as_tuple=True)
        out.append((e, tok, slot))
    return out


def _silu_mul(h, i: int):
    import torch

    return torch.nn.functional.silu(h[..., :i]) * h[..., i:]


def build_loop(case: GemmCase, wl) -> Built:
    """One cuBLAS GEMM per active expert (and per expert: gather rows, matmul, scatter)."""
    import torch

    op, I, dev = case.op, wl.I, wl.device
    w1, w2 = wl.weights.w1, wl.weights.w2
    w_op = wl.op_weight()
    calls, outs = [], []
    for r in range(wl.R):
        x, weights = wl.x[r], wl.topk_weights[r]
        groups = [(e, tok.to(dev), slot.to(dev)) for e, tok, slot in _groups(wl._host_ids[r])]
        if op == "fused":
            out = torch.empty(wl.M, wl.K, device=dev, dtype=torch.bfloat16)
            acc = torch.empty(wl.M, wl.K, device=dev, dtype=torch.float32)

            def call(x=x, weights=weights, groups=groups, out=out, acc=acc):
                acc.zero_()
                for e, tok, slot in groups:
                    h = x[tok] @ w1[e].T
                    y = _silu_mul(h, I) @ w2[e].T
                    acc.index_add_(0, tok, y.float() * weights[tok, slot].unsqueeze(1))
                return out.copy_(acc)
        else:
            n = w_op.shape[1]
            out = torch.empty(wl.M, wl.topk, n, device=dev, dtype=torch.bfloat16)

            def call(x=x, groups=groups, out=out):
                for e, tok, slot in groups:
                    rows = x[tok, slot] if op == "gemm2" else x[tok]
                    out[tok, slot] = rows @ w_op[e].T
                return out
        calls.append(call)
        outs.append(out)
    return Built(calls, outs, {"impl": "torch matmul per active expert", "routing": "grouped on host at build"})


def build_bmm(case: GemmCase, wl) -> Built:
    """Gather the active experts' weights into one tensor, pad rows per expert, one torch.bmm."""
    import torch

    op, I, dev = case.op, wl.I, wl.device
    w1, w2 = wl.weights.w1, wl.weights.w2
    w_op = wl.op_weight()
    calls, outs = [], []
    for r in range(wl.R):
        groups = _groups(wl._host_ids[r])
        experts = torch.tensor([e for e, _, _ in groups], device=dev)
        cap = max(len(t) for _, t, _ in groups)
        # (expert slot, row within expert) -> (token, topk slot); padding rows point at token 0 and are
        # dropped on the way out.
        tok = torch.zeros(len(groups), cap, dtype=torch.long)
        slot = torch.zeros(len(groups), cap, dtype=torch.long)
        valid = torch.zeros(len(groups), cap, dtype=torch.bool)
        for g, (_, t, s) in enumerate(groups):
            tok[g, : len(t)], slot[g, : len(t)], valid[g, : len(t)] = t, s, True
        # Index of the real (unpadded) rows, computed here: a boolean mask inside the call would sync.
        keep = valid.flatten().nonzero().flatten().to(dev)
        vt, vs = tok[valid].to(dev), slot[valid].to(dev)
        tok, slot = tok.to(dev), slot.to(dev)
        x, weights = wl.x[r], wl.topk_weights[r]
        if op == "fused":
            out = torch.empty(wl.M, wl.K, device=dev, dtype=torch.bfloat16)
            acc = torch.empty(wl.M, wl.K, device=dev, dtype=torch.float32)

            def call(x=x, weights=weights, experts=experts, tok=tok, keep=keep, vt=vt, vs=vs, out=out, acc=acc):
                h = torch.bmm(x[tok], w1[experts].transpose(1, 2))
                y = torch.bmm(_silu_mul(h, I), w2[experts].transpose(1, 2)).flatten(0, 1)[keep]
                acc.zero_().index_add_(0, vt, y.float() * weights[vt, vs].unsqueeze(1))
                return out.copy_(acc)
        else:
            out = torch.empty(wl.M, wl.topk, w_op.shape[1], device=dev, dtype=torch.bfloat16)

            def call(x=x, experts=experts, tok=tok, slot=slot, keep=keep, vt=vt, vs=vs, out=out):
                rows = x[tok, slot] if op == "gemm2" else x[tok]
                out[vt, vs] = torch.bmm(rows, w_op[experts].transpose(1, 2)).flatten(0, 1)[keep]
                return out
        calls.append(call)
        outs.append(out)
    return Built(calls, outs, {"impl": "gather active experts' weights + torch.bmm on padded rows",
                               "routing": "grouped on host at build"})


def build_grouped_mm(case: GemmCase, wl) -> Built:
    """Rows sorted by expert, one torch._grouped_mm over all E groups (empty groups cost nothing)."""
    import torch

    op, I, dev = case.op, wl.I, wl.device
    w1t, w2t = wl.weights.w1.transpose(1, 2), wl.weights.w2.transpose(1, 2)
    w_opt = wl.op_weight().transpose(1, 2) if op != "fused" else None
    calls, outs = [], []
    for r in range(wl.R):
        ids = wl._host_ids[r].flatten()
        order = torch.argsort(ids, stable=True)
        offs = torch.cumsum(torch.bincount(ids.long(), minlength=wl.E), 0).to(torch.int32).to(dev)
        tok = (order // wl.topk).to(dev)
        slot = (order % wl.topk).to(dev)
        x, weights = wl.x[r], wl.topk_weights[r]
        if op == "fused":
            out = torch.empty(wl.M, wl.K, device=dev, dtype=torch.bfloat16)
            acc = torch.empty(wl.M, wl.K, device=dev, dtype=torch.float32)

            def call(x=x, weights=weights, tok=tok, slot=slot, offs=offs, out=out, acc=acc):
                h = torch._grouped_mm(x[tok], w1t, offs=offs)
                y = torch._grouped_mm(_silu_mul(h, I), w2t, offs=offs)
                acc.zero_().index_add_(0, tok, y.float() * weights[tok, slot].unsqueeze(1))
                return out.copy_(acc)
        else:
            out = torch.empty(wl.M, wl.topk, w_opt.shape[2], device=dev, dtype=torch.bfloat16)

            def call(x=x, tok=tok, slot=slot, offs=offs, out=out):
                rows = x[tok, slot] if op == "gemm2" else x[tok]
                out[tok, slot] = torch._grouped_mm(rows, w_opt, offs=offs)
                return out
        calls.append(call)
        outs.append(out)
    return Built(calls, outs, {"impl": "torch._grouped_mm over rows sorted by expert",
                               "routing": "sorted on host at build"})


torch_loop = Backend("torch_loop", _OPS, _BF16, build_loop, "one cuBLAS GEMM per active expert", gpu_only=False)
torch_bmm = Backend("torch_bmm", _OPS, _BF16, build_bmm, "gathered experts' weights + torch.bmm", gpu_only=False)
torch_grouped_mm = Backend("torch_grouped_mm", _OPS, _BF16, build_grouped_mm, "torch._grouped_mm",
                           gpu_only=False, min_cc=(8, 0))

TORCH_BACKENDS = (torch_loop, torch_bmm, torch_grouped_mm)
