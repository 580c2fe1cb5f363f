"""What the engine says it chose: kernel and backend lines read back from its own log.

Pinning a backend is half the job; the other half is recording what actually ran, in the engine's
own words, because an engine can map a pin to a different kernel class (vLLM: TRITON ->
BATCHED_TRITON) or add choices of its own (MLA prefill backend, quantized-MoE kernels). Lines look like
  vLLM:   "Using TRITON Unquantized MoE backend out of potential backends: [...]"
          "Using 'MARLIN' NvFp4 MoE backend out of potential backends: [...]"
          "Using FLASHMLA attention backend out of potential backends: [...]", "Using CPU_MLA backend."
          "Using Marlin backend for WNA16 MoE (group_size=32, num_bits=4)" (compressed-tensors experts)
  SGLang: the server_args dump: "moe_runner_backend='flashinfer_cutlass'", "attention_backend='flashinfer'"
          (the request as given: 'auto' is no kernel and is not recorded);
          "Using CompressedTensorsWNA16MarlinMoEMethod" (the quantized MoE's method: its kernel, marlin, leads);
          "Attention backend not specified. Use fa3 backend by default." (SGLang's own choice)
"""

from __future__ import annotations

import re
from pathlib import Path

_PREFIX = re.compile(r"^.*?\[[\w.]+:\d+\]\s*")  # "(Worker pid=1) INFO 11-29 22:05:59 [cpu.py:175] "
_USING = re.compile(r"\bUsing\s+'?([\w./-]+)'?\s+((?:[\w-]+\s+){0,3}?)backend\b", re.I)
# SGLang's ServerArgs repr quotes strings; vLLM's config dump ("quantization=None") does not.
_FOR_MOE = re.compile(r"^\s*for\s+((?:[\w-]+\s+){0,2}MoE)\b", re.I)  # "... backend for WNA16 MoE"
_SGLANG = re.compile(r"\b(moe_runner_backend|attention_backend|quantization)='([\w.-]+)'")
_SGLANG_MOE_METHOD = re.compile(r"\bUsing ((?:CompressedTensors|Compressed)\w*MoE\w*)")
_SGLANG_ATTN_DEFAULT = re.compile(r"Attention backend not specified\. Use (\w+) backend by default")
_KERNELS = ("marlin", "triton", "cutlass", "flashinfer", "deep_gemm")


def choices(log: Path | str, max_bytes: int = 8 << 20) -> dict:
    """Parse an engine log: {'moe': [...], 'attention': [...], 'other': [...], 'lines': [...]}, each list
    in first-seen order without repeats (every rank logs the same choice)."""
    try:
        with open(log, "r", encoding="utf-8", errors="replace") as f:
            text = f.read(max_bytes)
    except OSError:
        return {"moe": [], "attention": [], "other": [], "lines": []}
    out: dict[str, list[str]] = {"moe": [], "attention": [], "other": [], "lines": []}

    def add(kind: str, value: str) -> None:
        if value not in out[kind]:
            out[kind].append(value)

    for raw in text.splitlines():
        for m in _SGLANG_MOE_METHOD.finditer(raw):
            cls = m.group(1)
            add("moe", f"{next((k for k in _KERNELS if k in cls.lower()), cls)} ({cls})")
            add("lines", raw.strip()[:240])
        for m in _SGLANG_ATTN_DEFAULT.finditer(raw):
            add("attention", m.group(1))
            add("lines", raw.strip()[:240])
        if "backend" not in raw.lower():
            continue
        line = _PREFIX.sub("", raw).strip()
        for m in _USING.finditer(line):
            name, what = m.group(1), m.group(2).strip().lower()
            after = _FOR_MOE.match(line[m.end():])
            if after and not what:
                what = after.group(1).lower()
                add("moe", f"{name} ({after.group(1)})")
                add("lines", line[:240])
                continue
            if "moe" in what:
                add("moe", f"{name} ({m.group(2).strip()})" if what != "moe" else name)
            elif "prefill" in what or "mla" in what:
                add("other", f"{name} ({m.group(2).strip()})")
            elif what in ("", "attention"):
                add("attention", name)
            else:
                add("other", f"{name} ({m.group(2).strip()})")
            add("lines", line[:240])
        for m in _SGLANG.finditer(line):
            key, value = m.groups()
            if key == "moe_runner_backend" and value == "auto":
                continue
            add("moe" if key == "moe_runner_backend" else "attention" if key == "attention_backend" else "other",
                f"{value} ({key})" if key not in ("moe_runner_backend", "attention_backend") else value)
    return out
