#!/usr/bin/env bash
# SGLang and vLLM on one lent H200, the steps of docs/sglang.md in one job (ci/device_job.sh runs it in
# the background across device calls). Each measuring step is a ci/lent.sh pass and leaves an archive
# STEP.tgz in $JOB_OUT (results.json, summary.md, pytest log, engine logs; the decode traces of the
# record and vLLM steps apart in STEP-traces.tgz when small enough to come back):
#
#   probe          the image's packages (pip freeze), nvcc, GPU: image-packages.txt beside the archives
#   install-sglang SGLang's kept parts installed (stage_engine.py install)
#   record-kimi    the Kimi INT4 rank through SGLang, recorded from 3 engine instances (the first compiles
#                  SGLang's JIT kernels; the next two show whether they reuse the cache)
#   jit-cache      SGLang's JIT cache ($TVM_FFI_CACHE_DIR, else ~/.cache/tvm-ffi) packed as jit-cache.tgz when
#                  under 15 MiB
#   gate-sglang    the same rank through SGLang, gated against the scratch baselines (the committed ones, or
#                  record-kimi's entry when it ran first), MOEBENCH_DECODE_INSTANCES engine instances (default
#                  1). A gate pass also proposes baselines, so on a machine outside the entry's recorders
#                  MOEBENCH_DECODE_INSTANCES=3 is the fresh-machine gate and a run to promote in one step
#   plant-kimi     ci/planted's SGLang plugin: every tenth MoE layer's Marlin GEMMs twice, gated
#   install-vllm   vLLM's kept parts installed (waiting up to 5 minutes for the last to arrive)
#   gate-vllm      the same rank through vLLM (in-process and server), gated against the committed entries
#   record-glm     the GLM-5 rank through SGLang (a `full` case), one instance
#
#   ci/engines_h200.sh STEP...     e.g. `probe install-sglang record-kimi jit-cache gate-sglang ...`
#
# SGLang's steps run with `ci/lent.sh --site none`: its processes see the same path in every step,
# whether vLLM is installed beside it yet or not (their pins differ: docs/sglang.md). Needs
# MOEBENCH_COMMIT (the tree has no .git) and JOB_OUT. A failing step does not stop the next (each is
# its own engine run); the exit code is the first failing step's, 0 when all passed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
out=${JOB_OUT:?JOB_OUT is not set: run through ci/device_job.sh}
scratch=${MOEBENCH_LENT_SCRATCH:-/tmp/moebench-lent}
logs=$scratch/engine-logs
export MOEBENCH_SGLANG_SITE=${MOEBENCH_SGLANG_SITE:-/tmp/site-sglang}
mkdir -p "$out" "$logs"
. ci/job_steps.sh  # step, install, finish

pack() {  # pack STEP: the step's pass folders, its engine logs (traces apart) and its log, into $out
  local step=$1 parts=()
  for d in "$scratch"/decode-engines-record "$scratch"/decode-engines-gate "$logs/$step" "$scratch/$step.log"; do
    [ -e "$d" ] && parts+=("${d#"$scratch"/}")
  done
  [ ${#parts[@]} -gt 0 ] || return 0
  tar -C "$scratch" --exclude='*-profile' -czf "$out/.$step.tgz" "${parts[@]}" && mv "$out/.$step.tgz" "$out/$step.tgz"
  # the SGLang and vLLM traces, for the category map and for ci/rederive_breakdown.py
  if [ "$step" = record-kimi ] || [ "$step" = record-glm ] || [ "$step" = gate-vllm ] || [ "$step" = gate-sglang ]; then
    # tar globs no member names when it creates an archive: the shell expands the pattern (run 1 sent none)
    local traces=()
    for d in "$logs/$step"/*/*-profile; do [ -d "$d" ] && traces+=("${d#"$scratch"/}"); done
    [ ${#traces[@]} -gt 0 ] && tar -C "$scratch" -czf "$out/.$step-traces.tgz" "${traces[@]}"
    if [ ! -f "$out/.$step-traces.tgz" ]; then
      echo "== $step: no trace was written"
    elif [ "$(stat -c %s "$out/.$step-traces.tgz")" -lt $((15 << 20)) ]; then
      mv "$out/.$step-traces.tgz" "$out/$step-traces.tgz"
    else
      echo "== $step: traces over 15 MiB, not brought back"; rm -f "$out/.$step-traces.tgz"
    fi
  fi
  # the next step's pass folders start empty, so each archive holds its own step only
  rm -rf "$scratch"/decode-engines-record "$scratch"/decode-engines-gate
}

lent() { ci/lent.sh decode-engines --scratch "$scratch" --out "$scratch/lent-out" "$@"; }
sglang() { lent --site none "$@"; }

for s in "$@"; do
  case "$s" in
    probe)
      { nvidia-smi -L; nvcc --version | tail -n 2; nproc; python3 --version; } 2>&1
      python3 -m pip list --format=freeze >"$out/.image-packages.txt" 2>/dev/null &&
        mv "$out/.image-packages.txt" "$out/image-packages.txt" ;;
    install-sglang) install sglang-0.5.15 "$MOEBENCH_SGLANG_SITE" || { echo "== nothing to measure"; exit 1; } ;;
    install-vllm) install vllm-0.21.0 /tmp/site 300 || { [ "$first_rc" -eq 0 ] && first_rc=1; } ;;
    record-kimi) step record-kimi sglang --pass record -- -k "sglang and kimi" --decode-instances 3 \
      --decode-log-dir "$logs/record-kimi" ;;
    jit-cache)  # SGLang's built JIT kernels, to carry to the next bare machine (when small enough)
      cache=${TVM_FFI_CACHE_DIR:-$HOME/.cache/tvm-ffi}  # where SGLang keeps them (sglang_engine.jit_cache_dir)
      tar -C "$(dirname "$cache")" -czf "$out/.jit-cache.tgz" "$(basename "$cache")" 2>/dev/null
      size=$(stat -c %s "$out/.jit-cache.tgz" 2>/dev/null || echo 0)
      echo "== jit-cache: $(find "$cache" -name '*.so' 2>/dev/null | wc -l) modules, $((size >> 20)) MiB packed"
      if [ "$size" -lt $((15 << 20)) ]; then mv "$out/.jit-cache.tgz" "$out/jit-cache.tgz"; else rm -f "$out/.jit-cache.tgz"; fi ;;
    gate-sglang) step gate-sglang sglang --pass gate -- -k "sglang and kimi" --decode-instances "${MOEBENCH_DECODE_INSTANCES:-1}" \
      --decode-log-dir "$logs/gate-sglang" ;;
    plant-kimi) PYTHONPATH="$PWD/ci/planted${PYTHONPATH:+:$PYTHONPATH}" MOEBENCH_PLANT_EXPERTS=0.10 \
      step plant-kimi sglang --pass gate -- -k "sglang and kimi" --decode-log-dir "$logs/plant-kimi" ;;
    gate-vllm) step gate-vllm lent --site /tmp/site --pass gate -- -k "kimi and int4 and not w4 and not mma and not sglang" \
      --decode-log-dir "$logs/gate-vllm" ;;
    record-glm) step record-glm sglang --pass record -- -m "decode and sglang and full" -k glm \
      --decode-log-dir "$logs/record-glm" ;;
    *) echo "ci/engines_h200.sh: error: unknown step '$s' (see the header)" >&2; exit 2 ;;
  esac
done
finish
