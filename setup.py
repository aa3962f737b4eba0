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
  SYMNCCL_NCCL_MINORS the NCCL 2.x minors to build the kernels for
                      (default: every supported one, NCCL_MINORS below)
  SYMNCCL_NCCL_INCLUDE_2_<minor>  that minor's include/ (nccl.h and
                      nccl_device.h); default: the installed NCCL wheel's
                      for its own minor, else a cache
                      (SYMNCCL_NCCL_CACHE, default ~/.cache/symnccl/nccl)
                      filled from that minor's nvidia-nccl-cu13 wheel on
                      PyPI (SYMNCCL_NCCL_FETCH=0: never fetch; the minors
                      without headers are then not built)
  NCCL_HOME           an NCCL install with include/ and lib/ to use instead
                      of the nvidia-nccl-cu13 wheel
  CUDA_HOME           CUDA toolkit root (default: from nvcc on PATH)
  NVCC                nvcc to use
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
from setuptools.command.build_py import build_py

# NCCL 2.x minors whose device API symnccl's kernels are built for: the
# kernels are compiled once per minor against its own headers (the device
# API's structs change between minors), and the module uses the build of
# the libnccl it loads (csrc/abi.c). pyproject.toml's nvidia-nccl-cu13
# range covers the same minors (tests/test_cpu.py checks it).
NCCL_MINORS = (28, 29, 30)
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


def _headers_minor(inc):
    """The NCCL 2.x minor of the headers in `inc`, or None."""
    header = os.path.join(inc, "nccl.h")
    if not (os.path.exists(header) and
            os.path.exists(os.path.join(inc, "nccl_device.h"))):
        return None
    text = open(header).read()
    major = int(re.search(r"#define NCCL_MAJOR (\d+)", text).group(1))
    minor = int(re.search(r"#define NCCL_MINOR (\d+)", text).group(1))
    return minor if major == 2 else None


def _fetch_headers(minor, cache):
    """nccl.h and nccl_device.h of NCCL 2.<minor> from its nvidia-nccl-cu13
    wheel (pip download, else PyPI's JSON API), unpacked into the cache."""
    import tempfile
    import zipfile
    dest = os.path.join(cache, f"2.{minor}")
    spec = f"nvidia-nccl-cu13>=2.{minor},<2.{minor + 1}"
    with tempfile.TemporaryDirectory() as tmp:
        wheel, why = None, []
        # pip as a module of this interpreter (not in pip's isolated build
        # environments), else the pip on PATH
        for pip in ([sys.executable, "-m", "pip"], [shutil.which("pip")]):
            if pip[0] is None:
                continue
            r = subprocess.run(pip + ["download", "--no-deps",
                                      "--only-binary=:all:", "-q",
                                      "--platform", "manylinux_2_18_x86_64",
                                      "-d", tmp, spec],
                               capture_output=True, text=True)
            found = glob.glob(os.path.join(tmp, "*.whl"))
            if r.returncode == 0 and found:
                wheel = found[0]
                break
            why.append(r.stderr.strip()[-200:])
        if wheel is None:
            import json
            import urllib.parse
            import urllib.request
            index = os.environ.get("SYMNCCL_PYPI_JSON",
                                   "https://pypi.org/pypi/nvidia-nccl-cu13/"
                                   "json")
            try:
                with urllib.request.urlopen(index, timeout=60) as f:
                    releases = json.load(f)["releases"]
                versions = sorted((v for v in releases
                                   if v.startswith(f"2.{minor}.")),
                                  key=lambda v: [int(x) for x in
                                                 v.split(".")])
                url = next(u["url"] for u in releases[versions[-1]]
                           if u["filename"].endswith("x86_64.whl"))
                wheel = os.path.join(tmp, "nccl.whl")
                # a mirror may give URLs relative to the JSON's
                urllib.request.urlretrieve(urllib.parse.urljoin(index, url),
                                           wheel)
            except Exception as e:   # offline, or no such release
                print(f"symnccl: no NCCL 2.{minor} headers: pip download "
                      f"failed ({'; '.join(why)}) and {index} could not be "
                      f"read ({e})", flush=True)
                return None
        with zipfile.ZipFile(wheel) as z:
            # the headers, and the library for tests that load this NCCL
            for name in z.namelist():
                if name.startswith(("nvidia/nccl/include/",
                                    "nvidia/nccl/lib/libnccl.so")):
                    z.extract(name, dest)
    inc = os.path.join(dest, "nvidia", "nccl", "include")
    return inc if _headers_minor(inc) == minor else None


def find_nccl():
    """(headers by minor, the include dir of the host code's nccl.h, the
    lib dir of the libnccl.so.2 to link, whether it came from NCCL_HOME)."""
    root = os.environ.get("NCCL_HOME") or _nccl_from_wheel()
    if root is None:
        _fail("NCCL was not found. Install the NCCL wheel "
              "(pip install 'nvidia-nccl-cu13>=2.28,<2.31') or set NCCL_HOME "
              "to an NCCL 2.28-2.30 install with include/ and lib/.")
    inc = os.path.join(root, "include")
    own = _headers_minor(inc)
    if own is None or own not in NCCL_MINORS:
        _fail(f"{inc} has no nccl.h/nccl_device.h of NCCL 2.{NCCL_MINORS[0]}"
              f"-2.{NCCL_MINORS[-1]} (the device API needs 2.28 or newer)")
    libdir = os.path.join(root, "lib")
    if not os.path.exists(os.path.join(libdir, "libnccl.so.2")):
        _fail(f"{libdir} has no libnccl.so.2")
    wanted = [int(m) for m in re.split(r"[;, ]+",
                                        os.environ.get("SYMNCCL_NCCL_MINORS",
                                                       ""))
              if m] or list(NCCL_MINORS)
    cache = os.environ.get("SYMNCCL_NCCL_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "symnccl", "nccl")
    fetch = os.environ.get("SYMNCCL_NCCL_FETCH", "1") != "0"
    builds = {}
    for minor in wanted:
        if minor not in NCCL_MINORS:
            _fail(f"SYMNCCL_NCCL_MINORS: 2.{minor} is not supported "
                  f"(2.{NCCL_MINORS[0]}-2.{NCCL_MINORS[-1]})")
        given = os.environ.get(f"SYMNCCL_NCCL_INCLUDE_2_{minor}")
        cached = os.path.join(cache, f"2.{minor}", "nvidia", "nccl",
                              "include")
        if given:
            if _headers_minor(given) != minor:
                _fail(f"SYMNCCL_NCCL_INCLUDE_2_{minor}={given} holds no NCCL "
                      f"2.{minor} nccl.h/nccl_device.h")
            builds[minor] = given
        elif minor == own:
            builds[minor] = inc
        elif _headers_minor(cached) == minor:
            builds[minor] = cached
        elif fetch:
            got = _fetch_headers(minor, cache)
            if got:
                builds[minor] = got
    missing = [m for m in wanted if m not in builds]
    if missing:
        print("symnccl: WARNING: no kernels for NCCL " +
              ", ".join(f"2.{m}" for m in missing) + ": importing with that "
              "NCCL will fail (set SYMNCCL_NCCL_INCLUDE_2_<minor>)",
              flush=True)
    if not builds:
        _fail("no NCCL headers to build the kernels against")
    return builds, inc, libdir, "NCCL_HOME" in os.environ


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


def kernel_jobs(objdir, minor):
    """(source, object, extra flags) of every kernel object of one NCCL
    minor's build."""
    kdir = os.path.join("csrc", "kernels")
    odir = os.path.join(objdir, f"2_{minor}")
    flags = [f"-DSYMNCCL_NCCL_MINOR={minor}"]
    jobs = [(os.path.join(kdir, "unit.cu"),
             os.path.join(odir, f"unit_{dt.lower()}.o"),
             flags + [f"-DSYMNCCL_UNIT_DT={dt}"]) for dt in kernel_dtypes()]
    for src in sorted(glob.glob(os.path.join(kdir, "*.cu"))):
        if os.path.basename(src) != "unit.cu":
            base = os.path.basename(src)[:-3]
            jobs.append((src, os.path.join(odir, base + ".o"), flags))
    return jobs


def _stale(out, key, inputs):
    stamp = out + ".cmd"
    return not (os.path.exists(out) and os.path.exists(stamp) and
                open(stamp).read() == key and
                max(os.path.getmtime(d) for d in inputs)
                <= os.path.getmtime(out))


def _stamp(out, key):
    with open(out + ".cmd", "w") as f:
        f.write(key)


def compile_kernels(nvcc, builds, objdir, force):
    """Compiles every minor's kernel objects in parallel, then joins each
    minor's into one object whose only global symbol is its table,
    symnccl_kernels_2_<minor> (so the builds' identically named C++
    symbols never meet); returns those objects."""
    headers = glob.glob(os.path.join("csrc", "kernels", "*.h")) + \
        glob.glob(os.path.join("csrc", "kernels", "*.cuh"))
    jobs = [(minor,) + job for minor in sorted(builds)
            for job in kernel_jobs(objdir, minor)]
    cores = os.cpu_count() or 1
    njobs = int(os.environ.get("SYMNCCL_BUILD_JOBS", cores))
    njobs = max(1, min(njobs, len(jobs)))
    archs = len(cuda_archs())
    # nvcc --threads compiles a unit's architectures in parallel: use what
    # the parallel jobs leave of the cores
    threads = max(1, min(archs, cores // njobs))
    todo = []
    for minor, src, obj, extra in jobs:
        os.makedirs(os.path.dirname(obj), exist_ok=True)
        cmd = [nvcc, "-c", src, "-o", obj, "-O3", "-std=c++17",
               "-Xcompiler", "-fPIC", "--expt-relaxed-constexpr",
               "-Xptxas", "-warn-spills",
               # fatbin compressed for size: 19% smaller than
               # -Xfatbin=-compress-all (benchmarks/NOTES.md, 31)
               "--compress-mode=size",
               f"--threads={threads}", f"-I{builds[minor]}", "-Icsrc"] + \
            extra + gencode_flags()
        key = hashlib.sha256(" ".join(cmd).encode()).hexdigest()
        if force or _stale(obj, key, [src] + headers):
            todo.append((obj, cmd, key))
    if todo:
        print(f"symnccl: compiling {len(todo)} of {len(jobs)} kernel objects "
              f"for NCCL " + ", ".join(f"2.{m}" for m in sorted(builds)) +
              f" ({njobs} jobs x {threads} nvcc threads, "
              f"{';'.join(cuda_archs())})", flush=True)
    t0 = time.monotonic()

    def run(item):
        obj, cmd, key = item
        start = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True)
        return item, r, time.monotonic() - start

    done = 0
    failed = []
    with concurrent.futures.ThreadPoolExecutor(njobs) as pool:
        for (obj, cmd, key), r, secs in pool.map(run, todo):
            done += 1
            spills = r.stderr.count("Registers are spilled")
            note = f", {spills} kernels spill registers" if spills else ""
            name = os.path.join(os.path.basename(os.path.dirname(obj)),
                                os.path.basename(obj))
            print(f"symnccl: [{done}/{len(todo)}] {name} {secs:.0f} s{note}",
                  flush=True)
            if r.returncode != 0:
                failed.append((cmd, r.stdout + r.stderr))
            else:
                _stamp(obj, key)
    for cmd, out in failed:
        print(" ".join(cmd) + "\n" + out, file=sys.stderr)
    if failed:
        _fail(f"{len(failed)} kernel object(s) failed to compile")
    if todo:
        print(f"symnccl: kernels compiled in {time.monotonic() - t0:.0f} s",
              flush=True)
    blobs = []
    for minor in sorted(builds):
        objs = [obj for m, _, obj, _ in jobs if m == minor]
        blob = os.path.join(objdir, f"kernels_2_{minor}.o")
        table = f"symnccl_kernels_2_{minor}"
        key = hashlib.sha256(" ".join(objs + [table]).encode()).hexdigest()
        if force or _stale(blob, key, objs):
            subprocess.check_call(["ld", "-r", "-o", blob] + objs)
            subprocess.check_call(["objcopy", f"--keep-global-symbol={table}",
                                   blob])
            _stamp(blob, key)
        blobs.append(blob)
    return blobs


class BuildPy(build_py):
    """Ships benchmarks/bench_allreduce.py inside the package as
    symnccl/_bench_allreduce.py, so that `symnccl bench` works from a wheel
    (an editable install finds it in the tree)."""

    def run(self):
        super().run()
        src = os.path.join(HERE, "benchmarks", "bench_allreduce.py")
        editable = getattr(self, "editable_mode", False)
        if os.path.exists(src) and not editable:
            self.copy_file(src, os.path.join(self.build_lib, "symnccl",
                                             "_bench_allreduce.py"))


class BuildExt(build_ext):
    def build_extensions(self):
        nvcc = CUDA[0]
        objects = compile_kernels(nvcc, NCCL[0],
                                  os.path.join(self.build_temp, "kernels"),
                                  self.force)
        builds = " ".join(f"X({m})" for m in sorted(NCCL[0]))
        for ext in self.extensions:
            ext.define_macros = list(ext.define_macros or []) + [
                ("SYMNCCL_NCCL_BUILDS(X)", builds)]
            # setuptools rebuilds a .c object only when its source changed:
            # also when the flags did
            key = hashlib.sha256(repr((ext.define_macros, ext.include_dirs,
                                       ext.extra_compile_args)).encode()
                                 ).hexdigest()
            stamp = os.path.join(self.build_temp, "c_flags.cmd")
            if not os.path.exists(stamp) or open(stamp).read() != key:
                self.force = True
                os.makedirs(self.build_temp, exist_ok=True)
                with open(stamp, "w") as f:
                    f.write(key)
        # The interpreter's own link flags may carry its build's rpath (a
        # pyenv or conda prefix): the wheel's RUNPATH holds only ours.
        self.compiler.linker_so = [
            a for a in self.compiler.linker_so
            if not a.startswith(("-Wl,-rpath", "-Wl,-R"))]
        headers = glob.glob(os.path.join("csrc", "*.h")) + \
            glob.glob(os.path.join("csrc", "kernels", "launch.h"))
        for ext in self.extensions:
            ext.extra_objects = objects + list(ext.extra_objects or [])
            # relink when a kernel object or a header is newer than the
            # library (setuptools looks only at the .c sources otherwise)
            ext.depends = list(ext.depends or []) + objects + headers
        super().build_extensions()


def _sources():
    """The C sources; a tree (or sdist) without them cannot build."""
    sources = sorted(glob.glob(os.path.join("csrc", "*.c")))
    need = [os.path.join("csrc", "symnccl.h"),
            os.path.join("csrc", "kernels", "launch.h"),
            os.path.join("csrc", "kernels", "unit.cu")]
    missing = [p for p in need if not os.path.exists(p)]
    if not sources or missing:
        _fail("the C/CUDA sources are missing from this tree (" +
              ", ".join(missing or ["csrc/*.c"]) + "): build from a git "
              "checkout or a complete sdist")
    return sources


def make_extension():
    nvcc, cuda_inc, cuda_lib = CUDA
    _, nccl_inc, nccl_lib, nccl_home = NCCL
    macros = [("Py_LIMITED_API", "0x030B0000")]
    # the XLA FFI handlers need no jaxlib here: csrc/xla_ffi_abi.h
    include_dirs = ["csrc", nccl_inc, cuda_inc]
    # $ORIGIN/../nvidia/nccl/lib is the wheel's libnccl beside an installed
    # symnccl; symnccl/_loader.py preloads it explicitly in any case.
    rpaths = ["$ORIGIN/../nvidia/nccl/lib"]
    if nccl_home:
        rpaths.append(nccl_lib)
    return Extension(
        "symnccl._C",
        sources=_sources(),
        include_dirs=include_dirs,
        library_dirs=[nccl_lib, cuda_lib],
        libraries=["cudart_static", "dl", "pthread", "rt"],
        extra_link_args=["-l:libnccl.so.2"]
        + [f"-Wl,-rpath,{p}" for p in rpaths],
        extra_compile_args=["-std=c11", "-O2", "-fvisibility=hidden",
                            "-Wall", "-Wextra",
                            # a function outside the limited API (abi3)
                            # is undeclared: never let it become an int
                            "-Werror=implicit-function-declaration",
                            "-Wno-unused-parameter",
                            "-Wno-missing-field-initializers",
                            "-Wno-cast-function-type"],
        define_macros=macros,
        py_limited_api=True,
    )


if __name__ == "__main__":   # setuptools runs this file as __main__ too;
    # scripts/ptxas_report.py imports it for its helpers
    os.chdir(HERE)   # the sources are named relative to the tree
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
        cmdclass={"build_ext": BuildExt, "build_py": BuildPy},
        options={"bdist_wheel": {"py_limited_api": "cp311"}},
    )
