#!/usr/bin/env bash
# One benchmark job: snapshot the machine, run the gated suite, keep the run, plot the trends.
#
#   ci/nightly.sh [--cpu | --gpu] [--job NAME] [--markers EXPR] [--out DIR] [options] [-- PYTEST_ARGS...]
#
#   --cpu / --gpu        CPU mode (GPUs hidden, the matrix's `cpu` job) or GPU mode; default: GPU mode
#                        when nvidia-smi lists a GPU, else CPU mode
#   --job NAME           a job of ci/matrix.toml: its markers, timeout, GPU count and workers (default: `cpu`
#                        in CPU mode, `smoke` in GPU mode)
#   --workers N|auto     pytest -n (pytest-xdist): one worker per GPU, each case on a fixed GPU (default:
#                        the job's `workers`; 0 = one process)
#   --markers EXPR       the -m expression (overrides the job's)
#   --out DIR            output folder (default: $MOEBENCH_OUT/<job>-<UTC time>-<random>, a new folder
#                        per run; MOEBENCH_OUT defaults to out)
#   --baseline-dir DIR   baselines to gate against (default: baselines)
#   --storage URI        pytest-benchmark storage (default: file://$MOEBENCH_HOME/benchmark-storage;
#                        elasticsearch+https://... works too, see ci/README.md)
#   --history DIR        where results files are kept for the trend plots (default: $MOEBENCH_HOME/history)
#   --timeout-minutes N  the job's limit, at least 1; pytest is interrupted (SIGINT) early enough to
#                        still write what it measured (default: the job's timeout_minutes)
#   --acknowledged FILE  accepted change points for `moebench changes` (default: ci/acknowledged-changes.toml)
#   --strict/--no-strict --baseline-strict (NEW and STALE fail); default on in GPU mode, off in CPU mode
#   --record             write the measured values into --baseline-dir (--baseline-update) instead of
#                        proposing them, never strict: the record half of record-then-gate (ci/lent.sh)
#   --no-plots           skip the trend plots (a machine without matplotlib); the comparison stays
#
# Writes into the output folder: results.json, summary.md, junit.xml, pytest.log, proposed-baselines/ (not with --record),
# baselines-not-written.txt (only when the baseline write refused an entry or kept one as not gating),
# machine/ (ci/snapshot.sh), report/ (plots/*.png, index.html, index.md), compare-previous.txt,
# changes.txt / changes.json / changes.md (`moebench changes` over this job's history; also in summary.md).
# The run joins the history as <hardware-key>/<job>/<UTC time>-<random>.json: two runs started in the
# same second keep both. A history file that does not load is skipped with one line naming it.
# Exit code: pytest's (1 when a case regressed), else 1 when `moebench changes` found a change towards
# worse in the last 3 runs, else non-zero if the report could not be made.
# MOEBENCH_HOME: $HOME/.moebench under GitHub Actions (it outlives the workspace on a self-hosted
# runner), else .benchmarks/moebench in this checkout. PYTHON: the interpreter (default python3).
set -uo pipefail
shopt -s nullglob
cd "$(dirname "$0")/.." || exit 2
root="$PWD"
py="${PYTHON:-python3}"
export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's moebench, installed or not

die() { echo "ci/nightly.sh: error: $*" >&2; exit 2; }
# The words as a shell needs them typed: plain ones as they are, any other single-quoted (${a@Q}), so a
# command shown can be pasted back (`-m "gemm and tiny"` used to show as -m gemm and tiny).
shell_words() {
  local a out=()
  for a in "$@"; do
    if [[ "$a" =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then out+=("$a"); else out+=("${a@Q}"); fi
  done
  echo "${out[*]}"
}

mode=auto job="" markers="" workers="" out="" baseline_dir=baselines storage="" history="" timeout_min="" strict="" extra=()
acknowledged=ci/acknowledged-changes.toml
record=0 plots=1
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) mode=cpu ;;
    --gpu) mode=gpu ;;
    --job) job="${2:?--job needs a name}"; shift ;;
    --markers) markers="${2:?--markers needs an expression}"; shift ;;
    --workers) workers="${2:?--workers needs a number or auto}"; shift ;;
    --out) out="${2:?--out needs a folder}"; shift ;;
    --baseline-dir) baseline_dir="${2:?--baseline-dir needs a folder}"; shift ;;
    --storage) storage="${2:?--storage needs a URI}"; shift ;;
    --history) history="${2:?--history needs a folder}"; shift ;;
    --timeout-minutes) timeout_min="${2:?--timeout-minutes needs a number}"; shift ;;
    --acknowledged) acknowledged="${2:?--acknowledged needs a file}"; shift ;;
    --strict) strict=1 ;;
    --no-strict) strict=0 ;;
    --record) record=1 ;;
    --no-plots) plots=0 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown option '$1' (see ci/nightly.sh --help)" ;;
  esac
  shift
done

if [ "$mode" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then mode=gpu; else mode=cpu; fi
fi
[ -n "$job" ] || job=$([ "$mode" = cpu ] && echo cpu || echo smoke)
matrix() { "$py" ci/matrix.py --job "$job" --field "$1"; }
[ -n "$markers" ] || markers=$(matrix markers) || die "cannot read job '$job' from ci/matrix.toml"
[ -n "$timeout_min" ] || timeout_min=$(matrix timeout_minutes) || die "cannot read job '$job' from ci/matrix.toml"
case "$timeout_min" in ''|*[!0-9]*) die "--timeout-minutes '$timeout_min': not a whole number of minutes" ;; esac
[ "$timeout_min" -ge 1 ] || die "--timeout-minutes $timeout_min: must be at least 1 (there is no 'no limit')"
gpus=$(matrix gpus 2>/dev/null || echo 0)
[ -n "$workers" ] || workers=$(matrix workers 2>/dev/null || echo 0)
case "$workers" in auto|[0-9]|[0-9][0-9]) ;; *) die "--workers '$workers': a number of workers or auto" ;; esac
[ -n "$strict" ] || strict=$([ "$mode" = gpu ] && echo 1 || echo 0)
[ "$record" = 1 ] && strict=0  # a record writes NEW entries: strict would refuse what it is there to write

if [ "$mode" = cpu ]; then
  # Hide any GPU: NVML then reports none, the hardware key is the CPU's, GPU cases skip with a reason.
  export CUDA_VISIBLE_DEVICES=""
elif [ -z "${CUDA_VISIBLE_DEVICES+x}" ] && [ "${gpus:-0}" -gt 0 ]; then
  CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((gpus - 1)))
  export CUDA_VISIBLE_DEVICES
fi

stamp=$(date -u +%Y%m%dT%H%M%SZ)
if [ -z "$out" ]; then
  out_root="${MOEBENCH_OUT:-out}"
  mkdir -p "$out_root" || die "cannot create $out_root"
  # mktemp: a new folder even for two runs started in the same second
  out=$(mktemp -d "$out_root/$job-$stamp-XXXXXX") || die "cannot create a folder under $out_root"
fi
if [ "${GITHUB_ACTIONS:-}" = true ]; then home_default="$HOME/.moebench"; else home_default="$root/.benchmarks/moebench"; fi
home="${MOEBENCH_HOME:-$home_default}"
[ -n "$storage" ] || storage="${MOEBENCH_BENCHMARK_STORAGE:-file://$home/benchmark-storage}"
[ -n "$history" ] || history="${MOEBENCH_HISTORY:-$home/history}"
mkdir -p "$out" || die "cannot create $out"

echo "== moebench $job ($mode mode): -m \"$markers\", limit $timeout_min min, CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-<all>}"
echo "== output $out; storage $storage; history $history"
ci/snapshot.sh "$out/machine"

# --- the run: per-case lines (-v) and the outcome of every test (-rA) stay on the terminal and in the log.
args=(-m "$markers" -v -rA --baseline-dir "$baseline_dir"
      --results-json "$out/results.json" --junitxml "$out/junit.xml" --summary-md "$out/summary.md"
      --benchmark-storage "$storage" --benchmark-save "$job")
if [ "$record" = 1 ]; then args+=(--baseline-update); else args+=(--baseline-propose "$out/proposed-baselines"); fi
[ "$strict" = 1 ] && args+=(--baseline-strict)
if [ "$workers" != 0 ]; then
  # One worker per GPU, each case always on the same GPU; without pytest-xdist, one process as before.
  if "$py" -c 'import xdist' 2>/dev/null; then args+=(-n "$workers"); else echo "== pytest-xdist is not installed: one process (no -n $workers)"; fi
fi
# Leave a fifth of the limit (at most 5 minutes) for the report; SIGINT lets pytest write what it has.
limit_s=$((timeout_min * 60)); reserve=$((limit_s / 5 < 300 ? limit_s / 5 : 300))
echo "== $(shell_words "$py" -m pytest benchmarks/ "${args[@]}" "${extra[@]}")"
# --foreground: pytest stays in this script's process group, so a cancelled job or a Ctrl-C reaches it.
timeout --foreground -s INT -k 120 $((limit_s - reserve)) "$py" -m pytest benchmarks/ "${args[@]}" "${extra[@]}" 2>&1 | tee "$out/pytest.log"
rc=${PIPESTATUS[0]}
# What the run's baseline write left out or kept without gating, by case key (the plugin's lines): said in
# one line here, in summary.md and at the top of the report page.
unwritten="$out/baselines-not-written.txt"
grep -E '^moebench: .*NOT written|stored as not gating' "$out/pytest.log" >"$unwritten" 2>/dev/null
refused=$(grep -c 'baseline NOT written: \|^moebench: baselines NOT written' "$unwritten")
ungated=$(grep -c 'stored as not gating' "$unwritten")
if [ -s "$unwritten" ]; then
  what=$([ "$record" = 1 ] && echo "$baseline_dir" || echo "proposed-baselines/")
  echo "== baselines ($what): $refused entr$([ "$refused" = 1 ] && echo y || echo ies) NOT written, $ungated metric(s) stored as not gating (noise too wide); to gate them, record with more runs on a quieter machine (moebench aa --runs 3 --promote DIR -- ...); see $unwritten"
  { echo; echo "### Baselines not written or not gating"; echo; echo '```'; cat "$unwritten"; echo '```'; } >>"$out/summary.md" 2>/dev/null
else
  rm -f "$unwritten"
fi
case "$rc" in
  0) ;;
  1) if [ "$refused" -gt 0 ]; then echo "== pytest: $refused baseline entr$([ "$refused" = 1 ] && echo y || echo ies) NOT written (see above)";
     else echo "== pytest: some cases failed (a regression or an error): see the verdict table above"; fi ;;
  5) echo "== pytest: -m \"$markers\" selected no test" ;;
  124|130) echo "== pytest: interrupted at the time limit; the results hold the cases that finished" ;;
  *) echo "== pytest exited $rc" ;;
esac

# --- keep the run, compare it with the previous one of this job, find change points, plot the trends.
loads() {  # loads FILE: whether moebench reads FILE as a results file
  "$py" -c 'import sys
from moebench.results.document import ResultsError
from moebench.history.runs import load_run
try:
    load_run(sys.argv[1])
except ResultsError:
    sys.exit(1)' "$1" 2>/dev/null
}
report_rc=0 changes_rc=0 kept=""
if [ -f "$out/results.json" ]; then
  hw=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["hardware_key"])' "$out/results.json")
  keep="$history/$hw/$job"
  mkdir -p "$keep"
  past=("$keep"/*.json)  # <UTC time>[-<random>].json: the glob's order is the time order
  prev=""
  for ((i = ${#past[@]} - 1; i >= 0; i--)); do  # the newest that loads (`moebench changes` names the others)
    if loads "${past[i]}"; then prev="${past[i]}"; break; fi
  done
  # A unique name (mktemp), filled through a hidden temporary file and a rename: a reader never sees
  # half a file, and two runs started in the same second keep both.
  if kept=$(mktemp "$keep/$stamp-XXXXXX.json") && cp "$out/results.json" "$keep/.tmp-$(basename "$kept")" &&
     mv "$keep/.tmp-$(basename "$kept")" "$kept"; then
    echo "== kept as $kept"
  else
    echo "== could not keep the run in $keep"; kept=""; report_rc=1
  fi
  if [ -n "$prev" ]; then
    "$py" -m moebench compare "$prev" "$out/results.json" >"$out/compare-previous.txt" 2>&1
    # its tally says "-> exit 1" when a case moved against that run; the job's exit is the gate's against the
    # baselines (and the change points'), so the line says so rather than read as the job's verdict
    echo "== against the previous $job run ($(basename "$prev")): $(tail -n 1 "$out/compare-previous.txt" | sed 's/ -> exit 1 / /')" \
      "(shown, not gated: the run is gated against its baselines)"
    if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
      { echo; echo "<details><summary>moebench $job: this run against the previous one</summary>"; echo;
        echo '```'; cat "$out/compare-previous.txt"; echo '```'; echo "</details>"; } >>"$GITHUB_STEP_SUMMARY"
    fi
  fi
  # The stored baselines draw the line and band, and acknowledge the change points they were recorded after.
  with_baselines=()
  [ -d "$baseline_dir" ] && with_baselines=(--baseline-dir "$baseline_dir")
  with_changes=()
  if "$py" -c 'import ruptures' 2>/dev/null; then
    echo "== change points over this job's history ($keep):"
    "$py" -m moebench changes "$keep" "${with_baselines[@]}" --acknowledged "$acknowledged" \
      --json "$out/changes.json" --markdown "$out/changes.md" 2>&1 | tee "$out/changes.txt"
    changes_rc=${PIPESTATUS[0]}
    if [ -f "$out/changes.md" ]; then
      { echo; cat "$out/changes.md"; } >>"$out/summary.md"
      [ -z "${GITHUB_STEP_SUMMARY:-}" ] || { echo; cat "$out/changes.md"; } >>"$GITHUB_STEP_SUMMARY"
      with_changes=(--changes "$out/changes.json")
    fi
    [ "$changes_rc" -le 1 ] || report_rc=$changes_rc
  else
    echo "== change points: not looked for (ruptures is not installed: pip install 'moebench[history]')"
  fi
  # The last 90 runs of this job on this hardware: a quarter of nightly history in one plot.
  runs=("$keep"/*.json)
  first=$((${#runs[@]} > 90 ? ${#runs[@]} - 90 : 0))
  if [ "$plots" = 1 ]; then
    # Its "skipped FILE" lines are left out when `moebench changes` has already named those files.
    skipped_named='^moebench report: skipped '
    [ -f "$out/changes.json" ] || skipped_named='^$^'
    with_note=()
    [ -s "$unwritten" ] && with_note=(--note "$unwritten")
    { "$py" -m moebench report "${runs[@]:$first}" --out "$out/report" "${with_baselines[@]}" "${with_changes[@]}" \
        "${with_note[@]}" \
        2>&1 1>&3 | grep -v "$skipped_named" >&2; plot_rc=${PIPESTATUS[0]}; } 3>&1
    [ "$plot_rc" -eq 0 ] || report_rc=$plot_rc
  fi
else
  echo "== no results file: pytest stopped before the end of the session (see $out/pytest.log)"
  report_rc=1
fi

# Only what is there: a run stopped early has no report, a --record run no proposed baselines.
wrote=()
for f in results.json summary.md junit.xml pytest.log proposed-baselines/ baselines-not-written.txt machine/ \
         compare-previous.txt changes.txt report/index.html; do
  [ -e "$out/$f" ] && wrote+=("$f")
done
echo "== wrote $out: ${wrote[*]:-nothing}${kept:+; history $kept}"
if [ "$rc" -ne 0 ]; then exit "$rc"; fi
if [ "$changes_rc" -eq 1 ]; then exit 1; fi
exit "$report_rc"
