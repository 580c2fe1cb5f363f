"""The pytest-xdist scheduler of `pytest benchmarks/ -n N`: each case on its own GPU's worker.

xdist's own modes cannot do this: `load` and `worksteal` hand any test to whichever worker is free, and
`loadgroup` keeps a group's tests on one worker but picks the worker at run time (and renames every
test id with an `@group` suffix, which would change the ids in the verdict table, results and junit).
A worker here owns one GPU for its whole life (CUDA_VISIBLE_DEVICES is set before CUDA starts), so the
test must go to the worker of its GPU, which only a scheduler of our own can promise; it is handed to
xdist through its documented hook, pytest_xdist_make_scheduler (moebench.suite.xdist_glue), and speaks xdist's
scheduler protocol (xdist.scheduler.protocol.Scheduling) without importing xdist.

- Single-GPU tests: the plan (moebench.suite.gpu_plan, computed by the workers at collection, where the
  markers are) gives each its GPU slot; a worker is sent all of its slot's tests at once and told to
  shut down after them: nothing moves between GPUs at run time.
- Multi-GPU tests (`gpus(n=N)`, N > 1) run alone, on every GPU: once every other worker has finished,
  the worker of slot 0 gets them, after its own cases (its last one waits for the others: an xdist
  worker holds its last test until it is told what comes next). That worker's process never narrowed
  what its children see: moebench.suite.xdist_glue widens CUDA_VISIBLE_DEVICES to the box's for such a test,
  and the families start their ranks and engines as child processes.
- A worker that crashes is replaced by xdist with the same slot (xdist_glue), and gets the rest of its
  slot's tests when it has collected.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

ALL = "all"  # a plan slot meaning: every GPU, after the single-GPU phase
PHASE2_SLOT = 0  # the worker that runs the multi-GPU tests


@dataclass(frozen=True)
class Plan:
    """What the workers' collection decided: per collected test id its slot (an int, or ALL), and a usage
    problem (an unknown --gpu-of case) to stop the run with."""

    ids: list[str]
    slots: list[Any]
    problem: str | None = None


class GpuScheduling:
    """xdist's Scheduling protocol, placing each test on the worker of its GPU (see the module docstring).

    slot_of(node): the GPU slot xdist_glue gave a worker; read_plan(node): the plan that worker wrote;
    fail(message): stop the run with a usage line."""

    def __init__(self, numnodes: int, slot_of: Callable[[Any], int], read_plan: Callable[[Any], Plan],
                 fail: Callable[[str], None], log: Callable[..., None] = lambda *a: None,
                 report_diff: Callable[[list, list, str, str], str | None] | None = None) -> None:
        self.numnodes = numnodes
        self._slot_of, self._read_plan, self._fail, self.log = slot_of, read_plan, fail, log
        self._report_diff = report_diff
        self.node2collection: dict[Any, list[str]] = {}
        self.node2pending: dict[Any, list[int]] = {}
        self.collection: list[str] | None = None
        self._slot_of_index: list[Any] = []
        self._queues: dict[Any, list[int]] = {}  # slot (or ALL) -> indices not yet sent

    # --- the protocol's state --------------------------------------------------------------------
    @property
    def nodes(self) -> list:
        """The workers up now."""
        return list(self.node2pending)

    @property
    def collection_is_completed(self) -> bool:
        """Every initial worker has sent its collection."""
        return len(self.node2collection) >= self.numnodes

    @property
    def tests_finished(self) -> bool:
        """Nothing left to send, and no worker has more than its last test (which it runs on shutdown)."""
        return (self.collection is not None and not any(self._queues.values())
                and all(len(p) < 2 for p in self.node2pending.values()))

    @property
    def has_pending(self) -> bool:
        """Tests not yet run (queued here or sent to a worker)."""
        return any(self._queues.values()) or any(self.node2pending.values())

    # --- workers coming and going ----------------------------------------------------------------
    def add_node(self, node) -> None:
        """A worker is up (it collects next)."""
        self.node2pending[node] = []

    def add_node_collection(self, node, collection: Sequence[str]) -> None:
        """A worker's collection; a late one (a replacement) must equal the first."""
        if self.collection is not None and list(collection) != self.collection:
            self.log(f"{node.gateway.id} collected other tests than the first workers: not used")
            return
        self.node2collection[node] = list(collection)

    def remove_node(self, node) -> str | None:
        """A worker went down: its unfinished tests go back to their slot's queue (the crashed one, the
        first, is xdist's to report) and wait for the worker that replaces it."""
        pending = self.node2pending.pop(node, [])
        self.node2collection.pop(node, None)
        if not pending:
            self._release_multi()
            return None
        assert self.collection is not None
        crashed = self.collection[pending.pop(0)]
        for i in pending:
            self._queues.setdefault(self._slot_of_index[i], []).append(i)
        self._release_multi()
        return crashed

    def mark_test_complete(self, node, item_index: int, duration: float = 0) -> None:
        """A worker finished a test: when that was the single-GPU phase's last, the multi-GPU one starts."""
        self.node2pending[node].remove(item_index)
        self._release_multi()

    def mark_test_pending(self, item: str) -> None:
        """Run a test again (xdist asks this of a scheduler): back on its slot's queue."""
        assert self.collection is not None
        i = self.collection.index(item)
        self._queues.setdefault(self._slot_of_index[i], []).insert(0, i)
        for node in self.nodes:
            self._feed(node)

    def remove_pending_tests_from_node(self, node, indices: Sequence[int]) -> None:
        """Work stealing: never asked of this scheduler (a test belongs to its GPU's worker)."""
        raise NotImplementedError("moebench's GPU scheduler does not steal work")

    # --- scheduling ------------------------------------------------------------------------------
    def schedule(self) -> None:
        """First call: check the collections, read the plan, send every worker its slot's tests. Later
        calls (a replacement worker collected): send it the rest of its slot's tests."""
        if self.collection is not None:
            for node in self.nodes:
                self._feed(node)
            self._release_multi()
            return
        (first_node, first), *others = list(self.node2collection.items())
        for node, collection in others:
            if collection != first:
                diff = self._report_diff(first, collection, first_node.gateway.id, node.gateway.id) \
                    if self._report_diff else None
                self._fail(diff or f"workers {first_node.gateway.id} and {node.gateway.id} collected different tests")
                return
        plan = self._read_plan(first_node)
        if plan.problem:
            self._fail(plan.problem)
            return
        if plan.ids != first:
            self._fail(f"moebench: the GPU plan of {first_node.gateway.id} is not of its collection")
            return
        self.collection = first
        self._slot_of_index = list(plan.slots)
        for i, slot in enumerate(plan.slots):
            self._queues.setdefault(slot, []).append(i)
        for node in self.nodes:
            self._feed(node)
        self._release_multi()

    def _feed(self, node) -> None:
        """Send a worker its slot's queued tests; shut it down after them unless it runs the multi-GPU phase."""
        if node.shutting_down or self.collection is None or node not in self.node2collection:
            return
        slot = self._slot_of(node)
        todo = self._queues.pop(slot, [])
        if todo:
            self.node2pending[node].extend(todo)
            node.send_runtest_some(todo)
        if slot != PHASE2_SLOT or not self._queues.get(ALL):
            node.shutdown()

    def _release_multi(self) -> None:
        """Once no single-GPU test is left anywhere but on the phase-2 worker, send it the multi-GPU tests."""
        multi = self._queues.get(ALL)
        if not multi or self.collection is None:
            return
        busy = any(q for s, q in self._queues.items() if s != ALL) or any(
            p for n, p in self.node2pending.items() if self._slot_of(n) != PHASE2_SLOT)
        node = next((n for n in self.nodes if self._slot_of(n) == PHASE2_SLOT and n in self.node2collection), None)
        if busy or node is None or node.shutting_down:
            return
        del self._queues[ALL]
        self.node2pending[node].extend(multi)
        node.send_runtest_some(multi)
        node.shutdown()
