"""The `decode` family: full single-stream decode through a real engine, against stored baselines.

The number users feel is milliseconds per output token for one stream. A case runs a scenario
(benchmarks/decode_scenarios.toml) through one engine, pins and records what the engine chose, and
gates steady-state ms/token and TTFT; warm-up trials are reported apart.

- scenarios: the scenario file, validation, cases (scenario x engine), keys, markers, definitions
- options: --decode-* command-line options and applying them to scenarios
- models: the configs shipped under models/ (dummy weights), reading a model folder
- commands: server command lines, in-process LLM kwargs, engine environment, prompts
- inproc / inproc_worker: vLLM's LLM class driven step by step in a worker process we own
- server / openai_stream: an OpenAI-compatible server started (or reached) and streamed
- sglang_engine / sglang_trace: SGLang through its native /generate, its profiled trial and trace steps
- procs: process groups, teardown, log tails; engine_log: what the engine says it chose
- stats: TTFT, inter-token latency, steady state; floor: weight bytes per token
- runner: one case from requirements to verdict

Nothing here imports vllm, sglang or torch at import time: collection stays fast on any machine.
"""
