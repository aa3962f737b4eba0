#!/usr/bin/env bash
# Benchmark sweep on a device machine: each line of the spec file is
#   label | VAR=value ... | bench_allreduce.py arguments
# run as a separate benchmark process (the knobs are read at communicator
# creation); JSON and logs land under $OUT/<label>.* For example, the ll
# grid sweep of docs/PERFORMANCE.md ('Packets: ll and ll128') was lines of
#   ll2_64 | SYMNCCL_LL_CTAS=64 | --nranks 2 --sizes 4K,64K,256K,1M --methods symnccl:ll --reps 5
# for 16, 32, 64 and 128 CTAs at 2 and 4 ranks:
#   bash tools/gpu/sweep.sh my_spec.txt
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
