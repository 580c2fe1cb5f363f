"""pytest-benchmark keeps working with moebench's device-timed numbers.

The plugin feeds each case's primary samples into pytest-benchmark's private Metadata (_make_stats), so
its JSON, storage and compare show the gate's numbers. A private API is pinned, so the installed version
must be inside the range pyproject.toml states.
"""

from __future__ import annotations

import json
import statistics
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


@pytest.mark.parametrize("name", ["pytest", "pytest-benchmark"])
def test_installed_version_is_inside_the_pinned_range(name):
    deps = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    pins = [Requirement(d) for d in deps if Requirement(d).name == name]
    assert len(pins) == 1, f"pyproject.toml must pin {name} once: {deps}"
    # An upper bound: moebench uses pytest-benchmark's private API, and pytest 9.2 broke pytest-benchmark.
    assert any(s.operator in ("<", "<=", "==", "~=") for s in pins[0].specifier), pins[0]
    installed = Version(metadata.version(name))
    assert installed in pins[0].specifier, f"{name} {installed} is outside {pins[0].specifier}"


def test_benchmark_json_holds_the_fake_samples_in_seconds(fakebench, tmp_path):
    out = tmp_path / "bench.json"
    r = fakebench.run("--benchmark-json", str(out))
    r.assert_outcomes(passed=2, skipped=2, deselected=1)
    benches = {b["name"]: b for b in json.loads(out.read_text())["benchmarks"]}
    assert sorted(benches) == ["test_fake[a]", "test_fake[b]"]
    for name, key in (("test_fake[a]", "fake[a]"), ("test_fake[b]", "fake[b]")):
        # The plugin converts each sample the same way: us -> s by multiplying by 1e-6.
        seconds = [x * 1e-6 for x in fakebench.control["samples"][key]]
        stats = benches[name]["stats"]
        assert stats["data"] == seconds
        assert (stats["min"], stats["max"], stats["median"]) == (min(seconds), max(seconds), statistics.median(seconds))
        assert stats["rounds"] == len(seconds) and stats["iterations"] == 1
        assert benches[name]["extra_info"]["moebench_key"] == key
        assert benches[name]["extra_info"]["verdict"] == "NEW"
        assert benches[name]["extra_info"]["units"] == {"latency_us": "us", "busbw_GBps": "GB/s"}
    # Only the fake samples were fed: pytest-benchmark never timed anything itself.
    assert fakebench.calls() == {"fake[a]": 1, "fake[b]": 1}


def test_benchmark_disable_still_gates_without_warnings(fakebench, tmp_path):
    fakebench.write_baseline({"a": 70.0, "b": 200.0})
    r = fakebench.run("--benchmark-disable")
    r.assert_outcomes(passed=1, failed=1, skipped=2, deselected=1)
    assert "REGRESSION fake[a] latency_us: 100 us, baseline 70 us" in r.stdout.str()
    assert "Benchmark fixture was not used" not in r.stdout.str() + r.stderr.str()
    assert "benchmark: 2 tests" not in r.stdout.str(), "no pytest-benchmark table when disabled"


def test_benchmark_skip_skips_moebench_tests(fakebench):
    r = fakebench.run("--benchmark-skip")
    r.assert_outcomes(skipped=4, deselected=1)
    assert fakebench.calls() == {}
    # The four skips share one reason, so the closing table folds them into one row.
    r.stdout.fnmatch_lines(["*SKIP*4 cases*--benchmark-skip*"])
