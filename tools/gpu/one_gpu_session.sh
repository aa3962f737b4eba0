#!/usr/bin/env bash
# A one-GPU session (nvidia-h100-x1 / nvidia-h200), in stages that each fit
# one device call. Build here first and carry the module:
#   SYMNCCL_NCCL_MINORS=28,29 SYMNCCL_CUDA_ARCHS=90 python setup.py build_ext --inplace
#   (the device machines load NCCL 2.28.9; the 2.29.7 build serves 2.29.7-2.32)
# then, there, with carry ["symnccl/_C.abi3.so"] (and ["out/ab"] for ab):
#   STAGE=tests bash tools/gpu/one_gpu_session.sh   # the default GPU tier
#   STAGE=bench bash tools/gpu/one_gpu_session.sh   # fused, all-to-all, eager
#   STAGE=ab    bash tools/gpu/one_gpu_session.sh   # kernel cost against out/ab/old.tar.xz
#   STAGE=abfused bash tools/gpu/one_gpu_session.sh # bench_fused, the same
# Results and logs go to $OUT. Multicast variables are left as found.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export SYMNCCL_NCCL_MINORS=${SYMNCCL_NCCL_MINORS:-28,29}
OUT=${OUT:-/tmp/symnccl-out}
mkdir -p "$OUT"
gpu=$(python3 -c "import sys, torch; sys.path.insert(0, 'benchmarks'); from bench_allreduce import gpu_model; print(gpu_model(torch.cuda.get_device_name(0)))")
for stage in ${STAGE:-tests}; do
  case $stage in
    tests)
      python3 -m pytest -q -rs tests -p no:cacheprovider --durations=20 \
        2>&1 | tee "$OUT/tier.log" | grep -v '^SKIPPED' | tail -45 ;;
    bench)
      python3 benchmarks/bench_fused.py --out "$OUT/fused_${gpu}x1_bfloat16.json" \
        2>&1 | tail -24
      for n in 1 2 4; do   # 2 and 4: a loopback team on the one GPU
        sfx=; [ "$n" -gt 1 ] && sfx=_loopback$n
        python3 benchmarks/bench_alltoall.py --nranks $n \
          --out "$OUT/alltoall_${gpu}x1_bfloat16$sfx.json" 2>&1 | tail -14
      done
      python3 benchmarks/bench_eager.py --out "$OUT/eager_${gpu}x1_bfloat16.json" \
        2>&1 | tail -30 ;;
    ab)
      mkdir -p /tmp/ab/old && tar -C /tmp/ab/old -xJf out/ab/old.tar.xz
      for r in 1 2 3; do
        for b in old new; do
          p=$PWD; [ "$b" = old ] && p=/tmp/ab/old
          echo "== round $r $b" >> "$OUT/one_rank.log"
          PYTHONPATH=$p timeout 100 python3 scripts/bench_one_rank.py \
            >> "$OUT/one_rank.log" 2>&1
        done
      done
      tail -20 "$OUT/one_rank.log" ;;
    abfused)   # bench_fused, old build then new, in one run
      mkdir -p /tmp/ab/old && tar -C /tmp/ab/old -xJf out/ab/old.tar.xz
      for b in old new; do
        p=$PWD; [ "$b" = old ] && p=/tmp/ab/old
        PYTHONPATH=$p python3 benchmarks/bench_fused.py \
          --out "$OUT/fused_ab_$b.json" 2>&1 | tail -24
      done ;;
    *) echo "unknown stage $stage (tests, bench, ab, abfused)"; exit 2 ;;
  esac
done
