"""Adding a gemm backend is one Backend record in the registry plus its marker in pyproject.toml: the
case axis, the registry and the registered markers must name the same backends, or collection would
make cases nobody can build, or backends no -m expression can select."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from moebench.gemm import cases
from moebench.gemm.backends import BACKENDS as REGISTRY

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _markers() -> dict[str, str]:
    lines = tomllib.loads(PYPROJECT.read_text())["tool"]["pytest"]["ini_options"]["markers"]
    return {re.split(r"[:(]", line, maxsplit=1)[0].strip(): line.split(":", 1)[1].strip() for line in lines}


def test_the_case_axis_is_the_registry():
    assert tuple(REGISTRY) == cases.BACKENDS


def test_every_backend_has_its_marker_with_a_description():
    markers = _markers()
    missing = [name for name in REGISTRY if name not in markers]
    assert missing == [], f"register these in pyproject.toml's markers: {missing}"
    assert all(markers[name] for name in REGISTRY)


def test_a_backend_record_names_itself_by_its_marker():
    for name, backend in REGISTRY.items():
        assert backend.name == name and re.fullmatch(r"[a-z][a-z0-9_]*", name), name
