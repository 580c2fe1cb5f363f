"""Baselines: the versioned file schema, atomic storage, and the pure verdict logic."""
