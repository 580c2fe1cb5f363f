"""Finding ncu and running a child Python process under it.

Discovery is cheap and never fails (the hardware fingerprint calls it): MOEBENCH_NCU names the executable,
else `ncu` on PATH; its version is `ncu --version`'s "Version X" line, None when that cannot be read.

The launch profiles only the child's measured window: `--profile-from-start off`, and the child brackets its
window with cudaProfilerStart/Stop (torch.cuda.profiler.start/stop). It pins what the counters mean:
`--cache-control all` (ncu's default, caches flushed before each profiled kernel, so DRAM bytes are the
bytes a cold L2 reads), `--clock-control none` (the GPU's own clocks, as the timer sees them) and
`--print-units base` (unscaled values, no rounding to 4 digits). A machine whose ncu cannot read the counters
(ERR_NVGPUCTRPERM) raises NcuUnavailable: a skip with its reason, not a failure. With KEEP_ENV set to a
folder, each launch's raw output (ncu's stdout as <name>.csv, its stderr as <name>.err; the caller names the
launch, keep_path) is kept there, also when it failed or could not be parsed: the table a parse was made
from, and the file to read when it was not.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Sequence

from moebench.core.ncu import Launch, parse_raw_csv

ENV = "MOEBENCH_NCU"
KEEP_ENV = "MOEBENCH_NCU_KEEP"
PERMISSION = "ERR_NVGPUCTRPERM"
# NVIDIA's page on the permission error (how an admin lets users read the counters)
PERMISSION_HELP = ("https://developer.nvidia.com/nvidia-development-tools-solutions-ERR_NVGPUCTRPERM-"
                   "permission-issue-performance-counters")
_VERSION = re.compile(r"\bVersion\s+(\S+)")
_TAG = re.compile(r"^==\w+==\s*")  # ncu's "==ERROR== " prefix


class NcuUnavailable(Exception):
    """ncu cannot count here (not installed, or no permission to read the counters): the reason is a skip's."""


class NcuFailed(RuntimeError):
    """ncu or its child failed: one line saying how (exit status and the last line it wrote, or a timeout)."""


@dataclass(frozen=True)
class NcuTool:
    """Where ncu is (None: not found) and its version (None: not readable)."""

    path: str | None
    version: str | None


def find_ncu() -> NcuTool:
    """MOEBENCH_NCU if set (and an executable file), else `ncu` on PATH; with `ncu --version`. Never raises."""
    try:
        named = os.environ.get(ENV)
        if named:  # a named ncu that is not an executable is none (why_unavailable says so), not PATH's
            path = named if os.path.isfile(named) and os.access(named, os.X_OK) else None
        else:
            path = shutil.which("ncu")
        return NcuTool(path, ncu_version(path) if path else None)
    except Exception:  # the fingerprint must not fail on a strange PATH
        return NcuTool(None, None)


def ncu_version(path: str, timeout_s: float = 20.0) -> str | None:
    """The version `ncu --version` prints ("2024.3.2.0"), or None when it cannot be run or read."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.SubprocessError):
        return None
    m = _VERSION.search(out.stdout + "\n" + out.stderr)
    return m.group(1) if m else None


def why_unavailable(tool: NcuTool) -> str | None:
    """The skip reason of a machine without a usable ncu, else None."""
    if tool.path is None:
        named = os.environ.get(ENV)
        if named:
            return f"{ENV}={named} is not an executable file"
        return f"no ncu: not on PATH and {ENV} is not set (Nsight Compute counts the hardware counters)"
    return None


def ncu_command(ncu: str, metrics: Sequence[str], module: str, args: Sequence[str],
                python: str = sys.executable) -> list[str]:
    """The command line that runs `python -m module args` under ncu (see the module docstring)."""
    return [ncu, "--csv", "--page", "raw", "--print-units", "base", "--clock-control", "none",
            "--cache-control", "all", "--profile-from-start", "off", "--metrics", ",".join(metrics),
            "--target-processes", "all", python, "-m", module, *args]


def keep_path(name: str) -> str | None:
    """Where to keep the raw output of the launch called `name` (a chunk of cases, say): KEEP_ENV's folder,
    else None."""
    folder = os.environ.get(KEEP_ENV)
    return os.path.join(folder, re.sub(r"[^\w.-]", "_", name) + ".csv") if folder else None


def _keep(path: str, stdout: str, stderr: str) -> None:
    """Write ncu's stdout to `path` and its stderr, if any, beside it (.err), each atomically (a reader never
    sees half a file); a failure to keep them is said, not raised: the counters stand without their copy."""
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        for target, text in ((path, stdout), (os.path.splitext(path)[0] + ".err", stderr)):
            if target != path and not text:
                continue
            tmp = f"{target}.tmp{os.getpid()}"
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, target)
    except OSError as e:
        print(f"moebench: could not keep ncu's output in {path}: {e}", file=sys.stderr)


def _run_as_group(cmd: Sequence[str], timeout_s: float, env: dict | None) -> subprocess.CompletedProcess:
    """subprocess.run(capture_output, text) in a process group of its own, all of which is killed when it
    runs past timeout_s (TimeoutExpired) or the caller is interrupted: killing ncu alone left the Python
    child it profiles running, holding the GPU and timing the next case."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except BaseException:  # the timeout, or Ctrl-C: nothing it started may outlive this call
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def run_under_ncu(ncu: str, metrics: Sequence[str], module: str, args: Sequence[str] = (), *,
                  timeout_s: float = 600.0, env: dict | None = None, python: str = sys.executable,
                  keep: str | None = None) -> list[Launch]:
    """Run the child under ncu and return its profiled launches; `keep`: a file to write ncu's raw output to
    first (kept whatever follows). Raises NcuUnavailable when ncu may not read the counters
    (ERR_NVGPUCTRPERM), NcuFailed when it or the child fails or runs past timeout_s, and NcuFormatError (a
    ValueError) when its output is not the table it should be."""
    cmd = ncu_command(ncu, metrics, module, args, python)
    try:
        out = _run_as_group(cmd, timeout_s, env)
    except subprocess.TimeoutExpired:
        # the module, not its arguments: a child counting a chunk of cases has dozens of them
        raise NcuFailed(f"ncu did not finish within {timeout_s:.0f} s running {module} (it and its child were "
                        f"killed)") from None
    except OSError as e:
        raise NcuFailed(f"ncu could not be started ({ncu}): {e}") from None
    if keep:
        _keep(keep, out.stdout, out.stderr)
    both = out.stdout + "\n" + out.stderr
    if PERMISSION in both:
        line = next((ln.strip() for ln in both.splitlines() if PERMISSION in ln), PERMISSION)
        raise NcuUnavailable(f"ncu may not read the GPU performance counters here ({_TAG.sub('', line)}); "
                             f"see {PERMISSION_HELP}")
    if out.returncode != 0:
        last = next((ln.strip() for ln in reversed(both.splitlines()) if ln.strip()), "no output")
        raise NcuFailed(f"ncu exited with status {out.returncode} running {module}: {last}")
    return parse_raw_csv(out.stdout, metrics, source=f"ncu output of {module}")
