#!/usr/bin/env bash
# Device-machine run: build with the torch venv's NCCL wheel, run the GPU
# tier and the CLI self-check, keep logs under $OUT (device tool).
set -uo pipefail
OUT=${OUT:-/tmp/symnccl-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
env | grep -E 'NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS' | tee "$OUT/env.txt"
nvidia-smi --query-gpu=index,name,driver_version --format=csv | tee -a "$OUT/env.txt"
python3 -m pip install --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1 \
  || { tail -50 "$OUT/build.log"; exit 1; }
python3 -m pytest -q -rs tests ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/pytest.log" | tail -40
python3 -m symnccl 2>&1 | tee "$OUT/selftest.log" | tail -${SELFTEST_TAIL:-8}
