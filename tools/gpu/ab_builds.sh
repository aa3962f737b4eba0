#!/usr/bin/env bash
# Side by side on one device machine: several builds of symnccl, benchmarked
# in interleaved rounds (so drift hits every build alike), and optionally
# the push race worker per build.
#
# A build is its whole Python package with its _C.abi3.so (builds of
# different API, such as the ones before and after a redesign, compare too).
# Here, for each build, from a tree where it is built:
#   tar -C TREE --exclude=__pycache__ -cJf out/ab/NAME.tar.xz symnccl
# (out/ is git-ignored; the tarballs travel with carry ["out/ab"]). There:
#   BUILDS="old new" ROUNDS=3 \
#   BENCH_ARGS="--nranks 2 --dtype bfloat16 --reps 7 --sizes 16M,256M --methods symnccl:push" \
#   RACE_SEEDS="1 2" RACE_ITERS=5000 bash tools/gpu/ab_builds.sh
# BENCH=bench_collectives.py (BENCH_ARGS then its own, e.g. --collectives
# reduce_scatter --sizes 4M,16M) compares the other collectives. The
# benchmark script and the tests' workers are this tree's.
set -uo pipefail
export PYTHONUNBUFFERED=1
BUILDS=${BUILDS:?list of build names under out/ab}
mkdir -p /tmp/ab
for b in $BUILDS; do
  rm -rf "/tmp/ab/$b" && mkdir -p "/tmp/ab/$b" &&
    tar -C "/tmp/ab/$b" -xJf "out/ab/$b.tar.xz" || exit 1
done
for i in $(seq 1 "${ROUNDS:-3}"); do
  for b in $BUILDS; do
    echo "== round $i: $b"
    PYTHONPATH=/tmp/ab/$b timeout "${BENCH_TIMEOUT:-90}" python3 \
      "benchmarks/${BENCH:-bench_allreduce.py}" ${BENCH_ARGS:-} \
      --out "/tmp/ab/$b.json" \
      2>&1 | tail -n +3
  done
done
for b in $BUILDS; do
  for s in ${RACE_SEEDS:-}; do
    PYTHONPATH=/tmp/ab/$b:$PWD/tests timeout 150 python3 -c "
from symnccl.bootstrap import spawn
from _workers import collectives as W
res = spawn(W.push_chunks_under_contention, ${RACE_NRANKS:-2},
            args=($s, ${RACE_ITERS:-3000}), timeout=140)
print('$b seed $s: failing calls per rank', [len(r) for r in res])
for r in res: print('  ', r[:4])
" 2>&1 | tail -4
  done
done
