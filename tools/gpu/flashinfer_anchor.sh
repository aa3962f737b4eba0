#!/usr/bin/env bash
# FlashInfer's fused all-reduce + residual + RMSNorm
# (flashinfer.comm.trtllm_allreduce_fusion) as bench_fused.py's serving
# anchor on the device machines, which reach no package index (issue 38).
# Nothing of FlashInfer enters this repository: `prep` cuts its wheel down
# under out/ (git-ignored) to what that one function imports, since the
# package's own __init__ imports every module and, with them, dependencies
# the machines lack (cuDNN's and CUTLASS's Python packages among them):
#   - its Python files at the top level and under jit/ and comm/, with
#     flashinfer/__init__.py and flashinfer/comm/__init__.py replaced by
#     two stubs that import the version and trtllm_ar's names only;
#   - the three trtllm_*allreduce*.cu sources of its trtllm_comm JIT module
#     and the headers they include (57 files, ~1 MB);
#   - the wheels of apache-tvm-ffi (its JIT's loader) and nvidia-ml-py.
# The JIT build of trtllm_comm takes ~280 s on an H100 machine, so `build`
# runs once on a one-GPU machine and sends the module back; `prep` again
# puts it where FlashInfer loads a prebuilt ("AOT") module from
# (flashinfer/data/aot/trtllm_comm/trtllm_comm.so), which no ninja
# freshness check rebuilds. The 2-GPU call then installs the wheels and
# runs bench_fused.py with the package on PYTHONPATH.
#
#   here:   bash tools/gpu/flashinfer_anchor.sh prep        # out/fi.tgz
#   device (nvidia-h100-x1), carry ["out/fi.tgz"]:
#           bash tools/gpu/flashinfer_anchor.sh build  # $OUT/trtllm_comm.so
#   here:   cp <files_at>/trtllm_comm.so out/
#           bash tools/gpu/flashinfer_anchor.sh prep
#   device (2 GPUs), carry ["symnccl/_C.abi3.so", "out/fi.tgz"]:
#           bash tools/gpu/flashinfer_anchor.sh bench [bench_fused.py args]
#
# Session 18 (2026-11-26, 2x H100) measured FlashInfer 0.7.2.post1 so
# (docs/PERFORMANCE.md, 'Fused all-reduce, all-to-all and steps').
set -euo pipefail
VERSION=${FLASHINFER_VERSION:-0.7.2.post1}
TVM_FFI=${TVM_FFI_VERSION:-0.1.15.post2}
OUT=${OUT:-/tmp/symnccl-out}
ROOT=$(pwd)

prep() {
    local w=out/fi-wheels src=out/fi-src dst=out/fi
    mkdir -p "$w"
    [ -f "$w/flashinfer_python-$VERSION-py3-none-any.whl" ] ||
        pip download -q "flashinfer-python==$VERSION" --no-deps -d "$w"
    # the device machines' python is 3.12
    ls "$w"/apache_tvm_ffi-"$TVM_FFI"-cp312-*.whl >/dev/null 2>&1 ||
        pip download -q "apache-tvm-ffi==$TVM_FFI" --no-deps -d "$w" \
            --python-version 3.12 --only-binary=:all: \
            --platform manylinux_2_28_x86_64
    ls "$w"/nvidia_ml_py-*.whl >/dev/null 2>&1 ||
        pip download -q nvidia-ml-py --no-deps -d "$w"
    rm -rf "$src" "$dst" && mkdir -p "$src" "$dst/pkg" "$dst/wheels"
    python3 -m zipfile -e "$w/flashinfer_python-$VERSION-py3-none-any.whl" "$src"
    cp "$w"/apache_tvm_ffi-"$TVM_FFI"-cp312-*.whl "$w"/nvidia_ml_py-*.whl \
        "$dst/wheels/"
    python3 - "$src/flashinfer" "$dst/pkg/flashinfer" <<'EOF'
import os, re, shutil, sys
src, dst = sys.argv[1:]
# the Python files: top level, jit/, comm/
for root, _, files in os.walk(src):
    rel = os.path.relpath(root, src)
    if rel != "." and rel.split(os.sep)[0] not in ("jit", "comm"):
        continue
    for f in files:
        if f.endswith(".py"):
            os.makedirs(os.path.join(dst, rel), exist_ok=True)
            shutil.copy2(os.path.join(root, f), os.path.join(dst, rel, f))
# trtllm_comm's sources and the headers they include
data, roots = os.path.join(src, "data"), ["include", "csrc", "cutlass/include",
                                          "cccl", "spdlog/include"]
seen, stack = set(), ["csrc/trtllm_allreduce.cu",
                      "csrc/trtllm_allreduce_fusion.cu",
                      "csrc/trtllm_moe_allreduce_fusion.cu"]
while stack:
    f = stack.pop()
    if f in seen:
        continue
    seen.add(f)
    for line in open(os.path.join(data, f), errors="ignore"):
        m = re.match(r'\s*#\s*include\s*[<"]([^>"]+)[>"]', line)
        if not m:
            continue
        for c in [os.path.join(os.path.dirname(f), m.group(1))] + \
                 [os.path.join(r, m.group(1)) for r in roots]:
            if os.path.isfile(os.path.join(data, c)):
                stack.append(os.path.normpath(c))
                break
for f in seen:
    os.makedirs(os.path.join(dst, "data", os.path.dirname(f)), exist_ok=True)
    shutil.copy2(os.path.join(data, f), os.path.join(dst, "data", f))
for d in roots + ["cutlass/tools/util/include"]:
    os.makedirs(os.path.join(dst, "data", d), exist_ok=True)
print(f"{len(seen)} source and header files")
EOF
    cat > "$dst/pkg/flashinfer/__init__.py" <<'EOF'
# symnccl's benchmark anchor: FlashInfer cut down to its trtllm all-reduce
# fusion (tools/gpu/flashinfer_anchor.sh); not part of symnccl.
from .version import __version__ as __version__
EOF
    cat > "$dst/pkg/flashinfer/comm/__init__.py" <<'EOF'
# cut down (tools/gpu/flashinfer_anchor.sh): the trtllm all-reduce fusion
from .trtllm_ar import (AllReduceFusionPattern, trtllm_allreduce_fusion,
                        trtllm_create_ipc_workspace_for_all_reduce_fusion,
                        trtllm_destroy_ipc_workspace_for_all_reduce)
EOF
    if [ -f out/trtllm_comm.so ]; then
        mkdir -p "$dst/pkg/flashinfer/data/aot/trtllm_comm"
        cp out/trtllm_comm.so "$dst/pkg/flashinfer/data/aot/trtllm_comm/"
    fi
    tar -C out -czf out/fi.tgz fi
    ls -la out/fi.tgz
}

# on the device: the package under /tmp/fi, its wheels in /tmp/fi-deps
install() {
    rm -rf /tmp/fi && tar -xzf "$ROOT/out/fi.tgz" -C /tmp
    python3 -m pip install -q --no-deps --no-index --target /tmp/fi-deps \
        /tmp/fi/wheels/*.whl
    export PYTHONPATH=/tmp/fi-deps:/tmp/fi/pkg:$ROOT
    export FLASHINFER_WORKSPACE_BASE=/tmp/fi-ws
}

case ${1:-} in
    prep) prep ;;
    build)
        install
        mkdir -p "$OUT"
        python3 -c "
import time; t = time.time()
from flashinfer.jit.comm import gen_trtllm_comm_module
gen_trtllm_comm_module().build_and_load()
print('trtllm_comm built in', round(time.time() - t), 's')"
        cp "$(find /tmp/fi-ws -name trtllm_comm.so | head -1)" "$OUT/" ;;
    bench)
        install
        shift
        torchrun --standalone --nproc-per-node "${NPROC:-2}" \
            benchmarks/bench_fused.py "$@" ;;
    *) sed -n '2,/^set -euo/p' "$0" | grep '^#'; exit 2 ;;
esac
