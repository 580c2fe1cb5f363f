"""moebench's xdist scheduler (moebench.suite.xdist_sched) with fake workers: each test goes to its GPU's worker
and nowhere else; the multi-GPU tests go to slot 0's worker only once every other worker is done; a
crashed worker's tests wait for the worker that takes its slot."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from moebench.suite.xdist_sched import ALL, GpuScheduling, Plan

IDS = ["t::a", "t::b", "t::c", "t::d", "t::multi"]
SLOTS = [0, 1, 1, 0, ALL]


class Node:
    def __init__(self, wid: str, slot: int) -> None:
        self.gateway = SimpleNamespace(id=wid)
        self.slot, self.sent, self.shutting_down = slot, [], False

    def send_runtest_some(self, indices):
        self.sent.extend(indices)

    def shutdown(self):
        self.shutting_down = True


def _sched(nodes, slots=SLOTS, problem=None, fail=None):
    s = GpuScheduling(len(nodes), slot_of=lambda n: n.slot, read_plan=lambda n: Plan(IDS, list(slots), problem),
                      fail=fail or (lambda m: pytest.fail(m)))
    for n in nodes:
        s.add_node(n)
        s.add_node_collection(n, IDS)
    assert s.collection_is_completed
    s.schedule()
    return s


def test_each_worker_gets_its_slots_tests_and_the_multi_gpu_ones_wait_for_the_others():
    n0, n1 = Node("gw0", 0), Node("gw1", 1)
    s = _sched([n0, n1])
    assert (n0.sent, n1.sent) == ([0, 3], [1, 2])
    assert n1.shutting_down and not n0.shutting_down, "slot 0 stays up for the multi-GPU phase"
    s.mark_test_complete(n0, 0)
    s.mark_test_complete(n1, 1)
    assert 4 not in n0.sent, "a multi-GPU test must not start while another GPU is busy"
    assert not s.tests_finished
    s.mark_test_complete(n1, 2)
    assert n0.sent == [0, 3, 4] and n0.shutting_down
    s.mark_test_complete(n0, 3)
    s.mark_test_complete(n0, 4)
    assert s.tests_finished and not s.has_pending


def test_a_crashed_workers_tests_go_to_the_worker_taking_its_slot_and_no_other():
    n0, n1 = Node("gw0", 0), Node("gw1", 1)
    s = _sched([n0, n1], slots=[0, 1, 1, 1, 0])
    assert s.remove_node(n1) == "t::b", "the test it was running is xdist's to report"
    assert n0.sent == [0, 4], "slot 1's tests must not move to slot 0's GPU"
    n2 = Node("gw2", 1)
    s.add_node(n2)
    s.add_node_collection(n2, IDS)
    s.schedule()
    assert n2.sent == [2, 3] and n2.shutting_down


def test_a_usage_problem_in_the_plan_stops_the_run():
    said = []
    _sched([Node("gw0", 0)], problem="--gpu-of x=1: no such case", fail=said.append)
    assert said == ["--gpu-of x=1: no such case"]
