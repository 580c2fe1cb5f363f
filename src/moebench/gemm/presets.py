"""Model presets: the MoE shapes of the models our users deploy."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MoEPreset:
    """A model's MoE layer: hidden size, full moe_intermediate size, routed experts, top-k."""

    name: str
    hidden: int
    moe_intermediate: int
    experts: int
    topk: int

    def intermediate_per_rank(self, tp: int) -> int:
        """I per GPU when the experts' intermediate dimension is split over tp ranks (vLLM's TP MoE)."""
        if self.moe_intermediate % tp:
            raise ValueError(f"{self.name}: moe_intermediate {self.moe_intermediate} not divisible by tp {tp}")
        return self.moe_intermediate // tp


PRESETS: dict[str, MoEPreset] = {
    p.name: p
    for p in (
        MoEPreset("kimi-k2.5", hidden=7168, moe_intermediate=2048, experts=384, topk=8),
        MoEPreset("deepseek-v3", hidden=7168, moe_intermediate=2048, experts=256, topk=8),
        MoEPreset("glm-5", hidden=6144, moe_intermediate=2048, experts=256, topk=8),
        # Small enough for a 2-core CPU box (and a quick smoke test on any GPU); same structure.
        MoEPreset("tiny", hidden=1024, moe_intermediate=1024, experts=32, topk=4),
    )
}
