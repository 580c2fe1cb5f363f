"""The case -> GPU assignment of an -n run (moebench.suite.gpu_plan): stable, balanced, overridable."""

from __future__ import annotations

import collections
import os
import subprocess
import sys

import pytest

from moebench.suite.gpu_plan import PlanError, assign, capacity, parse_pins, ranking, unknown_pins
from moebench.suite.xdist_glue import pytest_xdist_auto_num_workers

SRC = os.path.join(os.path.dirname(__file__), "..", "src")
IDS = [f"gemm[model{m}-m{mm}-bf16-backend{b}]" for m in range(5) for mm in range(24) for b in range(10)]  # 1,200


def test_the_same_cases_land_on_the_same_gpus_in_any_order_and_in_any_process():
    plan = assign(IDS, 8)
    assert assign(list(reversed(IDS)), 8) == plan, "the collection order must not matter"
    # Another interpreter with another hash seed (Python's hash() of a str changes per process):
    code = f"import sys; sys.path.insert(0, {SRC!r}); from moebench.suite.gpu_plan import assign; print(assign({IDS!r}, 8))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "12345"}).stdout
    assert eval(out) == plan


def test_every_gpu_gets_within_5_percent_of_the_mean_where_hashing_alone_does_not():
    loads = collections.Counter(assign(IDS, 8).values())
    assert sorted(loads) == list(range(8))
    assert max(loads.values()) <= capacity(len(IDS), 8) <= 1.05 * len(IDS) / 8
    first_choice = collections.Counter(ranking(c, 8)[0] for c in IDS)
    assert max(first_choice.values()) > 1.05 * len(IDS) / 8, "the fixture no longer shows why the bound exists"
    # a small selection is spread exactly
    assert sorted(collections.Counter(assign(IDS[:8], 4).values()).values()) == [2, 2, 2, 2]


def test_a_case_added_moves_few_others():
    before, after = assign(IDS, 8), assign(IDS + ["gemm[new-case]"], 8)
    moved = [c for c in IDS if before[c] != after[c]]
    assert len(moved) <= 2, moved


def test_a_pin_overrides_the_plan_and_counts_towards_its_gpu():
    free = assign(IDS[:40], 4)
    case = IDS[0]
    other = (free[case] + 1) % 4
    pinned = assign(IDS[:40], 4, {case: other})
    assert pinned[case] == other
    assert max(collections.Counter(pinned.values()).values()) <= capacity(40, 4)


@pytest.mark.parametrize("value, msg", [
    ("gemm[a]", "--gpu-of 'gemm[a]': expected CASE=INDEX"),
    ("gemm[a]=x", "--gpu-of 'gemm[a]=x': expected CASE=INDEX"),
    ("gemm[a]=4", "--gpu-of 'gemm[a]=4': GPU index 4 is not below 4 (4 GPUs)"),
])
def test_bad_pins_are_one_line_naming_the_option(value, msg):
    with pytest.raises(PlanError) as e:
        parse_pins([value], 4, "4 GPUs")
    assert str(e.value).startswith(msg) and "\n" not in str(e.value)


def test_a_pin_of_an_unknown_case_is_named():
    line = unknown_pins({"gemm[nope]": 1}, {"gemm[a]", "t.py::test[a]"})
    assert line.startswith("--gpu-of gemm[nope]=1: no such case in this selection")
    assert unknown_pins({"gemm[a]": 1}, {"gemm[a]"}) is None


@pytest.mark.parametrize("gpus, workers", [(8, 8), (1, 1), (0, 1)])
def test_n_auto_is_one_worker_per_gpu_and_one_without_gpus(monkeypatch, gpus, workers):
    from moebench.core import hardware

    monkeypatch.setattr(hardware, "visible_gpu_count", lambda: gpus)
    assert pytest_xdist_auto_num_workers(None) == workers
