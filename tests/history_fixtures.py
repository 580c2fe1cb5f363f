"""Synthetic nightly histories as real results files, for `moebench changes`, the report page and its
screenshot: the recorded tiny-GEMM CPU run (36 cases, three backends over M) and the recorded H200 decode
run (with its step breakdown, plus a second MoE kernel made from it), re-dated one night apart, each
value drawn around the recorded one with a small spread, and `moves(key, night)` multiplying it."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Callable

DATA = Path(__file__).resolve().parent / "data"
GEMM = DATA / "gemm-tiny-cpu.json"
DECODE = DATA / "results-decode-kimi-int4-rank-h200.json"
HW = "cpu-amd-epyc-2c"
STEP_CASE = "gemm[tiny-tp8-fused-m4-bf16-decode-torch_bmm]"


def _night_template() -> dict:
    """One run: the GEMM cases (with the chart description the gemm family writes now) and the decode
    in-process case twice, with vLLM's Marlin and with moebench's w4 kernel (its routed experts faster)."""
    doc = json.loads(GEMM.read_text())
    for c in doc["cases"]:
        d = c["definition"]
        c["info"]["chart"] = {"panel": f"{d['model']} tp{d['tp']} {d['op']} {d['dtype']} {d['routing']}", "x": d["m"],
                              "x_label": "M (tokens per step)", "series": d["backend"]}
    decode = json.loads(DECODE.read_text())["cases"][0]
    decode["group"] = decode["key"].replace("-moe_auto-", "-")
    w4 = copy.deepcopy(decode)
    w4["key"] = decode["key"].replace("moe_auto", "moe_moebench_w4")
    cats = w4["info"]["breakdown"]["categories"]
    cats["routed_experts"]["ms_per_step"] = 1.13
    cats["router_topk_align"]["ms_per_step"] = 0.48
    doc["cases"] += [decode, w4]
    return doc


def write_history(folder: Path, nights: int, *, moves: Callable[[str, int], float] = lambda key, night: 1.0,
                  spread: float = 0.003, seed: int = 0, only: str = "") -> list[Path]:
    """Write `nights` results files into `folder` (named by date, as ci/nightly.sh keeps them); returns
    their paths, oldest first. `only`: keep just the cases whose key contains it (fewer plots to draw)."""
    rng = random.Random(seed)
    template = _night_template()
    template["cases"] = [c for c in template["cases"] if only in c["key"]]
    template["not_measured"] = template["not_measured"][:1]
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for night in range(nights):
        doc = copy.deepcopy(template)
        doc["hardware_key"] = HW
        doc["started"] = f"2026-11-{1 + night:02d}T02:17:00Z"
        doc["finished"] = f"2026-11-{1 + night:02d}T02:47:00Z"
        doc["commit"] = f"{0xabc0000 + night:07x}"
        for c in doc["cases"]:
            factor = moves(c["key"], night) * (1 + rng.gauss(0.0, spread))
            c.pop("samples", None)
            for m in c["metrics"].values():
                m["value"] *= factor
                m["noise"] = spread
        path = folder / f"{doc['started'][:10].replace('-', '')}T021700Z-{night:06d}.json"
        path.write_text(json.dumps(doc))
        paths.append(path)
    return paths


def step(key: str, at: int, by: float) -> Callable[[str, int], float]:
    """A move: case `key` slower by `by` (relative) from night `at` on."""
    return lambda k, night: 1 + by if k == key and night >= at else 1.0

