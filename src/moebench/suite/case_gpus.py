"""How many GPUs a test needs (its `gpu` / `gpus(n=N)` markers), and which GPU a single-GPU case runs on."""

from __future__ import annotations

import pytest

from moebench.core import hardware


def gpus_needed(item: pytest.Item) -> int:
    """0 for a test with no GPU marker, 1 for `gpu`, N for `gpus(n=N)` (or the positional `gpus(N)`)."""
    need = 1 if item.get_closest_marker("gpu") else 0
    m = item.get_closest_marker("gpus")
    if m is not None:
        # gpus(2) or gpus(n=2): the keyword form used to be ignored, so the case needed only one GPU.
        need = max(need, int(m.args[0]) if m.args else int(m.kwargs.get("n", 1)))
    return need


def multi_gpu(item: pytest.Item) -> bool:
    """Whether the test runs on several GPUs at once (allreduce, TP decode): alone, on the whole box."""
    return gpus_needed(item) > 1


def case_gpu(item: pytest.Item) -> dict | None:
    """The one GPU a case runs on ({index, uuid, name}; hardware.own_gpu), None for a multi-GPU case (it
    runs on all of the box's: the machine id names them) or on a machine without GPUs."""
    return None if multi_gpu(item) else hardware.own_gpu()
