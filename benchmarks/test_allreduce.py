"""The allreduce family: NCCL / vLLM custom / gloo allreduce at decode and prefill sizes.

Collection imports only the case records (no torch, no CUDA). The first case of a group (backend,
world size, env variant) launches that group's ranks once for all of its selected cases; the other
cases read their results. `full` holds the bulk of the axes' product (see cases.in_default_selection).
"""

import pytest

from moebench.allreduce.cases import AllreduceCase, all_cases, in_default_selection
from moebench.suite.unmeasured import declare_cases

pytestmark = pytest.mark.allreduce


def _param(case: AllreduceCase):
    marks = [getattr(pytest.mark, case.backend)]
    if case.on_gpu:
        marks += [pytest.mark.gpu, pytest.mark.gpus(n=case.world)]  # by keyword: -m "gpus(n=2)" matches only that form
    if not in_default_selection(case):
        marks.append(pytest.mark.full)
    return pytest.param(case, id=case.id, marks=marks)


CASES = [_param(c) for c in all_cases()]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    declare_cases(metafunc.config, "allreduce", (c.key for c in all_cases()))  # every case, selected or not


@pytest.fixture(scope="session")
def allreduce_runner(request):
    """One runner per session; it knows every selected allreduce case, so a group's launch covers
    exactly the cases this session will ask for."""
    from moebench.allreduce.runner import AllreduceRunner

    selected = [item.callspec.params["case"] for item in request.session.items
                if isinstance(getattr(item, "callspec", None) and item.callspec.params.get("case"), AllreduceCase)]
    return AllreduceRunner(selected)


@pytest.mark.parametrize("case", CASES)
def test_allreduce(case: AllreduceCase, allreduce_runner, moebench):
    from moebench.allreduce.bench import run_case

    run_case(case, allreduce_runner, moebench)
