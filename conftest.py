"""Registers the moebench pytest plugin for every run from the repository root."""
pytest_plugins = ["moebench.plugin"]
