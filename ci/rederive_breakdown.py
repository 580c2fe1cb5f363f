#!/usr/bin/env python3
"""Re-derive the step breakdowns of a results file from the engine traces it was measured with.

A decode case's info.breakdown is computed on the device from its last engine instance's profiled
trial. When the breakdown's code changes after a device run (a category rule, how the busy time is
shared out), the traces that came back hold everything needed to compute it again: this writes a copy
of the results file whose cases carry the breakdown the current code derives, and says so in
info.breakdown_rederived (the trace, this tree's commit). Metrics are not touched (over several instances
they are medians); the re-derived kernel times per category must equal the stored breakdown's, or the
trace is not the one that breakdown came from and the case is refused.

    python3 ci/rederive_breakdown.py RESULTS TRACES --out NEW [--commit SHA]

TRACES is the folder the run's --decode-log-dir pointed at (one folder per case id, engine-I-N-profile
inside). Exit 1 when a case with a breakdown has no trace, or its kernel times disagree.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from moebench.decode.breakdown import breakdown
from moebench.decode.categories import CATEGORIES
from moebench.decode.options import DEFAULT_SCENARIOS
from moebench.decode.scenarios import cases_of, load_scenarios
from moebench.decode.sglang_engine import read_breakdown
from moebench.decode.sglang_trace import find_decode_trace
from moebench.decode.trace import load_events, split_steps

ROOT = Path(__file__).resolve().parents[1]


def last_profile(folder: Path) -> Path:
    """The last engine instance's profile folder (the one info.breakdown came from: moebench.decode.runner)."""
    found = sorted(folder.glob("engine-*-profile"), key=lambda p: [int(x) for x in p.name.split("-")[1:-1]])
    if not found:
        raise FileNotFoundError(f"{folder}: no engine-*-profile folder")
    return found[-1]


def rederive(case_doc: dict, profile: Path, steps: int) -> dict:
    """The breakdown JSON of one case from its profile folder, checked against the stored kernel times."""
    if case_doc["info"].get("engine", "").startswith("sglang"):
        trace = find_decode_trace(profile)
        b = read_breakdown(trace, steps)
    else:
        traces = sorted(profile.rglob("*.json*"))
        if len(traces) != 1:
            raise ValueError(f"{profile}: {len(traces)} trace files, not 1 (the runner writes one per profiled trial)")
        [trace] = traces
        b = breakdown(split_steps(load_events(trace), steps, str(trace)))
    for c in CATEGORIES:  # the stored breakdown keeps 4 decimals
        stored = case_doc["info"]["breakdown"]["categories"].get(c, {}).get("ms_per_step")
        if stored is not None and abs(stored - b.mean_ms(c)) > 6e-5:
            raise ValueError(f"{trace}: {c} reads {b.mean_ms(c):.6f} ms/step, the results say {stored:.6f}: "
                             "not the trace this case was measured with")
    return b.to_json() | {"rederived_from": str(trace)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", type=Path)
    p.add_argument("traces", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--commit", help="this tree's commit (default: git rev-parse --short HEAD)")
    a = p.parse_args(argv)
    commit = a.commit or subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                        capture_output=True, text=True, check=True).stdout.strip()
    doc = json.loads(a.results.read_text())
    steps_of = {c.id: c.scenario.profile_steps for c in cases_of(load_scenarios(ROOT / DEFAULT_SCENARIOS))}
    failed = 0
    for case in doc["cases"]:
        if not case.get("info", {}).get("breakdown"):
            continue
        cid = case["key"][case["key"].index("[") + 1:-1]
        try:
            bd = rederive(case, last_profile(a.traces / cid), steps_of[cid])
        except (OSError, ValueError, KeyError) as e:
            print(f"rederive_breakdown: {case['key']}: {e}", file=sys.stderr)
            failed += 1
            continue
        case["info"]["breakdown"] = bd
        case["info"]["breakdown_rederived"] = {"commit": commit, "trace": bd.pop("rederived_from")}
        print(f"{case['key']}: breakdown re-derived ({bd['steps']} steps, GPU busy {bd['gpu_busy_ms_per_step']} ms)")
    fd, tmp = tempfile.mkstemp(dir=a.out.parent, prefix=f".{a.out.name}.")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, a.out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
