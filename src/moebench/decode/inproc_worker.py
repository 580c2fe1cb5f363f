"""The process that hosts vLLM's in-process engine (the `LLM` class) for one case.

Run as `python -m moebench.decode.inproc_worker --spec SPEC.json --events-fd N` by
moebench.decode.inproc, never imported by the test process: vLLM (and CUDA) stay out of pytest, and
the harness can stop the engine with its whole process group when it hangs.

Protocol: one JSON command per line on stdin ({"cmd": "trial", "index", "prompt", "max_tokens"},
{"cmd": "profile", "index", "prompt", "steps"} or {"cmd": "stop"}); one JSON event per line on fd N
({"event": "ready"|"trial"|"profile"|"error", ...}). Engine
logs go to stdout/stderr, which the parent sends to the case's log file. End of stdin (the parent is
gone) ends the worker, and vLLM's exit hooks stop its engine processes.

Per-token timing: vLLM's LLMEngine step loop with output_kind=DELTA hands back each step's new tokens;
each step's return is stamped with time.perf_counter(), relative to the moment the request was added.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback


def _run_trial(engine, params_cls, kind, cmd: dict, detokenize: bool) -> dict:
    n = int(cmd["max_tokens"])
    params = params_cls(max_tokens=n, min_tokens=n, ignore_eos=True, temperature=0.0, output_kind=kind,
                        detokenize=detokenize)
    chunks: list[list[float]] = []
    ids: list[int] = []
    t0 = time.perf_counter()
    engine.add_request(f"moebench-{cmd['index']}", {"prompt_token_ids": cmd["prompt"]}, params)
    while engine.has_unfinished_requests():
        for out in engine.step():
            now = time.perf_counter() - t0
            new = list(out.outputs[0].token_ids) if out.outputs else []
            if new:
                chunks.append([now, len(new)])
                ids.extend(int(t) for t in new)
    return {"event": "trial", "index": cmd["index"], "chunks": chunks, "token_ids": ids}


def _run_profiled(engine, params_cls, kind, cmd: dict, detokenize: bool) -> dict:
    """A trial whose decode steps after the first token run under the engine's profiler (its
    profiler_config): prefill stays out of the window, and the trace holds exactly `steps` decode steps
    plus whatever the engine had in flight when profiling started and stopped."""
    steps = int(cmd["steps"])
    params = params_cls(max_tokens=steps + 1, min_tokens=steps + 1, ignore_eos=True, temperature=0.0,
                        output_kind=kind, detokenize=detokenize)
    engine.add_request(f"moebench-profile-{cmd['index']}", {"prompt_token_ids": cmd["prompt"]}, params)
    tokens = 0
    while tokens == 0 and engine.has_unfinished_requests():
        tokens += sum(len(out.outputs[0].token_ids) for out in engine.step() if out.outputs)
    engine.start_profile()
    t0 = time.perf_counter()
    while engine.has_unfinished_requests():
        tokens += sum(len(out.outputs[0].token_ids) for out in engine.step() if out.outputs)
    wall = time.perf_counter() - t0
    engine.stop_profile()  # returns once the trace is written
    return {"event": "profile", "index": cmd["index"], "tokens": tokens, "steps": steps, "wall_s": wall}


def main(argv: list[str] | None = None) -> int:
    """Start the engine, say 'ready', then run trials as commanded until 'stop' or end of stdin."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", required=True, help="JSON file: {'llm_kwargs': {...}, 'detokenize': bool}")
    ap.add_argument("--events-fd", type=int, required=True)
    args = ap.parse_args(argv)
    events = os.fdopen(args.events_fd, "w", buffering=1)

    def send(ev: dict) -> None:
        events.write(json.dumps(ev) + "\n")
        events.flush()

    with open(args.spec, encoding="utf-8") as f:
        spec = json.load(f)
    try:
        t0 = time.perf_counter()
        import vllm
        from vllm import LLM, SamplingParams
        from vllm.sampling_params import RequestOutputKind

        llm = LLM(**spec["llm_kwargs"])
        send({"event": "ready", "start_s": time.perf_counter() - t0, "vllm_version": getattr(vllm, "__version__", None)})
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd.get("cmd") == "stop":
                break
            run = _run_profiled if cmd.get("cmd") == "profile" else _run_trial
            send(run(llm.llm_engine, SamplingParams, RequestOutputKind.DELTA, cmd, spec.get("detokenize", False)))
    except BaseException as e:  # noqa: BLE001 - report any failure to the parent before dying
        traceback.print_exc()
        sys.stdout.flush()
        try:
            send({"event": "error", "message": f"{type(e).__name__}: {e}"[:500]})
        except OSError:
            pass
        return 1
    return 0


if __name__ == "__main__":  # the engine spawns processes: nothing may run at import
    sys.exit(main())
