#!/usr/bin/env bash
# The multi-GPU issue's first runs: what NCCL 2.28, 2.29 and 2.30 do on this
# machine, one step per device call (each step fits a call's time limit).
#
#   bash tools/gpu/nccl_diagnose.sh list         # the calls, in order
#   bash tools/gpu/nccl_diagnose.sh MINOR STEP   # one call
#
# Steps, per minor (28 29 30):
#   selfcheck  python -m symnccl --quick (every GPU): the summary and every
#              failing cell ("wrong:" lines); SYMNCCL_NCCL_WINDOWS as set
#              (auto: NCCL gets plain memory where csrc/runtime/nccl_policy.c says)
#   windows    the same with SYMNCCL_NCCL_WINDOWS=1: NCCL gets every
#              window (its symmetric kernels run where it picks them)
#   nosym      the same with NCCL_SYM_KERNEL=none: no NCCL symmetric kernel
# and for 30 also (2.30.7's first ncclAllReduce failed with "invalid device
# function" on 2x H200):
#   probe      a 2-rank ncclAllReduce (algo="nccl") on plain buffers, then on
#              windows, NCCL_DEBUG=WARN, every element checked
#   ring       the same with NCCL_ALGO=Ring NCCL_PROTO=Simple
#
# 2.28 is the device machines' own (the torch venv's wheel). 2.29 and 2.30
# come from setup.py's cache in pieces (tools/gpu/other_nccl.sh, formerly
# scripts/other_nccl.sh: prep here, take on the device, see there); the
# first step of those minors joins the pieces into /tmp/nccl2.<minor>/lib,
# which the machine keeps while warm. Logs go to $OUT (the device call's
# folder) when set. The multicast switches of the environment are left as
# they are.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
ACC=/tmp/symnccl-nccl-parts
LOGS=${OUT:-/tmp}
MINORS="28 29 30"

other_nccl() {
  if [ -f tools/gpu/other_nccl.sh ]; then echo tools/gpu/other_nccl.sh
  else echo scripts/other_nccl.sh; fi
}

list() {
  local o; o=$(other_nccl)
  echo "# here: SYMNCCL_CUDA_ARCHS=90 python3 setup.py build_ext --inplace"
  echo "#       bash $o prep"
  for v in $MINORS; do
    if [ "$v" != 28 ]; then
      echo "# device: each call carries out-nccl/n$v.gz ($o prep)"
    fi
    for s in selfcheck windows nosym; do
      echo "bash tools/gpu/nccl_diagnose.sh $v $s"
    done
    if [ "$v" = 30 ]; then
      echo "bash tools/gpu/nccl_diagnose.sh 30 probe"
      echo "bash tools/gpu/nccl_diagnose.sh 30 ring"
    fi
  done
}

# Sets ENVS: how a process of this step gets NCCL 2.<v>.
use_minor() {
  local v=$1 home=/tmp/nccl2.$v
  ENVS=()
  if [ "$v" = 28 ]; then
    return 0
  fi
  if [ ! -f "$home/lib/libnccl.so.2" ]; then
    mkdir -p "$home/lib"
    if [ -f "out-nccl/n$v.gz" ]; then   # other_nccl.sh prep, carried
      gunzip -c "out-nccl/n$v.gz" > "$home/lib/libnccl.so.2" || exit 1
    elif ls "$ACC"/n"$v".part.* >/dev/null 2>&1; then   # older pieces
      cat "$ACC"/n"$v".part.* | gunzip > "$home/lib/libnccl.so.2" || exit 1
    else
      echo "no NCCL 2.$v here: carry out-nccl/n$v.gz ($(other_nccl) prep)"
      exit 1
    fi
  fi
  sha256sum "$home/lib/libnccl.so.2"
  ENVS=(NCCL_HOME="$home" LD_PRELOAD="$home/lib/libnccl.so.2")
}

versions() {
  env "${ENVS[@]}" python3 -c "import symnccl, symnccl._C as C; \
v = symnccl.versions(); print('NCCL', v['nccl_runtime'], \
v['nccl_library'], 'kernels', C.nccl_device_api(), \
'headers', C.NCCL_DEVICE_API_HEADERS)"
}

selfcheck() {   # selfcheck TAG [VAR=VALUE ...]
  local tag=$1; shift
  local log="$LOGS/diagnose_nccl2.${MINOR}_$tag.log"
  echo "== NCCL 2.$MINOR, self-check ($tag${*:+: $*})"
  env "${ENVS[@]}" "$@" timeout 500 python3 -m symnccl --quick \
    > "$log" 2>&1
  echo "exit $?, log $log"
  grep -E "^wrong|checks over|Error|Warning" "$log" | head -40
}

probe() {   # probe TAG [VAR=VALUE ...]
  local tag=$1; shift
  local py; py=$(mktemp /tmp/nccl_probe_XXXX.py)
  cat > "$py" <<'PY'
"""2 ranks: ncclAllReduce through symnccl (algo="nccl") on plain device
memory (torch), then on symmetric windows (comm.empty), every element
checked against the exact sum."""
import sys


def rank(r, n, uid):
    import symnccl
    import torch
    out = []
    comm = symnccl.Communicator(uid, r, n, device=r)
    out.append(f"rank {r}: symmetric={comm.symmetric} "
               f"device_api_reason={getattr(comm, 'device_api_reason', '?')}")
    count = 1 << 20
    want = float(sum(q + 1 for q in range(n)))
    for where in ("plain", "window"):
        try:
            if where == "plain":
                x = torch.full((count,), float(r + 1), device=f"cuda:{r}")
            else:
                x = torch.from_dlpack(comm.empty((count,), "float32"))
                x.fill_(float(r + 1))
            comm.all_reduce(x, algo="nccl")
            torch.cuda.synchronize(r)
            wrong = int((x != want).sum())
            out.append(f"rank {r} {where}: {wrong} wrong of {count}")
        except Exception as e:   # the error is the finding
            out.append(f"rank {r} {where}: {type(e).__name__}: {e}")
    comm.close()
    return out


if __name__ == "__main__":
    from symnccl.bootstrap import spawn
    for lines in spawn(rank, 2, timeout=240):
        print("\n".join(lines))
    sys.stdout.flush()
PY
  echo "== NCCL 2.$MINOR, 2-rank ncclAllReduce ($tag${*:+: $*})"
  env "${ENVS[@]}" NCCL_DEBUG=WARN SYMNCCL_NCCL_WINDOWS=1 "$@" \
    timeout 300 python3 "$py" 2>&1 | tee "$LOGS/diagnose_nccl2.${MINOR}_$tag.log"
  echo "exit ${PIPESTATUS[0]}"
  rm -f "$py"
}

case "${1:-}" in
list) list ;;
28|29|30)
  MINOR=$1
  use_minor "$MINOR"
  versions
  case "${2:-}" in
  selfcheck) selfcheck auto ;;
  windows) selfcheck windows SYMNCCL_NCCL_WINDOWS=1 ;;
  nosym) selfcheck nosym NCCL_SYM_KERNEL=none ;;
  probe) probe probe ;;
  ring) probe ring NCCL_ALGO=Ring NCCL_PROTO=Simple ;;
  *) echo "steps: selfcheck windows nosym probe ring" >&2; exit 2 ;;
  esac ;;
*)
  echo "usage: $0 list | MINOR STEP (bash $0 list)" >&2; exit 2 ;;
esac
