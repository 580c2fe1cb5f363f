"""How each engine is started for a case: server command lines, the in-process LLM kwargs, the env.

Everything a scenario pins goes on the command line explicitly (MoE and attention backend, CUDA
graphs, TP, dtype), and prefix caching is off so that no trial's TTFT is a cache hit.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from moebench.decode import models
from moebench.decode.scenarios import DecodeCase
from moebench.core.sites import site_paths

SERVED_NAME = "moebench"

# Set for every engine unless the caller's environment already says otherwise: the FlashInfer sampler
# would import flashinfer, which the GPU image does not have; on a CPU the KV cache gets 1 GiB (the
# default takes a fraction of RAM that a 24 GB box cannot spare next to the weights).
ENGINE_ENV_DEFAULTS = {"VLLM_USE_FLASHINFER_SAMPLER": "0"}
CPU_ENV_DEFAULTS = {"VLLM_CPU_KVCACHE_SPACE": "1"}
# A folder SGLang was staged into apart from vLLM's (their pins differ: openai, transformers, tvm-ffi), put
# first on the path of SGLang's processes only (ci/stage_engine.py, docs/sglang.md).
SGLANG_SITE_ENV = "MOEBENCH_SGLANG_SITE"
# SGLang's KV pool, in tokens: one stream of a few hundred tokens needs megabytes, but without a cap SGLang
# fills --mem-fraction-static (39.7 GB on the H200 Kimi rank). 4096 holds the stream, its prefill chunk and
# the warm-up request with room to spare.
SGLANG_KV_TOKENS = 4096
# SGLang 0.5.15 derives a gRPC port (its --port + 10000) and refuses to start when that passes 65535, gRPC on
# or not (server_args._handle_deprecated_args): a free port from the kernel's ephemeral range (up to 60999)
# failed one of six starts that way on the H200 (a fifth of that range is above 55535). Its servers get a
# port under this.
SGLANG_PORT_BELOW = 65536 - 10000


def port_below(case: DecodeCase) -> int | None:
    """The bound a case's server port must stay under (None: any free port)."""
    return SGLANG_PORT_BELOW if case.engine_kind == "sglang-server" else None



def max_model_len(case: DecodeCase) -> int:
    """Prompt + output + margin, rounded up to 256: a small KV cache and few CUDA-graph sizes."""
    need = case.scenario.prompt_tokens + case.scenario.output_tokens + 16
    return (need + 255) // 256 * 256


def engine_env(case: DecodeCase, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment an engine process runs with: the caller's, our defaults where unset, the
    scenario's own `env`, and moebench importable (the in-process worker imports it)."""
    env = dict(os.environ if base is None else base)
    defaults = dict(ENGINE_ENV_DEFAULTS)
    if case.scenario.device == "cpu":
        defaults.update(CPU_ENV_DEFAULTS)
    for k, v in defaults.items():
        env.setdefault(k, v)
    env.update(dict(case.scenario.env))
    front = [str(Path(__file__).resolve().parents[2])]
    from moebench.decode import vllm_moe_hook  # light: the vLLM side loads only inside the engine

    env.pop(vllm_moe_hook.ENV, None)  # a stray variable must not swap the kernel of a Marlin case
    if case.scenario.moe_hook:
        env[vllm_moe_hook.ENV] = case.scenario.moe_hook
        front.append(vllm_moe_hook.hook_path())  # its .dist-info makes vLLM load the hook
    if case.engine_family == "sglang" and env.get(SGLANG_SITE_ENV):
        front += site_paths(env[SGLANG_SITE_ENV])
    env["PYTHONPATH"] = os.pathsep.join(front + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                 if p and p not in front])
    env.setdefault("PYTHONUNBUFFERED", "1")  # log lines reach the file as they happen
    return env


def env_recorded(env: dict[str, str]) -> dict[str, str]:
    """The engine-relevant variables of an environment, for the results (VLLM_*, SGLANG_*, NCCL_*,
    CUDA_VISIBLE_DEVICES, OMP_NUM_THREADS)."""
    keep = ("VLLM_", "SGLANG_", "NCCL_", "TORCH_CUDA", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")
    return {k: v for k, v in sorted(env.items()) if k.startswith(keep)}


def _template(args: tuple[str, ...], values: dict[str, Any]) -> list[str]:
    return [a.format(**values) for a in args]


def server_command(case: DecodeCase, model_dir: Path, port: int, python: str = sys.executable) -> list[str]:
    """The command line that starts the case's server, listening on 127.0.0.1:port."""
    s = case.scenario
    values = {"python": python, "model": str(model_dir), "port": port, "host": "127.0.0.1", "tp": s.tp,
              "served_name": SERVED_NAME}
    if s.server_command:
        return _template(s.server_command, values) + _template(s.server_args, values)
    dummy = s.weights == "dummy"
    if case.engine_kind == "vllm-server":
        # The api_server module, not `vllm serve`: vllm-cpu's CLI stops at start (it looks up a
        # distribution named `vllm`), and the GPU image has no `vllm` on PATH.
        cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
               "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
               "--tensor-parallel-size", str(s.tp), "--dtype", s.dtype, "--max-model-len", str(max_model_len(case)),
               "--max-num-seqs", "1", "--gpu-memory-utilization", str(s.gpu_memory_fraction),
               "--moe-backend", s.moe_backend, "--no-enable-prefix-caching", "--seed", "0"]
        if dummy:
            cmd += ["--load-format", "dummy"]
        if not models.has_tokenizer(model_dir):
            cmd += ["--skip-tokenizer-init"]
        if s.quantization:
            cmd += ["--quantization", s.quantization]
        if s.attention_backend != "auto":
            cmd += ["--attention-backend", s.attention_backend]
        if not s.cuda_graphs:
            cmd += ["--enforce-eager"]
    elif case.engine_kind == "sglang-server":
        cmd = [python, "-m", "sglang.launch_server", "--model-path", str(model_dir),
               "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
               "--tensor-parallel-size", str(s.tp), "--dtype", s.dtype, "--context-length", str(max_model_len(case)),
               "--max-running-requests", "1", "--mem-fraction-static", str(s.gpu_memory_fraction),
               "--moe-runner-backend", s.moe_backend, "--disable-radix-cache", "--random-seed", "0",
               "--max-total-tokens", str(max(SGLANG_KV_TOKENS, 4 * max_model_len(case))),
               # no constrained decoding here: no grammar backend to import (xgrammar is not staged)
               "--grammar-backend", "none"]
        if dummy:
            cmd += ["--load-format", "dummy"]
        if not models.has_tokenizer(model_dir):
            # token-id prompts through the native /generate (sglang_engine.py): no tokenizer needed
            cmd += ["--skip-tokenizer-init"]
        if s.quantization:
            cmd += ["--quantization", s.quantization]
        if s.attention_backend != "auto":
            cmd += ["--attention-backend", s.attention_backend]
        if not s.cuda_graphs:
            cmd += ["--disable-cuda-graph"]
    else:
        raise ValueError(f"{case.engine} is not a server engine moebench starts")
    return cmd + _template(s.server_args, values)


def llm_kwargs(case: DecodeCase, model_dir: Path) -> dict[str, Any]:
    """Keyword arguments of vllm.LLM for the in-process engine."""
    s = case.scenario
    kw: dict[str, Any] = {
        "model": str(model_dir), "tensor_parallel_size": s.tp, "dtype": s.dtype,
        "max_model_len": max_model_len(case), "max_num_seqs": 1, "gpu_memory_utilization": s.gpu_memory_fraction,
        "moe_backend": s.moe_backend, "enable_prefix_caching": False, "enforce_eager": not s.cuda_graphs,
        "seed": 0, "disable_log_stats": True,
        "skip_tokenizer_init": not models.has_tokenizer(model_dir),
    }
    if s.weights == "dummy":
        kw["load_format"] = "dummy"
    if s.quantization:
        kw["quantization"] = s.quantization
    if s.attention_backend != "auto":
        kw["attention_backend"] = s.attention_backend
    kw.update(dict(s.engine_kwargs))
    return kw


def prompt_ids(case: DecodeCase, trial: int, vocab_size: int) -> list[int]:
    """A deterministic prompt of token ids, different for every trial (no prefix is ever reused).
    Ids start above 10 to stay clear of special tokens (BOS/EOS/pad sit at the bottom in these vocabs)."""
    import random

    rng = random.Random(1000 + trial)
    hi = max(11, min(vocab_size, 32000) - 1)
    return [rng.randint(10, hi) for _ in range(case.scenario.prompt_tokens)]
