"""Build symnccl._C: CPython C sources in csrc/, CUDA C++ in csrc/kernels/.

The .cu files are compiled by nvcc into objects that the C extension links
(the approach cupy takes), with the CUDA runtime linked statically and
libnccl.so.2 taken from the nvidia-nccl-cu13 wheel (or $NCCL_HOME).
csrc/kernels/unit.cu is compiled once per kernel dtype (launch.h's
SYMNCCL_KERNEL_DTYPES); all nvcc jobs run in parallel, and an object is
rebuilt when its source, a header or its command line changed.

Environment:
  SYMNCCL_CUDA_ARCHS  SM list, default "90;100" (SASS only)
  SYMNCCL_PTX         1: also embed PTX of the lowest architecture (for
                      GPUs newer than the list; costs size and build time)
  SYMNCCL_BUILD_JOBS  parallel nvcc jobs (default: the CPU count)
  NCCL_HOME           an NCCL install with include/ and lib/ to use instead
                      of the nvidia-nccl-cu13 wheel
  CUDA_HOME           CUDA toolkit root (default: from nvcc on PATH)
  NVCC                nvcc to use
  SYMNCCL_JAXLIB_INCLUDE  jaxlib's include/ (with xla/ffi/api/c_api.h) for
                      the XLA FFI handler; default: the installed jaxlib's.
                      Without it the handler is not built (symnccl.jax then
                      says why).
"""
import concurrent.futures
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

NCCL_MAJOR_MINOR = (2, 28)   # device-API ABI: build headers == runtime
HERE = os.path.dirname(os.path.abspath(__file__))


def _fail(msg):
    sys.exit(f"symnccl build error: {msg}")


def find_cuda():
    nvcc = os.environ.get("NVCC") or shutil.which("nvcc")
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if nvcc is None and home:
        cand = os.path.join(home, "bin", "nvcc")
        nvcc = cand if os.path.exists(cand) else None
    if nvcc is None and os.path.exists("/usr/local/cuda/bin/nvcc"):
        nvcc = "/usr/local/cuda/bin/nvcc"
    if nvcc is None:
        _fail("nvcc was not found. Install the CUDA toolkit (12.8 or newer, "
              "with nvcc) and put it on PATH, or set CUDA_HOME.")
    if home is None:
        home = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    inc = os.path.join(home, "include")
    libdir = next((d for d in (os.path.join(home, "lib64"),
                               os.path.join(home, "lib"))
                   if os.path.exists(os.path.join(d, "libcudart_static.a"))),
                  None)
    if libdir is None or not os.path.exists(
            os.path.join(inc, "cuda_runtime_api.h")):
        _fail(f"CUDA toolkit at {home} lacks cuda_runtime_api.h or "
              "libcudart_static.a; set CUDA_HOME to a full toolkit.")
    return nvcc, inc, libdir


def _nccl_from_wheel():
    try:
        import nvidia.nccl as m   # namespace package from nvidia-nccl-cu13
    except ImportError:
        return None
    for root in list(getattr(m, "__path__", [])):
        if os.path.exists(os.path.join(root, "include", "nccl.h")):
            return root
    return None


def find_nccl():
    root = os.environ.get("NCCL_HOME") or _nccl_from_wheel()
    if root is None:
        _fail("NCCL headers were not found. Install the NCCL wheel "
              "(pip install 'nvidia-nccl-cu13>=2.28,<2.29') or set NCCL_HOME "
              "to an NCCL 2.28 install with include/ and lib/.")
    inc = os.path.join(root, "include")
    header = os.path.join(inc, "nccl.h")
    if not os.path.exists(header) or not os.path.exists(
            os.path.join(inc, "nccl_device.h")):
        _fail(f"{inc} has no nccl.h/nccl_device.h (NCCL >= 2.28 is needed "
              "for the device API).")
    text = open(header).read()
    major = int(re.search(r"#define NCCL_MAJOR (\d+)", text).group(1))
    minor = int(re.search(r"#define NCCL_MINOR (\d+)", text).group(1))
    if (major, minor) != NCCL_MAJOR_MINOR:
        _fail(f"NCCL headers at {inc} are {major}.{minor}; symnccl's device "
              f"code needs {NCCL_MAJOR_MINOR[0]}.{NCCL_MAJOR_MINOR[1]} (the "
              "device API ABI changes between minor versions).")
    libdir = os.path.join(root, "lib")
    if not os.path.exists(os.path.join(libdir, "libnccl.so.2")):
        _fail(f"{libdir} has no libnccl.so.2")
    return inc, libdir, "NCCL_HOME" in os.environ


def find_xla_ffi():
    """jaxlib's include dir holding xla/ffi/api/c_api.h, or None. Found
    without importing jaxlib (a build environment may lack a GPU)."""
    inc = os.environ.get("SYMNCCL_JAXLIB_INCLUDE")
    if inc is None:
        import importlib.util
        spec = importlib.util.find_spec("jaxlib")
        roots = list(spec.submodule_search_locations or []) if spec else []
        inc = next((os.path.join(r, "include") for r in roots
                    if os.path.exists(os.path.join(r, "include"))), None)
    if inc and os.path.exists(os.path.join(inc, "xla", "ffi", "api",
                                           "c_api.h")):
        return inc
    if os.environ.get("SYMNCCL_JAXLIB_INCLUDE"):
        _fail(f"SYMNCCL_JAXLIB_INCLUDE={inc} has no xla/ffi/api/c_api.h")
    return None


def cuda_archs():
    archs = os.environ.get("SYMNCCL_CUDA_ARCHS", "90;100")
    sms = [a.strip() for a in re.split(r"[;, ]+", archs) if a.strip()]
    if not sms or not all(re.fullmatch(r"\d+a?", a) for a in sms):
        _fail(f"SYMNCCL_CUDA_ARCHS={archs!r}: expected e.g. '90;100'")
    return sms


def gencode_flags():
    sms = cuda_archs()
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in sms]
    if os.environ.get("SYMNCCL_PTX", "0") not in ("", "0"):
        lowest = min(sms, key=lambda a: int(a.rstrip("a")))
        flags.append(f"-gencode=arch=compute_{lowest},code=compute_{lowest}")
    return flags


def kernel_dtypes():
    """The IDs of SYMNCCL_KERNEL_DTYPES in csrc/kernels/launch.h."""
    text = open(os.path.join(HERE, "csrc", "kernels", "launch.h")).read()
    block = re.search(r"#define SYMNCCL_KERNEL_DTYPES\(X\)(.*?)\n\n", text,
                      re.S).group(1)
    ids = re.findall(r"X\((\w+),", block)
    if not ids:
        _fail("no SYMNCCL_KERNEL_DTYPES entries found in launch.h")
    return ids


def kernel_jobs(objdir):
    """(source, object, extra flags) for every kernel object."""
    kdir = os.path.join("csrc", "kernels")
    jobs = [(os.path.join(kdir, "unit.cu"),
             os.path.join(objdir, f"unit_{dt.lower()}.o"),
             [f"-DSYMNCCL_UNIT_DT={dt}"]) for dt in kernel_dtypes()]
    for src in sorted(glob.glob(os.path.join(kdir, "*.cu"))):
        if os.path.basename(src) != "unit.cu":
            base = os.path.basename(src)[:-3]
            jobs.append((src, os.path.join(objdir, base + ".o"), []))
    return jobs


def compile_kernels(nvcc, nccl_inc, objdir, force):
    """Compiles the kernel objects in parallel; returns their paths."""
    os.makedirs(objdir, exist_ok=True)
    jobs = kernel_jobs(objdir)
    headers = glob.glob(os.path.join("csrc", "kernels", "*.h")) + \
        glob.glob(os.path.join("csrc", "kernels", "*.cuh"))
    cores = os.cpu_count() or 1
    njobs = int(os.environ.get("SYMNCCL_BUILD_JOBS", cores))
    njobs = max(1, min(njobs, len(jobs)))
    archs = len(cuda_archs())
    # nvcc --threads compiles a unit's architectures in parallel: use what
    # the parallel jobs leave of the cores
    threads = max(1, min(archs, cores // njobs))
    todo = []
    for src, obj, extra in jobs:
        cmd = [nvcc, "-c", src, "-o", obj, "-O3", "-std=c++17",
               "-Xcompiler", "-fPIC", "--expt-relaxed-constexpr",
               "-Xptxas", "-warn-spills", "-Xfatbin=-compress-all",
               f"--threads={threads}", f"-I{nccl_inc}", "-Icsrc"] + \
            extra + gencode_flags()
        stamp = obj + ".cmd"
        key = hashlib.sha256(" ".join(cmd).encode()).hexdigest()
        fresh = (not force and os.path.exists(obj) and
                 os.path.exists(stamp) and open(stamp).read() == key and
                 max(os.path.getmtime(d) for d in [src] + headers)
                 <= os.path.getmtime(obj))
        if not fresh:
            todo.append((src, obj, cmd, stamp, key))
    if todo:
        print(f"symnccl: compiling {len(todo)} of {len(jobs)} kernel objects "
              f"({njobs} jobs x {threads} nvcc threads, "
              f"{';'.join(cuda_archs())})", flush=True)
    t0 = time.monotonic()

    def run(item):
        src, obj, cmd, stamp, key = item
        start = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True)
        return item, r, time.monotonic() - start

    done = 0
    failed = []
    with concurrent.futures.ThreadPoolExecutor(njobs) as pool:
        for item, r, secs in pool.map(run, todo):
            done += 1
            src, obj, cmd, stamp, key = item
            spills = r.stderr.count("Registers are spilled")
            note = f", {spills} kernels spill registers" if spills else ""
            print(f"symnccl: [{done}/{len(todo)}] {os.path.basename(obj)} "
                  f"{secs:.0f} s{note}", flush=True)
            if r.returncode != 0:
                failed.append((cmd, r.stdout + r.stderr))
            else:
                with open(stamp, "w") as f:
                    f.write(key)
    for cmd, out in failed:
        print(" ".join(cmd) + "\n" + out, file=sys.stderr)
    if failed:
        _fail(f"{len(failed)} kernel object(s) failed to compile")
    if todo:
        print(f"symnccl: kernels compiled in {time.monotonic() - t0:.0f} s",
              flush=True)
    return [obj for _, obj, _ in jobs]


class BuildExt(build_ext):
    def build_extensions(self):
        nvcc = CUDA[0]
        objects = compile_kernels(nvcc, NCCL[0],
                                  os.path.join(self.build_temp, "kernels"),
                                  self.force)
        headers = glob.glob(os.path.join("csrc", "*.h")) + \
            glob.glob(os.path.join("csrc", "kernels", "launch.h"))
        for ext in self.extensions:
            ext.extra_objects = objects + list(ext.extra_objects or [])
            # relink when a kernel object or a header is newer than the
            # library (setuptools looks only at the .c sources otherwise)
            ext.depends = list(ext.depends or []) + objects + headers
        super().build_extensions()


def make_extension():
    nvcc, cuda_inc, cuda_lib = CUDA
    nccl_inc, nccl_lib, nccl_home = NCCL
    xla_inc = find_xla_ffi()
    macros = [("Py_LIMITED_API", "0x030B0000")]
    include_dirs = ["csrc", nccl_inc, cuda_inc]
    if xla_inc is not None:
        print(f"symnccl: building the XLA FFI handler against {xla_inc}")
        macros.append(("SYMNCCL_HAVE_XLA_FFI", "1"))
        include_dirs.append(xla_inc)
    else:
        print("symnccl: jaxlib's headers not found: building without the "
              "XLA FFI handler")
    # $ORIGIN/../nvidia/nccl/lib is the wheel's libnccl beside an installed
    # symnccl; symnccl/_loader.py preloads it explicitly in any case.
    rpaths = ["$ORIGIN/../nvidia/nccl/lib"]
    if nccl_home:
        rpaths.append(nccl_lib)
    return Extension(
        "symnccl._C",
        sources=sorted(glob.glob(os.path.join("csrc", "*.c"))),
        include_dirs=include_dirs,
        library_dirs=[nccl_lib, cuda_lib],
        libraries=["cudart_static", "dl", "pthread", "rt"],
        extra_link_args=["-l:libnccl.so.2"]
        + [f"-Wl,-rpath,{p}" for p in rpaths],
        extra_compile_args=["-std=c11", "-O2", "-Wall", "-Wextra",
                            "-Wno-unused-parameter",
                            "-Wno-missing-field-initializers",
                            "-Wno-cast-function-type"],
        define_macros=macros,
        py_limited_api=True,
    )


if __name__ == "__main__":   # setuptools runs this file as __main__ too;
    # scripts/ptxas_report.py imports it for its helpers
    if any(a in sys.argv for a in ("egg_info", "sdist", "dist_info")) and \
            not any(a.startswith("build") or a in ("develop", "bdist_wheel",
                    "editable_wheel", "install") for a in sys.argv):
        ext_modules = []   # metadata only: no toolchain needed
    else:
        CUDA = find_cuda()
        NCCL = find_nccl()
        ext_modules = [make_extension()]

    setup(
        ext_modules=ext_modules,
        cmdclass={"build_ext": BuildExt},
        options={"bdist_wheel": {"py_limited_api": "cp311"}},
    )
