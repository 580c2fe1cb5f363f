"""The `moebench` command (also `python -m moebench`): argument parsing, the subcommands, and errors
turned into one line and an exit code."""
