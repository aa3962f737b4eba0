#!/usr/bin/env bash
# Device-machine run with a prebuilt symnccl/_C.abi3.so (carried): tests
# selected by PYTEST_K, then the benchmark; logs and results under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/symnccl-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
env | grep -E 'NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS' | tee "$OUT/env.txt"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee -a "$OUT/env.txt"
python3 -c "import symnccl; print(symnccl.versions())" || exit 1
if [ -n "${PYTEST_K:-}" ]; then
  timeout ${TEST_TIMEOUT:-400} python3 -m pytest -q -rs -x tests -k "$PYTEST_K" 2>&1 | tee "$OUT/pytest.log" | tail -25
fi
if [ -n "${BENCH:-}" ]; then
  timeout ${BENCH_TIMEOUT:-300} python3 benchmarks/bench_allreduce.py $BENCH --out "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log" | tail -25
fi
