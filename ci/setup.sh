#!/usr/bin/env bash
# Install this checkout of moebench (editable, with matplotlib for the plots) into the runner's Python.
# The GPU image already has torch, triton and vLLM: --no-build-isolation keeps pip from fetching a
# build backend, and the pins in pyproject.toml leave installed packages alone when they fit.
#   PYTHON               the interpreter (default python3; point it at a venv's python to use one)
#   MOEBENCH_SETUP=skip  use the environment as it is (a prepared image), only print versions
#   MOEBENCH_EXTRAS      extras to install (default: plots,history; e.g. "plots,history,vllm")
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"
if [ "${MOEBENCH_SETUP:-}" != skip ]; then
  "$py" -m pip install --disable-pip-version-check -q --no-build-isolation -e ".[${MOEBENCH_EXTRAS:-plots,history}]"
fi
"$py" - <<'PY'
from importlib import metadata
for name in ("moebench", "torch", "triton", "vllm", "sglang", "pytest", "pytest-benchmark", "nvidia-ml-py", "matplotlib"):
    try:
        print(f"{name:>18} {metadata.version(name)}")
    except metadata.PackageNotFoundError:
        print(f"{name:>18} (not installed)")
PY
