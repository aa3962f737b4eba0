#!/usr/bin/env bash
# What a 2-GPU device session must run to close the open measurements
# (issues 15-19; benchmarks/NOTES.md 18-28), one stage per device call
# (each fits the 10-minute limit). out/ is git-ignored and travels with
# carry ["out"].
#
#   here:   bash scripts/two_gpu_session.sh prep
#   device: STAGE=build  bash scripts/two_gpu_session.sh   # ~1 min
#           STAGE=tests  bash scripts/two_gpu_session.sh   # GPU tier + selftest
#           STAGE=ab     bash scripts/two_gpu_session.sh   # old / prefault / new
#           STAGE=bench  bash scripts/two_gpu_session.sh   # anchors, steps
#           STAGE=collectives ...   # RS/AG/bcast/reduce, graph and eager
#           STAGE=examples    ...   # training examples, auto and ll128
# The machine keeps its files only while warm (30 s): run the stages back
# to back, or STAGE=build again first. NCCL 2.29 and 2.30 on 2 GPUs (issue
# 18): scripts/other_nccl.sh (prep here, take 1..8 and check there).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/symnccl-out}
mkdir -p "$OUT" out/ab
export PYTHONUNBUFFERED=1
# builds to compare: the landing before the redesign, the build before the
# failure model (both NCCL 2.28 only)
OLD=${OLD:-9cbc5b9}
PREFAULT=${PREFAULT:-d7fc515}

build_tree() {   # $1 name: unpack out/ab/src-$1.tar.xz, build, package
  local d=/tmp/ab-src/$1
  rm -rf "$d" && mkdir -p "$d" && tar -C "$d" -xJf "out/ab/src-$1.tar.xz" &&
    (cd "$d" && SYMNCCL_NCCL_MINORS=28 SYMNCCL_CUDA_ARCHS=90 \
       SYMNCCL_NCCL_FETCH=0 python3 setup.py -q build_ext --inplace \
       > "$OUT/build_$1.log" 2>&1) &&
    tar -C "$d" --exclude=__pycache__ -cJf "out/ab/$1.tar.xz" symnccl
}

case "${1:-${STAGE:-}}" in
prep)
  for spec in "old:$OLD" "prefault:$PREFAULT"; do
    git archive "${spec#*:}" | xz > "out/ab/src-${spec%%:*}.tar.xz"
  done
  ls -la out/ab ;;
build)
  env | grep -E 'NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS' | tee "$OUT/env.txt"
  nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee -a "$OUT/env.txt"
  SYMNCCL_NCCL_MINORS=28 SYMNCCL_CUDA_ARCHS=90 SYMNCCL_NCCL_FETCH=0 \
    python3 -m pip install --no-build-isolation --no-deps -e . \
    > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  tar --exclude=__pycache__ -cJf out/ab/new.tar.xz symnccl
  build_tree old & build_tree prefault & wait
  ls -la out/ab ;;
tests)
  timeout 540 python3 -m pytest -q -rs --durations=15 tests 2>&1 |
    tee "$OUT/pytest.log" | tail -40
  timeout 50 python3 -m symnccl --quick 2>&1 | tail -3 ;;
ab)
  BUILDS="old prefault new" ROUNDS=2 BENCH_TIMEOUT=150 BENCH_ARGS="--nranks 2 \
    --dtype bfloat16 --reps 7 --sizes 4K,64K,256K,1M,4M,16M,64M,256M \
    --methods symnccl:" bash scripts/ab_builds.sh 2>&1 | tee "$OUT/ab.log" |
    tail -60 ;;
bench)
  timeout 240 python3 benchmarks/bench_allreduce.py --nranks 2 \
    --dtype bfloat16 --out "$OUT/h200x2_bfloat16.json" 2>&1 | tail -20
  timeout 150 python3 benchmarks/bench_step.py --nranks 2 \
    --out "$OUT/step_h200x2_bfloat16.json" 2>&1 | tail -10
  timeout 120 python3 benchmarks/bench_step.py --nranks 2 --tokens 1 \
    --sp-algo ll128 --out "$OUT/step_h200x2_bfloat16_ll128.json" 2>&1 |
    tail -4 ;;
collectives)
  for mode in "" --eager; do
    timeout 200 python3 benchmarks/bench_collectives.py --nranks 2 $mode \
      --out "$OUT/collectives_h200x2_bfloat16${mode:+_eager}.json" 2>&1 |
      tail -24
  done ;;
examples)
  for algo in auto ll128; do
    timeout 100 torchrun --standalone --nproc-per-node 2 \
      examples/train_tp_torch.py --algo $algo 2>&1 | tail -8
    timeout 80 python3 examples/train_tp_jax.py --algo $algo 2>&1 | tail -6
  done ;;
*)
  echo "usage: $0 prep | STAGE=build|tests|ab|bench|collectives|examples" \
    "$0"; exit 2 ;;
esac
