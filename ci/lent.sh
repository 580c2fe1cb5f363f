#!/usr/bin/env bash
# One phase of the suite on a lent GPU machine (a copy of the tree without .git, a staged vLLM, results
# to bring back): record a selection into a scratch copy of baselines/, then gate against what it
# recorded. Both passes are ci/nightly.sh runs (the nightly job's pytest command, results.json,
# summary.md, junit.xml, the comparison with the previous run); the record pass with --record.
# The committed baselines/nvidia-h200-x*/ files were measured this way (docs/baseline-runs.md).
#
#   ci/lent.sh PHASE [--gpu N] [--pass both|record|gate] [--scratch DIR] [--out DIR] [--site DIR]
#                    [--cpu] [--timeout-minutes N] [--dry-run] [-- PYTEST_ARGS...]
#
#   PHASE (what it runs; record and gate expressions)
#     selfcheck                -m selfcheck
#     gemm                     -m gemm (every backend; this machine's sweep winners applied first)
#     gemm-torch               -m "gemm and (torch_loop or torch_bmm or torch_grouped_mm)"
#     gemm-triton              -m "gemm and (triton or triton_rows4)" (this machine's sweep winners applied first)
#     gemm-vllm                -m "gemm and (vllm_triton or vllm_marlin or flashinfer_cutlass)"
#     decode                   -m decode
#     decode-engines           -m "decode and (vllm or sglang)": vLLM and SGLang side by side (SGLang staged
#                              with ci/stage_engine.py into --site: docs/sglang.md)
#     allreduce                -m allreduce, on every GPU (nvidia-smi topo -m kept beside the results)
#     allreduce-vllm-custom-ar records -m "allreduce and vllm_custom_ar", gates all of -m allreduce
#     triton-sweep             the Triton MoE config sweep (SWEEP_ARGS narrow it, e.g. "--dtypes bf16 --ms 1,2");
#                              later gemm phases on this machine merge its winners into configs.json
#     triton-profile           Nsight Compute over the Kimi-K2.5 M=1 fused MoE after its graph timing
#                              (PROFILE_ARGS go to moebench.gemm.triton_moe.profile, e.g. --config JSON)
#   --gpu N            the GPU a one-GPU phase runs on (CUDA_VISIBLE_DEVICES; default 0)
#   --pass P           both (default), record, or gate: a long phase can be split over two device calls
#                      while the machine is held (the scratch folder stays); `gate` alone on a fresh
#                      machine gates against the committed baselines
#   --scratch DIR      the scratch baselines (DIR/baselines, copied from baselines/ on first use), each
#                      pass's output folder and the run history (default /tmp/moebench-lent)
#   --out DIR          what comes back: summary.md, an archive of the scratch folder (default $OUT or /tmp/out)
#   --site DIR         a staged vLLM's site-packages, put on PYTHONPATH (default $MOEBENCH_SITE, else
#                      /tmp/site where it exists: shared/gpu/vllm-stage installs there); `none`: no site,
#                      so SGLang's processes see the same path whether or not vLLM was staged beside it
#   --cpu              CPU mode (tests, laptops): passed to ci/nightly.sh
#   --timeout-minutes N  each pass's limit (default: the family's job in ci/matrix.toml)
#   --dry-run          print the commands, run nothing
#
# Phases on different GPUs run side by side: `ci/lent.sh gemm-vllm --gpu 0 & ci/lent.sh decode --gpu 1; wait`.
# Provenance: a copied tree has no .git, so the record pass needs MOEBENCH_COMMIT=$(git rev-parse --short
# HEAD) (add -dirty for uncommitted changes); without it, it refuses rather than record "unknown".
# Exit code: the last pass's (ci/nightly.sh: pytest's, 1 when a case regressed); 2 for a bad option.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
root="$PWD"
py="${PYTHON:-python3}"

die() { echo "ci/lent.sh: error: $*" >&2; exit 2; }

phase="" gpu=0 pass=both scratch=/tmp/moebench-lent out="${OUT:-/tmp/out}" site="${MOEBENCH_SITE:-}" dry=0
nightly_opts=() extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --gpu) gpu="${2:?--gpu needs an index}"; shift ;;
    --pass) pass="${2:?--pass needs both, record or gate}"; shift ;;
    --scratch) scratch="${2:?--scratch needs a folder}"; shift ;;
    --out) out="${2:?--out needs a folder}"; shift ;;
    --site) site="${2:?--site needs a folder}"; shift ;;
    --cpu) nightly_opts+=(--cpu) ;;
    --timeout-minutes) nightly_opts+=(--timeout-minutes "${2:?--timeout-minutes needs a number}"); shift ;;
    --dry-run) dry=1 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    -*) die "unknown option '$1' (see ci/lent.sh --help)" ;;
    *) [ -z "$phase" ] || die "one phase at a time ('$phase', then '$1')"; phase=$1 ;;
  esac
  shift
done
case "$pass" in both|record|gate) ;; *) die "--pass '$pass': not both, record or gate" ;; esac
case "$gpu" in ''|*[!0-9]*) die "--gpu '$gpu': not a GPU index" ;; esac

# phase -> family (the ci/matrix.toml job), record expression, gate expression
gemm_torch="gemm and (torch_loop or torch_bmm or torch_grouped_mm)"
case "$phase" in
  selfcheck) family=selfcheck rec="selfcheck" gate="selfcheck" ;;
  gemm) family=gemm rec="gemm" gate="gemm" ;;
  gemm-torch) family=gemm rec="$gemm_torch" gate="$gemm_torch" ;;
  gemm-triton) family=gemm rec="gemm and (triton or triton_rows4)" gate="$rec" ;;
  gemm-vllm) family=gemm rec="gemm and (vllm_triton or vllm_marlin or flashinfer_cutlass)" gate="$rec" ;;
  decode) family=decode rec="decode" gate="decode" ;;
  decode-engines) family=decode rec="decode and (vllm or sglang)" gate="$rec" ;;
  allreduce) family=allreduce rec="allreduce" gate="allreduce" ;;
  allreduce-vllm-custom-ar) family=allreduce rec="allreduce and vllm_custom_ar" gate="allreduce" ;;
  triton-sweep|triton-profile) family="" rec="" gate="" ;;
  "") die "no phase given (see ci/lent.sh --help)" ;;
  *) die "unknown phase '$phase' (see ci/lent.sh --help)" ;;
esac

# A record without a commit would file baselines whose provenance says "unknown".
if [ "$pass" != gate ] && [ -n "$family" ] && [ -z "${MOEBENCH_COMMIT:-}" ] \
    && ! git -C "$root" rev-parse HEAD >/dev/null 2>&1; then
  die "this tree has no .git and MOEBENCH_COMMIT is not set: the record would name no commit (send MOEBENCH_COMMIT=\$(git rev-parse --short HEAD))"
fi

[ -n "$site" ] || { [ -d /tmp/site ] && site=/tmp/site; }
[ "$site" = none ] && site=""
# A PYTHONPATH entry does not read .pth files: the folders they add go on it too (CuTe DSL's, for SGLang).
site_path=$site
[ -z "$site" ] || site_path=$(PYTHONPATH="$root/src" "$py" -m moebench.core.sites "$site") || die "cannot read --site $site"
export PYTHONPATH="$root/src${site_path:+:$site_path}${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
[ "$dry" = 1 ] && echo "PYTHONPATH=$PYTHONPATH"
# NVLink multicast stays off on shared hosts (see the device notes).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# History and pytest-benchmark storage live with the scratch baselines: the gate pass is compared with
# the record pass as "the previous run".
export MOEBENCH_HOME="$scratch/home"
if [ "$family" = allreduce ]; then
  n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  [ "${n:-0}" -gt 0 ] && { CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1))); export CUDA_VISIBLE_DEVICES; }
else
  export CUDA_VISIBLE_DEVICES=$gpu
fi
# The report's plots need matplotlib, which the lent image may not have; results and comparison do not.
"$py" -c 'import matplotlib' >/dev/null 2>&1 || nightly_opts+=(--no-plots)

run() {  # the command, printed; run unless --dry-run
  echo "== $(printf "%q " "$@")"
  [ "$dry" = 1 ] || "$@"
}
nightly() {  # nightly PASS EXPR [OPTIONS...]: one ci/nightly.sh run into $scratch/$phase-PASS
  local name=$1 expr=$2 rc
  shift 2
  if [ "$dry" = 1 ]; then
    run ci/nightly.sh --job "$family" --markers "$expr" --baseline-dir "$scratch/baselines" \
      --out "$scratch/$phase-$name" "${nightly_opts[@]}" "$@" -- "${extra[@]}"
    return 0
  fi
  echo "== $phase $name: -m \"$expr\" into $scratch/baselines"
  ci/nightly.sh --job "$family" --markers "$expr" --baseline-dir "$scratch/baselines" --out "$scratch/$phase-$name" \
    "${nightly_opts[@]}" "$@" -- "${extra[@]}" >"$scratch/$phase-$name.log" 2>&1
  rc=$?
  # the verdict table and the outcome lines, not every case's progress line
  grep -E '^(== |[A-Z_]+ +[a-z]+\[|FAILED|ERROR)|(passed|failed|error)' "$scratch/$phase-$name.log" | tail -n 60
  echo "== $phase $name: exit $rc (log $scratch/$phase-$name.log)"
  return "$rc"
}
# This machine's sweep winners (triton-sweep, an earlier call) go into configs.json before any Triton
# case runs, in record and gate passes alike: the copied tree is fresh on every call.
apply_sweep() {
  [ -f "$scratch/triton-sweep/sweep.json" ] || return 0
  run "$py" -m moebench.gemm.triton_moe.apply_sweep "$scratch/triton-sweep/sweep.json" &&
    { [ "$dry" = 1 ] || cp src/moebench/gemm/triton_moe/configs.json "$out/"; }
}

[ "$dry" = 1 ] || mkdir -p "$out" "$scratch" || die "cannot create $out or $scratch"
if [ -n "$family" ] && [ ! -d "$scratch/baselines" ]; then run cp -r baselines "$scratch/baselines"; fi
rc=0
case "$phase" in
  gemm|gemm-triton) apply_sweep ;;
  allreduce*) [ "$dry" = 1 ] || nvidia-smi topo -m >"$scratch/topology.txt" 2>&1 ;;
esac
case "$phase" in
  triton-sweep)
    [ "$dry" = 1 ] || mkdir -p "$scratch/triton-sweep"
    # shellcheck disable=SC2086  # SWEEP_ARGS is a list of options
    run "$py" -m moebench.gemm.triton_moe.sweep --out "$scratch/triton-sweep/sweep.json" ${SWEEP_ARGS:-}
    rc=$? ;;
  triton-profile)
    apply_sweep
    [ "$dry" = 1 ] || mkdir -p "$scratch/triton-profile"
    # graph timing first (no profiler), then the kernels one by one under ncu (clocks left alone)
    # shellcheck disable=SC2086  # PROFILE_ARGS is a list of options
    run "$py" -m moebench.gemm.triton_moe.profile --model kimi-k2.5 --m 1 ${PROFILE_ARGS:-}
    rc=$?
    # shellcheck disable=SC2086
    run timeout 240 ncu --clock-control none --graph-profiling node -k regex:moe_ --csv --log-file "$scratch/triton-profile/ncu.log" \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active \
      "$py" -m moebench.gemm.triton_moe.profile --model kimi-k2.5 --m 1 --rotations 4 --replays 2 ${PROFILE_ARGS:-} ;;
  *)
    if [ "$pass" != gate ]; then nightly record "$rec" --record; rc=$?; fi
    if [ "$pass" != record ]; then
      nightly gate "$gate"; rc=$?
      [ "$dry" = 1 ] || cp "$scratch/$phase-gate/summary.md" "$out/" 2>/dev/null
    fi ;;
esac
[ "$dry" = 1 ] || tar -C "$scratch" -czf "$out/$phase-$pass.tgz" .
exit "$rc"
