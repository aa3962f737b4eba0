#!/usr/bin/env bash
# Side by side on one device machine: several builds of symnccl/_C.abi3.so,
# benchmarked in interleaved rounds (so drift hits every build alike), and
# optionally the push race worker per build.
#
# Here, for each build:   xz -3 -c symnccl/_C.abi3.so > out/ab/NAME.so.xz
# (three builds fit the 64 MiB a device call carries; out/ is git-ignored).
# There, with carry ["out/ab"]:
#   BUILDS="old new" ROUNDS=3 \
#   BENCH_ARGS="--nranks 2 --dtype bfloat16 --reps 7 --sizes 16M,40M,256M --methods symnccl:push" \
#   RACE_SEEDS="1 2" RACE_ITERS=5000 bash scripts/ab_builds.sh
# The last build listed stays installed afterwards.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/tests
BUILDS=${BUILDS:?list of build names under out/ab}
mkdir -p /tmp/ab
for b in $BUILDS; do xz -dc "out/ab/$b.so.xz" > "/tmp/ab/$b.so" || exit 1; done
for i in $(seq 1 "${ROUNDS:-3}"); do
  for b in $BUILDS; do
    cp "/tmp/ab/$b.so" symnccl/_C.abi3.so
    echo "== round $i: $b"
    timeout "${BENCH_TIMEOUT:-90}" python3 benchmarks/bench_allreduce.py \
      ${BENCH_ARGS:-} --out /tmp/ab/bench.json 2>&1 | tail -n +3
  done
done
for b in $BUILDS; do
  cp "/tmp/ab/$b.so" symnccl/_C.abi3.so
  for s in ${RACE_SEEDS:-}; do
    timeout 150 python3 -c "
from symnccl.bootstrap import spawn
from _workers import collectives as W
res = spawn(W.push_chunks_under_contention, ${RACE_NRANKS:-2},
            args=($s, ${RACE_ITERS:-3000}), timeout=140)
print('$b seed $s: failing calls per rank', [len(r) for r in res])
for r in res: print('  ', r[:4])
" 2>&1 | tail -4
  done
done
