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
  timeout ${TEST_TIMEOUT:-400} python3 -m pytest -q -rs --durations=15 tests -k "$PYTEST_K" 2>&1 | tee "$OUT/pytest.log" | tail -40
fi
# PROFILE: a spec file of lines "nranks | cases | metrics" for
# scripts/profile_ncu.py (Nsight Compute on rank 0, one pass). The profile
# in docs/PERFORMANCE.md ('Nsight Compute profile') came from two lines,
# nranks 2 and 4, each with
#   ll:4K,ll:256K,two_shot:1M,push:1M,push:16M,push:256M,nccl:256M |
#   gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,
#   nvltx__bytes.sum,nvlrx__bytes.sum,nvltx__bytes_data_user.sum,
#   nvlrx__bytes_data_user.sum
# (each line's three fields on one line, '|' between them).
if [ -n "${PROFILE:-}" ]; then
  ncu --version | tail -1
  ncu --query-metrics --chip gh100 2>/dev/null | grep -E '^nvl(rx|tx)__' | cut -c1-90 | head -8
  k=0
  while IFS='|' read -r nr cases metrics; do
    nr=$(echo "$nr" | xargs); [ -z "$nr" ] && continue
    case "$nr" in \#*) continue;; esac
    k=$((k + 1))
    echo "== profile $k: $nr ranks: $cases"
    timeout ${PROFILE_TIMEOUT:-240} python3 scripts/profile_ncu.py --nranks "$nr" \
        --cases "$(echo $cases | xargs)" --metrics "$(echo $metrics | xargs)" \
        --log "$OUT/ncu$k.csv" 2>&1 | grep -v "^==PROF==" | tail -40
  done < "$PROFILE"
fi
# BENCH, BENCH2, BENCH3: argument lists for separate benchmark runs
i=0
for b in "${BENCH:-}" "${BENCH2:-}" "${BENCH3:-}"; do
  i=$((i + 1))
  [ -n "$b" ] || continue
  timeout ${BENCH_TIMEOUT:-300} python3 benchmarks/bench_allreduce.py $b --out "$OUT/bench$i.json" 2>&1 | tee "$OUT/bench$i.log" | tail -16
done
if [ -n "${SASS:-}" ]; then
  # the multicast kernel is only compiled here: show its multimem SASS
  cuobjdump -sass symnccl/_C.abi3.so > /tmp/sass.txt 2>&1
  awk '/Function :/{f=$0} /MULTIMEM|multimem|UBLKRED|LDGMC|REDG|\.MC/{print f" :: "$0}' /tmp/sass.txt | grep -i multimem_allreduce | sed 's/  */ /g' > "$OUT/multimem_sass.txt"
  grep -c . "$OUT/multimem_sass.txt"; head -20 "$OUT/multimem_sass.txt"
fi
