#!/usr/bin/env python3
"""Read ci/matrix.toml: print the GitHub Actions matrix of an event, or one field of one job.

    python3 ci/matrix.py --event schedule                      # {"include": [...]} for the workflow
    python3 ci/matrix.py --event workflow_dispatch --markers "gemm and triton"   # one ad-hoc job
    python3 ci/matrix.py --job cpu --field markers             # what ci/nightly.sh --cpu runs
    python3 ci/matrix.py --list                                # a readable table of the jobs

Standard library only (tomllib, Python 3.11+): it runs before anything is installed. A malformed
matrix file is one line naming the file and the field, exit code 2.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tomllib
from pathlib import Path

DEFAULT_FILE = Path(__file__).resolve().parent / "matrix.toml"
EVENTS = ("schedule", "workflow_dispatch", "pull_request")
FIELDS = ("name", "markers", "runs_on", "timeout_minutes", "gpus", "events", "workers")


class MatrixError(ValueError):
    """The matrix file cannot be used; one line naming the file and field."""


def _check(cond: bool, where: str, what: str) -> None:
    if not cond:
        raise MatrixError(f"{where}: {what}")


def load(path: Path = DEFAULT_FILE) -> list[dict]:
    """The jobs of the matrix file, defaults applied and every field checked."""
    try:
        doc = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MatrixError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as e:
        raise MatrixError(f"{path}: invalid TOML: {e}") from None
    defaults = doc.get("defaults", {})
    _check(isinstance(defaults, dict), f"{path}: defaults", "must be a table")
    jobs_raw = doc.get("job")
    _check(isinstance(jobs_raw, list) and jobs_raw, f"{path}: job", "needs at least one [[job]]")
    jobs, names = [], set()
    for i, raw in enumerate(jobs_raw):
        job = {**defaults, **raw}
        where = f"{path}: job[{i}]" + (f" ({job['name']})" if isinstance(job.get("name"), str) else "")
        unknown = sorted(set(job) - set(FIELDS))
        _check(not unknown, where, f"unknown field(s) {', '.join(unknown)} (known: {', '.join(FIELDS)})")
        job.setdefault("workers", 0)  # optional: one pytest process unless a job asks for -n
        for f in FIELDS:
            _check(f in job, f"{where}.{f}", "missing (and no default)")
        _check(isinstance(job["name"], str) and re.fullmatch(r"[a-z0-9][a-z0-9_-]*", job["name"]) is not None,
               f"{where}.name", "must be lowercase letters, digits, '-' or '_'")
        _check(job["name"] not in names, f"{where}.name", "appears twice")
        names.add(job["name"])
        _check(isinstance(job["markers"], str) and job["markers"].strip() != "", f"{where}.markers", "must be a non-empty -m expression")
        _check(isinstance(job["runs_on"], list) and job["runs_on"] and all(isinstance(x, str) for x in job["runs_on"]),
               f"{where}.runs_on", "must be a non-empty list of runner labels")
        for f in ("timeout_minutes", "gpus"):
            _check(isinstance(job[f], int) and not isinstance(job[f], bool) and job[f] >= (1 if f == "timeout_minutes" else 0),
                   f"{where}.{f}", f"must be an integer >= {1 if f == 'timeout_minutes' else 0}, got {job[f]!r}")
        w = job["workers"]
        _check(w == "auto" or (isinstance(w, int) and not isinstance(w, bool) and w >= 0), f"{where}.workers",
               f"must be \"auto\" (one pytest-xdist worker per GPU) or an integer >= 0 (0: one process), got {w!r}")
        _check(isinstance(job["events"], list) and all(e in EVENTS for e in job["events"]), f"{where}.events",
               f"must be a list of {', '.join(EVENTS)}, got {job['events']!r}")
        jobs.append(job)
    return jobs


def for_event(jobs: list[dict], event: str, markers: str = "") -> list[dict]:
    """The jobs a GitHub event runs. A manual dispatch with a marker expression runs that expression as
    one job on the default runner (every GPU), whatever the file lists for dispatches."""
    if event == "workflow_dispatch" and markers.strip():
        base = next((j for j in jobs if j["name"] == "gemm"), jobs[0])
        return [{**base, "name": "dispatch", "markers": markers.strip(), "gpus": max(j["gpus"] for j in jobs),
                 "timeout_minutes": max(j["timeout_minutes"] for j in jobs)}]
    return [j for j in jobs if event in j["events"]]


def job(jobs: list[dict], name: str) -> dict:
    """One job by name."""
    for j in jobs:
        if j["name"] == name:
            return j
    raise MatrixError(f"--job {name!r}: no such job (jobs: {', '.join(j['name'] for j in jobs)})")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="ci/matrix.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--file", type=Path, default=DEFAULT_FILE, help="matrix file (default: ci/matrix.toml)")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--event", choices=EVENTS, help="print {\"include\": [jobs]} for this event, as one JSON line")
    what.add_argument("--job", metavar="NAME", help="one job (with --field: one field of it)")
    what.add_argument("--list", action="store_true", help="a table of the jobs")
    p.add_argument("--markers", default="", help="with --event workflow_dispatch: run this expression as one job")
    p.add_argument("--field", choices=FIELDS, help="with --job: print only this field")
    args = p.parse_args(argv)
    try:
        jobs = load(args.file)
        if args.event:
            print(json.dumps({"include": for_event(jobs, args.event, args.markers)}, separators=(",", ":")))
        elif args.job:
            j = job(jobs, args.job)
            v = j[args.field] if args.field else j
            print(v if isinstance(v, (str, int)) else json.dumps(v))
        else:
            for j in jobs:
                print(f"{j['name']:<10} {j['timeout_minutes']:>4} min  {j['gpus']} GPU  "
                      + (f"-n {j['workers']}  " if j["workers"] else "") +
                      f"[{', '.join(j['runs_on'])}]  on {', '.join(j['events']) or '(CPU mode only)'}:  -m {j['markers']!r}")
    except MatrixError as e:
        print(f"ci/matrix.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
