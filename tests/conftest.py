"""Shared fixtures for the harness's own tests: a valid baseline document, and a tiny fake benchmark
project that runs the moebench plugin end to end in a pytest subprocess.

Everything here is CPU-only and deterministic: the fake cases return fixed samples read from a control
file, so the gate is tested with known numbers, never with a wall-clock threshold.
"""

from __future__ import annotations

import collections
import copy
import json
import multiprocessing
import os
import tomllib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

# pytester drives the plugin end to end (runpytest_subprocess). Allowed here because tests/ is in
# testpaths, so this conftest is loaded before configuration.
pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
HW = "test-hw-x1"  # forced with --hardware-key so the baseline folder does not depend on this CPU

# Plugins that auto-load from the environment but have nothing to do with moebench; hypothesis alone
# costs over a second of imports per subprocess, and the suite starts a couple of dozen of them.
UNRELATED_PLUGINS = ("-p", "no:hypothesispytest", "-p", "no:anyio")


def valid_document() -> dict:
    """A baseline file that passes validation: one measured and one external entry."""
    return {
        "schema_version": 1,
        "hardware_key": HW,
        "family": "gemm",
        "fingerprint": {"cpu": {"model": "fake"}, "gpus": []},
        "created": "2026-01-01T00:00:00Z",
        "updated": "2026-01-01T00:00:00Z",
        "entries": {
            "fake[a]": {
                "definition_hash": "0123456789abcdef",
                "metrics": {"latency_us": {"value": 100.0, "unit": "us", "direction": "lower", "rel_tol": 0.05,
                                           "noise": 0.01, "n": 20}},
                "provenance": {"kind": "measured", "commit": "abc123", "date": "2026-01-01T00:00:00Z",
                               "versions": {"torch": "2.13.0"}},
            },
            "fake[b]": {
                "definition_hash": "fedcba9876543210",
                "metrics": {"tokens_per_s": {"value": 10.3, "unit": "tok/s", "direction": "higher", "rel_tol": 0.1,
                                             "noise": 0.0, "n": 1}},
                "provenance": {"kind": "external", "source": "user report, 97 ms/token", "date": "2026-01-01"},
            },
        },
    }


@pytest.fixture
def valid_doc() -> dict:
    """A fresh deep copy of valid_document() for a test to mutate."""
    return copy.deepcopy(valid_document())


class FakeNvml:
    """The NVML calls hardware.clock_monitor makes: `count` GPUs at `clock_mhz` (memory at 3201 MHz,
    drawing 650 W at 61 C), every sample reporting the clocks-event (throttle) reasons bitmask `mask`."""

    NVML_CLOCK_SM = 0
    NVML_CLOCK_MEM = 1
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, mask: int = 0, count: int = 1, clock_mhz: int = 1980) -> None:
        self.mask, self.count, self.clock_mhz = mask, count, clock_mhz

    def nvmlDeviceGetPowerUsage(self, handle):
        return 650_000  # milliwatts

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 61

    def nvmlDeviceGetCount(self):
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetClockInfo(self, handle, clock):
        return self.clock_mhz if clock == self.NVML_CLOCK_SM else 3201

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return self.mask


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch):
    """Install a FakeNvml as the machine's NVML: fake_nvml(mask) -> the fake, all GPUs visible."""
    from moebench.core import hardware

    def install(mask: int = 0, **kw) -> FakeNvml:
        nvml = FakeNvml(mask, **kw)
        monkeypatch.setattr(hardware, "_nvml", lambda: nvml)
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        return nvml
    return install


# The fake benchmark project. Samples, definition revisions and interrupts come from control.json, and
# every measure() call appends the case key to calls.txt, so a test can see the re-measurement.
FAKE_TESTS = '''
"""Fake moebench cases with deterministic samples (see tests/conftest.py)."""
import json
import pathlib

import pytest

from moebench.core.metrics import Metric

HERE = pathlib.Path(__file__).parent


def _control():
    return json.loads((HERE / "control.json").read_text())


def _measure(key):
    def measure():
        with open(HERE / "calls.txt", "a") as f:
            f.write(key + "\\n")
        control = _control()
        if key in control["interrupt"]:
            raise KeyboardInterrupt
        t = Metric.from_samples(control["samples"][key], "us", "lower", rel_tol=0.05)
        return {"latency_us": t, "busbw_GBps": t.derived(1e3 / t.value, "GB/s", "higher")}
    return measure


def _record(moebench, name):
    key = f"fake[{name}]"
    definition = {"name": name, "rev": _control()["rev"].get(key, 0)}
    moebench.record(key, "gemm", definition, _measure(key), info={"what ran": "fake"}, primary="latency_us")


@pytest.mark.gemm
@pytest.mark.parametrize("name", ["a", "b"])
def test_fake(name, moebench):
    _record(moebench, name)


@pytest.mark.gemm
@pytest.mark.gpu
def test_needs_gpu(moebench):
    pytest.fail("a gpu case ran on a box without GPUs")


@pytest.mark.gemm
@pytest.mark.gpus(n=2)
def test_needs_two_gpus(moebench):
    pytest.fail("a gpus(2) case ran on a box without GPUs")


@pytest.mark.gemm
@pytest.mark.full
def test_full_only(moebench):
    _record(moebench, "full")
'''

SAMPLES = {
    # median 100, MAD 1 -> noise 1.4826 %; median 200, MAD 1 -> noise 0.74 %
    "fake[a]": [100.0, 101.0, 99.0, 100.0, 102.0],
    "fake[b]": [200.0, 201.0, 199.0, 200.0, 202.0],
    "fake[full]": [50.0, 50.0, 50.0],
}


class FakeBench:
    """A pytester project with the fake cases, run in a subprocess with the moebench plugin."""

    def __init__(self, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
        self.pytester = pytester
        self.monkeypatch = monkeypatch
        self.path: Path = pytester.path
        self.baselines = self.path / "baselines"
        self.control = {"samples": copy.deepcopy(SAMPLES), "rev": {}, "interrupt": []}
        # The subprocess imports moebench from this checkout (pytester prepends its cwd to PYTHONPATH).
        monkeypatch.setenv("PYTHONPATH", str(SRC))
        # A step summary from an outer CI job must not receive (or change) these runs' tables.
        monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
        monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
        # The fake gpu/gpus(2) cases must skip on any box, also when a developer runs this on a GPU one.
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
        markers = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
        pytester.makeini("[pytest]\naddopts = --strict-markers -p no:cacheprovider\nmarkers =\n"
                         + "".join(f"    {m}\n" for m in markers))
        pytester.makepyfile(test_fake=FAKE_TESTS)

    def family_file(self, root: Path | None = None) -> Path:
        return (root or self.baselines) / HW / "gemm.json"

    def write_baseline(self, values: dict[str, float], *, revs: dict[str, int] | None = None,
                       fingerprint: dict | None = None, root: Path | None = None) -> Path:
        """Store a gemm baseline file for the fake cases ('a' -> latency_us value), as an update on this
        machine would have written it (same definition hashes, this machine's fingerprint)."""
        from moebench.core import hardware, provenance
        from moebench.baselines.store import dumps, merge_entries

        entries = {}
        for name, value in values.items():
            definition = {"name": name, "rev": (revs or {}).get(name, 0)}
            entries[f"fake[{name}]"] = {
                "definition_hash": provenance.definition_hash(definition),
                "metrics": {"latency_us": {"value": value, "unit": "us", "direction": "lower", "rel_tol": 0.05,
                                           "noise": 0.0, "n": 5}},
                "provenance": {"kind": "measured", "commit": "c0ffee", "date": "2026-01-01T00:00:00Z",
                               "versions": {}},
                # recorded on this machine: the gate uses the spread here, not the one between machines
                "machines": [hardware.machine_id({**hardware.fingerprint(), "gpus": []})],
            }
        # The subprocess sees no GPUs (CUDA_VISIBLE_DEVICES is empty), so neither does the stored header.
        here = {**hardware.fingerprint(), "gpus": []}
        doc, _ = merge_entries(None, HW, "gemm", fingerprint or here, "2026-01-01T00:00:00Z", entries)
        path = self.family_file(root)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dumps(doc))
        return path

    def calls(self) -> collections.Counter:
        """How many times each case's measure() ran in the last run."""
        p = self.path / "calls.txt"
        return collections.Counter(p.read_text().split()) if p.exists() else collections.Counter()

    def run(self, *args: str, env: dict | None = None, other_hardware: bool = True) -> pytest.RunResult:
        """One pytest subprocess over the fake cases; calls.txt starts empty. HW is not this machine's
        detected key, so writing baselines under it needs --baseline-other-hardware (other_hardware)."""
        (self.path / "calls.txt").unlink(missing_ok=True)
        (self.path / "control.json").write_text(json.dumps(self.control))
        with self.monkeypatch.context() as mp:
            for k, v in (env or {}).items():
                mp.setenv(k, v)
            return self.pytester.runpytest_subprocess(
                *UNRELATED_PLUGINS, "-p", "moebench.plugin", "--hardware-key", HW,
                *(["--baseline-other-hardware"] if other_hardware else []),
                "--baseline-dir", str(self.baselines), "-rfEs", *args, timeout=120)


def table_rows(result: pytest.RunResult) -> pytest.LineMatcher:
    """The run's output with each row of the closing verdict table on one line: a row whose note (or whose
    long case id) wrapped to indented lines under it, within 120 columns, is joined back with single
    spaces, so a test can fnmatch a row as a whole. Other lines are kept as they are."""
    out: list[str] = []
    in_table = False
    for line in result.outlines:
        if "moebench verdicts on" in line:
            in_table = True
        elif in_table and (line[:1].isdigit() or line.startswith(("=", "moebench:", "FAILED"))):
            in_table = False  # the tally line, or the next section
        if in_table and line.startswith(" ") and out and not out[-1].startswith(("-", "=")):
            out[-1] = f"{out[-1].rstrip()} {line.strip()}"
            continue
        out.append(line)
    return pytest.LineMatcher(out)


@pytest.fixture
def fakebench(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> FakeBench:
    return FakeBench(pytester, monkeypatch)


def _interpreter_on() -> bool:
    import triton

    return bool(triton.knobs.runtime.interpret)


@pytest.fixture(scope="module")
def interp():
    """Runs fn(*args) in a worker whose triton was imported with TRITON_INTERPRET=1.

    Triton builds its own language helpers (tl.zeros, tl.sum, ...) for the interpreter only if the
    variable is set before triton is first imported, and flipping it in this process would break other
    tests' GPU kernels; so Triton kernels run in one spawned worker per test module."""
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        assert pool.submit(_interpreter_on).result(timeout=120), "worker did not start in interpreter mode"
    finally:
        if saved is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = saved
    yield lambda fn, *args: pool.submit(fn, *args).result(timeout=300)
    pool.shutdown()
