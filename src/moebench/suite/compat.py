"""Installed-version pairs moebench is known not to run with, refused at startup in one line.

pyproject.toml's ranges cannot express a constraint between two packages, and pip installs a newer
pytest beside an already-installed pytest-benchmark without complaint: pytest 9.2 with pytest-benchmark
5.2.3 then errors at the setup of every case (`'Function' object has no attribute '_nodeid'`).
"""

from __future__ import annotations

from importlib import metadata

from packaging.version import Version

# (pytest at least, pytest-benchmark below, why): each a pair that installs but cannot run.
_BAD_PAIRS = [
    (Version("9.2"), Version("5.3.1"),
     "pytest-benchmark before 5.3.1 reads Node._nodeid, which pytest 9.2 removed"),
]


def version_problem(pytest_version: str, benchmark_version: str) -> str | None:
    """The one-line usage error for a known-bad pytest / pytest-benchmark pair, else None."""
    pt, bm = Version(pytest_version), Version(benchmark_version)
    for pytest_from, benchmark_below, why in _BAD_PAIRS:
        if pt >= pytest_from and bm < benchmark_below:
            return (f"moebench: pytest {pt} with pytest-benchmark {bm} does not work ({why}): "
                    f"pip install 'pytest-benchmark>={benchmark_below},<5.4' (or 'pytest<{pytest_from}')")
    return None


def installed_problem() -> str | None:
    """version_problem() for the installed pytest and pytest-benchmark (None when either is absent)."""
    try:
        return version_problem(metadata.version("pytest"), metadata.version("pytest-benchmark"))
    except metadata.PackageNotFoundError:
        return None
