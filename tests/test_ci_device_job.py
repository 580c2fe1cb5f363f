"""ci/device_job.sh: a job that outlives the call that started it, followed and collected by later calls.

Each collect brings back only what the job finished since the last one (a device call returns at most 8
files), never a half-written file, and `wait` exits 75 while the job runs and with the job's own code
once it has finished."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOOL = REPO / "ci" / "device_job.sh"


def job(tmp_path: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, MOEBENCH_JOBS=str(tmp_path / "jobs"))
    return subprocess.run(["bash", str(TOOL), *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_a_job_is_followed_collected_once_and_ends_with_its_own_exit_code(tmp_path):
    go = tmp_path / "go"
    # the job writes one file at once, a second under a dot name renamed only after `go` appears
    script = (f'echo started; echo one > "$JOB_OUT/a.txt"; echo partial > "$JOB_OUT/.b.txt"; '
              f'while [ ! -e {go} ]; do sleep 0.1; done; mv "$JOB_OUT/.b.txt" "$JOB_OUT/b.txt"; echo done; exit 3')
    r = job(tmp_path, "start", "j1", "--", "bash", "-c", script)
    assert r.returncode == 0 and "job j1 started" in r.stdout
    deadline = time.monotonic() + 30
    while not (tmp_path / "jobs" / "j1" / "out" / "a.txt").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    first = tmp_path / "c1"
    r = job(tmp_path, "wait", "j1", "--max", "1", "--collect", str(first))
    assert r.returncode == 75 and "started" in r.stdout and "still running" in r.stdout
    assert sorted(p.name for p in first.iterdir()) == ["a.txt", "j1.log"]  # not the half-written one
    assert job(tmp_path, "start", "j1", "--", "true").returncode == 2  # one job of a name at a time
    go.touch()
    second = tmp_path / "c2"
    r = job(tmp_path, "wait", "j1", "--max", "30", "--collect", str(second))
    assert r.returncode == 3 and "done" in r.stdout and "started" not in r.stdout  # only the new log lines
    assert sorted(p.name for p in second.iterdir()) == ["b.txt", "j1.log"]  # a.txt came back already
    assert (second / "b.txt").read_text() == "partial\n"
    assert "finished: exit 3" in job(tmp_path, "status", "j1").stdout


def test_bad_usage_is_one_line_and_exit_2(tmp_path):
    for args, said in ((("wait", "nope"), "no job nope under"), (("start", "a/b", "--", "true"), "job name 'a/b'"),
                       (("start", "j2"), "no command given"), (("wait", "j2", "--max", "soon"), "")):
        r = job(tmp_path, *args)
        assert r.returncode == 2 and said in r.stderr and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)


def test_the_last_lines_of_a_job_that_ends_between_two_looks_are_shown(tmp_path):
    """The race CI met on a loaded box: the job wrote its last line and its exit code just after `wait`
    had read the log's size. A `stat` on PATH makes that happen on the first look, every time."""
    jobs = tmp_path / "jobs" / "j3"
    (jobs / "out").mkdir(parents=True)
    (jobs / "log").write_text("started\n")
    (jobs / "pid").write_text("999999\n")
    shim = tmp_path / "bin"
    shim.mkdir()
    real_stat = subprocess.run(["bash", "-c", "command -v stat"], capture_output=True, text=True).stdout.strip()
    (shim / "stat").write_text(
        "#!/bin/bash\n"
        f'out=$("{real_stat}" "$@")\n'  # the size as it was when looked at
        f'if [ ! -e "{jobs}/rc" ]; then echo "done" >>"{jobs}/log"; echo 4 >"{jobs}/rc"; fi\n'
        'echo "$out"\n')
    (shim / "stat").chmod(0o755)
    env = dict(os.environ, MOEBENCH_JOBS=str(tmp_path / "jobs"), PATH=f"{shim}:{os.environ['PATH']}")
    r = subprocess.run(["bash", str(TOOL), "wait", "j3", "--max", "20"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 4 and "started" in r.stdout and "done" in r.stdout, r.stdout
