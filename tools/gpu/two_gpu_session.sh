#!/usr/bin/env bash
# What a 2-GPU device session must run to close the open measurements
# (issues 15-19; docs/PERFORMANCE.md, 'Next multi-GPU session'). out/ is
# git-ignored and travels with carry ["symnccl/_C.abi3.so", "out"]; device
# time goes to measuring, not building: every build is made here.
#
#   here:   SYMNCCL_CUDA_ARCHS=90 python3 setup.py build_ext --inplace
#           bash tools/gpu/two_gpu_session.sh prep   # old and prefault built
#                                                  # here too (~6 min)
#   device: STAGE="collectives ab bench" bash tools/gpu/two_gpu_session.sh
#     stages (wall times on 2x H200, 2026-11-23):
#             collectives  RS/AG/bcast/reduce, graph and eager   (40 s)
#             push         push RS/AG by SYMNCCL_PUSH_CHUNK_KIB     (~3 min)
#             ab           old / new all-reduce, 2 rounds        (60 s)
#             bench        all-reduce anchors, TP steps          (80 s)
#             serving      fused all-reduce+RMSNorm, all-to-all   (new)
#             tests        GPU tier less faults and examples (~5-7 min)
#             faults       failure scenarios            (~20-60 s a test)
#             examples     the examples' tests, then each example (~6 min)
#             hang         lifecycle's loopback-rank test, looped (~50 s a run)
#             build        build on the device instead (~1 min + old trees)
# A fresh machine takes 60-80 s of device time to start. On a 4-GPU
# machine two stages run at once, one per pair, each with its own OUT
# (session 12: the tier in two halves, then the faults in two groups):
#   (CUDA_VISIBLE_DEVICES=0,1 OUT=$OUT/a STAGE=tests bash $0 &
#    CUDA_VISIBLE_DEVICES=2,3 OUT=$OUT/b STAGE=faults bash $0 & wait)
# Pytest runs -v there: the results so far survive a run cut at its limit.
# The machine keeps its files only while warm (30 s): run the calls back to
# back. NCCL 2.29 and 2.30 on 2 GPUs (issue 18): tools/gpu/other_nccl.sh.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/symnccl-out}
mkdir -p "$OUT" out/ab
export PYTHONUNBUFFERED=1
# the results' machine tag (h100x2, h200x2): the card and how many there are
if command -v nvidia-smi >/dev/null; then
  card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  case "$card" in *H200*) card=h200 ;; *H100*) card=h100 ;; *) card=gpu ;; esac
  TAG=${TAG:-${card}x$(nvidia-smi -L | wc -l)}
fi
TAG=${TAG:-gpu}
# ranks of the benchmarks and examples: 2, or NPROC=3/4/8 on a larger
# machine (issue 43; the tag then says x4, x8)
NPROC=${NPROC:-2}
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

stage() {
case "$1" in
prep)   # here: every build the device runs, NCCL 2.28 headers from the
        # cache setup.py fills (NCCL_HOME serves the old trees' setup.py)
  [ -f symnccl/_C.abi3.so ] || { echo "build symnccl/_C.abi3.so first"; exit 1; }
  for spec in "old:$OLD" "prefault:$PREFAULT"; do
    git archive "${spec#*:}" | xz > "out/ab/src-${spec%%:*}.tar.xz"
  done
  export NCCL_HOME=${SYMNCCL_NCCL_CACHE:-$HOME/.cache/symnccl/nccl}/2.28/nvidia/nccl
  build_tree old & build_tree prefault & wait
  tar --exclude=__pycache__ -cJf out/ab/new.tar.xz symnccl
  rm -f out/ab/src-*.tar.xz
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
tests)   # the GPU tier less the failure tests (stage faults) and the
         # loopback file (one GPU; LOOPBACK=all: here too). -rfE: the
         # failures' messages come first in the summary, which a time
         # limit would otherwise cut
  env | grep -E 'NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS' | tee "$OUT/env.txt"
  nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee -a "$OUT/env.txt"
  python3 -c "import symnccl; print(symnccl.versions())" | tee -a "$OUT/env.txt"
  timeout 450 python3 -m pytest -v -rfE --tb=short --durations=15 tests \
    --ignore=tests/test_loopback.py --ignore=tests/test_faults.py \
    --ignore=tests/test_examples.py 2>&1 |
    tee "$OUT/pytest.log" | tail -40
  if [ "${LOOPBACK:-some}" = all ]; then k=""; else k="symnccl_algo"; fi
  timeout 200 python3 -m pytest -q tests/test_loopback.py ${k:+-k "$k"} 2>&1 |
    tee "$OUT/pytest_loopback.log" | tail -3
  timeout 60 python3 -m symnccl --quick 2>&1 | tee "$OUT/selftest.log" |
    tail -3 ;;
faults)  # 2-GPU failure scenarios, ~20-65 s each (a rehearsal
         # communicator, the timeout, a fresh one): over two calls, e.g.
         # FAULTS_K="exits or sleeps" then FAULTS_K="not (exits or sleeps)"
  timeout 560 python3 -m pytest -v -rfE --tb=short --durations=50 \
    tests/test_faults.py ${FAULTS_K:+-k "$FAULTS_K"} 2>&1 |
    tee "$OUT/pytest_faults.log" | tail -30 ;;
hang)    # a teardown test again and again under tools/gpu/stacks.sh (each
         # run's C stacks after 45 s, a passing run takes ~15 s; Python's by
         # faulthandler at 40 s), until a run hangs or HANG_RUNS have
         # passed (docs/FAILURES.md, 'Lifecycle': the loopback-rank "hang"
         # of session 14 was a call's timeout; 10 runs since passed)
  for i in $(seq 1 "${HANG_RUNS:-8}"); do
    OUT="$OUT/hang$i" bash tools/gpu/stacks.sh 45 timeout 60 \
      python3 -m pytest -v -p no:cacheprovider -o faulthandler_timeout=40 \
      tests/test_lifecycle.py -k loopback_rank > "$OUT/hang$i.log" 2>&1
    grep -q " 2 passed" "$OUT/hang$i.log" || { echo "run $i hung or failed:" \
      "$OUT/hang$i.log, $OUT/hang$i/stacks.log"; break; }
    echo "run $i passed"
  done ;;
ab)
  BUILDS=${BUILDS:-"old new"} ROUNDS=2 BENCH_TIMEOUT=150 BENCH_ARGS="--nranks $NPROC \
    --dtype bfloat16 --reps 7 --sizes 4K,64K,256K,1M,4M,16M,64M,256M \
    --methods symnccl:" bash tools/gpu/ab_builds.sh 2>&1 | tee "$OUT/ab.log" |
    tail -60 ;;
bench)
  timeout 240 python3 benchmarks/bench_allreduce.py --nranks $NPROC \
    --dtype bfloat16 --out "$OUT/allreduce_${TAG}_bfloat16.json" 2>&1 | tail -20
  timeout 150 python3 benchmarks/bench_step.py --nranks $NPROC \
    --out "$OUT/step_${TAG}_bfloat16.json" 2>&1 | tail -10
  timeout 120 python3 benchmarks/bench_step.py --nranks $NPROC --tokens 1 \
    --sp-algo ll128 --out "$OUT/step_${TAG}_bfloat16_ll128.json" 2>&1 |
    tail -4 ;;
collectives)
  for mode in "" --eager; do
    timeout 200 python3 benchmarks/bench_collectives.py --nranks $NPROC $mode \
      --out "$OUT/collectives_${TAG}_bfloat16${mode:+_eager}.json" 2>&1 |
      tail -24
  done ;;
push)    # push reduce_scatter/all_gather by SYMNCCL_PUSH_CHUNK_KIB
         # (docs/PERFORMANCE.md, 'Push chunks'): 0 (whole slot, unsplit:
         # the default) against the split kernels, whose default is chosen
         # from this run (~40 s each)
  for kib in ${CHUNKS:-0 1024 2048 4096}; do
    echo "== SYMNCCL_PUSH_CHUNK_KIB=$kib"
    SYMNCCL_PUSH_CHUNK_KIB=$kib timeout 150 python3 \
      benchmarks/bench_collectives.py --nranks $NPROC \
      --collectives reduce_scatter,all_gather --sizes 1M,4M,16M,64M \
      --out "$OUT/collectives_${TAG}_push_chunk$kib.json" 2>&1 | tail -12
  done ;;
serving)    # issues 31 and 32 over NVLink: the fused all-reduce + RMSNorm
            # against the unfused path (and FlashInfer's where installed),
            # the all-to-all against all_to_all_single and all_to_all_vdev
  timeout 200 torchrun --standalone --nproc-per-node $NPROC \
    benchmarks/bench_fused.py --out "$OUT/fused_${TAG}_bfloat16.json" \
    2>&1 | tail -14
  timeout 200 torchrun --standalone --nproc-per-node $NPROC \
    benchmarks/bench_alltoall.py --out "$OUT/alltoall_${TAG}_bfloat16.json" \
    2>&1 | tail -12 ;;
examples)   # the examples' tests (2 ranks), then each example as is
  timeout 300 python3 -m pytest -q -rfE --tb=line tests/test_examples.py \
    2>&1 | tee "$OUT/pytest_examples.log" | tail -8
  timeout 100 torchrun --standalone --nproc-per-node $NPROC \
    examples/train_tp_torch.py 2>&1 | tail -8
  timeout 80 python3 examples/train_tp_jax.py 2>&1 | tail -6
  for ex in decode_tp_torch moe_ep_torch; do
    timeout 150 torchrun --standalone --nproc-per-node $NPROC \
      examples/$ex.py 2>&1 | tail -6
  done ;;
*)
  echo "usage: $0 prep | STAGE=\"build|tests|faults|hang|ab|bench|collectives|push|serving|examples" \
    "...\" $0"; exit 2 ;;
esac
}

export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
for s in ${1:-${STAGE:-}}; do
  echo "=== stage $s ($(date +%T))"
  stage "$s"
done
