#!/usr/bin/env bash
# Benchmark sweep on a device machine: each line of the spec file is
#   label | VAR=value ... | bench_allreduce.py arguments
# run as a separate benchmark process (the knobs are read at communicator
# creation); JSON and logs land under $OUT/<label>.*
set -uo pipefail
OUT=${OUT:-/tmp/symnccl-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
env | grep -E 'NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS' > "$OUT/env.txt"
while IFS='|' read -r label vars args; do
  label=$(echo "$label" | xargs); [ -z "$label" ] && continue
  case "$label" in \#*) continue;; esac
  echo "== $label: $vars :: $args"
  env $vars timeout ${BENCH_TIMEOUT:-120} python3 benchmarks/bench_allreduce.py $args \
      --out "$OUT/$label.json" > "$OUT/$label.log" 2>&1
  echo "rc $?"; grep -A20 "CUDA-graph" "$OUT/$label.log" | grep -v "^skipped" | cut -c1-200
done < "${1:?spec file}"
