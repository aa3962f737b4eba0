#!/usr/bin/env bash
# Every thread's C stack of a command's Python processes after SECONDS
# (a hang's diagnosis on the device machine, which has cuda-gdb but no
# gdb): the command runs in the background, and after SECONDS each python3
# process started since is attached with cuda-gdb and its threads'
# backtraces written to $OUT/stacks.log; then the command is waited for.
# Found the watchdog's missed NCCL hang (docs/FAILURES.md, 'Runs on real
# peers'):
#
#   DIAG_TIMEOUT=45 bash tools/gpu/stacks.sh 22 \
#       python3 tools/gpu/peer_exit_diag.py all_reduce
set -uo pipefail
secs=${1:?usage: $0 SECONDS command...}; shift
OUT=${OUT:-/tmp/symnccl-out}
mkdir -p "$OUT"
before=$(pgrep python3 | sort)
"$@" &
cmd=$!
sleep "$secs"
for p in $(pgrep python3 | sort); do
  grep -qx "$p" <<< "$before" && continue
  echo "=== pid $p $(tr '\0' ' ' < /proc/$p/cmdline | cut -c1-100)"
  timeout 25 cuda-gdb -p "$p" -batch -ex "thread apply all bt 25" 2>&1 |
    grep -E "^Thread|^#" | grep -v "in ?? ()"
done > "$OUT/stacks.log" 2>&1
echo "stacks of $(grep -c '^=== pid' "$OUT/stacks.log") processes: $OUT/stacks.log"
wait "$cmd"
