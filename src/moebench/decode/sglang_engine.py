"""An SGLang server driven through its native API: token-id prompts streamed from `/generate`, and a
profiled trial through `/start_profile` (stdlib only; read against SGLang 0.5.15's source).

Why `/generate`: the shipped model folders are configs without a tokenizer, and SGLang's OpenAI API needs
one; with `--skip-tokenizer-init` the native endpoint takes `input_ids` and streams token ids back.
The request is greedy with `ignore_eos` and `max_new_tokens`, which give exactly that many tokens
(`min_new_tokens` is refused under --skip-tokenizer-init: it needs the tokenizer's EOS id).

What a streamed event holds (managers/tokenizer_manager.py, BatchTokenIDOutput):
  data: {"output_ids": [...], "meta_info": {"id", "finish_reason", "prompt_tokens", "completion_tokens", ...}}
  ... data: [DONE]
`output_ids` is the whole output so far by default and only the new ids with
`--incremental-streaming-output`; `meta_info.completion_tokens` is the running count either way. So a
chunk carries the tokens by which completion_tokens grew, and their ids are the tail of `output_ids`;
an event that adds no token (a repeated final state) is not a chunk. Several steps' tokens in one event
(a slow reader: the server merges what waited) count as one chunk of several tokens, as stats.Trial
expects.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

from moebench.decode import openai_stream
from moebench.decode.breakdown import Breakdown, breakdown
from moebench.decode.openai_stream import StreamBroken, StreamResult
from moebench.decode.procs import EngineError
from moebench.decode.server import ServerEngine
from moebench.decode.sglang_trace import find_decode_trace, sglang_category, split_by_graph_launches
from moebench.decode.trace import TraceError, load_events

PROFILE_ID = "moebench"
# decode steps run past the profiled ones, so the profiler's stop (at step N + 1) happens inside the request
PROFILE_EXTRA_TOKENS = 8


def generate_payload(prompt_ids: list[int], max_tokens: int) -> dict:
    """The /generate body: a token-id prompt, greedy, exactly max_tokens tokens, streamed."""
    return {"input_ids": prompt_ids, "stream": True,
            "sampling_params": {"max_new_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0}}


def take_event(res: StreamResult, obj: dict, now: float) -> None:
    """Add one /generate event to the stream's timeline (see the module docstring)."""
    if "error" in obj:
        raise StreamBroken(f"the server sent an error mid-stream: {str(obj['error'])[:300]}")
    meta = obj.get("meta_info")
    total = meta.get("completion_tokens") if isinstance(meta, dict) else None
    if not isinstance(total, int):
        raise StreamBroken(f"a /generate event without meta_info.completion_tokens: {str(obj)[:200]}")
    ids = obj.get("output_ids") or []
    new = total - res.usage_tokens if res.usage_tokens is not None else total
    if new < 0:
        raise StreamBroken(f"completion_tokens went back from {res.usage_tokens} to {total}")
    if new == 0:
        return
    if len(ids) == total:  # the whole output so far (SGLang's default)
        tail = ids[-new:]
    elif len(ids) == new:  # only the new ids (--incremental-streaming-output)
        tail = ids
    else:
        raise StreamBroken(f"an event with {len(ids)} output ids for {new} new tokens ({total} so far)")
    res.chunks.append((now, new))
    res.token_ids.extend(int(i) for i in tail)
    res.usage_tokens = total


def stream_generate(url: str, payload: dict, *, read_timeout: float, deadline: float) -> StreamResult:
    """POST /generate with stream: true and time every event until `data: [DONE]`."""
    res = StreamResult()
    post = openai_stream.post_stream
    post(url, "/generate", payload, lambda obj, now: take_event(res, obj, now), lambda: res.usage_tokens or 0,
         read_timeout=read_timeout, deadline=deadline)
    return res


def profile_request(folder: Path, steps: int) -> dict:
    """The /start_profile body: N decode steps by stage, GPU and CPU activity (the launches), no stacks."""
    return {"output_dir": str(folder), "num_steps": steps, "profile_by_stage": True, "activities": ["CPU", "GPU"],
            "with_stack": False, "record_shapes": False, "profile_id": PROFILE_ID}


def jit_cache_dir(env: dict[str, str] | None) -> Path:
    """Where SGLang's JIT kernels (tvm-ffi's load_inline) are cached for an engine environment:
    $TVM_FFI_CACHE_DIR, else ~/.cache/tvm-ffi (sglang/jit_kernel/utils.py, 0.5.15)."""
    env = os.environ if env is None else env
    raw = env.get("TVM_FFI_CACHE_DIR") or "~/.cache/tvm-ffi"
    home = env.get("HOME") or os.path.expanduser("~")
    return Path(raw.replace("~", home, 1) if raw.startswith("~") else raw)


def jit_modules(folder: Path) -> int:
    """How many built JIT modules (a .so in a module's folder) a cache folder holds."""
    return sum(1 for _ in folder.glob("*/*.so")) if folder.is_dir() else 0


class SGLangServerEngine(ServerEngine):
    """ServerEngine whose trials go through SGLang's native /generate, with a profiled trial."""

    def __init__(self, *args, profile_dir: Path | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.profile_dir = profile_dir
        self.jit_cache: dict = {}

    def start(self, progress: Callable[[str], None] = lambda s: None) -> float:
        """Start the server; also count its JIT cache's modules before and after, so a result shows
        whether this start compiled SGLang's kernels (the first on a machine) or reused them."""
        folder = jit_cache_dir(self.env)
        before = jit_modules(folder)
        took = super().start(progress)
        self.jit_cache = {"dir": str(folder), "modules_before": before, "modules_after_start": jit_modules(folder)}
        return took

    def stop(self) -> list[int]:
        """Stop the server; the JIT cache is counted once more (kernels first called by a trial build then)."""
        left = super().stop()
        if self.jit_cache:
            self.jit_cache["modules_at_stop"] = jit_modules(Path(self.jit_cache["dir"]))
        return left

    def stream(self, prompt: list[int], max_tokens: int) -> StreamResult:
        """One streamed /generate request."""
        return stream_generate(self.url, generate_payload(prompt, max_tokens), read_timeout=self.trial_timeout,
                               deadline=time.monotonic() + self.trial_timeout)

    def profile(self, index: int, prompt: list[int], steps: int, timeout: float,
                sleep: Callable[[float], None] = time.sleep) -> Path:
        """Profile `steps` decode steps of one request (apart from the timed trials); returns the trace
        SGLang wrote, waiting up to `timeout` s for it (the scheduler writes it after the last step)."""
        if self.profile_dir is None:
            raise EngineError("profiled trial: no folder for the trace was given")
        self.profile_dir.mkdir(parents=True, exist_ok=True)
        try:
            status, text = openai_stream.post_json(self.url, "/start_profile", profile_request(self.profile_dir, steps),
                                                   timeout=30.0)
        except OSError as e:
            raise self._fail(f"profiled trial: POST /start_profile failed: {e}") from None
        if status != 200:
            raise self._fail(f"profiled trial: POST /start_profile answered HTTP {status}: {text.strip()[:300]}")
        self.trial(index, prompt, steps + PROFILE_EXTRA_TOKENS, warmup=True, name="profiled trial")
        deadline, seen = time.monotonic() + timeout, None
        while True:
            try:
                trace = find_decode_trace(self.profile_dir)
                now = (trace, trace.stat().st_size)
                if now == seen and now[1] > 0:  # the same size twice: written
                    return trace
                seen, why = now, f"{trace} was still being written"
            except TraceError as e:
                why = str(e)
            if time.monotonic() > deadline:
                raise self._fail(f"profiled trial: {why} after {timeout:.0f} s")
            sleep(0.5)


def read_breakdown(trace: Path, steps: int) -> Breakdown:
    """The per-category breakdown of an SGLang decode trace (its steps told apart by graph launches)."""
    return breakdown(split_by_graph_launches(load_events(trace), steps, str(trace)), classify=sglang_category)
