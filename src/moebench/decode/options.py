"""Command-line options of the decode family, and applying them to the scenarios.

Every override takes `VALUE` (all scenarios) or `NAME=VALUE` (the scenario NAME); --decode-model
always names its scenario. A malformed value stops pytest at argument parsing with one line naming the
option; an unknown scenario name stops collection with one line naming the option.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from moebench.decode import models
from moebench.decode.scenarios import ENGINES, Scenario, ScenarioError, check_scenario, is_url

DEFAULT_SCENARIOS = "benchmarks/decode_scenarios.toml"
_NAMED = re.compile(r"^([a-z0-9][a-z0-9._-]*)=(.*)$")


@dataclass(frozen=True)
class Override:
    """One `[NAME=]VALUE` from the command line, VALUE already converted."""

    option: str
    scenario: str | None
    value: Any


def _split(option: str, text: str, convert: Callable[[str], Any], need_name: bool = False) -> Override:
    # A URL value holds ':' before any '=', so "http://h:8000/x?a=b" is never read as NAME=VALUE.
    m = _NAMED.match(text)
    name, value = (m.group(1), m.group(2)) if m else (None, text)
    if need_name and name is None:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH (a scenario name and a model folder), got {text!r}")
    return Override(option, name, convert(value))


def _positive_int(v: str) -> int:
    if not v.isdigit() or int(v) < 1:
        raise argparse.ArgumentTypeError(f"{v!r} is not a positive integer")
    return int(v)


def _count(v: str) -> int:
    if not v.isdigit():
        raise argparse.ArgumentTypeError(f"{v!r} is not an integer >= 0")
    return int(v)


def _seconds(v: str) -> float:
    try:
        x = float(v)
    except ValueError:
        x = -1.0
    if not x > 0:
        raise argparse.ArgumentTypeError(f"{v!r} is not a number of seconds > 0")
    return x


def _on_off(v: str) -> bool:
    if v.lower() not in ("on", "off", "true", "false", "1", "0"):
        raise argparse.ArgumentTypeError(f"{v!r}: expected on or off")
    return v.lower() in ("on", "true", "1")


def _engine(v: str) -> str:
    if v not in ENGINES and not is_url(v):
        raise argparse.ArgumentTypeError(f"{v!r}: expected one of {', '.join(ENGINES)} or an http(s):// URL")
    return v


def _backend(v: str) -> str:
    if not re.match(r"^[A-Za-z0-9_]+$", v):
        raise argparse.ArgumentTypeError(f"{v!r} is not a backend name")
    return v


def _model_dir(v: str) -> str:
    p = Path(v).expanduser()
    if not p.is_dir():
        raise argparse.ArgumentTypeError(f"{v}: no such model folder")
    if not (p / "config.json").is_file():
        raise argparse.ArgumentTypeError(f"{v}: no config.json in this folder")
    return str(p.resolve())


# option name -> (converter, Scenario field, help)
_OVERRIDES: dict[str, tuple[Callable[[str], Any], str, str]] = {
    "--decode-engine": (_engine, "engines", "engine: vllm (in-process LLM), vllm-server, sglang-server, or the URL "
                                            "of an OpenAI-compatible server already running"),
    "--decode-trials": (_positive_int, "trials", "measured trials (after warm-up)"),
    "--decode-warmup": (_count, "warmup_trials", "warm-up trials, reported apart and never gated"),
    "--decode-prompt-tokens": (_positive_int, "prompt_tokens", "prompt length in tokens"),
    "--decode-output-tokens": (_positive_int, "output_tokens", "output tokens per trial"),
    "--decode-tp": (_positive_int, "tp", "tensor-parallel size"),
    "--decode-moe-backend": (_backend, "moe_backend", "MoE kernel to pin (vLLM --moe-backend, SGLang --moe-runner-backend)"),
    "--decode-attention-backend": (_backend, "attention_backend", "attention backend to pin"),
    "--decode-cuda-graphs": (_on_off, "cuda_graphs", "CUDA graphs (and torch.compile) on or off"),
    "--decode-start-timeout": (_seconds, "start_timeout_s", "seconds an engine may take to become ready"),
    "--decode-instances": (_positive_int, "engine_instances",
                           "engine instances started one after another per measurement (an A/A: their spread "
                           "is the noise a --baseline-update stores)"),
    "--decode-profile-steps": (_count, "profile_steps", "decode steps of the profiled trial behind the per-category "
                                                        "breakdown (0: no profiled trial)"),
}


def add_decode_options(group) -> None:
    """Register the decode family's options on the moebench option group (called from pytest_addoption)."""
    group.addoption("--decode-scenarios", metavar="PATH", default=None,
                    help=f"decode scenario file (default: <rootdir>/{DEFAULT_SCENARIOS})")
    group.addoption("--decode-log-dir", metavar="DIR", default=None,
                    help="keep every engine's log under DIR/<case id>/ (default: the test's tmp_path)")
    group.addoption("--decode-model", metavar="NAME=PATH", action="append", default=[],
                    type=lambda t: _split("--decode-model", t, _model_dir, need_name=True),
                    help="run scenario NAME on the model folder PATH (its weights; a folder with only "
                         "config.json runs with dummy weights); repeatable")
    for opt, (conv, _, text) in _OVERRIDES.items():
        group.addoption(opt, metavar="[NAME=]VALUE", action="append", default=[],
                        type=lambda t, opt=opt, conv=conv: _split(opt, t, conv),
                        help=f"{text}; for scenario NAME only, or all; repeatable")


def overrides_from(getoption: Callable[[str], Any]) -> list[Override]:
    """All overrides given on the command line, in option order."""
    out: list[Override] = list(getoption("decode_model") or [])
    for opt in _OVERRIDES:
        out.extend(getoption(opt.lstrip("-").replace("-", "_")) or [])
    return out


def apply_overrides(scenarios: list[Scenario], overrides: list[Override]) -> list[Scenario]:
    """Scenarios with the command-line overrides applied. Raises ScenarioError with one line naming the
    option for an unknown scenario name or a combination the scenario rules refuse."""
    names = [s.name for s in scenarios]
    by_name = {s.name: s for s in scenarios}
    for o in overrides:
        if o.scenario is not None and o.scenario not in by_name:
            raise ScenarioError(f"{o.option}: unknown scenario {o.scenario!r} (known: {', '.join(names)})")
        targets = [o.scenario] if o.scenario else names
        for n in targets:
            s = by_name[n]
            if o.option == "--decode-model":
                d = Path(o.value)
                s = replace(s, model=o.value, weights="checkpoint" if models.has_weights(d) else "dummy",
                            model_label=s.model_label if s.weights == "checkpoint" else "")
            else:
                field = _OVERRIDES[o.option][1]
                s = replace(s, **{field: (o.value,) if field == "engines" else o.value})
            try:
                by_name[n] = check_scenario(s, f"scenario {n!r}")
            except ScenarioError as e:
                raise ScenarioError(f"{o.option}: {e}") from None
    return [by_name[n] for n in names]
