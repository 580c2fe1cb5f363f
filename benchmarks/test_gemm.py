"""The expert GEMM family: per-expert grouped GEMMs of MoE decode, every backend side by side.

Cases come from moebench.gemm.cases (model preset x op x M x dtype x routing x backend). The default
selection is what one H200 runs in about ten minutes; `-m full` opens the whole product. Backends are
selected by marker: `-m "gemm and (triton or vllm_triton)"`.
"""

from __future__ import annotations

import functools

import pytest

from moebench.core import hardware
from moebench.gemm import counters as gemm_counters
from moebench.gemm.backends import BACKENDS
from moebench.gemm.cases import ALL_CASES, GemmCase, is_default
from moebench.gemm.counter_batch import CounterBatch
from moebench.plugin import marker_names_in
from moebench.suite.unmeasured import declare_cases
from moebench.suite.xdist_glue import placed_here

pytestmark = pytest.mark.gemm


def _marks(case: GemmCase) -> list:
    marks = [getattr(pytest.mark, case.backend)]
    if BACKENDS[case.backend].gpu_only:
        marks.append(pytest.mark.gpu)
    if case.model == "tiny":
        marks.append(pytest.mark.tiny)
    if not is_default(case):
        marks.append(pytest.mark.full)
    return marks


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "case" not in metafunc.fixturenames:
        return
    # The full product is ~10^4 cases: generated only when -m asks for `full`, so that collecting the
    # default selection stays fast.
    full = "full" in marker_names_in(metafunc.config.getoption("markexpr", default="") or "")
    supported = [c for c in ALL_CASES if BACKENDS[c.backend].supports(c)]
    declare_cases(metafunc.config, "gemm", (c.key for c in supported))  # all of them, also those not generated
    cases = [c for c in supported if full or is_default(c)]
    metafunc.parametrize("case", [pytest.param(c, id=c.id, marks=_marks(c)) for c in cases])


@functools.lru_cache(maxsize=1)
def _device() -> tuple[str, tuple[int, int] | None, int | None]:
    import torch

    if not torch.cuda.is_available():
        return "cpu", None, None
    p = torch.cuda.get_device_properties(0)
    return "cuda", (p.major, p.minor), getattr(p, "L2_cache_size", None)


@functools.lru_cache(maxsize=1)
def _workload(shape_case: GemmCase, device: str):
    # Keyed by the shape (backend axis fixed) so all backends of one shape share inputs and routings.
    from moebench.gemm.workload import Workload

    return Workload(shape_case, device)


# The session's counts under --counters (one ncu child a chunk of cases), made on its first counted case.
_COUNTER_BATCH = pytest.StashKey[CounterBatch]()


def _selected_cases(items) -> list[GemmCase]:
    """The cases of the session's selected test_gemm items, in the order they run."""
    return [item.callspec.params["case"] for item in items
            if getattr(item, "originalname", None) == "test_gemm" and hasattr(item, "callspec")
            and isinstance(item.callspec.params.get("case"), GemmCase)]


def _counter_batch(request, device: str, cc) -> CounterBatch:
    """The session's CounterBatch, planned on first use from every selected gemm case whose backend runs on
    this machine (the others skip before counting) and, in an -n worker, whose GPU is this worker's, so that
    one ncu child counts a chunk of them and later cases read their counts from it."""
    stash = request.config.stash
    if _COUNTER_BATCH not in stash:
        here = [it for it in request.session.items if placed_here(request.config, it)]  # -n: this worker's
        planned = [c.id for c in _selected_cases(here) if BACKENDS[c.backend].unavailable(c, device, cc) is None]
        stash[_COUNTER_BATCH] = CounterBatch(planned, gemm_counters.tool_of(hardware.fingerprint()))
    return stash[_COUNTER_BATCH]


def test_gemm(case: GemmCase, moebench, request):
    from moebench.gemm import runner

    device, cc, l2 = _device()
    backend = BACKENDS[case.backend]
    why = backend.unavailable(case, device, cc)
    if why:
        pytest.skip(why)
    if device == "cpu" and case.model != "tiny" and "full" not in marker_names_in(request.config.getoption("markexpr") or ""):
        pytest.skip(f"{case.model} weights are GBs: on a CPU box only the tiny preset runs by default (-m full runs it)")
    moebench.progress(f"{case.key}: building")
    wl = _workload(GemmCase(case.model, case.tp, case.op, case.m, case.dtype, case.routing, "-"), device)
    built = backend.build(case, wl)
    # Correct first: a fast wrong kernel is a regression.
    checked = runner.check(built, wl, backend.error_bounds.get(case.dtype), key=case.key)
    # The expert GEMMs stream weights and write a few KB: their floor is bytes over the read ceiling.
    ceiling = moebench.ceiling(device, "read")
    # chart: the report draws the backends of one model, op and dtype side by side over M (moebench.outputs.charts)
    chart = {"panel": f"{case.model} tp{case.tp} {case.op} {case.dtype} {case.routing}", "x": case.m,
             "x_label": "M (tokens per step)", "series": case.backend, "tokens": case.m}
    info = {"backend": case.backend, "group": case.shape_id, "shape": case.shape_id, "check": checked,
            "chart": chart, **built.info}

    # request is None where a unit test calls test_gemm itself (tests/test_gemm_runner.py)
    counting = request is not None and bool(request.config.getoption("counters", default=False))
    counted: dict = {}
    if counting:  # one more run under ncu; a machine that cannot count says why and the timing stands
        # Before the timing, not inside measure(): the case's chunk may count dozens of cases (minutes), which
        # must not run under this case's clock monitor; a re-measure reads the same counts.
        counted, info["counters"] = gemm_counters.count(case, device, ceiling, _counter_batch(request, device, cc),
                                                        moebench.progress)
        if not counted:
            moebench.progress(f"{case.key}: counters not recorded: {next(iter(info['counters'].values()))}")

    def measure():
        metrics, extra = runner.measure(built, wl, ceiling=ceiling, l2_bytes=l2)
        info.update(extra)
        metrics.update(counted)
        return metrics

    moebench.record(case.key, "gemm", runner.definition(case, device), measure, info=info,
                    primary="wall_us" if device == "cpu" else "graph_us", group=case.shape_id,
                    explain=gemm_counters.explain if counting else None)
    failed = gemm_counters.failure(info) if counting else None
    if failed:
        pytest.fail(f"{case.key}: {failed}", pytrace=False)
