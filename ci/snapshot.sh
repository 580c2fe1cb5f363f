#!/usr/bin/env bash
# Snapshot the machine a run measured on, into DIR (default: out/machine):
#   fingerprint.json   moebench.core.hardware.fingerprint() (NVML, no CUDA init) and the hardware key
#   nvidia-smi.txt     `nvidia-smi -q` (clocks, power, ECC, driver), when nvidia-smi is present
#   topology.txt       `nvidia-smi topo -m` (NVLink / PCIe paths between the GPUs)
#   system.txt         kernel, CPU, memory, commit, and the CUDA_* / NCCL_* / VLLM_* environment
#   pip-freeze.txt     every installed Python package and version
# Prints one line naming the hardware key. Never fails the job: a missing tool is noted in the files.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
dir="${1:-out/machine}"
py="${PYTHON:-python3}"
mkdir -p "$dir"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

"$py" -c 'import json; from moebench.core.hardware import fingerprint, hardware_key
fp = fingerprint()
print(json.dumps({"hardware_key": hardware_key(fp), "fingerprint": fp}, indent=2, sort_keys=True))' \
  >"$dir/fingerprint.json" 2>"$dir/fingerprint.err" || echo "snapshot: fingerprint failed, see $dir/fingerprint.err" >&2
[ -s "$dir/fingerprint.err" ] || rm -f "$dir/fingerprint.err"

if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi -q >"$dir/nvidia-smi.txt" 2>&1 || true
  nvidia-smi topo -m >"$dir/topology.txt" 2>&1 || true
else
  echo "nvidia-smi: not found on this machine" >"$dir/nvidia-smi.txt"
fi

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(hostname 2>/dev/null || cat /etc/hostname 2>/dev/null)"
  echo "kernel: $(uname -srm)"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "cpus: $(nproc 2>/dev/null)"
  grep -m1 'model name' /proc/cpuinfo 2>/dev/null
  grep -E '^(MemTotal|MemAvailable)' /proc/meminfo 2>/dev/null
  echo "python: $("$py" --version 2>&1)"
  echo "--- environment (CUDA_*, NCCL_*, VLLM_*, TORCH_*, OMP_*)"
  env | grep -E '^(CUDA_|NCCL_|VLLM_|TORCH_|OMP_)' | sort || true
} >"$dir/system.txt"

"$py" -m pip freeze >"$dir/pip-freeze.txt" 2>&1 || echo "pip freeze failed" >"$dir/pip-freeze.txt"

key=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["hardware_key"])' "$dir/fingerprint.json" 2>/dev/null || echo unknown)
echo "snapshot: hardware key $key; machine details in $dir/"
