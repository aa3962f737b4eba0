#!/usr/bin/env bash
# Run symnccl on the device machines with NCCL 2.29 and 2.30 (issue 18),
# which have only the 2.28.9 of the torch venv installed. The libraries
# come from setup.py's cache of the wheels it fetched for their headers
# (~/.cache/symnccl/nccl/2.<minor>), gzipped (xz gains nothing: NCCL's
# fatbins are compressed) and split into pieces of PIECE_MB (default 28),
# so that two fit a device call's carry (64 MiB with the tracked tree,
# ~6 MiB): 8 pieces a minor (the last one small).
#
#   here:   SYMNCCL_CUDA_ARCHS=90 python3 setup.py build_ext --inplace
#           bash tools/gpu/other_nccl.sh prep          # out-nccl/p1 .. p16
#   device (back to back: the machine keeps /tmp only while warm, 30 s):
#           run carry ["symnccl/_C.abi3.so", "out-nccl/p1"]:
#               bash tools/gpu/other_nccl.sh take 1
#           run carry ["out-nccl/p2", "out-nccl/p3"]:
#               bash tools/gpu/other_nccl.sh take 2 3
#           ... up to the last piece (prep prints them), then
#           run: bash tools/gpu/other_nccl.sh check    # ~3 min on 1 GPU
# `check` runs, for each minor, in a process that does not import torch:
# the versions import reports and `python -m symnccl` (every rank the
# machine has, its whole log kept under $OUT); then, unless LOOPBACK=0, the
# loopback tier (tests/test_loopback.py, torch loaded after symnccl,
# LD_PRELOAD making that NCCL torch's as well).
set -uo pipefail
cd "$(dirname "$0")/../.."
MINORS=${MINORS:-"29 30"}
CACHE=${SYMNCCL_NCCL_CACHE:-$HOME/.cache/symnccl/nccl}
ACC=/tmp/symnccl-nccl-parts

case "${1:-}" in
prep)
  rm -rf out-nccl
  k=0
  for v in $MINORS; do
    lib="$CACHE/2.$v/nvidia/nccl/lib/libnccl.so.2"
    [ -f "$lib" ] || { echo "no $lib: build with SYMNCCL_NCCL_MINORS" \
                            "including $v first"; exit 1; }
    sha256sum "$lib" | sed "s|$CACHE/||"
    gzip -1 -c "$lib" > "/tmp/n$v.gz" &&
      split -b "${PIECE_MB:-28}M" -d "/tmp/n$v.gz" "/tmp/n$v.part." &&
      rm "/tmp/n$v.gz"
    for f in /tmp/n$v.part.*; do
      k=$((k + 1)); mkdir -p "out-nccl/p$k"; mv "$f" "out-nccl/p$k/"
    done
  done
  du -sh out-nccl/p* ;;
take)   # take K [K ...]
  shift
  mkdir -p "$ACC" || exit 1
  for k in "$@"; do cp "out-nccl/p$k"/* "$ACC"/ || exit 1; done
  ls "$ACC" ;;
check)
  export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
  for v in $MINORS; do
    home=/tmp/nccl$v
    mkdir -p "$home/lib"
    cat "$ACC"/n$v.part.* | gunzip > "$home/lib/libnccl.so.2" || exit 1
    sha256sum "$home/lib/libnccl.so.2"
    echo "== NCCL 2.$v"
    NCCL_HOME=$home python3 -c "import symnccl, symnccl._C as C; \
v = symnccl.versions(); print(v['nccl_runtime'], v['nccl_library'], \
C.nccl_device_api())"
    NCCL_HOME=$home timeout 300 python3 -m symnccl ${SELFTEST_ARGS:---quick} \
      2>&1 | tee "${OUT:-/tmp}/selftest_nccl2.$v.log" |
      grep -E "^wrong|checks over|Error"
    [ "${LOOPBACK:-1}" = 1 ] || continue
    LD_PRELOAD=$home/lib/libnccl.so.2 NCCL_HOME=$home timeout 200 \
      python3 -m pytest -q -p no:cacheprovider tests/test_loopback.py 2>&1 |
      tail -1
  done ;;
*)
  echo "usage: $0 prep | take K [K ...] | check" >&2; exit 2 ;;
esac
