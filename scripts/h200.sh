#!/usr/bin/env bash
# Runs one phase of the suite on a lent H200 machine and leaves what it measured under $OUT.
# This is how the committed baselines/nvidia-h200-x*/ files were produced: each phase records
# (--baseline-update into a scratch copy of baselines/), then runs again against what it recorded.
#
#   bash scripts/h200.sh PHASE        PHASE: selfcheck | sweep | gemm | decode | allreduce
#
# Environment expected there: torch 2.11 cu130, triton 3.6, pytest-benchmark 5.2.3; vLLM staged into
# /tmp/site by ../shared/gpu/vllm-stage for the phases that use it.
set -uo pipefail
phase=$1
: "${OUT:=/tmp/out}"
mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
# NVLink multicast stays off on shared hosts (see the device notes).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
work=/tmp/moebench-$phase
rm -rf "$work" && mkdir -p "$work/bl"
cp -r baselines/. "$work/bl/" 2>/dev/null || true

twice() {  # twice LOGNAME PYTEST-ARGS...: record into the scratch baselines, then compare against them
  local name=$1; shift
  python3 -m pytest benchmarks/ -p no:cacheprovider -q -rfEs --baseline-dir "$work/bl" --baseline-update \
    --results-json "$work/$name-run1.json" "$@" 2>&1 | tee "$work/$name-run1.log" | grep -vE '^(test_|---|Name|Legend|  Outliers|  OPS|$)'
  python3 -m pytest benchmarks/ -p no:cacheprovider -q -rfEs --baseline-dir "$work/bl" \
    --results-json "$work/$name-run2.json" --summary-md "$work/$name-summary.md" "$@" 2>&1 \
    | tee "$work/$name-run2.log" | grep -vE '^(test_|---|Name|Legend|  Outliers|  OPS|$)'
}

nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv
case $phase in
  selfcheck) CUDA_VISIBLE_DEVICES=0 twice selfcheck -m selfcheck ;;
  sweep) CUDA_VISIBLE_DEVICES=${SWEEP_GPU:-0} python3 -m moebench.gemm.triton_moe.sweep --out "$work/sweep.json" 2>&1 \
           | tee "$work/sweep.log" ;;
  gemm) CUDA_VISIBLE_DEVICES=0 twice gemm -m "${GEMM_MARKS:-gemm}" --benchmark-disable ;;
  decode) CUDA_VISIBLE_DEVICES=0 twice decode -m "${DECODE_MARKS:-decode}" --benchmark-disable ;;
  allreduce) twice allreduce -m "${ALLREDUCE_MARKS:-allreduce}" --benchmark-disable ;;
  *) echo "unknown phase $phase (selfcheck | sweep | gemm | decode | allreduce)"; exit 2 ;;
esac
# At most 8 files come back: the results and summaries as they are, everything else in one archive.
cp "$work"/*-run2.json "$work"/*-summary.md "$OUT/" 2>/dev/null
[ -f "$work/sweep.json" ] && cp "$work/sweep.json" "$OUT/"
tar -C "$work" -czf "$OUT/$phase-all.tgz" .
ls -la "$OUT"
