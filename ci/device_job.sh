#!/usr/bin/env bash
# A long job on a lent GPU machine across several device calls. One call may run 10 minutes and the
# machine stays only while calls follow each other; a job that needs longer (an engine's first start
# compiling its JIT kernels, then several engine instances) runs in its own session (setsid), from a
# snapshot of the tree taken when it starts (a later call's copy of the tree does not change it), and
# each following call waits on it for a while and brings back what it has finished so far.
#
#   ci/device_job.sh start NAME -- CMD [ARGS...]   start CMD in the background; returns at once
#   ci/device_job.sh wait NAME [--max S] [--collect DIR]
#                                                  follow its log for up to S s (default 540); copy the files
#                                                  it has finished in its out folder since the last collect
#                                                  into DIR (a device call brings back at most 8: 7 and the log)
#   ci/device_job.sh status NAME                   running, or its exit code
#
# The job runs in /root/jobs/NAME/tree with JOB_OUT=/root/jobs/NAME/out (what it leaves for collection:
# each file written under a dot name and renamed when complete, so no half-written file is collected);
# its output goes to /root/jobs/NAME/log. Exit codes of `wait`: the job's own when it has finished, 75 when
# it is still running at --max (call wait again), 2 for bad usage or an unknown job.
set -uo pipefail
jobs_root=${MOEBENCH_JOBS:-/root/jobs}

die() { echo "ci/device_job.sh: error: $*" >&2; exit 2; }

cmd=${1:-}; name=${2:-}
[ -n "$cmd" ] && [ -n "$name" ] || die "usage: ci/device_job.sh start|wait|status NAME ... (see the header)"
case "$name" in *[!A-Za-z0-9_.-]*) die "job name '$name': letters, digits, '.', '_' and '-' only" ;; esac
dir="$jobs_root/$name"
shift 2

collect() {  # copy the job's out files not collected before (and the log) into $1
  [ -n "$1" ] || return 0
  mkdir -p "$1" || return 0
  local f base
  for f in "$dir"/out/*; do  # the job writes a file under a dot name and renames it when complete
    [ -f "$f" ] || continue
    base=${f##*/}
    grep -qxF "$base" "$dir/collected" 2>/dev/null && continue
    cp -p "$f" "$1/" && echo "$base" >>"$dir/collected"
  done
  cp -p "$dir/log" "$1/$name.log" 2>/dev/null
  return 0
}

case "$cmd" in
  start)
    [ "${1:-}" = -- ] && shift
    [ $# -gt 0 ] || die "start $name: no command given (ci/device_job.sh start NAME -- CMD ...)"
    if [ -f "$dir/pid" ] && [ ! -f "$dir/rc" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
      die "job $name is already running (pid $(cat "$dir/pid"))"
    fi
    rm -rf "$dir" && mkdir -p "$dir/tree" "$dir/out" || die "cannot create $dir"
    # the tree as it is now, without staged engine parts (hundreds of MB, and not the job's)
    tar --exclude=./.stage --exclude=./.whl -cf - . | tar -C "$dir/tree" -xf - || die "cannot copy the tree to $dir/tree"
    printf '%q ' "$@" >"$dir/cmd"
    # setsid: the job outlives the call that started it (the device tool ends a call's own processes)
    (
      cd "$dir/tree" || exit 2
      # every stream redirected: a caller reading this command's output is not held open by the job
      JOB_OUT="$dir/out" setsid bash -c '"$@"; echo $? >"'"$dir"'/rc"' job "$@" >"$dir/log" 2>&1 </dev/null &
      echo $! >"$dir/pid"
    ) || die "cannot start in $dir/tree"
    echo "job $name started (pid $(cat "$dir/pid")) in $dir/tree: $(cat "$dir/cmd")"
    ;;
  wait)
    max=540 into=""
    while [ $# -gt 0 ]; do
      case "$1" in
        --max) max=${2:?--max needs seconds}; shift ;;
        --collect) into=${2:?--collect needs a folder}; shift ;;
        *) die "wait $name: unknown option '$1'" ;;
      esac
      shift
    done
    case "$max" in ''|*[!0-9]*) die "--max '$max': not a number of seconds" ;; esac
    [ -d "$dir" ] || die "no job $name under $jobs_root"
    seen="$dir/log.seen"; from=$(cat "$seen" 2>/dev/null || echo 0)
    end=$((SECONDS + max))
    show_new_lines() {
      size=$(stat -c %s "$dir/log" 2>/dev/null || echo 0)
      if [ "$size" -gt "$from" ]; then tail -c +"$((from + 1))" "$dir/log" | head -c "$((size - from))"; from=$size; echo "$from" >"$seen"; fi
    }
    while :; do
      # rc is looked at before the log is read: a job that writes its last lines and ends between
      # the two still has those lines shown (the last read happens after rc was seen)
      done_already=0; [ -f "$dir/rc" ] && done_already=1
      show_new_lines
      [ "$done_already" = 1 ] && break
      [ "$SECONDS" -ge "$end" ] && break
      sleep 2
    done
    collect "$into"
    if [ -f "$dir/rc" ]; then rc=$(cat "$dir/rc"); echo "== job $name finished: exit $rc"; exit "$rc"; fi
    echo "== job $name still running after ${max} s more (ci/device_job.sh wait $name again)"
    exit 75
    ;;
  status)
    [ -d "$dir" ] || die "no job $name under $jobs_root"
    if [ -f "$dir/rc" ]; then echo "job $name finished: exit $(cat "$dir/rc")"; else echo "job $name running (pid $(cat "$dir/pid"))"; fi
    ;;
  *) die "unknown command '$cmd' (start, wait or status)" ;;
esac
