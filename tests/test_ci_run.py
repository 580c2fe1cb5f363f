""".ci/run and README.md agree: CI runs README's install and test commands (up to -q), in a virtual
environment of its own that does not see the machine's packages."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CI = REPO / ".ci" / "run"


def readme_commands(heading: str) -> list[list[str]]:
    """The commands of the code block under README.md's paragraph starting with `heading`, split at
    `&&` and `;`, each as argv."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = re.search(re.escape(heading) + r".*?```\n(.*?)\n```", text, re.S)
    assert block, f"README.md: no code block after {heading!r}"
    return [shlex.split(c) for c in re.split(r"&&|;", block.group(1))]


def ci_commands() -> list[list[str]]:
    """The python3 commands .ci/run runs (a `run LABEL` prefix dropped)."""
    out = []
    for line in CI.read_text(encoding="utf-8").splitlines():
        try:
            words = shlex.split(line.split(" || ")[0], comments=True)
        except ValueError:  # a line of the embedded Python, not a command
            continue
        if words[:1] == ["run"] and len(words) > 2:
            words = words[2:]
        if words[:1] == ["python3"]:
            out.append(words)
    return out


def quiet(argv: list[str]) -> list[str]:
    return [w for w in argv if w != "-q"]


def test_ci_runs_the_readme_install_and_test_commands():
    ci = [quiet(c) for c in ci_commands()]
    for cmd in readme_commands("Run the harness's tests"):
        assert quiet(cmd) in ci, f".ci/run does not run README's {shlex.join(cmd)!r}"


def test_the_readme_suite_command_installs_the_same_way():
    suite, tests = readme_commands("Run the suite"), readme_commands("Run the harness's tests")
    assert suite[:2] == tests[:2]


def test_ci_makes_a_fresh_venv_without_the_machine_packages():
    venvs = [c for c in ci_commands() if c[1:3] == ["-m", "venv"]]
    assert venvs and all("--system-site-packages" not in c for c in venvs)
    assert "activate" in CI.read_text(encoding="utf-8")


def test_ci_run_passes_shellcheck():
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (Debian: apt-get install shellcheck)")
    r = subprocess.run(["shellcheck", "-s", "bash", str(CI)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout
