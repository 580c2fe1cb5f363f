# The step runner of the lent-H200 job scripts (ci/engines_h200.sh, ci/gate_h200.sh): sourced, not run.
# The sourcing script sets `scratch` (step logs) and `out` (what comes back, $JOB_OUT) and defines
# `pack NAME` (what a finished step leaves in $out) before it calls:
#
#   step NAME CMD...            run CMD with its output in $scratch/NAME.log; print the log's verdict and
#                               progress lines, the rows of its pass summaries that did not pass, its exit
#                               code and time; pack NAME (which empties the pass folders); remember the
#                               first failure
#   install NAME TARGET [WAIT_S]  a staged engine's kept parts (ci/stage_engine.py install), retried every
#                               10 s for WAIT_S while the last parts may still be arriving
#   finish                      the closing line; exits with the first failing step's code (0 when all passed)
#
# A failing step does not stop the next (each measures something of its own), but the job's exit code
# is never 0 when one failed.
first_rc=0

# the lines worth seeing from a step's log: the harness's progress and verdicts, aa's run lines
step_lines() {
  grep -E '^== |^moebench( aa)?: |moebench: .*(engine|steady|server starting|instance|breakdown)|(PASS|REGRESSION|IMPROVEMENT|AMBIGUOUS|NEW|STALE|FAIL|ERROR) |[0-9]+ (passed|failed)' \
    "$1" | tail -n "${2:-40}"
}

step() {
  local name=$1 t0=$SECONDS rc
  shift
  echo "== step $name at $(date -u +%H:%M:%S): $*"
  "$@" >"$scratch/$name.log" 2>&1
  rc=$?
  step_lines "$scratch/$name.log"
  # the rows that did not pass, with their notes (the reason, "moved most: ..."), from the step's pass
  # summaries (pack empties the pass folders, so these are this step's)
  grep -hE '^\| (FAIL|ERROR|REGRESSION|IMPROVEMENT|AMBIGUOUS|STALE|ENV_MISMATCH) ' "$scratch"/*/summary.md 2>/dev/null | cut -c1-600
  echo "== step $name: exit $rc after $((SECONDS - t0)) s"
  pack "$name"
  [ "$rc" -ne 0 ] && [ "$first_rc" -eq 0 ] && first_rc=$rc
  return 0
}

install() {
  local keep=/root/stage-$1 t0=$SECONDS
  until python3 ci/stage_engine.py install --keep "$keep" --target "$2"; do
    [ $((SECONDS - t0)) -lt "${3:-0}" ] || { echo "== install $1 failed"; return 1; }
    sleep 10
  done
  echo "== install $1: $((SECONDS - t0)) s"
}

finish() {
  echo "== all steps done: exit $first_rc"
  exit "$first_rc"
}
