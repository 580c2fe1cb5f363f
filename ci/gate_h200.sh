#!/usr/bin/env bash
# Issue 36's measurements on one lent H200 (the gate as tight on any machine of the kind as on the one that
# recorded it), in one job (ci/device_job.sh runs it in the background across device calls). Each step
# leaves what it measured in $JOB_OUT, written complete (a dot name renamed), so a `wait --collect` never
# brings back half a file:
#
#   install-vllm     vLLM's kept parts installed (ci/stage_engine.py; waits up to 5 minutes for the last)
#   gemm-aa          the default gemm selection and the selfcheck (-m "(gemm and not full) or selfcheck", or
#                    MOEBENCH_GEMM_M's expression when set), narrowed by -k "$MOEBENCH_GEMM_K" when set,
#                    MOEBENCH_AA_RUNS times (default 3), each a separate process gated against the committed
#                    baselines: a fresh-machine A/A, and independent runs to promote (run-<i>.json, and the
#                    A/A table in gemm-aa.log); no run starts that would end past MOEBENCH_AA_BUDGET_S
#                    (default 1300)
#   decode-gate      the default decode selection but SGLang's (-m decode -k "not sglang": in-process Marlin,
#                    server, w4, mma) gated against the committed baselines, MOEBENCH_DECODE_INSTANCES engine
#                    instances each (default 1): decode-gate.tgz
#   plant-marlin     ci/planted's gemm plugin holding the stream MOEBENCH_PLANT_MARLIN_CYCLES GPU cycles
#                    (default 700: +4.2% of Kimi's Marlin M=1 call in session 13) before each Kimi M=1 Marlin call,
#                    -m "gemm and vllm_marlin" gated: that one case must fail, the others pass (plant-marlin.json)
#   plant-attention  ci/planted's vLLM plugin running one MLA decode attention call in round(1/F) twice
#                    (MOEBENCH_PLANT_ATTENTION, default 0.07) on the in-process Kimi INT4 rank, gated: it must
#                    fail on step_attention_ms, "moved most: attention" (plant-attention.tgz)
#   counters-aa      issue 34's counter runs: MOEBENCH_COUNTERS_RUNS (default MOEBENCH_AA_RUNS, else 3; no run
#                    starts past MOEBENCH_COUNTERS_BUDGET_S, default 1500) separate processes of the gemm cases
#                    -m "$MOEBENCH_COUNTERS_M" selects (default: the default selection's triton and vllm_marlin,
#                    "gemm and not full and (triton or vllm_marlin)"), narrowed by -k "$MOEBENCH_COUNTERS_K"
#                    when set, with --counters (ncu: MOEBENCH_NCU, default /usr/local/cuda/bin/ncu), gated
#                    against the committed baselines: counters.tgz (run-<i>.json, the kept ncu tables), and
#                    each run as it finishes: counters-run-<i>.json
#   counters-promote counters-aa's runs promoted (every case) into a scratch copy of the committed baselines,
#                    $MOEBENCH_LENT_SCRATCH/baselines, which plant-narrow then gates against
#   plant-narrow     ci/planted's narrow weight loads (MOEBENCH_PLANT_NARROW_LOADS=1: the same bytes in twice the
#                    load instructions) on the Kimi-K2.5 and DeepSeek-V3 int4 M=1 triton cases with --counters,
#                    gated against the scratch baselines when counters-promote ran, else the committed ones: the
#                    instruction counters must fail, the time must not (plant-narrow.json, plant-narrow.tgz)
#
#   ci/gate_h200.sh STEP...     e.g. `install-vllm gemm-aa decode-gate`
#
# Needs JOB_OUT; the tree has no .git there, so MOEBENCH_COMMIT names it (the runs' provenance). A failing
# step does not stop the next; the exit code is the first failing step's, 0 when all passed (2: an unknown
# step, nothing run).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
out=${JOB_OUT:?JOB_OUT is not set: run through ci/device_job.sh}
scratch=${MOEBENCH_LENT_SCRATCH:-/tmp/moebench-lent}
mkdir -p "$out" "$scratch"
. ci/job_steps.sh  # step, install, finish

for s in "$@"; do  # every step named is known before any runs: a typo costs no device time
  case "$s" in
    install-vllm|gemm-aa|decode-gate|plant-marlin|plant-attention|counters-aa|counters-promote|plant-narrow) ;;
    *) echo "ci/gate_h200.sh: error: unknown step '$s' (see the header)" >&2; exit 2 ;;
  esac
done

pack() {  # pack STEP: the step's log, and its pass folders (ci/lent.sh steps, counters) as STEP.tgz, into $out
  local step=$1 parts=()
  cp -p "$scratch/$step.log" "$out/.$step.log" 2>/dev/null && mv "$out/.$step.log" "$out/$step.log"
  for d in "$scratch"/decode-record "$scratch"/decode-gate "$scratch"/counters "$scratch"/ncu-planted; do
    [ -e "$d" ] && parts+=("${d#"$scratch"/}")
  done
  [ ${#parts[@]} -gt 0 ] || return 0
  tar -C "$scratch" -czf "$out/.$step.tgz" "${parts[@]}" && mv "$out/.$step.tgz" "$out/$step.tgz"
  rm -rf "$scratch"/decode-record "$scratch"/decode-gate "$scratch"/ncu-planted
  [ "$step" = counters-aa ] && rm -rf "$scratch"/counters-done && mv "$scratch"/counters "$scratch"/counters-done  # counters-promote reads it
  return 0
}

# the suite's own environment on this machine, as ci/lent.sh sets it (src, the staged vLLM, NVLink
# multicast off, one GPU), for the steps that call pytest or moebench directly; PLANTED=1 puts ci/planted
# in front (its plugins)
in_suite() {
  (
    site_path=""
    [ -d /tmp/site ] && site_path=$(PYTHONPATH="$PWD/src" python3 -m moebench.core.sites /tmp/site)
    export PYTHONPATH="$PWD/src${site_path:+:$site_path}${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 \
      VLLM_USE_FLASHINFER_SAMPLER=0 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
      CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
    [ "${PLANTED:-0}" = 1 ] && export PYTHONPATH="$PWD/ci/planted:$PYTHONPATH"
    exec "$@"
  )
}

decode_lent() { ci/lent.sh decode --scratch "$scratch" --out "$scratch/lent-out" --pass gate "$@"; }

export MOEBENCH_NCU=${MOEBENCH_NCU:-/usr/local/cuda/bin/ncu}
publish_runs() {  # each finished run-<i>.json of $1 into $out as $2-run-<i>.json (once; dot name, then renamed)
  local f b
  for f in "$1"/run-*.json; do
    [ -f "$f" ] || continue
    b="$2-${f##*/}"
    [ -e "$out/$b" ] || { cp -p "$f" "$out/.$b" && mv "$out/.$b" "$out/$b"; }
  done
}
counters_aa() {  # the counted runs, into $scratch/counters (run-<i>.json; ncu's tables kept in ncu/)
  local k=() rc watcher
  [ -n "${MOEBENCH_COUNTERS_K:-}" ] && k=(-k "$MOEBENCH_COUNTERS_K")
  mkdir -p "$scratch/counters/ncu"
  # a counted run takes 10+ minutes: each one comes back as it finishes (counters-run-<i>.json), so a lease
  # that ends inside the step still brings back the runs it finished (the step's .tgz is packed at its end)
  ( while sleep 20; do publish_runs "$scratch/counters" counters; done ) &
  watcher=$!
  MOEBENCH_NCU_KEEP="$scratch/counters/ncu" in_suite python3 -m moebench aa \
    --runs "${MOEBENCH_COUNTERS_RUNS:-${MOEBENCH_AA_RUNS:-3}}" --budget-s "${MOEBENCH_COUNTERS_BUDGET_S:-1500}" --out "$scratch/counters" -- benchmarks/ \
    -m "${MOEBENCH_COUNTERS_M:-gemm and not full and (triton or vllm_marlin)}" "${k[@]}" --counters
  rc=$?
  kill "$watcher" 2>/dev/null; wait "$watcher" 2>/dev/null
  publish_runs "$scratch/counters" counters
  return $rc
}
counters_promote() {  # counters-aa's runs as the entries of a scratch copy of the committed baselines
  local runs=("$scratch"/counters-done/run-*.json)
  [ -e "${runs[0]}" ] || { echo "counters-promote: no run-*.json in $scratch/counters-done (run counters-aa first)"; return 2; }
  rm -rf "$scratch/baselines" && cp -r baselines "$scratch/baselines" &&
    in_suite python3 -m moebench baselines promote "${runs[@]}" --all --baseline-dir "$scratch/baselines"
}
plant_narrow() {  # the plant, gated against the scratch entries when counters-promote made them
  local dir=baselines
  [ -d "$scratch/baselines" ] && dir="$scratch/baselines"
  mkdir -p "$scratch/ncu-planted"
  PLANTED=1 MOEBENCH_PLANT_NARROW_LOADS=1 MOEBENCH_NCU_KEEP="$scratch/ncu-planted" in_suite python3 -m pytest \
    benchmarks/test_gemm.py -m "gemm and triton" -k "int4 and m1- and (kimi or deepseek)" --counters \
    --baseline-dir "$dir" -rA --results-json "$out/plant-narrow.json"
}

for s in "$@"; do
  case "$s" in
    install-vllm) install vllm-0.21.0 /tmp/site 300 || { [ "$first_rc" -eq 0 ] && first_rc=1; } ;;
    gemm-aa) gemm_k=(); [ -n "${MOEBENCH_GEMM_K:-}" ] && gemm_k=(-k "$MOEBENCH_GEMM_K")
      step gemm-aa in_suite python3 -m moebench aa --runs "${MOEBENCH_AA_RUNS:-3}" \
      --budget-s "${MOEBENCH_AA_BUDGET_S:-1300}" --out "$out" -- benchmarks/ \
      -m "${MOEBENCH_GEMM_M:-(gemm and not full) or selfcheck}" "${gemm_k[@]}" ;;
    # SGLang is not staged by this job: its entries would read as strict skips
    decode-gate) step decode-gate decode_lent -- -k "not sglang" --decode-instances "${MOEBENCH_DECODE_INSTANCES:-1}" ;;
    plant-marlin) PLANTED=1 MOEBENCH_PLANT_MARLIN_CYCLES=${MOEBENCH_PLANT_MARLIN_CYCLES:-700} \
      step plant-marlin in_suite python3 -m pytest -p moebench_planted_gemm benchmarks/ \
        -m "gemm and vllm_marlin" -rA --results-json "$out/plant-marlin.json" ;;
    plant-attention) PYTHONPATH="$PWD/ci/planted${PYTHONPATH:+:$PYTHONPATH}" \
        MOEBENCH_PLANT_ATTENTION=${MOEBENCH_PLANT_ATTENTION:-0.07} \
        step plant-attention decode_lent -- -k "kimi and int4 and not server and moe_auto" ;;
    counters-aa) step counters-aa counters_aa ;;
    counters-promote) step counters-promote counters_promote ;;
    plant-narrow) step plant-narrow plant_narrow ;;
  esac
done
finish
