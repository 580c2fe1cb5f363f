#!/usr/bin/env bash
# One phase of the suite on a lent H200 machine; what it measured lands under $OUT.
# This is how the committed baselines/nvidia-h200-x*/ files were produced: a phase records into a
# scratch copy of baselines/ (--baseline-update), then runs again and is gated against what it recorded.
#
#   bash scripts/h200.sh PHASE [GPU] [PASS]
#     PHASE  selfcheck | sweep | gemm-torch | gemm-triton | gemm-vllm | gemm | decode | allreduce |
#            allreduce-car | profile | order-probe
#            gemm: records the Triton fused MoE issue's one run, -m "gemm and (triton or vllm_triton or
#            vllm_marlin)", then the torch backends, then compares all of -m gemm against both.
#            allreduce-car: records vllm_custom_ar only, then compares all of -m allreduce.
#            sweep: SWEEP_ARGS narrows it (e.g. "--dtypes bf16 --ms 1,2,4").
#            profile: Nsight Compute per-kernel time, DRAM bytes / throughput, registers and occupancy of
#            the Kimi-K2.5 M=1 bf16 fused MoE (ncu runs each kernel alone, caches flushed: not a breakdown
#            of the graph time); PROFILE_ARGS go to the profile module (e.g. --config JSON).
#            order-probe: scripts/order_probe.py (does a case's time depend on what ran before it).
#     GPU    the GPU index the phase runs on (CUDA_VISIBLE_DEVICES); allreduce uses them all
#     PASS   both (default) | record | compare   (a long phase can be split over two device calls:
#            the scratch folder /tmp/moebench-FAMILY stays on the machine while it is held; `compare`
#            alone on a fresh machine checks the committed baselines)
#
# Phases on different GPUs run side by side: `bash scripts/h200.sh gemm-vllm 0 & bash scripts/h200.sh decode 1; wait`.
# Expected there: torch 2.11 cu130, triton 3.6, pytest-benchmark 5.2.3; vLLM in /tmp/site (vllm-stage).
# The copied tree has no .git: send the commit along, MOEBENCH_COMMIT=$(git rev-parse --short HEAD) (add
# -dirty for uncommitted changes), or the recorded provenance says "unknown".
set -uo pipefail
phase=$1 gpu=${2:-0} pass=${3:-both}
: "${OUT:=/tmp/out}"
mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
# NVLink multicast stays off on shared hosts (see the device notes).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
case $phase in allreduce*) ;; *) export CUDA_VISIBLE_DEVICES=$gpu ;; esac
# One scratch copy of the committed baselines per family (gemm-torch, gemm-vllm and gemm share
# /tmp/moebench-gemm; allreduce and allreduce-car share /tmp/moebench-allreduce), made on the family's first
# phase on this machine and kept while the machine is held: records of several phases and calls
# accumulate there, and a later compare gates against all of them. A compare on a fresh machine gates
# against the committed files themselves.
work=/tmp/moebench-${phase%%-*}
[ -d "$work/bl" ] || { mkdir -p "$work/bl" && cp -r baselines/. "$work/bl/"; }
quiet='^(test_|---|Name |Legend|  Outliers|  OPS|$)'

record() {  # REC names the record's files (default run1)
  local rec=${REC:-run1}
  python3 -m pytest benchmarks/ -p no:cacheprovider -q -rfEs --benchmark-disable --baseline-dir "$work/bl" \
    --baseline-update --results-json "$work/$phase-$rec.json" "$@" >"$work/$phase-$rec.log" 2>&1
  echo "== $phase record $rec: $(tail -n 1 "$work/$phase-$rec.log")"
}
compare() {
  python3 -m pytest benchmarks/ -p no:cacheprovider -q -rfEs --benchmark-disable --baseline-dir "$work/bl" \
    --results-json "$work/$phase-run2.json" --summary-md "$work/$phase-summary.md" "$@" >"$work/$phase-run2.log" 2>&1
  grep -vE "$quiet" "$work/$phase-run2.log" | tail -n 60
  cp "$work/$phase-summary.md" "$OUT/" 2>/dev/null
}
run() { [ "$pass" = compare ] || record "$@"; [ "$pass" = record ] || compare "$@"; }
# run_split RECORD_EXPR COMPARE_EXPR: record one selection, gate a wider one against the result
run_split() { [ "$pass" = compare ] || record -m "$1"; [ "$pass" = record ] || compare -m "$2"; }
# This machine's sweep winners (sweep phase, earlier call) go into configs.json before any Triton case
# runs, in record and compare passes alike: the copied tree is fresh on every call.
apply_sweep() {
  if [ -f /tmp/moebench-sweep/sweep.json ]; then
    python3 -m moebench.gemm.triton_moe.apply_sweep /tmp/moebench-sweep/sweep.json && cp src/moebench/gemm/triton_moe/configs.json "$OUT/"
  fi
}

case $phase in
  selfcheck) run -m selfcheck ;;
  sweep) python3 -m moebench.gemm.triton_moe.sweep --out "$work/sweep.json" ${SWEEP_ARGS:-} >"$work/sweep.log" 2>&1
         echo "== sweep: $(tail -n 3 "$work/sweep.log")"; cp "$work/sweep.json" "$work/sweep.log" "$OUT/" ;;
  gemm-torch) run -m "gemm and (torch_loop or torch_bmm or torch_grouped_mm)" ;;
  gemm-triton) apply_sweep; run -m "gemm and triton" ;;
  gemm-vllm) run -m "gemm and (vllm_triton or vllm_marlin or flashinfer_cutlass)" ;;
  gemm) apply_sweep
    # the Triton fused-MoE issue's one run, then the torch backends on this machine, then all of -m gemm
    if [ "$pass" != compare ]; then
      record -m "gemm and (triton or vllm_triton or vllm_marlin)"
      REC=run1-torch record -m "gemm and (torch_loop or torch_bmm or torch_grouped_mm)"
    fi
    [ "$pass" = record ] || compare -m gemm ;;
  decode) run -m decode ${DECODE_ARGS:-} ;;
  allreduce) nvidia-smi topo -m >"$work/topology.txt" 2>&1; run -m allreduce ;;
  profile) apply_sweep; tag=${PROFILE_TAG:-m1}
    # graph timing first (no profiler), then the kernels one by one under ncu (clocks left alone)
    python3 -m moebench.gemm.triton_moe.profile --model kimi-k2.5 --m 1 ${PROFILE_ARGS:-} >"$work/$tag.log" 2>&1
    timeout 240 ncu --clock-control none --graph-profiling node -k regex:moe_ --csv --metrics \
      gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active \
      python3 -m moebench.gemm.triton_moe.profile --model kimi-k2.5 --m 1 --rotations 4 --replays 2 ${PROFILE_ARGS:-} \
      >"$work/$tag-ncu.csv" 2>>"$work/$tag.log"
    tail -n 4 "$work/$tag.log"; cp "$work/$tag.log" "$work/$tag-ncu.csv" "$OUT/" 2>/dev/null ;;
  order-probe) python3 scripts/order_probe.py 2>&1 | tee "$work/order-probe.log" | tail -n 8 ;;
  allreduce-car) nvidia-smi topo -m >"$work/topology.txt" 2>&1; run_split "allreduce and vllm_custom_ar" allreduce ;;
  *) echo "unknown phase $phase"; exit 2 ;;
esac
tar -C "$work" -czf "$OUT/$phase-$pass.tgz" .
