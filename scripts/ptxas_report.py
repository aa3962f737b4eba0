"""Registers, spills and stack of every kernel, per dtype unit, from ptxas.

Runs nvcc on csrc/kernels/unit.cu once per kernel dtype (in parallel) for
one architecture and prints a table; no GPU needed. A kernel that spills in
its hot loop shows it here before any benchmark does.

    python scripts/ptxas_report.py            # sm_90
    python scripts/ptxas_report.py --arch 100 --only-spills
"""
import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENTRY = re.compile(
    r"Compiling entry function '(\S+)' for 'sm_\d+a?'\s*\n\s*ptxas info\s*:"
    r"\s*Function properties for \S+\n\s*(\d+) bytes stack frame, (\d+) "
    r"bytes spill stores, (\d+) bytes spill loads\n\s*ptxas info\s*:\s*Used "
    r"(\d+) registers")


def kernel_name(mangled):
    """'_ZN7symnccl8nccl2_2815packet_one_shotI13__nv_bfloat16NS0_5LL128EE..'
    -> 'packet_one_shot<LL128>' (the last length-prefixed name of the
    nested name before its template arguments)."""
    names, i = [], len("_ZN") if mangled.startswith("_ZN") else 0
    while i < len(mangled) and mangled[i].isdigit():
        j = i
        while mangled[j].isdigit():
            j += 1
        n = int(mangled[i:j])
        names.append(mangled[j:j + n])
        i = j + n
    fmt = re.search(r"NS\d*_\d+(LL128|LL)EE", mangled)
    return (names[-1] if names else mangled) + \
        (f"<{fmt.group(1)}>" if fmt else "")


def parse(text):
    """[(kernel, registers, spill stores, spill loads, stack)]"""
    return [(kernel_name(m.group(1)), int(m.group(5)), int(m.group(3)),
             int(m.group(4)), int(m.group(2))) for m in ENTRY.finditer(text)]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="90")
    p.add_argument("--only-spills", action="store_true")
    a = p.parse_args(argv)
    sys.path.insert(0, ROOT)
    os.chdir(ROOT)
    import setup  # noqa: F401  (its helpers; does not build when imported)
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    inc = setup._nccl_from_wheel()
    if inc is None and not os.environ.get("NCCL_HOME"):
        sys.exit("NCCL headers not found (pip install nvidia-nccl-cu13)")
    inc = os.path.join(os.environ.get("NCCL_HOME") or inc, "include")
    minor = setup._headers_minor(inc)
    out = tempfile.mkdtemp()

    def run(dt):
        cmd = [nvcc, "-c", "csrc/kernels/unit.cu", "-o",
               os.path.join(out, dt + ".o"), "-O3", "-std=c++17",
               "--expt-relaxed-constexpr", "-Xptxas", "-v", f"-I{inc}",
               "-Icsrc", f"-DSYMNCCL_UNIT_DT={dt}",
               f"-DSYMNCCL_NCCL_MINOR={minor}",
               f"-gencode=arch=compute_{a.arch},code=sm_{a.arch}"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            sys.exit(r.stderr)
        return dt, parse(r.stderr)

    with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
        results = list(pool.map(run, setup.kernel_dtypes()))
    print(f"sm_{a.arch}: {'dtype':8} {'kernel':24} {'regs':>4} "
          f"{'spill st/ld':>12} {'stack':>5}")
    for dt, rows in results:
        for k, regs, st, ld, stack in sorted(rows):
            if a.only_spills and not st:
                continue
            print(f"       {dt:8} {k:24} {regs:4} {f'{st}/{ld}':>12} "
                  f"{stack:5}")
    shutil.rmtree(out)


if __name__ == "__main__":
    main()
