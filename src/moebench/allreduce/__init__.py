"""The `allreduce` family: tensor-parallel allreduce at decode and prefill sizes, over the box's GPUs.

Parent side (pytest process; no torch import, no CUDA init):
  cases.py         the case record (named axes -> id, key, definition) and the default / full selection
  bandwidth.py     algbw / busbw arithmetic
  requirements.py  why a case cannot run here (GPU count, vllm, link type, vLLM's size limit)
  protocol.py      the group spec the parent hands to its ranks, and the message lines they send back
  processes.py     process-group plumbing: free port, spawn in a new session, kill a group, find leftovers
  launcher.py      runs one group of ranks under deadlines and always tears it down
  runner.py        session cache: one launch per (backend, world size, env variant), results per case
  bench.py         what a benchmark case does: skip / fail / record through the `moebench` fixture

Rank side (spawned `python -m moebench.allreduce.rank`; imports torch):
  rank.py          the rank's main: hello, rendezvous, every job of the group, bye
  collectives.py   nccl / gloo / vllm_custom_ar: process groups, the K-op callables, graph capture
  sampling.py      the fill pattern and its check, and the synchronized timing loop
"""
