#!/usr/bin/env bash
# symnccl on two GPUs with each NCCL release pip installs (2.28.9, 2.29.7,
# 2.30.7, 2.31.2, 2.32.3; issue 40). The device machines have no network
# and only the torch venv's 2.28.9; the other libraries come from setup.py's
# cache (~/.cache/symnccl/nccl/2.<minor>: the wheels it fetched, or any
# unpacked there), each reduced to its sm_90 device code
# (tools/gpu/nccl_sm_only.py: the same file with every other architecture's
# code and the debug sections zeroed, 32-37 MB gzipped instead of 207-293)
# and gzipped whole: one library per device call, beside the module and
# the tree (~3.5 MiB), under the 64 MiB carry. Each call is whole by itself
# (nothing waits in /tmp between calls):
#
#   here:   SYMNCCL_CUDA_ARCHS=90 python3 setup.py build_ext --inplace
#           bash tools/gpu/other_nccl.sh prep     # out-nccl/n29.gz .. n32.gz
#           bash tools/gpu/other_nccl.sh list     # the device calls
#   device: carry ["symnccl/_C.abi3.so", "out-nccl/n29.gz"]:
#               bash tools/gpu/other_nccl.sh check 28 29
#           carry ["symnccl/_C.abi3.so", "out-nccl/n30.gz"]:
#               bash tools/gpu/other_nccl.sh check 30
#           ... 31, 32 likewise
#
# `check MINOR ...` runs, for each library (28: the machine's own 2.28.9,
# else out-nccl/n<minor>.gz, its sha256 checked against prep's), the steps
# of STEPS (default "versions probe self windows torch"), each bounded by
# a timeout, its output in $OUT/nccl2.<minor>.log:
#   versions  the versions import reports: the library, the kernel build in
#             use and its headers (symnccl.versions())
#   probe     NCCL's own kernels on plain buffers (nccl_kernel_probe.py):
#             that the library loads and runs here at all
#   self      python -m symnccl --quick on every GPU (the default window
#             policy: csrc/runtime/nccl_policy.c)
#   windows   the same with SYMNCCL_NCCL_WINDOWS=1: NCCL's own symmetric
#             kernels get every window
#   torch     TORCH_TESTS (pytest) with the library preloaded, so torch
#             loads the same NCCL
# and prints one summary line per step (also $OUT/summary_nccl.txt).
set -uo pipefail
cd "$(dirname "$0")/../.."
CACHE=${SYMNCCL_NCCL_CACHE:-$HOME/.cache/symnccl/nccl}
PACKED="29 30 31 32"
STEPS=${STEPS:-"versions probe self windows torch"}
TORCH_TESTS=${TORCH_TESTS:-"tests/test_torch.py tests/test_multigpu.py -k torch"}
OUT=${OUT:-/tmp/symnccl-out}

case "${1:-}" in
prep)
  [ -f symnccl/_C.abi3.so ] || { echo "build symnccl/_C.abi3.so first"; exit 1; }
  mkdir -p out-nccl
  rm -f out-nccl/n*.gz out-nccl/sha256.txt
  for v in $PACKED; do
    lib="$CACHE/2.$v/nvidia/nccl/lib/libnccl.so.2"
    [ -f "$lib" ] || { echo "no $lib: unpack that wheel's nvidia/nccl" \
                            "there (setup.py fetches the builds' own)"; exit 1; }
    python3 tools/gpu/nccl_sm_only.py "$lib" "/tmp/n$v.so" || exit 1
    echo "n$v $(sha256sum < "/tmp/n$v.so" | cut -d' ' -f1)" >> out-nccl/sha256.txt
    gzip -1 -c "/tmp/n$v.so" > "out-nccl/n$v.gz" && rm "/tmp/n$v.so"
  done
  du -sh out-nccl/* symnccl/_C.abi3.so ;;
list)
  echo "# here: SYMNCCL_CUDA_ARCHS=90 python3 setup.py build_ext --inplace"
  echo "#       bash tools/gpu/other_nccl.sh prep"
  first="28 "
  for v in $PACKED; do
    echo "carry [\"symnccl/_C.abi3.so\", \"out-nccl/n$v.gz\", \"out-nccl/sha256.txt\"]:" \
         "bash tools/gpu/other_nccl.sh check $first$v"
    first=""
  done ;;
check)
  shift
  export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
  mkdir -p "$OUT"
  sum="$OUT/summary_nccl.txt"
  nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader \
    | tee -a "$sum"
  for v in "$@"; do
    envs=()
    if [ "$v" != 28 ]; then
      home=/tmp/nccl2.$v
      mkdir -p "$home/lib"
      gunzip -c "out-nccl/n$v.gz" > "$home/lib/libnccl.so.2" || exit 1
      want=$(sed -n "s/^n$v //p" out-nccl/sha256.txt)
      got=$(sha256sum < "$home/lib/libnccl.so.2" | cut -d' ' -f1)
      [ "$want" = "$got" ] || { echo "NCCL 2.$v: sha256 $got, prep's $want" | tee -a "$sum"; exit 1; }
      envs=(NCCL_HOME="$home" LD_PRELOAD="$home/lib/libnccl.so.2")
    fi
    log="$OUT/nccl2.$v.log"   # one per library: a call returns 8 files
    step() {   # step NAME SECONDS command...
      local name=$1 secs=$2 part=/tmp/nccl_step.log; shift 2
      env "${envs[@]}" timeout "$secs" "$@" > "$part" 2>&1
      local rc=$?
      { echo "== NCCL 2.$v $name (exit $rc): $*"; cat "$part"; } >> "$log"
      echo "NCCL 2.$v $name: exit $rc; $(grep -E "checks over|passed|failed|^NCCL |caveat|rank .*:|rror" "$part" | tail -3 | tr '\n' ' ')" | tee -a "$sum"
    }
    for s in $STEPS; do
      case $s in
      versions) step versions 60 python3 -c "import symnccl, warnings; \
warnings.simplefilter('always'); v = symnccl.versions(); \
print('NCCL', v['nccl_runtime'], v['nccl_library'], 'kernels', \
v['nccl_kernels'], 'builds', v['nccl_kernel_builds']); \
import symnccl._C as C; print('caveat:', C._multi_gpu_caveat())" ;;
      probe) step probe 120 python3 tools/gpu/nccl_kernel_probe.py ;;
      self) step self 420 python3 -m symnccl --quick --timeout 400 ;;
      windows) step windows 420 env SYMNCCL_NCCL_WINDOWS=1 \
                 python3 -m symnccl --quick --timeout 400 ;;
      torch) # shellcheck disable=SC2086
             step torch 420 python3 -m pytest -q -p no:cacheprovider \
               $TORCH_TESTS ;;
      *) echo "unknown step $s (versions probe self windows torch)"; exit 2 ;;
      esac
    done
  done ;;
*)
  echo "usage: $0 prep | list | check MINOR ..." >&2; exit 2 ;;
esac
