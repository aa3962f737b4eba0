#!/usr/bin/env bash
# One device run: smoke check, benchmarks (4 and 2 ranks), then the LSA tests.
set -uo pipefail
OUT=${OUT:-/tmp/symnccl-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
env | grep -E 'NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS' | tee "$OUT/env.txt"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee -a "$OUT/env.txt"
timeout ${SMOKE_TIMEOUT:-90} python3 -m symnccl --quick --nranks 2 > "$OUT/smoke.log" 2>&1
echo "smoke rc $?"; tail -4 "$OUT/smoke.log"
grep -q PASS "$OUT/smoke.log" || exit 1
i=0
for b in "${BENCH:-}" "${BENCH2:-}" "${BENCH3:-}"; do
  i=$((i + 1))
  [ -n "$b" ] || continue
  timeout ${BENCH_TIMEOUT:-150} python3 benchmarks/bench_allreduce.py $b --out "$OUT/bench$i.json" 2>&1 | tee "$OUT/bench$i.log" | tail -12
done
if [ -n "${PYTEST_K:-}" ]; then
  timeout ${TEST_TIMEOUT:-250} python3 -m pytest -q -rs -x --durations=10 tests -k "$PYTEST_K" 2>&1 | tee "$OUT/pytest.log" | tail -25
fi
