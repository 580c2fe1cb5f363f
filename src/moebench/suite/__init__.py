"""The pytest side: the plugin's session state, what -m selects, strict runs, outcomes, signals, the
families' registries (options, tables) and the GPU placement under -n auto. The hooks themselves are
moebench.plugin, the entry point `-p moebench.plugin` names."""
