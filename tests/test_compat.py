"""pytest / pytest-benchmark versions: the ranges pyproject.toml states are the tested ones, and a pair
that installs but cannot run is refused at startup in one line."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from moebench.suite.compat import version_problem

REPO = Path(__file__).resolve().parents[1]
# The GPU image's pair (it cannot install anything) and the newest pair .ci/run tests.
OLDEST = {"pytest": "9.0.0", "pytest-benchmark": "5.2.3"}
NEWEST = {"pytest": "9.2.0", "pytest-benchmark": "5.3.1"}


def pins() -> dict[str, Requirement]:
    deps = [Requirement(d) for d in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]]
    return {r.name: r for r in deps if r.name in OLDEST}


def test_the_ranges_hold_the_tested_pairs_and_stop_above_the_newest():
    for name, req in pins().items():
        assert Version(OLDEST[name]) in req.specifier and Version(NEWEST[name]) in req.specifier, req
        lowest = [Version(s.version) for s in req.specifier if s.operator == ">="]
        assert lowest == [Version(OLDEST[name])], f"{req}: the lower bound is the oldest tested version"
        upper = [s for s in req.specifier if s.operator == "<"]
        assert upper, f"{req}: an upper bound just above the newest tested version"


def test_ci_runs_the_oldest_pair():
    ci = (REPO / ".ci" / "run").read_text()
    assert f"pytest=={OLDEST['pytest']}" in ci and f"pytest-benchmark=={OLDEST['pytest-benchmark']}" in ci


@pytest.mark.parametrize("pair", [("9.0.0", "5.2.3"), ("9.1.1", "5.2.3"), ("9.2.0", "5.3.1"), ("9.0.3", "5.3.1")])
def test_working_pairs_pass(pair):
    assert version_problem(*pair) is None


@pytest.mark.parametrize("old", ["5.2.3", "5.3.0"])
def test_pytest_9_2_with_an_older_pytest_benchmark_is_one_line(old):
    msg = version_problem("9.2.0", old)
    assert msg == (f"moebench: pytest 9.2.0 with pytest-benchmark {old} does not work (pytest-benchmark "
                   "before 5.3.1 reads Node._nodeid, which pytest 9.2 removed): "
                   "pip install 'pytest-benchmark>=5.3.1,<5.4' (or 'pytest<9.2')")


def _fake_dist(root: Path, name: str, version: str) -> None:
    d = root / f"{name.replace('-', '_')}-{version}.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_a_bad_pair_stops_the_run_at_configure_with_a_usage_error(fakebench, tmp_path):
    # Metadata found first on sys.path says pytest 9.2.0 and pytest-benchmark 5.2.3, as pip leaves them
    # when it upgrades pytest beside an installed pytest-benchmark; the code that runs is the real one.
    fake = tmp_path / "dists"
    _fake_dist(fake, "pytest", "9.2.0")
    _fake_dist(fake, "pytest-benchmark", "5.2.3")
    r = fakebench.run(env={"PYTHONPATH": f"{fake}:{REPO / 'src'}"})
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in r.stderr.lines if line.strip()]
    assert errors == [f"ERROR: {version_problem('9.2.0', '5.2.3')}"]
    assert fakebench.calls() == {}
