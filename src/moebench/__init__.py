"""moebench: regression benchmarks for MoE LLM decode, gated against stored baselines.

Importing this package never touches CUDA: collection must stay fast and work on CPU boxes.
"""

__version__ = "0.1.0"
