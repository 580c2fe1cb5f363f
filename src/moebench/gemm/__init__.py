"""The expert GEMM family: per-expert grouped GEMMs of MoE decode, across MoE backends."""
