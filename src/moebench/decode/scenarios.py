"""Decode scenarios as data: the TOML file, its validation, and the cases (scenario x engine) it yields.

A scenario is one `[[scenario]]` table of benchmarks/decode_scenarios.toml. Every field is named in
`FIELDS`; an unknown field, a wrong type or a bad value is a `ScenarioError` with one line naming the
file, the scenario and the field. Collection parses this file only (no engine import), so it is fast.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from moebench.decode import models, sglang_trace, vllm_moe_hook
from moebench.decode.categories import CATEGORIES, MAP_VERSION
from moebench.decode.scenario_errors import toml_error
from moebench.decode.stats import STEADY_WINDOW
from moebench.core.method import steady_state_rule

ENGINES = ("vllm", "vllm-server", "sglang-server")
DEVICES = ("cuda", "cpu")
DTYPES = ("bfloat16", "float16", "float32")
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")

# Marker per (engine family, MoE backend) so `-m` selects a kernel. Only markers registered in
# pyproject.toml (strict markers) may appear here; backends without one are selected by engine marker.
MOE_MARKERS = {
    ("vllm", "triton"): "vllm_triton",
    ("vllm", "marlin"): "vllm_marlin",
    ("vllm", "flashinfer_cutlass"): "flashinfer_cutlass",
    # moebench's own int4 Triton kernels, through the engine hook: the default one (mma) is `triton`
    ("vllm", "moebench_mma"): "triton",
    ("vllm", "moebench_w4"): "triton_rows4",
    ("sglang", "flashinfer_cutlass"): "flashinfer_cutlass",
}


# the gated decode metrics a scenario may gate on a cliff only (cliff_metrics)
CLIFF_METRICS = ("ms_per_token", "ttft_ms")
# engine hooks a scenario may name in moe_hook
MOE_HOOKS = tuple(vllm_moe_hook.HOOKS)


class ScenarioError(ValueError):
    """A scenario file that cannot be used; the message is one line naming file, scenario and field."""


@dataclass(frozen=True)
class Scenario:
    """One decode scenario: what model, through which engine(s), with which pinned backends.

    model: a shipped config name (see moebench.decode.models) or a model folder. weights: "dummy"
    (random weights, no download) or "checkpoint" (the folder's own weights). moe_backend is always
    pinned (the engine's --moe-backend / --moe-runner-backend value); "auto" is accepted on a CPU, where
    the engine has a single MoE kernel, and where `expect_moe` names the kernel the engine must report
    (quantized experts, whose method picks its own kernel: vLLM runs compressed-tensors W4A16 with
    Marlin). only_on: hardware keys where the scenario can run (elsewhere its row reads ENV_MISMATCH
    against any stored figure). profile_steps: decode steps of one profiled trial, run after the timed
    ones, for the per-category breakdown (0: none); gate_categories: the breakdown's categories that
    gate, at rel_tol_category. engine_instances: engines started one after the other per measurement
    (the A/A: their spread is the stored noise). cliff_metrics: host-bound gated metrics (spread between
    machines or instances over 10%) that fail only when they double (moebench.baselines.compare.CLIFF).
    """

    name: str
    engines: tuple[str, ...]
    model: str
    moe_backend: str
    weights: str = "dummy"
    model_label: str = ""
    device: str = "cuda"
    tp: int = 1
    dtype: str = "bfloat16"
    quantization: str = ""
    attention_backend: str = "auto"
    cuda_graphs: bool = True
    prompt_tokens: int = 64
    output_tokens: int = 128
    trials: int = 3
    warmup_trials: int = 1
    tiny: bool = False
    full: bool = False
    only_on: tuple[str, ...] = ()
    gpu_memory_utilization: float = 0.0  # 0: the device default (0.3 on a CPU, 0.8 on a GPU)
    start_timeout_s: float = 0.0  # 0: the device default (300 s on a CPU, 1200 s on a GPU)
    trial_timeout_s: float = 300.0
    rel_tol_ms_per_token: float = 0.10
    rel_tol_ttft: float = 0.20
    cliff_metrics: tuple[str, ...] = ()
    expect_moe: str = ""
    moe_hook: str = ""  # "moebench_w4" / "moebench_mma": vLLM runs our int4 kernel in place of Marlin (vllm_moe_hook.py)
    profile_steps: int = 0
    gate_categories: tuple[str, ...] = ()
    rel_tol_category: float = 0.05
    rel_tol_categories: tuple[tuple[str, float], ...] = ()  # per-category overrides of rel_tol_category
    engine_instances: int = 1
    server_command: tuple[str, ...] = ()
    server_args: tuple[str, ...] = ()
    engine_kwargs: tuple[tuple[str, Any], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    note: str = ""

    # --- derived ---------------------------------------------------------------------------------
    @property
    def model_dir(self) -> Path | None:
        """The folder the engine loads: a shipped config's folder or the given path (None for a bare
        label that still needs --decode-model)."""
        shipped = models.shipped_models()
        if self.model in shipped:
            return shipped[self.model]
        p = Path(self.model).expanduser()
        return p if p.is_dir() else None

    @property
    def moe_kernel(self) -> str:
        """The MoE kernel the case runs: the one the engine must report, else the pin."""
        return self.expect_moe.lower() or self.moe_backend

    @property
    def moe_token(self) -> str:
        """The MoE part of case keys: the engine hook where one replaces the kernel, else the pin."""
        return f"moe_{self.moe_hook or self.moe_backend}"

    @property
    def model_tag(self) -> str:
        """The model's name in case keys: the shipped config name, the label, or the folder name."""
        if self.model_label:
            return self.model_label.lower()
        if self.model in models.shipped_models():
            return self.model
        return re.sub(r"[^a-z0-9.]+", "-", Path(self.model).name.lower()).strip("-") or "model"

    @property
    def gpu_memory_fraction(self) -> float:
        """The memory fraction the engine may take (the scenario's, else the device default)."""
        return self.gpu_memory_utilization or (0.3 if self.device == "cpu" else 0.8)

    @property
    def start_timeout(self) -> float:
        """Seconds the engine may take to become ready (the scenario's, else the device default)."""
        return self.start_timeout_s or (300.0 if self.device == "cpu" else 1200.0)

    def config_digest(self) -> str:
        """sha256 prefix of the model's config.json (part of the case definition: a changed config is a
        changed case), or "" when the folder is not here."""
        d = self.model_dir
        if d is None or not (d / "config.json").is_file():
            return ""
        return hashlib.sha256((d / "config.json").read_bytes()).hexdigest()[:16]


@dataclass(frozen=True)
class DecodeCase:
    """One benchmark case: a scenario run through one engine."""

    scenario: Scenario
    engine: str  # "vllm" | "vllm-server" | "sglang-server" | an http(s) URL

    @property
    def engine_kind(self) -> str:
        """vllm (in-process LLM class), vllm-server, sglang-server, or url (a server already running)."""
        return "url" if is_url(self.engine) else self.engine

    @property
    def engine_family(self) -> str | None:
        """Which engine answers: vllm or sglang (None for a URL: unknown)."""
        kind = self.engine_kind
        return None if kind == "url" else kind.split("-")[0]

    @property
    def key(self) -> str:
        """The baseline key, rendered from the case's axes (never a path or a port)."""
        s = self.scenario
        engine = "openai" if self.engine_kind == "url" else self.engine
        # the weights' precision as the engine runs them: the flag, else what the config declares, else dtype
        precision = (s.quantization or models.quant_label(s.model_dir)
                     or {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}[s.dtype])
        parts = [s.model_tag, engine, f"tp{s.tp}", precision, s.moe_token,
                 f"attn_{s.attention_backend.lower()}", "graph" if s.cuda_graphs else "eager",
                 f"p{s.prompt_tokens}", f"o{s.output_tokens}"]
        if s.device == "cpu":
            parts.insert(2, "cpu")
        return f"decode[{'-'.join(parts)}]"

    @property
    def id(self) -> str:
        """The pytest id: the key's inside."""
        return self.key[len("decode["):-1]

    def markers(self) -> list[tuple[str, tuple]]:
        """(marker name, args) to apply: family, engine, MoE backend, tiny/full, hardware."""
        s = self.scenario
        out: list[tuple[str, tuple]] = [("decode", ())]
        fam = self.engine_family
        if fam:
            out.append((fam, ()))
            moe = MOE_MARKERS.get((fam, s.moe_kernel))
            if moe:
                out.append((moe, ()))
        if s.tiny:
            out.append(("tiny", ()))
        if s.full:
            out.append(("full", ()))
        # A scenario pinned to other hardware keys carries no GPU marker: the plugin would skip it at
        # setup, before the test can report its stored figure as ENV_MISMATCH.
        if s.device == "cuda" and not s.only_on and self.engine_kind != "url":
            out.append(("gpus", (s.tp,)) if s.tp > 1 else ("gpu", ()))
        return out

    def definition(self) -> dict[str, Any]:
        """Everything that shapes the numbers (its hash makes a stored entry STALE when it changes).
        Trial counts, timeouts and paths are left out: they change noise or location, not the value."""
        s = self.scenario
        # A dummy-weight model is its config, so the config's digest is part of the case; a checkpoint
        # is named by its label (its config is recorded in the results, and a figure measured elsewhere
        # on the same checkpoint, like the users' external one, stays comparable).
        return {
            "family": "decode", "engine": "openai" if self.engine_kind == "url" else self.engine,
            "model": s.model_tag, "weights": s.weights,
            "config_sha256": s.config_digest() if s.weights == "dummy" else None,
            "device": s.device, "tp": s.tp, "dtype": s.dtype, "quantization": s.quantization or None,
            "moe_backend": s.moe_backend, "attention_backend": s.attention_backend, "cuda_graphs": s.cuda_graphs,
            "prompt_tokens": s.prompt_tokens, "output_tokens": s.output_tokens, "batch": 1, "sampling": "greedy",
            "prefix_caching": False, "gpu_memory_utilization": s.gpu_memory_fraction,
            # how ms_per_token is read from the timeline (a changed rule makes stored entries STALE)
            "steady_state": steady_state_rule(STEADY_WINDOW),
            # what the gated breakdown categories mean (only where they are measured and gated)
            **({"breakdown_map": MAP_VERSION} if s.gate_categories and self.engine_kind == "vllm" else {}),
            **({"breakdown_map": sglang_trace.breakdown_map()} if s.gate_categories and self.engine_kind == "sglang-server"
               else {}),
            "server_args": list(s.server_args), "engine_kwargs": dict(s.engine_kwargs), "env": dict(s.env),
            # only where set, so the definitions (and stored entries) of hook-less cases stay as they were
            **({"moe_hook": s.moe_hook} if s.moe_hook else {}),
        }


def is_url(engine: str) -> bool:
    """Whether an engine value is the URL of a server already running."""
    return engine.startswith(("http://", "https://"))


# --- parsing -------------------------------------------------------------------------------------
def _kind(v: Any) -> str:
    return type(v).__name__


def _want(cond: bool, where: str, what: str) -> None:
    if not cond:
        raise ScenarioError(f"{where}: {what}")


def _pos_int(v: Any, where: str, zero_ok: bool = False) -> int:
    _want(isinstance(v, int) and not isinstance(v, bool) and (v >= 0 if zero_ok else v >= 1), where,
          f"must be an integer >= {0 if zero_ok else 1}, got {v!r}")
    return v


def _str_list(v: Any, where: str) -> tuple[str, ...]:
    _want(isinstance(v, list) and all(isinstance(x, str) for x in v), where, f"must be a list of strings, got {v!r}")
    return tuple(v)


def _check_engine(e: Any, where: str) -> str:
    _want(isinstance(e, str) and (e in ENGINES or is_url(e)), where,
          f"must be one of {', '.join(ENGINES)} or an http(s):// URL, got {e!r}")
    return e


def parse_scenario(raw: dict[str, Any], where: str) -> Scenario:
    """One [[scenario]] table -> Scenario; `where` names the file for messages."""
    _want(isinstance(raw.get("name"), str) and _NAME.match(raw["name"]), f"{where}: name",
          f"must be lowercase letters, digits, '.', '_' or '-', got {raw.get('name')!r}")
    w = f"{where}: scenario {raw['name']!r}"
    known = {f for f in Scenario.__dataclass_fields__} - {"engines"} | {"engine"}
    unknown = sorted(set(raw) - known)
    _want(not unknown, w, f"unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    for req in ("engine", "model", "moe_backend"):
        _want(req in raw, f"{w}: {req}", "missing")
    engines = raw["engine"] if isinstance(raw["engine"], list) else [raw["engine"]]
    _want(bool(engines), f"{w}: engine", "must name at least one engine")
    kw: dict[str, Any] = {"name": raw["name"], "engines": tuple(_check_engine(e, f"{w}: engine") for e in engines)}
    for f in ("model", "moe_backend", "model_label", "quantization", "attention_backend", "expect_moe", "moe_hook", "note"):
        if f in raw:
            _want(isinstance(raw[f], str) and (f in ("model_label", "quantization", "note") or raw[f]),
                  f"{w}: {f}", f"must be a non-empty string, got {raw[f]!r}")
            kw[f] = raw[f]
    for f, choices in (("device", DEVICES), ("dtype", DTYPES), ("weights", ("dummy", "checkpoint"))):
        if f in raw:
            _want(raw[f] in choices, f"{w}: {f}", f"must be one of {', '.join(choices)}, got {raw[f]!r}")
            kw[f] = raw[f]
    for f in ("tp", "prompt_tokens", "output_tokens", "trials", "engine_instances"):
        if f in raw:
            kw[f] = _pos_int(raw[f], f"{w}: {f}")
    for f in ("warmup_trials", "profile_steps"):
        if f in raw:
            kw[f] = _pos_int(raw[f], f"{w}: {f}", zero_ok=True)
    for f in ("cuda_graphs", "tiny", "full"):
        if f in raw:
            _want(isinstance(raw[f], bool), f"{w}: {f}", f"must be true or false, got {raw[f]!r}")
            kw[f] = raw[f]
    for f in ("gpu_memory_utilization", "start_timeout_s", "trial_timeout_s", "rel_tol_ms_per_token", "rel_tol_ttft",
              "rel_tol_category"):
        if f in raw:
            v = raw[f]
            _want(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0, f"{w}: {f}",
                  f"must be a number > 0, got {v!r}")
            kw[f] = float(v)
    for f in ("only_on", "server_command", "server_args", "gate_categories", "cliff_metrics"):
        if f in raw:
            kw[f] = _str_list(raw[f], f"{w}: {f}")
    _want(set(kw.get("cliff_metrics", ())) <= set(CLIFF_METRICS), f"{w}: cliff_metrics",
          f"must name gated metrics among {', '.join(CLIFF_METRICS)}, got {list(kw.get('cliff_metrics', ()))}")
    unknown_cats = sorted(set(kw.get("gate_categories", ())) - set(CATEGORIES))
    _want(not unknown_cats, f"{w}: gate_categories", f"unknown {', '.join(unknown_cats)} (known: {', '.join(CATEGORIES)})")
    if "rel_tol_categories" in raw:
        t, wt = raw["rel_tol_categories"], f"{w}: rel_tol_categories"
        _want(isinstance(t, dict), wt, f"must be a table of category = tolerance, got {_kind(t)}")
        bad = sorted(set(t) - set(CATEGORIES))
        _want(not bad, wt, f"unknown {', '.join(bad)} (known: {', '.join(CATEGORIES)})")
        _want(all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1 for v in t.values()), wt,
              f"tolerances must be numbers in (0, 1], got {t}")
        kw["rel_tol_categories"] = tuple(sorted((k, float(v)) for k, v in t.items()))
    for f in ("engine_kwargs", "env"):
        if f in raw:
            _want(isinstance(raw[f], dict), f"{w}: {f}", f"must be a table, got {_kind(raw[f])}")
            if f == "env":
                _want(all(isinstance(v, str) for v in raw[f].values()), f"{w}: env", "values must be strings")
            kw[f] = tuple(sorted(raw[f].items()))
    s = Scenario(**kw)
    if "weights" not in raw and s.model not in models.shipped_models():
        d = s.model_dir
        if d is None:  # a typo in a shipped config's name must not turn into "needs a checkpoint"
            raise ScenarioError(f"{w}: model: {s.model!r} is neither a shipped config ({', '.join(models.shipped_models())}) "
                                "nor a folder here (a checkpoint given later with --decode-model needs weights = \"checkpoint\")")
        s = replace(s, weights="checkpoint" if models.has_weights(d) else "dummy")
    return check_scenario(s, w)


def check_scenario(s: Scenario, where: str) -> Scenario:
    """Rules across fields (also re-checked after command-line overrides)."""
    _want(s.moe_backend != "auto" or s.device == "cpu" or bool(s.expect_moe), f"{where}: moe_backend",
          "must be pinned (not 'auto') on a GPU, or name the kernel the engine must choose in expect_moe: an "
          "engine upgrade that changes the automatic choice is a regression this suite exists to catch")
    _want(not s.gate_categories or s.profile_steps >= 4, f"{where}: gate_categories",
          "gating breakdown categories needs a profiled trial (profile_steps >= 4)")
    _want(s.gpu_memory_fraction <= 1.0, f"{where}: gpu_memory_utilization", "must be at most 1")
    if s.moe_hook:
        _want(s.moe_hook in MOE_HOOKS, f"{where}: moe_hook", f"must be one of {', '.join(MOE_HOOKS)}, got {s.moe_hook!r}")
        _want(all(e in ("vllm", "vllm-server") for e in s.engines), f"{where}: moe_hook",
              "is a vLLM plugin: the scenario's engines must be vllm or vllm-server")
        _want(s.expect_moe.lower() == s.moe_hook, f"{where}: expect_moe",
              f"must be {s.moe_hook!r} with moe_hook = {s.moe_hook!r}: the engine's log has to confirm the hook took over")
    if s.device == "cpu":
        _want(s.tp == 1, f"{where}: tp", "a CPU scenario runs on one rank (tp = 1)")
    if s.weights == "dummy" and s.model_dir is None:
        raise ScenarioError(f"{where}: model: {s.model!r} is neither a shipped config "
                            f"({', '.join(models.shipped_models())}) nor a folder here")
    return s


def load_scenarios(path: Path) -> list[Scenario]:
    """Parse and validate a scenario file. Raises ScenarioError (one line) on any problem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        doc = tomllib.loads(text)
    except OSError as e:
        raise ScenarioError(f"{path}: cannot read: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(toml_error(path, text, e)) from None
    extra = sorted(set(doc) - {"scenario"})
    _want(not extra, str(path), f"unknown top-level key(s) {', '.join(extra)} (scenarios are [[scenario]] tables)")
    raws = doc.get("scenario", [])
    _want(isinstance(raws, list) and all(isinstance(r, dict) for r in raws), str(path), "[[scenario]] must be tables")
    out: list[Scenario] = []
    for raw in raws:
        s = parse_scenario(raw, str(path))
        _want(all(o.name != s.name for o in out), f"{path}: scenario {s.name!r}", "name used twice")
        out.append(s)
    return out


def cases_of(scenarios: list[Scenario]) -> list[DecodeCase]:
    """Every (scenario, engine) case, checking that no two render to the same key."""
    cases: list[DecodeCase] = []
    seen: dict[str, str] = {}
    for s in scenarios:
        for e in s.engines:
            c = DecodeCase(s, e)
            if c.key in seen:
                raise ScenarioError(f"scenarios {seen[c.key]!r} and {s.name!r} describe the same case {c.key}")
            seen[c.key] = s.name
            cases.append(c)
    return cases
