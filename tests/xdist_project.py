"""A tiny benchmark project for the -n tests: fake GPUs through the hardware layer, real xdist workers.

Its conftest.py installs a fake NVML in every process (controller and workers) when MOEBENCH_FAKE_GPUS
is set: that many "NVIDIA H200" GPUs with UUIDs GPU-fake-<i> and SM clocks of 1980 - 10 * i MHz, seen
whatever CUDA_VISIBLE_DEVICES says (NVML sees every GPU), so the hardware layer's narrowing is what is
tested. Each case logs what its process saw (CUDA_VISIBLE_DEVICES, the hardware key, the GPU the
hardware layer names, the time) to seen/<case>.json, and measures samples from control.json: a value per
case, times a factor for the GPU it runs on (`gpu_factor`), so a test can make one GPU slower.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
CASES = [f"c{i:02d}" for i in range(12)]

CONFTEST = '''
import os

from moebench.core import hardware


class FakeNvml:
    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 0, 1, 0
    NVML_P2P_CAPS_INDEX_NVLINK, NVML_P2P_CAPS_INDEX_READ, NVML_P2P_STATUS_OK = 0, 1, 0

    def __init__(self, count):
        self.count = count

    def nvmlDeviceGetCount(self):
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i):
        if i >= self.count:
            raise ValueError(i)
        return i

    def nvmlDeviceGetName(self, h):
        return "NVIDIA H200"

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-fake-{h}"

    def nvmlSystemGetDriverVersion(self):
        return "580.0"

    def nvmlDeviceGetClockInfo(self, h, clock):
        return 1980 - 10 * h if clock == self.NVML_CLOCK_SM else 3201

    def nvmlDeviceGetPowerUsage(self, h):
        return 650_000

    def nvmlDeviceGetTemperature(self, h, sensor):
        return 60 + h

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return 0

    def nvmlDeviceGetP2PStatus(self, a, b, kind):
        return 0

    def __getattr__(self, name):  # every other NVML call: not supported here (hardware._try reads None)
        if not name.startswith("nvml"):
            raise AttributeError(name)

        def unsupported(*args):
            raise RuntimeError(name)
        return unsupported


if os.environ.get("MOEBENCH_FAKE_GPUS"):
    _fake = FakeNvml(int(os.environ["MOEBENCH_FAKE_GPUS"]))
    hardware._nvml = lambda: _fake
'''

CASES_PY = '''
import json
import os
import pathlib
import time

import pytest

from moebench.core import hardware
from moebench.core.metrics import Metric
from moebench.suite.xdist_glue import placed_here

HERE = pathlib.Path(__file__).parent
CASES = %r


class Case:  # a case parameter with its baseline key, as the families' are (moebench.suite.unmeasured.case_key)
    def __init__(self, name):
        self.name, self.key = name, f"fake[{name}]"


def _seen(name, request):
    gpu = hardware.own_gpu()
    (HERE / "seen").mkdir(exist_ok=True)
    here = sorted(it.name for it in request.session.items if placed_here(request.config, it))
    (HERE / "seen" / f"{name}.json").write_text(json.dumps({
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "pid": os.getpid(),
        "worker": os.environ.get("PYTEST_XDIST_WORKER"), "key": hardware.hardware_key(),
        "machine_id": hardware.fingerprint()["machine_id"], "own_gpu": gpu, "t": time.time(),
        "placed_here": here}))
    return gpu


def _measure(name, gpu):
    control = json.loads((HERE / "control.json").read_text())
    factor = control["gpu_factor"].get(str(gpu["index"]) if gpu else "", 1.0)
    value = control["values"].get(name, 100.0) * factor
    return lambda: {"latency_us": Metric.from_samples([value] * 5, "us", "lower", rel_tol=0.05)}


@pytest.mark.gemm
@pytest.mark.gpu
@pytest.mark.parametrize("case", [pytest.param(Case(n), id=n) for n in CASES])
def test_case(case, moebench, request):
    name = case.name
    gpu = _seen(name, request)
    time.sleep(0.05)
    moebench.record(f"fake[{name}]", "gemm", {"name": name}, _measure(name, gpu), primary="latency_us")


@pytest.mark.allreduce
@pytest.mark.gpus(n=2)
def test_all_gpus(moebench, request):
    _seen("all", request)
    moebench.record("fake[all]", "allreduce", {"name": "all"}, _measure("all", None), primary="latency_us")


@pytest.mark.gemm
@pytest.mark.gpu
def test_skipped():
    pytest.skip("not on this box")
''' % (CASES,)


class XdistProject:
    """The project in a pytester folder; run(*args, gpus=N) is one pytest subprocess (xdist loads itself)."""

    def __init__(self, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
        self.pytester, self.monkeypatch, self.path = pytester, monkeypatch, pytester.path
        self.baselines = self.path / "baselines"
        self.control = {"values": {}, "gpu_factor": {}}
        monkeypatch.setenv("PYTHONPATH", str(SRC))
        for var in ("GITHUB_STEP_SUMMARY", "PYTEST_ADDOPTS", "CUDA_VISIBLE_DEVICES", "PYTEST_XDIST_AUTO_NUM_WORKERS"):
            monkeypatch.delenv(var, raising=False)
        markers = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
        pytester.makeini("[pytest]\naddopts = --strict-markers -p no:cacheprovider\nmarkers =\n"
                         + "".join(f"    {m}\n" for m in markers))
        pytester.makeconftest(CONFTEST)
        pytester.makepyfile(test_cases=CASES_PY)

    def run(self, *args: str, gpus: int = 4) -> pytest.RunResult:
        """One run over the project with `gpus` fake GPUs (0: a machine without GPUs); seen/ starts empty."""
        for p in (self.path / "seen").glob("*.json"):
            p.unlink()
        (self.path / "control.json").write_text(json.dumps(self.control))
        with self.monkeypatch.context() as mp:
            if gpus:
                mp.setenv("MOEBENCH_FAKE_GPUS", str(gpus))
            else:
                mp.delenv("MOEBENCH_FAKE_GPUS", raising=False)
            return self.pytester.runpytest_subprocess(
                "-p", "no:hypothesispytest", "-p", "no:anyio", "-p", "moebench.plugin",
                "--baseline-dir", str(self.baselines), "-rfEs", *args, timeout=180)

    def seen(self) -> dict[str, dict]:
        """What each case's process saw, by case name."""
        return {p.stem: json.loads(p.read_text()) for p in (self.path / "seen").glob("*.json")}

    def results(self, path: Path) -> dict:
        return json.loads(Path(path).read_text())


def gpu_env(n: int) -> dict[str, str]:
    """The environment variable that gives a project run n fake GPUs."""
    return {"MOEBENCH_FAKE_GPUS": str(n)}


__all__ = ["XdistProject", "CASES", "gpu_env", "os"]
