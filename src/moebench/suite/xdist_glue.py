"""pytest-xdist glue: `pytest benchmarks/ -n auto` runs one worker per GPU of the box, each case on a fixed GPU.

Registered by moebench.plugin at startup, with or without xdist installed: every xdist hook here is an
optional one, and nothing imports xdist (without it `-n` does not exist and none of this runs).

- `-n auto` means one worker per GPU (pytest_xdist_auto_num_workers), 1 on a machine without GPUs: CPU
  cases timed side by side would share its cores and time each other. `-n N` on a box of G GPUs: the run
  spreads over its first N GPUs; N > G is a usage error (two workers on one GPU would time each other).
- The controller gives each worker a slot (its GPU: slot k is the k-th GPU of the box's visible list) in
  its workerinput; a worker replacing a crashed one gets the slot that went down. The worker sets
  CUDA_VISIBLE_DEVICES to that GPU in pytest_configure, before any collection or test touches CUDA, and
  keeps the box's list in hardware.BOX_ENV: its fingerprint, hardware key and machine id are the box's.
- Each worker computes the plan at collection (moebench.suite.gpu_plan over the case ids, the markers and
  `--gpu-of`) and writes it to a file in a folder the controller made; the scheduler
  (moebench.suite.xdist_sched) reads it and sends each test to its GPU's worker. For a multi-GPU test the
  worker widens CUDA_VISIBLE_DEVICES back to the box's while it runs.
- One verdict: a worker gates its cases as usual and ships each case's results document entry (and the
  rows it added) on the test's report (an attribute, which pytest's report serialization carries to the
  controller), and the family keys it declared on its workeroutput. The controller's RunState gathers
  them (Merge), so the closing table, results.json, summary.md and a --baseline-update (written once,
  by the controller, under the store's lock) are one run's. Workers write no file of their own.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from moebench.core import hardware
from moebench.suite.case_gpus import multi_gpu
from moebench.suite.gpu_plan import OPTION, PlanError, assign, parse_pins, unknown_pins
from moebench.results.document import CaseDoc, Row
from moebench.suite.session import RunState
from moebench.suite.unmeasured import case_key, declare_cases, declared
from moebench.suite.xdist_sched import ALL, GpuScheduling, Plan

SLOT, SLOTS, PLAN_DIR = "moebench_slot", "moebench_slots", "moebench_plan_dir"  # workerinput keys
DECLARED = "moebench_declared"  # workeroutput key: {family: [case keys]}
PAYLOAD = "moebench_payload"  # the TestReport attribute a worker's measured cases travel on
_SHIP = pytest.StashKey[dict]()
_PLACED_HERE = pytest.StashKey[frozenset]()  # a worker's single-GPU items (nodeids) on its GPU


def is_worker(config: pytest.Config) -> bool:
    """Whether this process is an xdist worker."""
    return hasattr(config, "workerinput")


def is_controller(config: pytest.Config) -> bool:
    """Whether this process is the controller of an xdist run (it runs no test; workers do)."""
    return (not is_worker(config) and config.getoption("dist", default="no") != "no"
            and not config.getoption("collectonly", default=False))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("moebench").addoption(
        OPTION, action="append", default=[], metavar="CASE=INDEX",
        help="under -n: run CASE (a case id like gemm[...] or a test id) on GPU INDEX (0..N-1 over the GPUs "
             "the run spreads over) instead of the one the stable assignment gives it; repeatable")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: one worker per GPU of the box; 1 without GPUs (CPU timings side by side disturb each other)."""
    return hardware.visible_gpu_count() or 1


@pytest.hookimpl(tryfirst=True)  # before moebench.plugin reads the fingerprint, and before any CUDA
def pytest_configure(config: pytest.Config) -> None:
    if is_worker(config):
        if SLOT in config.workerinput:
            _narrow_to_slot(int(config.workerinput[SLOT]))
            config.pluginmanager.register(Worker(config), "moebench-xdist-worker")
        return
    pins = config.getoption("gpu_of") or []
    if not is_controller(config):
        if pins and not config.getoption("collectonly", default=False):
            raise pytest.UsageError(f"{OPTION} {pins[0]}: places cases on the GPUs of an -n run (pytest-xdist); "
                                    "this run has no workers")
        return
    workers = len(config.getoption("tx") or [])
    gpus = hardware.visible_gpu_count()
    if gpus and workers > gpus:
        raise pytest.UsageError(f"-n {workers}: moebench runs one worker per GPU and this box has {gpus} "
                                f"(two workers on one GPU would time each other); use -n auto or -n {gpus}")
    try:
        parse_pins(pins, workers, f"-n {workers}: the run spreads over {workers} {'GPUs' if gpus else 'workers'}")
    except PlanError as e:
        raise pytest.UsageError(str(e)) from None
    plan_dir = tempfile.mkdtemp(prefix="moebench-plan-")
    config.add_cleanup(lambda: shutil.rmtree(plan_dir, ignore_errors=True))
    config.pluginmanager.register(Controller(workers, plan_dir), "moebench-xdist-controller")


def _narrow_to_slot(slot: int) -> None:
    """Make this worker's process see only its GPU (the box's list kept in hardware.BOX_ENV)."""
    box = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ.setdefault(hardware.BOX_ENV, box if box is not None else hardware.ALL)
    gpus = hardware.fingerprint().get("gpus") or []
    if not gpus:
        return  # a machine without GPUs: the slot is only the worker's share of the plan
    # NVML numbers GPUs by PCI bus, CUDA fastest first unless told otherwise: the index set below is NVML's.
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    os.environ["CUDA_VISIBLE_DEVICES"] = str(gpus[slot]["index"])


def placed_here(config: pytest.Config, item: pytest.Item) -> bool:
    """Whether `item` runs in this process: every item does outside an -n run; in a worker, a single-GPU item
    whose GPU the plan made this worker's (a multi-GPU item runs on every GPU and is no worker's own). For
    work a family plans for the items it will run (--counters counts a chunk of cases in one ncu child):
    a worker sees every item of the session, and would otherwise do the other workers' share too."""
    if not is_worker(config):
        return True
    return item.nodeid in config.stash.get(_PLACED_HERE, frozenset())


def register_merge(config: pytest.Config, state: RunState) -> None:
    """On an xdist controller, gather the workers' cases into `state` (called by the plugin once it has one)."""
    if is_controller(config):
        config.pluginmanager.register(Merge(config, state), "moebench-xdist-merge")


def ship(config: pytest.Config, item: pytest.Item, *, case: CaseDoc | None = None, row: Row | None = None,
         ceilings: dict | None = None) -> None:
    """In a worker, keep what a case measured (or a row it added) for its next report; elsewhere nothing."""
    if not is_worker(config):
        return
    box = item.stash.setdefault(_SHIP, {"cases": [], "rows": [], "ceilings": {}})
    if case is not None:
        box["cases"].append(case.to_json())
    if row is not None:
        box["rows"].append(row.to_json())
    box["ceilings"].update(ceilings or {})


class Worker:
    """A worker's hooks: the plan, a multi-GPU test's view of the box, the cases on the reports."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.box = hardware.box_visible_env()

    @pytest.hookimpl(trylast=True)  # after every deselection (-m, -k, moebench's `full`)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        slots = int(config.workerinput[SLOTS])
        single = {it.nodeid: case_key(it) or it.nodeid for it in items if not multi_gpu(it)}
        names = {n: cid for nodeid, cid in single.items() for n in (nodeid, cid)}
        pins = parse_pins(config.getoption("gpu_of") or [], slots)
        problem = unknown_pins(pins, names)
        multi = {n for it in items if multi_gpu(it) for n in (it.nodeid, case_key(it))}
        if problem and any(p in multi for p in pins):
            problem = f"{OPTION} {next(p for p in pins if p in multi)}: a multi-GPU case runs on every GPU, after the others"
        placed = assign(single.values(), slots, {names[p]: g for p, g in pins.items() if p in names})
        plan = {"ids": [it.nodeid for it in items], "problem": problem,
                "slots": [ALL if multi_gpu(it) else placed[single[it.nodeid]] for it in items]}
        mine = int(config.workerinput[SLOT])
        config.stash[_PLACED_HERE] = frozenset(it.nodeid for it in items
                                               if not multi_gpu(it) and placed[single[it.nodeid]] == mine)
        path = Path(config.workerinput[PLAN_DIR]) / f"{config.workerinput['workerid']}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(plan), encoding="utf-8")
        tmp.replace(path)  # whole before the controller hears that collection finished

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem):
        if not multi_gpu(item):
            return (yield)
        # The families run multi-GPU work in child processes (ranks, engines), which inherit this.
        mine = os.environ.get("CUDA_VISIBLE_DEVICES")
        _set_visible(self.box)
        try:
            return (yield)
        finally:
            _set_visible(mine)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call):
        report = yield
        box = item.stash.get(_SHIP, None)
        if box and (box["cases"] or box["rows"]):
            setattr(report, PAYLOAD, dict(box))
            item.stash[_SHIP] = {"cases": [], "rows": [], "ceilings": {}}
        return report

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.config.workeroutput[DECLARED] = {f: sorted(keys) for f, keys in declared(self.config).items()}


def _set_visible(value: str | None) -> None:
    if value is None:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = value


class Controller:
    """The controller's xdist hooks: slots for workers, the scheduler, the workers' declared keys."""

    def __init__(self, workers: int, plan_dir: str) -> None:
        self.workers, self.plan_dir = workers, plan_dir
        self.slots: dict[str, int] = {}  # worker id -> slot, for the workers up now

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        free = sorted(set(range(self.workers)) - set(self.slots.values()))
        slot = free[0] if free else len(self.slots) % self.workers
        self.slots[node.gateway.id] = slot
        node.workerinput.update({SLOT: slot, SLOTS: self.workers, PLAN_DIR: self.plan_dir})

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        self.slots.pop(node.gateway.id, None)  # its replacement, if any, takes this slot
        for family, keys in (getattr(node, "workeroutput", None) or {}).get(DECLARED, {}).items():
            declare_cases(node.config, family, keys)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log) -> GpuScheduling:
        try:
            from xdist.report import report_collection_diff  # xdist's own wording for a collection mismatch
        except ImportError:  # pragma: no cover - this hook is only called by xdist
            report_collection_diff = None
        return GpuScheduling(self.workers, slot_of=lambda node: int(node.workerinput[SLOT]),
                             read_plan=self._read_plan, fail=_fail, log=log, report_diff=report_collection_diff)

    def _read_plan(self, node) -> Plan:
        doc = json.loads((Path(self.plan_dir) / f"{node.gateway.id}.json").read_text(encoding="utf-8"))
        return Plan(doc["ids"], doc["slots"], doc.get("problem"))


def _fail(message: str) -> None:
    pytest.exit(message, returncode=pytest.ExitCode.USAGE_ERROR)


class Merge:
    """On the controller: each worker report's cases and rows into the run's one RunState, in report order,
    before the plugin's own outcome rows (a gate failure must not also read FAIL)."""

    def __init__(self, config: pytest.Config, state: RunState) -> None:
        self.config, self.state = config, state

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        payload = getattr(report, PAYLOAD, None)
        if not payload:
            return
        where = f"{report.nodeid}: a worker's report"
        for c in payload.get("cases", []):
            self.state.add_doc(CaseDoc.from_json(c, where, "case"))
        for r in payload.get("rows", []):
            self.state.add_row(Row.from_json(r, where, "row"))
        gpu = next((c.get("gpu") for c in payload.get("cases", []) if c.get("gpu")), None)
        self.state.merge_ceilings(payload.get("ceilings", {}), f"gpu{gpu['index']}" if gpu else "")
