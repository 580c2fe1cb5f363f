"""A TP-N decode prediction from one GPU's share of the model and a box's allreduce latency.

A decode scenario that runs one TP rank's share of a model on one GPU (kimi-k2.5-int4-rank: exactly the
work of one of Kimi-K2.5's TP8 ranks) measures everything a TP-N step does on a rank except the
communication. Tensor parallelism adds two allreduces per layer (after attention, after the MLP/MoE),
each of one token's hidden state (hidden x 2 bytes in bf16 at batch 1), which engines run inside
their CUDA graphs. So:

    predicted ms/token = the rank's steady ms/token + 2 x layers x allreduce latency (graph mode)

Assumed, and printed with every prediction: no overlap of compute and communication; the rank's own
step unchanged at TP-N (it holds exactly 1/N of the work); the vocab-parallel LM head's gather and the
embedding's allreduce (one each per step) left out. Works on stored files alone: a decode results file,
and an allreduce results file or baseline file of the target box. The allreduce backend is the one the
engine would use: NCCL, or vLLM's custom allreduce (`vllm_custom_ar`), which vLLM takes for decode-size
messages on NVLink and on two PCIe GPUs.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moebench.decode import models
from moebench.decode.breakdown import PREFIX
from moebench.decode.categories import CATEGORIES, LABELS
from moebench.outputs.report import fmt_fixed, fmt_pct
from moebench.results.document import CaseDoc, ResultsDoc, ResultsError, read_json

ALLREDUCES_PER_LAYER = 2
ASSUMPTIONS = (
    "two allreduces per layer (after attention, after the MLP/MoE), one token's hidden state each, in bf16",
    "allreduce latency in CUDA-graph mode (engines capture it), of the slowest rank",
    "no overlap of compute and communication",
    "the rank's own step unchanged at TP-N (it holds exactly 1/N of the model's work)",
    "the LM head's gather and the embedding's allreduce (one each per step) left out",
)


class PredictError(ValueError):
    """An input that cannot serve a prediction; one line naming the file and what is missing."""


def term(value: float, label: str, *, positive: bool = False) -> float:
    """A term of the prediction: a finite number >= 0 (> 0 where `positive`), else PredictError naming
    `label` (an option, or a file's case and metric): a negative, NaN or infinite input used to print a
    negative ms/token or a 'nan%' share."""
    if not (math.isfinite(value) and (value > 0 if positive else value >= 0)):
        raise PredictError(f"{label} {value:g}: must be a finite number {'>' if positive else '>='} 0")
    return float(value)


@dataclass
class Prediction:
    """The terms of a prediction (ms per step) and what they came from."""

    decode_key: str
    rank_ms: float
    layers: int
    hidden: int
    world: int
    transport: str
    allreduce_key: str
    allreduce_us: float
    allreduce_source: str
    scale: float = 1.0
    breakdown: dict[str, float] = field(default_factory=dict)  # label -> ms/step (GPU busy split, host gap)

    @property
    def allreduce_ms(self) -> float:
        """Time per step in allreduces."""
        return ALLREDUCES_PER_LAYER * self.layers * self.allreduce_us * self.scale / 1e3

    @property
    def total_ms(self) -> float:
        """Predicted ms/token at TP-N."""
        return self.rank_ms + self.allreduce_ms

    @property
    def allreduce_share(self) -> float:
        """The allreduce part of the predicted step (0..1)."""
        return self.allreduce_ms / self.total_ms

    def rows(self) -> list[list[str]]:
        """The terms as table rows: term, ms/step, share of the predicted step."""
        def row(label: str, ms: float) -> list[str]:
            return [label, fmt_fixed(ms), fmt_pct(100 * ms / self.total_ms)]

        out = [row("rank step, measured (steady ms/token)", self.rank_ms)]
        out += [row(f"  {label}", ms) for label, ms in self.breakdown.items()]
        scaled = f" x {self.scale:g}" if self.scale != 1.0 else ""
        out.append(row(f"allreduce: {ALLREDUCES_PER_LAYER} x {self.layers} layers x {self.allreduce_us:.2f} us{scaled}",
                       self.allreduce_ms))
        out.append(row(f"predicted TP{self.world} ms/token ({self.transport})", self.total_ms))
        return out

    def sources(self) -> list[str]:
        """Where the terms came from, one line each."""
        return [f"rank step: {self.decode_key}",
                f"allreduce: {self.allreduce_key} in {self.allreduce_source}"]


def read_doc(path: Path) -> Any:
    """A JSON document (gzipped or not), or PredictError naming the file."""
    try:
        return read_json(path)
    except ResultsError as e:
        raise PredictError(str(e)) from None


def results(doc: Any, where: str) -> ResultsDoc:
    """A results document, or PredictError naming the file and the field."""
    try:
        return ResultsDoc.from_json(doc, where)
    except ResultsError as e:
        raise PredictError(str(e)) from None


def decode_case(run: ResultsDoc, pattern: str | None = None) -> CaseDoc:
    """The decode case to predict from: the one matching `pattern` (a substring of its key), else the
    one with a breakdown, else the only one."""
    cases = [c for c in run.cases.values() if c.family == "decode" and (not pattern or pattern in c.key)]
    if not cases:
        raise PredictError(f"{run.path}: no decode case" + (f" matching {pattern!r}" if pattern else "")
                           + " (a --results-json of `pytest benchmarks/ -m decode`)")
    if len(cases) == 1:
        return cases[0]
    profiled = [c for c in cases if c.info.get("breakdown")]
    if len(profiled) == 1:
        return profiled[0]
    raise PredictError(f"{run.path}: {len(cases)} decode cases; name one with --case "
                       f"({', '.join(c.key for c in cases)})")


def model_shape(case: CaseDoc, layers: int | None, hidden: int | None) -> tuple[int, int]:
    """(layers, hidden) from the overrides, else the shipped config the case ran."""
    if layers and hidden:
        return layers, hidden
    tag = case.definition.get("model")
    shipped = models.shipped_models()
    if tag not in shipped:
        raise PredictError(f"{case.key}: model {tag!r} is not a config moebench ships: give --layers and --hidden")
    cfg = models.read_config(shipped[tag])
    return layers or int(cfg["num_hidden_layers"]), hidden or int(cfg["hidden_size"])


def allreduce_latency(doc: Any, where: str, key: str) -> float:
    """latency_us of one allreduce case from a results file or a baseline file."""
    if isinstance(doc, dict) and isinstance(doc.get("entries"), dict):
        entry = doc["entries"].get(key)
        m = (entry or {}).get("metrics", {}).get("latency_us")
        value = m.get("value") if isinstance(m, dict) else None
        have = sorted(doc["entries"])
    else:
        run = results(doc, where)
        m = run.cases[key].metrics.get("latency_us") if key in run.cases else None
        value = m.metric.value if m is not None else None
        have = sorted(k for k in run.cases if k.startswith("allreduce["))
    if not isinstance(value, (int, float)):
        worlds = sorted({k.split("-w")[1].split("-")[0] for k in have if "-w" in k})
        raise PredictError(f"{where}: no {key} (its allreduce cases have worlds {', '.join(worlds) or 'none'}): "
                           "record it on the target box with `pytest benchmarks/ -m allreduce`")
    return term(value, f"{where}: {key} latency_us")


def allreduce_file(path: Path) -> Path:
    """An allreduce results/baseline file, or the allreduce.json inside a baseline folder."""
    if path.is_dir():
        inside = path / "allreduce.json"
        if not inside.is_file():
            raise PredictError(f"{path}: no allreduce.json in this folder: no allreduce latency is stored for this "
                               "box; record one there with `pytest benchmarks/ -m allreduce --baseline-update`")
        return inside
    if not path.is_file():
        raise PredictError(f"{path}: no such file")
    return path


def predict(decode_path: Path, allreduce_path: Path, *, world: int, transport: str = "auto", scale: float = 1.0,
            case_pattern: str | None = None, layers: int | None = None, hidden: int | None = None,
            backend: str = "nccl") -> Prediction:
    """The prediction from the files (see the module docstring)."""
    if world < 2:
        raise PredictError(f"--world {world}: tensor parallelism needs at least 2 ranks")
    term(scale, "--allreduce-scale", positive=True)
    for option, n in (("--layers", layers), ("--hidden", hidden)):
        if n is not None and n < 1:
            raise PredictError(f"{option} {n}: must be at least 1")
    case = decode_case(results(read_doc(decode_path), str(decode_path)), case_pattern)
    steady = case.metrics["ms_per_token"].metric.value if "ms_per_token" in case.metrics else None
    if steady is None:
        raise PredictError(f"{decode_path}: {case.key} has no ms_per_token")
    term(steady, f"{decode_path}: {case.key} ms_per_token", positive=True)
    n_layers, h = model_shape(case, layers, hidden)
    suffix = "" if transport == "auto" else f"-{transport}"
    if transport != "auto" and backend != "nccl":
        raise PredictError(f"--transport {transport}: transports steer NCCL; --backend {backend} has none")
    ar_key = f"allreduce[{backend}-w{world}-h{h}-t1-bf16-graph{suffix}]"
    ar_path = allreduce_file(allreduce_path)
    lat = allreduce_latency(read_doc(ar_path), str(ar_path), ar_key)
    values = {n: m.metric.value for n, m in case.metrics.items()}
    parts = {f"GPU: {LABELS[c]}": term(values[f"{PREFIX}{c}_ms"], f"{decode_path}: {case.key} {PREFIX}{c}_ms")
             for c in CATEGORIES if values.get(f"{PREFIX}{c}_ms")}
    if parts and f"{PREFIX}host_gap_ms" in values:
        parts["host gap"] = term(values[f"{PREFIX}host_gap_ms"], f"{decode_path}: {case.key} {PREFIX}host_gap_ms")
    return Prediction(case.key, steady, n_layers, h, world, transport, ar_key, lat, str(ar_path), scale, parts)


def as_json(p: Prediction) -> str:
    """The prediction as JSON (terms and assumptions), for scripts."""
    return json.dumps({"decode_case": p.decode_key, "rank_ms_per_token": p.rank_ms, "layers": p.layers,
                       "hidden": p.hidden, "world": p.world, "transport": p.transport,
                       "allreduce_case": p.allreduce_key, "allreduce_us": p.allreduce_us, "allreduce_scale": p.scale,
                       "allreduce_source": p.allreduce_source, "allreduce_ms_per_step": p.allreduce_ms,
                       "predicted_ms_per_token": p.total_ms, "allreduce_share": p.allreduce_share,
                       "breakdown_ms_per_step": p.breakdown, "assumptions": list(ASSUMPTIONS)}, indent=2)
