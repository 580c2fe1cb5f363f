"""Merge a sweep's winning configs into configs.json (the table config_for reads).

    python -m moebench.gemm.triton_moe.apply_sweep SWEEP.json

Entries the sweep did not cover keep their bytes; the file's `_sweeps` list records which sweep
(device, date, torch/triton versions) each run of this command merged, so the table says where its
numbers came from.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from moebench.core.files import atomic_write_text

TABLE = Path(__file__).with_name("configs.json")


def merge(table: dict, sweep: dict) -> tuple[dict, int]:
    """The table with the sweep's winners written over it, and how many entries changed."""
    out = dict(table)
    changed = 0
    for key, cfg in sweep.get("table", {}).items():
        if out.get(key) != cfg:
            out[key] = cfg
            changed += 1
    record = {"device": sweep.get("device"), "torch": sweep.get("torch"), "triton": sweep.get("triton"),
              "merged": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "entries": len(sweep.get("table", {}))}
    if sweep.get("what"):  # which tool wrote the table (w4_tune.py says so; the config sweep does not)
        record["what"] = sweep["what"]
    if changed:  # the history lists the sweeps that changed the table
        out["_sweeps"] = [*table.get("_sweeps", []), record]
    return out, changed


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m moebench.gemm.triton_moe.apply_sweep SWEEP.json", file=sys.stderr)
        return 2
    try:
        sweep = json.loads(Path(args[0]).read_text())
    except (OSError, json.JSONDecodeError) as e:
        print(f"apply_sweep: {args[0]}: {e}", file=sys.stderr)
        return 2
    table, changed = merge(json.loads(TABLE.read_text()), sweep)
    atomic_write_text(TABLE, json.dumps(table, indent=2, sort_keys=True) + "\n")
    print(f"apply_sweep: {changed} config(s) merged into {TABLE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
