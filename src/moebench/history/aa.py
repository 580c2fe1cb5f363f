"""`moebench aa`: repeat a selection in N separate processes and read how much it moves on its own.

    moebench aa --runs 3 --out aa/ -- benchmarks/ -m "gemm and triton"
    moebench aa --runs 3 --out aa/ --promote baselines/ -- benchmarks/ -m "gemm and triton"

Each run is `python -m pytest PYTEST_ARGS --results-json OUT/run-<i>.json`, gated as usual against the
baselines the arguments name (default baselines/). Then one table: per case its primary metric in every
run, the spread between the runs (half the range over the median: what a baseline of these runs stores
as its noise) and the verdicts the runs read. A run that read REGRESSION or IMPROVEMENT on unchanged code
is a false alarm: the exit code is 1 when any run was flagged, 0 otherwise, 2 on bad input.

--per-gpu runs the selection once on each GPU of the box, one process after the other, each seeing only
its GPU (CUDA_VISIBLE_DEVICES) while its hardware key and machine id stay the box's (hardware.BOX_ENV,
as an -n worker's do): the table's columns are the GPUs and its spread the spread between them.

--promote DIR stores the runs as baselines (`moebench baselines promote` of every run file: the median,
with the spread between the runs): how a user's own runner records the entries it will gate against.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from moebench.core import hardware
from moebench.core.ncu_launch import KEEP_ENV
from moebench.baselines.combine import half_range
from moebench.baselines.compare import Verdict
from moebench.results.document import ResultsDoc, read_json

FLAGGED = (Verdict.REGRESSION.value, Verdict.IMPROVEMENT.value)


@dataclass(frozen=True)
class CaseSpread:
    """One case over the runs: its primary metric per run (None where a run did not measure it)."""

    key: str
    metric: str
    unit: str
    values: tuple[float | None, ...]
    verdicts: tuple[str | None, ...]

    @property
    def spread(self) -> float:
        """Half the range of the measured values over their median (0 for fewer than two)."""
        return half_range([v for v in self.values if v is not None])

    @property
    def flagged(self) -> bool:
        """Whether any run read REGRESSION or IMPROVEMENT."""
        return any(v in FLAGGED for v in self.verdicts)


def run_command(pytest_args: Sequence[str], results: Path) -> list[str]:
    """The pytest command of one run."""
    return [sys.executable, "-m", "pytest", *pytest_args, "--results-json", str(results)]


def keep_env(run: int) -> dict | None:
    """The environment of run `run` when MOEBENCH_NCU_KEEP names a folder: the run keeps ncu's raw tables in
    its own subfolder (run-<i>), where each run's chunk files would otherwise overwrite the last's; None
    (inherit the environment) otherwise."""
    folder = os.environ.get(KEEP_ENV)
    return {**os.environ, KEEP_ENV: os.path.join(folder, f"run-{run}")} if folder else None


def repeat(pytest_args: Sequence[str], out: Path, runs: int, *, budget_s: float | None = None,
           say: Callable[[str], None] = print, runner=subprocess.run) -> list[Path]:
    """Run the selection `runs` times, one process each, and return the results files written. With a
    time budget, no run starts once the runs so far, at their mean length, would not fit in it."""
    out.mkdir(parents=True, exist_ok=True)
    done: list[Path] = []
    start = time.monotonic()
    for i in range(1, runs + 1):
        spent = time.monotonic() - start
        if budget_s is not None and done and spent + spent / len(done) > budget_s:
            say(f"moebench aa: {len(done)} of {runs} runs in {spent:.0f} s; another would pass the {budget_s:.0f} s budget")
            break
        path = out / f"run-{i}.json"
        cmd = run_command(pytest_args, path)
        say(f"moebench aa: run {i}/{runs}: {' '.join(cmd[1:])}")
        env = keep_env(i)
        rc = (runner(cmd) if env is None else runner(cmd, env=env)).returncode
        if not path.is_file():
            say(f"moebench aa: run {i} wrote no results (pytest exit {rc}); stopping")
            break
        say(f"moebench aa: run {i} done (pytest exit {rc}, {time.monotonic() - start:.0f} s so far)")
        done.append(path)
    return done


def per_gpu(pytest_args: Sequence[str], out: Path, *, say: Callable[[str], None] = print,
            runner=subprocess.run) -> list[Path]:
    """Run the selection once on each GPU of the box, one process at a time (so no run disturbs another),
    each seeing only its GPU; return the results files written, gpu-<index>.json."""
    out.mkdir(parents=True, exist_ok=True)
    box = hardware.box_visible_env()
    done: list[Path] = []
    for gpu in hardware.fingerprint().get("gpus") or []:
        path = out / f"gpu-{gpu['index']}.json"
        env = {**os.environ, hardware.BOX_ENV: box if box is not None else hardware.ALL,
               "CUDA_VISIBLE_DEVICES": str(gpu["index"]), "CUDA_DEVICE_ORDER": os.environ.get("CUDA_DEVICE_ORDER", "PCI_BUS_ID")}
        cmd = run_command(pytest_args, path)
        say(f"moebench aa: GPU {gpu['index']} ({gpu.get('uuid')}): {' '.join(cmd[1:])}")
        rc = runner(cmd, env=env).returncode
        if not path.is_file():
            say(f"moebench aa: the run on GPU {gpu['index']} wrote no results (pytest exit {rc}); stopping")
            break
        done.append(path)
    return done


def spreads(docs: Sequence[ResultsDoc]) -> list[CaseSpread]:
    """Every case of any run, its primary metric (the first run's that measured it) across the runs."""
    keys = sorted({k for d in docs for k in d.cases})
    out = []
    for k in keys:
        first = next(d.cases[k] for d in docs if k in d.cases)
        name = first.primary or next(iter(first.metrics), "")
        vals, verdicts = [], []
        for d in docs:
            c = d.cases.get(k)
            m = c.metrics.get(name) if c else None
            vals.append(m.metric.value if m else None)
            verdicts.append(c.verdict if c else None)
        unit = first.metrics[name].metric.unit if name in first.metrics else ""
        out.append(CaseSpread(k, name, unit, tuple(vals), tuple(verdicts)))
    return out


def load_runs(paths: Sequence[Path]) -> list[ResultsDoc]:
    """The results documents of the runs (ResultsError names a bad file)."""
    return [ResultsDoc.from_json(read_json(p), str(p)) for p in paths]


def summary(rows: Sequence[CaseSpread]) -> tuple[int, float]:
    """(cases flagged, median spread between runs in percent) over the cases measured in 2+ runs."""
    measured = [r.spread for r in rows if sum(v is not None for v in r.values) > 1]
    return sum(r.flagged for r in rows), 100 * statistics.median(measured) if measured else 0.0
