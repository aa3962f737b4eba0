"""Build symnccl._C: C sources in csrc/runtime/, csrc/python/ and csrc/xla/,
CUDA C++ in csrc/kernels/.

The .cu files are compiled by nvcc into objects that the C extension links
(the approach cupy takes), with the CUDA runtime linked statically and
libnccl.so.2 loaded at run time from the nvidia-nccl-cu13 wheel (or
$NCCL_HOME). csrc/kernels/unit.cu is compiled once per kernel dtype
(launch.h's SYMNCCL_KERNEL_DTYPES) and NCCL build (NCCL_HEADERS below);
all nvcc jobs run in parallel. docs/BUILD.md has the knobs, the caches and measured times.

pip hides a build's output unless run with -v: the build also writes its
progress to <cache>/build.log (tail -f it).

Environment:
  SYMNCCL_CUDA_ARCHS  SM list, default "90;100" (SASS only)
  SYMNCCL_PTX         1: also embed PTX of the lowest architecture (for
                      GPUs newer than the list; costs size and build time)
  SYMNCCL_BUILD_JOBS  parallel nvcc jobs (default: the CPU count)
  SYMNCCL_NCCL_MINORS the kernel builds to make, by the NCCL 2.x minor of
                      their headers (default: every one, NCCL_HEADERS
                      below)
  SYMNCCL_NCCL_INCLUDE_2_<minor>  that build's include/ (nccl.h and
                      nccl_device.h) instead of its pinned release's: the
                      library loaded at run time must then be at least as
                      new as these headers
  SYMNCCL_CACHE       the per-machine cache (default ~/.cache/symnccl):
                      nccl/ (the pinned NCCL wheels' include/ and lib/,
                      SYMNCCL_NCCL_CACHE moves it), objects/ (compiled
                      kernel objects by content key), build.log
  SYMNCCL_NCCL_FETCH  0: never download an NCCL wheel (the minors without
                      headers are then not built)
  SYMNCCL_PYPI_JSON   the JSON API to find the NCCL wheels in when pip
                      download fails (default: PyPI's)
  SYMNCCL_OBJECT_CACHE_MIB  bound of objects/ (default 2048; 0: no object
                      cache); the least recently used objects go first
  NCCL_HOME           an NCCL install with include/ and lib/ to use instead
                      of the nvidia-nccl-cu13 wheel for its own minor
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

# The kernel builds: the exact NCCL release whose headers each is compiled
# against, by the minor of those headers. One build serves several minors:
# a library runs kernels built against older headers where it carries a
# conversion of their device communicator (NCCL 2.30.3+ for 2.29.5-2.29.7
# headers), and never against newer headers than itself ("NCCL library is
# too old"); csrc/runtime/nccl_policy.c declares which library each build
# may run on, csrc/runtime/abi.c picks the newest build that may, and
# pyproject.toml's nvidia-nccl-cu13 range admits exactly the libraries some
# build serves (tests/test_build.py checks the three agree; docs/BUILD.md, 'NCCL
# headers', has the evidence). 2.28's device communicator carries no
# version, so 2.28 needs its own build; 2.29.7's serves 2.29.7 to 2.32.
NCCL_HEADERS = {28: "2.28.9", 29: "2.29.7"}
NCCL_MINORS = tuple(sorted(NCCL_HEADERS))
HERE = os.path.dirname(os.path.abspath(__file__))


def _fail(msg):
    sys.exit(f"symnccl build error: {msg}")


def cache_dir(*parts):
    root = os.environ.get("SYMNCCL_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "symnccl")
    return os.path.join(root, *parts)


def say(msg):
    """A line of the build's progress: on stdout (which pip shows with -v
    only) and in <cache>/build.log."""
    line = f"symnccl: {msg}"
    print(line, flush=True)
    try:
        os.makedirs(cache_dir(), exist_ok=True)
        with open(cache_dir("build.log"), "a") as f:
            f.write(time.strftime("%H:%M:%S ") + line + "\n")
    except OSError:
        pass


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
    """The root (include/, lib/) of an installed nvidia-nccl-cu13 wheel in
    this interpreter, or None."""
    try:
        import nvidia.nccl as m   # namespace package from nvidia-nccl-cu13
    except ImportError:
        return None
    for root in list(getattr(m, "__path__", [])):
        if os.path.exists(os.path.join(root, "include", "nccl.h")):
            return root
    return None


def _headers_version(inc):
    """(2, minor, patch) of the NCCL headers in `inc`, or None."""
    header = os.path.join(inc, "nccl.h")
    if not (os.path.exists(header) and
            os.path.exists(os.path.join(inc, "nccl_device.h"))):
        return None
    text = open(header).read()
    got = [re.search(rf"#define NCCL_{k} (\d+)", text)
           for k in ("MAJOR", "MINOR", "PATCH")]
    return tuple(int(g.group(1)) for g in got) if all(got) else None


def _headers_minor(inc):
    """The NCCL 2.x minor of the headers in `inc`, or None."""
    v = _headers_version(inc)
    return v[1] if v and v[0] == 2 else None


def _pinned(minor):
    return tuple(int(x) for x in NCCL_HEADERS[minor].split("."))


# The wheel tags _fetch_wheel accepts from pip (the headers are the same
# on every platform; the library is for linking and the tests).
_WHEEL_PLATFORMS = ("manylinux_2_18_x86_64", "manylinux_2_27_x86_64",
                    "manylinux_2_28_x86_64")


def _fetch_wheel(version, dest):
    """Unpacks include/ and lib/libnccl.so.2 of nvidia-nccl-cu13==version
    into dest (pip download, which goes through pip's own HTTP cache, else
    PyPI's JSON API)."""
    import tempfile
    import zipfile
    spec = f"nvidia-nccl-cu13=={version}"
    say(f"downloading {spec} (about 200 MB, once per machine) for its "
        f"headers and library into {dest}")
    with tempfile.TemporaryDirectory() as tmp:
        wheel, why = None, []
        # pip as a module of this interpreter (not in pip's isolated build
        # environments), else the pip on PATH
        for pip in ([sys.executable, "-m", "pip"], [shutil.which("pip")]):
            if pip[0] is None:
                continue
            # any manylinux x86-64 wheel: 2.32.3 is manylinux_2_27 only
            r = subprocess.run(pip + ["download", "--no-deps",
                                      "--only-binary=:all:", "-q"] +
                               [a for tag in _WHEEL_PLATFORMS
                                for a in ("--platform", tag)] +
                               ["-d", tmp, spec],
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
                url = next(u["url"] for u in releases[version]
                           if u["filename"].endswith("x86_64.whl"))
                wheel = os.path.join(tmp, "nccl.whl")
                # a mirror may give URLs relative to the JSON's
                urllib.request.urlretrieve(urllib.parse.urljoin(index, url),
                                           wheel)
            except Exception as e:   # offline, or no such release
                say(f"WARNING: could not fetch {spec}: pip download failed "
                    f"({'; '.join(why)}) and {index} could not be read "
                    f"({e})")
                return False
        size = os.path.getsize(wheel)
        # unpacked beside dest, then swapped in: a build reading dest never
        # sees half a tree
        part = f"{dest}.{os.getpid()}.tmp"
        with zipfile.ZipFile(wheel) as z:
            # the headers, and the library to link (and for tests that load
            # each supported NCCL)
            for name in z.namelist():
                if name.startswith(("nvidia/nccl/include/",
                                    "nvidia/nccl/lib/libnccl.so")):
                    z.extract(name, part)
        if os.path.exists(dest):
            shutil.rmtree(dest)   # another patch of this minor
        os.replace(part, dest)
    say(f"fetched {spec}: a {size / 1e6:.0f} MB wheel (from pip's cache "
        "if pip had it), unpacked: headers and libnccl.so.2")
    return True


def find_nccl():
    """(include dir by build, the include dir of the host code's nccl.h,
    the lib dir of the libnccl.so.2 to link, whether it came from
    NCCL_HOME). Each build uses exactly its NCCL_HEADERS release (from the
    installed wheel if that is the pinned release, else the cache, filled
    once per machine), unless SYMNCCL_NCCL_INCLUDE_2_<minor> gives its
    headers, or NCCL_HOME holds a release of its minor (NCCL_HOME of
    another minor only gives the library to link)."""
    wanted = [int(m) for m in re.split(r"[;, ]+",
                                        os.environ.get("SYMNCCL_NCCL_MINORS",
                                                       ""))
              if m] or list(NCCL_MINORS)
    for minor in wanted:
        if minor not in NCCL_MINORS:
            _fail(f"SYMNCCL_NCCL_MINORS: there is no kernel build of NCCL "
                  f"2.{minor}'s headers (the builds: " +
                  ", ".join(f"2.{m}" for m in NCCL_MINORS) + "; NCCL_HEADERS)")
    home = os.environ.get("NCCL_HOME")
    if home is not None and (_headers_minor(os.path.join(home, "include"))
                             or 0) < NCCL_MINORS[0]:
        _fail(f"NCCL_HOME={home}: {home}/include has no nccl.h/"
              f"nccl_device.h of NCCL 2.{NCCL_MINORS[0]} or newer (the "
              "device API needs 2.28 or newer)")
    wheel = _nccl_from_wheel()
    cache = os.environ.get("SYMNCCL_NCCL_CACHE") or cache_dir("nccl")
    fetch = os.environ.get("SYMNCCL_NCCL_FETCH", "1") != "0"
    builds, roots = {}, {}   # minor -> include dir; minor -> (include, lib)
    for minor in wanted:
        pin = _pinned(minor)
        given = os.environ.get(f"SYMNCCL_NCCL_INCLUDE_2_{minor}")
        cached = os.path.join(cache, f"2.{minor}", "nvidia", "nccl")
        if given:
            got = _headers_version(given)
            if got is None or got[:2] != (2, minor):
                _fail(f"SYMNCCL_NCCL_INCLUDE_2_{minor}={given} holds no NCCL "
                      f"2.{minor} nccl.h/nccl_device.h")
            if got != pin:
                say(f"WARNING: NCCL 2.{minor} kernels built against "
                    f"{'.'.join(map(str, got))} headers (not the pinned "
                    f"{NCCL_HEADERS[minor]}): load NCCL "
                    f"{'.'.join(map(str, got))} or newer")
            builds[minor] = given
            continue
        for root in (home, wheel, cached):
            if root is None:
                continue
            v = _headers_version(os.path.join(root, "include"))
            # NCCL_HOME's headers match its own library; a wheel's or the
            # cache's are used only if they are the pinned release
            if v and v[:2] == (2, minor) and (root == home or v == pin):
                builds[minor] = os.path.join(root, "include")
                roots[minor] = root
                break
        if minor in builds or not fetch:
            continue
        if _fetch_wheel(NCCL_HEADERS[minor], os.path.join(cache,
                                                          f"2.{minor}")) \
                and _headers_version(os.path.join(cached, "include")) == pin:
            builds[minor] = os.path.join(cached, "include")
            roots[minor] = cached
    missing = [m for m in wanted if m not in builds]
    if missing:
        say("WARNING: no kernel build of NCCL " +
            ", ".join(NCCL_HEADERS[m] for m in missing) + "'s headers: "
            "importing with an NCCL only it serves will fail (set "
            "SYMNCCL_NCCL_INCLUDE_2_<minor>, or allow the download: "
            "SYMNCCL_NCCL_FETCH=1)")
    if not builds:
        _fail("no NCCL headers to build the kernels against")
    for minor in sorted(builds):
        say(f"NCCL 2.{minor} kernels: headers {builds[minor]}")
    # the host code's nccl.h and the libnccl.so.2 to link (its soname is
    # what counts: the library is chosen at run time, csrc/runtime/abi.c):
    # NCCL_HOME's, else the lowest minor's with a library at hand
    libroot = home or next(
        (roots[m] for m in sorted(roots)
         if os.path.exists(os.path.join(roots[m], "lib", "libnccl.so.2"))),
        wheel)
    if libroot is None or not os.path.exists(
            os.path.join(libroot, "lib", "libnccl.so.2")):
        _fail("no libnccl.so.2 to link: install the NCCL wheel "
              f"(pip install 'nvidia-nccl-cu13=={NCCL_HEADERS[min(wanted)]}')"
              ", allow its download (SYMNCCL_NCCL_FETCH=1) or set NCCL_HOME")
    inc = os.path.join(libroot, "include")
    if _headers_minor(inc) not in NCCL_MINORS:
        inc = builds[min(builds)]
    return builds, inc, os.path.join(libroot, "lib"), home is not None


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


def _tree_digest(paths):
    """sha256 over the names and contents of files (directories walked)."""
    h = hashlib.sha256()
    files = []   # (name in the digest: relative to a walked directory, path)
    for p in paths:
        if os.path.isdir(p):
            for d, _, names in os.walk(p):
                files += [(os.path.relpath(os.path.join(d, n), p),
                           os.path.join(d, n)) for n in names]
        else:
            files.append((p, p))
    for name, f in sorted(files):
        h.update(name.encode() + b"\0")
        with open(f, "rb") as fh:
            h.update(fh.read())
    return h.hexdigest()


class ObjectCache:
    """Kernel objects by content key (nvcc's version, the command line but
    its output path, the source, every kernel header and the NCCL include
    tree), in <cache>/objects: pip builds in a fresh temporary directory
    each time, so only this makes a rebuild recompile what changed.
    Bounded by SYMNCCL_OBJECT_CACHE_MIB (least recently used go first)."""

    def __init__(self):
        self.limit = int(os.environ.get("SYMNCCL_OBJECT_CACHE_MIB",
                                        "2048")) << 20
        self.dir = cache_dir("objects")

    def path(self, key):
        return os.path.join(self.dir, key + ".o") if self.limit > 0 else None

    def get(self, key, obj):
        p = self.path(key)
        if p is None or not os.path.exists(p):
            return False
        shutil.copyfile(p, obj)
        os.utime(p)   # recently used
        return True

    def put(self, key, obj):
        p = self.path(key)
        if p is None:
            return
        try:
            os.makedirs(self.dir, exist_ok=True)
            tmp = f"{p}.{os.getpid()}.tmp"   # builds may run at once
            shutil.copyfile(obj, tmp)
            os.replace(tmp, p)
        except OSError as e:
            say(f"WARNING: object cache {self.dir} not writable: {e}")

    def prune(self):
        if self.limit <= 0 or not os.path.isdir(self.dir):
            return
        objs = [os.path.join(self.dir, f) for f in os.listdir(self.dir)
                if f.endswith(".o")]
        objs.sort(key=os.path.getmtime, reverse=True)
        total = 0
        for p in objs:
            total += os.path.getsize(p)
            if total > self.limit:
                os.remove(p)


def compile_kernels(nvcc, builds, objdir, force):
    """Compiles every minor's kernel objects in parallel, then joins each
    minor's into one object whose only global symbol is its table,
    symnccl_kernels_2_<minor> (so the builds' identically named C++
    symbols never meet); returns those objects."""
    kdir = os.path.join("csrc", "kernels")
    headers = sorted(glob.glob(os.path.join(kdir, "*.h")) +
                     glob.glob(os.path.join(kdir, "*.cuh")))
    jobs = [(minor,) + job for minor in sorted(builds)
            for job in kernel_jobs(objdir, minor)]
    cores = os.cpu_count() or 1
    njobs = int(os.environ.get("SYMNCCL_BUILD_JOBS", cores))
    njobs = max(1, min(njobs, len(jobs)))
    archs = len(cuda_archs())
    # nvcc --threads compiles a unit's architectures in parallel: use what
    # the parallel jobs leave of the cores
    threads = max(1, min(archs, cores // njobs))
    version = subprocess.run([nvcc, "--version"], capture_output=True,
                             text=True).stdout
    common = _tree_digest(headers)
    nccl = {m: _tree_digest([builds[m]]) for m in builds}
    cache = ObjectCache()
    say(f"plan: kernels for NCCL " +
        ", ".join(f"2.{m}" for m in sorted(builds)) +
        f", sm {';'.join(cuda_archs())}, {len(jobs)} objects, {njobs} nvcc "
        f"jobs x {threads} threads; object cache "
        f"{cache.dir if cache.limit else 'off'}")
    todo, reused = [], 0
    for minor, src, obj, extra in jobs:
        os.makedirs(os.path.dirname(obj), exist_ok=True)
        cmd = [nvcc, "-c", src, "-o", obj, "-O3", "-std=c++17",
               "-Xcompiler", "-fPIC", "--expt-relaxed-constexpr",
               "-Xptxas", "-warn-spills",
               # fatbin compressed for size: 19% smaller than
               # -Xfatbin=-compress-all (docs/BUILD.md, 'Size')
               "--compress-mode=size",
               f"--threads={threads}", f"-I{builds[minor]}", "-Icsrc"] + \
            extra + gencode_flags()
        h = hashlib.sha256()
        # the NCCL include dir by its contents, not its path (the same
        # release may sit in a wheel or in the cache)
        line = " ".join("<obj>" if c == obj else
                        "-I<nccl>" if c == f"-I{builds[minor]}" else c
                        for c in cmd)
        for part in (version, line, common, nccl[minor], _tree_digest([src])):
            h.update(part.encode() + b"\0")
        key = h.hexdigest()
        if not force and os.path.exists(obj) and os.path.exists(
                obj + ".cmd") and open(obj + ".cmd").read() == key:
            continue
        if not force and cache.get(key, obj):
            _stamp(obj, key)
            reused += 1
            continue
        todo.append((obj, cmd, key))
    say(f"{len(jobs) - len(todo) - reused} kernel objects up to date, "
        f"{reused} from the object cache, {len(todo)} to compile")
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
            say(f"[{done}/{len(todo)}] {name} {secs:.0f} s{note}")
            if r.returncode != 0:
                failed.append((cmd, r.stdout + r.stderr))
            else:
                _stamp(obj, key)
                cache.put(key, obj)
    for cmd, out in failed:
        print(" ".join(cmd) + "\n" + out, file=sys.stderr)
    if failed:
        _fail(f"{len(failed)} kernel object(s) failed to compile")
    if todo:
        say(f"kernels compiled in {time.monotonic() - t0:.0f} s")
    cache.prune()
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
        # csrc/methods.py's table -> csrc/methods.h and _C.pyi's method
        # stubs (files written only when they change)
        gen = os.path.join(HERE, "csrc", "methods.py")
        if os.path.exists(gen):
            subprocess.check_call([sys.executable, gen])
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
            glob.glob(os.path.join("csrc", "xla", "*.h")) + \
            glob.glob(os.path.join("csrc", "kernels", "launch.h"))
        for ext in self.extensions:
            ext.extra_objects = objects + list(ext.extra_objects or [])
            # relink when a kernel object or a header is newer than the
            # library (setuptools looks only at the .c sources otherwise)
            ext.depends = list(ext.depends or []) + objects + headers
            self.check_runtime_without_python(ext)
        super().build_extensions()

    def check_runtime_without_python(self, ext):
        """No Python API on XLA's threads: csrc/runtime/ and csrc/xla/
        compile (syntax only) with the extension's flags but without
        Python's include directory, so neither can reach Python.h."""
        cc = self.compiler.compiler_so[0]
        flags = [f"-D{k}={v}" if v is not None else f"-D{k}"
                 for k, v in ext.define_macros] + \
            [f"-I{d}" for d in ext.include_dirs] + \
            [a for a in ext.extra_compile_args if not a.startswith("-O")]
        for src in ext.sources:
            if os.path.basename(os.path.dirname(src)) not in ("runtime",
                                                              "xla"):
                continue
            r = subprocess.run([cc, "-fsyntax-only", *flags, src],
                               capture_output=True, text=True)
            if r.returncode:
                _fail(f"{src} must compile without Python.h (runtime/ and "
                      f"xla/ run on XLA's threads without the GIL):\n"
                      + r.stderr[-2000:])


def _sources():
    """The C sources (csrc/runtime/, csrc/python/, csrc/xla/); a tree (or
    sdist) without them cannot build."""
    sources = sorted(p for d in ("runtime", "python", "xla")
                     for p in glob.glob(os.path.join("csrc", d, "*.c")))
    need = [os.path.join("csrc", "symnccl.h"),
            os.path.join("csrc", "runtime.h"),
            os.path.join("csrc", "kernels", "launch.h"),
            os.path.join("csrc", "kernels", "unit.cu")]
    missing = [p for p in need if not os.path.exists(p)]
    if not sources or missing:
        _fail("the C/CUDA sources are missing from this tree (" +
              ", ".join(missing or ["csrc/*/*.c"]) + "): build from a git "
              "checkout or a complete sdist")
    return sources


def make_extension():
    nvcc, cuda_inc, cuda_lib = CUDA
    _, nccl_inc, nccl_lib, nccl_home = NCCL
    macros = [("Py_LIMITED_API", "0x030B0000")]
    # the XLA FFI handlers need no jaxlib here: csrc/xla/xla_ffi_abi.h
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
