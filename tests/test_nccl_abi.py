"""CPU tier: the NCCL device API's layout that symnccl's kernels rely on,
per kernel build (setup.py NCCL_HEADERS) and per NCCL a build runs on, and
the import's choice of build and version check (csrc/runtime/nccl_policy.c).

The kernels take ncclDevComm by value and read lsaSize, lsaRank and
lsaMultimem (kernels/devcomm.cu), NCCL 2.30's magic and version
(snk_devcomm_info), fill ncclDevCommRequirements (lsaBarrierCount,
lsaMultimem, through the initializer of 2.29+) and, for loopback teams,
ncclWindow_vidmem (lsaFlatBase, lsaRank, worldRank, stride4G). Those
offsets are compiled here against each minor's headers and compared with
the values recorded below, so that headers whose layout moved fail a test
before a build runs on them. Headers are found as setup.py finds them
(SYMNCCL_NCCL_INCLUDE_2_<minor>, the installed wheel's for its own minor,
else setup.py's cache); a minor without headers here is skipped."""
import os
import re
import shutil
import subprocess
import sys

import pytest

# Per minor: the headers' NCCL_VERSION_CODE (setup.py pins the builds'
# releases; 2.30.7, 2.31.2 and 2.32.3 are the libraries the 2.29.7 build
# runs on through NCCL's conversion, recorded to show what it converts
# between) and the layout of every field the code relies on. From 2.31 on
# lsaMultimem moved (2.31's inlined resource window shrank): a 2.29.7
# device communicator read with 2.31 offsets would be wrong, which is why
# NCCL converts it (ncclDevCommCompat_v22907, docs/BUILD.md).
EXPECTED = {
    28: {
        "NCCL_VERSION_CODE": 22809,
        "sizeof(ncclDevComm)": 200,
        "ncclDevComm.rank": 0, "ncclDevComm.nRanks": 4,
        "ncclDevComm.lsaRank": 12, "ncclDevComm.lsaSize": 16,
        "ncclDevComm.lsaMultimem": 112,
        "ncclMultimemHandle.mcBasePtr": 0,
        "sizeof(ncclDevCommRequirements)": 56,
        "ncclDevCommRequirements.lsaMultimem": 16,
        "ncclDevCommRequirements.lsaBarrierCount": 24,
        "ncclWindow_vidmem.lsaFlatBase": 8, "ncclWindow_vidmem.lsaRank": 16,
        "ncclWindow_vidmem.worldRank": 20, "ncclWindow_vidmem.stride4G": 24,
    },
    29: {
        "NCCL_VERSION_CODE": 22907,
        "sizeof(ncclDevComm)": 224,
        "ncclDevComm.rank": 0, "ncclDevComm.nRanks": 4,
        "ncclDevComm.lsaRank": 12, "ncclDevComm.lsaSize": 16,
        "ncclDevComm.lsaMultimem": 112,
        "ncclMultimemHandle.mcBasePtr": 0,
        "sizeof(ncclDevCommRequirements)": 88,
        "ncclDevCommRequirements.lsaMultimem": 32,
        "ncclDevCommRequirements.lsaBarrierCount": 40,
        "ncclDevCommRequirements.size": 0,
        "ncclDevCommRequirements.magic": 8,
        "ncclDevCommRequirements.version": 12,
        "initializer.size": 88, "initializer.magic": 0xcafebeef,
        "initializer.version": 22907,
        "ncclWindow_vidmem.lsaFlatBase": 8, "ncclWindow_vidmem.lsaRank": 16,
        "ncclWindow_vidmem.worldRank": 20, "ncclWindow_vidmem.stride4G": 24,
    },
    30: {
        "NCCL_VERSION_CODE": 23007,
        "sizeof(ncclDevComm)": 240,
        "ncclDevComm.magic": 0, "ncclDevComm.version": 4,
        "ncclDevComm.rank": 8, "ncclDevComm.nRanks": 12,
        "ncclDevComm.lsaRank": 20, "ncclDevComm.lsaSize": 24,
        "ncclDevComm.lsaMultimem": 120,
        "ncclMultimemHandle.mcBasePtr": 0,
        "sizeof(ncclDevCommRequirements)": 96,
        "ncclDevCommRequirements.lsaMultimem": 32,
        "ncclDevCommRequirements.lsaBarrierCount": 40,
        "ncclDevCommRequirements.size": 0,
        "ncclDevCommRequirements.magic": 8,
        "ncclDevCommRequirements.version": 12,
        "initializer.size": 96, "initializer.magic": 0xcafebeef,
        "initializer.version": 23007,
        "ncclWindow_vidmem.lsaFlatBase": 8, "ncclWindow_vidmem.lsaRank": 16,
        "ncclWindow_vidmem.worldRank": 20, "ncclWindow_vidmem.stride4G": 24,
    },
    31: {
        "NCCL_VERSION_CODE": 23102,
        "sizeof(ncclDevComm)": 248,
        "ncclDevComm.magic": 0, "ncclDevComm.version": 4,
        "ncclDevComm.rank": 8, "ncclDevComm.nRanks": 12,
        "ncclDevComm.lsaRank": 20, "ncclDevComm.lsaSize": 24,
        "ncclDevComm.lsaMultimem": 72,
        "ncclMultimemHandle.mcBasePtr": 0,
        "sizeof(ncclDevCommRequirements)": 120,
        "ncclDevCommRequirements.lsaMultimem": 32,
        "ncclDevCommRequirements.lsaBarrierCount": 40,
        "ncclDevCommRequirements.size": 0,
        "ncclDevCommRequirements.magic": 8,
        "ncclDevCommRequirements.version": 12,
        "initializer.size": 120, "initializer.magic": 0xcafebeef,
        "initializer.version": 23102,
        "ncclWindow_vidmem.lsaFlatBase": 8, "ncclWindow_vidmem.lsaRank": 16,
        "ncclWindow_vidmem.worldRank": 20, "ncclWindow_vidmem.stride4G": 24,
    },
}
# 2.32.3: 2.31.2's layout (NCCL converts between them as one version)
EXPECTED[32] = dict(EXPECTED[31], **{"NCCL_VERSION_CODE": 23203,
                                    "initializer.version": 23203})

# Prints "name value" for every entry of EXPECTED its headers have.
PROBE = r"""
#include <cstddef>
#include <cstdio>
#include <nccl.h>
#include <nccl_device.h>
#define OFF(T, f) std::printf("%s.%s %zu\n", #T, #f, offsetof(T, f))
#define SIZE(T) std::printf("sizeof(%s) %zu\n", #T, sizeof(T))
int main() {
  std::printf("NCCL_VERSION_CODE %d\n", NCCL_VERSION_CODE);
  SIZE(ncclDevComm);
  OFF(ncclDevComm, rank);
  OFF(ncclDevComm, nRanks);
  OFF(ncclDevComm, lsaRank);
  OFF(ncclDevComm, lsaSize);
  OFF(ncclDevComm, lsaMultimem);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 30, 0)
  OFF(ncclDevComm, magic);
  OFF(ncclDevComm, version);
#endif
  OFF(ncclMultimemHandle, mcBasePtr);
  SIZE(ncclDevCommRequirements);
  OFF(ncclDevCommRequirements, lsaMultimem);
  OFF(ncclDevCommRequirements, lsaBarrierCount);
#ifdef NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER
  OFF(ncclDevCommRequirements, size);
  OFF(ncclDevCommRequirements, magic);
  OFF(ncclDevCommRequirements, version);
  ncclDevCommRequirements r = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
  std::printf("initializer.size %zu\n", (size_t)r.size);
  std::printf("initializer.magic %u\n", r.magic);
  std::printf("initializer.version %u\n", r.version);
#endif
  OFF(ncclWindow_vidmem, lsaFlatBase);
  OFF(ncclWindow_vidmem, lsaRank);
  OFF(ncclWindow_vidmem, worldRank);
  OFF(ncclWindow_vidmem, stride4G);
  return 0;
}
"""


def _headers_minor(inc):
    try:
        text = open(os.path.join(inc, "nccl.h")).read()
    except OSError:
        return None
    m = re.search(r"#define NCCL_MINOR (\d+)", text)
    ok = os.path.exists(os.path.join(inc, "nccl_device.h"))
    return int(m.group(1)) if m and ok else None


def _include(minor):
    """That minor's include/ as setup.py finds it, or None."""
    env = os.environ.get(f"SYMNCCL_NCCL_INCLUDE_2_{minor}")
    cands = [env] if env else []
    try:
        import nvidia.nccl as m
        cands += [os.path.join(p, "include") for p in m.__path__]
    except ImportError:
        pass
    cache = os.environ.get("SYMNCCL_NCCL_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "symnccl", "nccl")
    cands.append(os.path.join(cache, f"2.{minor}", "nvidia", "nccl",
                              "include"))
    for c in cands:
        if c and _headers_minor(c) == minor:
            return c
    return None


def _nvcc():
    nvcc = os.environ.get("NVCC") or shutil.which("nvcc")
    if nvcc is None and os.path.exists("/usr/local/cuda/bin/nvcc"):
        nvcc = "/usr/local/cuda/bin/nvcc"
    return nvcc


def _layout(minor, tmp_path):
    inc = _include(minor)
    if inc is None:
        pytest.skip(f"no NCCL 2.{minor} headers here (set "
                    f"SYMNCCL_NCCL_INCLUDE_2_{minor}, or build once to "
                    f"fill setup.py's cache)")
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found: the device API headers need it")
    src = tmp_path / "probe.cu"
    src.write_text(PROBE)
    exe = tmp_path / "probe"
    subprocess.run([nvcc, "-std=c++17", f"-I{inc}", str(src), "-o",
                    str(exe)], check=True, capture_output=True, timeout=300)
    out = subprocess.run([str(exe)], check=True, capture_output=True,
                         text=True, timeout=60).stdout
    return {k: int(v) for k, v in
            (line.rsplit(" ", 1) for line in out.splitlines())}


@pytest.mark.parametrize("minor", sorted(EXPECTED))
def test_device_api_layout_matches_the_recorded_one(minor, tmp_path):
    """Every field the kernels and devcomm.cu rely on sits where it sat
    when the code was checked against these headers, and the headers are
    the patch setup.py pins."""
    got = _layout(minor, tmp_path)
    want = EXPECTED[minor]
    assert got == want, {k: (got.get(k), want.get(k))
                         for k in set(got) | set(want)
                         if got.get(k) != want.get(k)}


@pytest.mark.parametrize("minor", [m for m in sorted(EXPECTED) if m >= 29])
def test_requirements_initializer_carries_the_headers_version(minor,
                                                              tmp_path):
    """NCCL 2.29+ reads the version of the headers from the requirements
    (NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER) and refuses an older library;
    2.30 copies it into ncclDevComm.version, which snk_devcomm_info
    compares with NCCL_VERSION_CODE."""
    got = _layout(minor, tmp_path)
    assert got["initializer.version"] == got["NCCL_VERSION_CODE"]
    assert got["initializer.magic"] == 0xcafebeef   # SN_NCCL_API_MAGIC
    assert got["initializer.size"] == got["sizeof(ncclDevCommRequirements)"]


# ------------------------------------------------------ the import's check

def _C():
    return pytest.importorskip("symnccl._C")


def _pkg(C):
    return f"nvidia-nccl-cu{C.CUDA_BUILD_VERSION // 1000}"


# What each library runs, written down from NCCL's compatibility tables
# (docs/BUILD.md, 'NCCL headers'): the 2.28.9 build on 2.28 only (its
# device communicator carries no version), the 2.29.7 build on 2.29.7 and,
# through ncclDevCommCompat_v22907, on 2.30.7 to 2.32.x.
B28, B29 = 22809, 22907
BUILDS = (B28, B29)


def test_a_library_older_than_the_headers_is_refused_naming_both():
    C = _C()
    msg = C._nccl_version_verdict(22903, B29)
    assert msg is not None
    assert "2.29.3" in msg and "2.29.7" in msg and "older" in msg, msg
    assert f"pip install '{_pkg(C)}>=2.29.7,<2.30'" in msg, msg


@pytest.mark.parametrize("runtime,headers", [
    (B29, B29), (22909, B29), (B28, B28), (22812, B28),
    (23007, B29), (23099, B29), (23102, B29), (23203, B29),   # v22907
    (23102, 23007), (23203, 23007),                            # v23000
    (23203, 23102)])                                           # v23100
def test_a_library_of_the_build_s_minor_or_carrying_a_conversion_is_accepted(
        runtime, headers):
    assert _C()._nccl_version_verdict(runtime, headers) is None


@pytest.mark.parametrize("runtime,headers", [
    (22907, B28),      # 2.29 takes no unversioned (2.28) device communicator
    (23203, B28),
    (23006, B29),      # no 2.30 before 2.30.7 was read for its conversion
    (23300, B29),      # past the newest minor checked
    (32907, B29),
    (23007, 23102)])   # older than the headers, of another minor
def test_a_library_without_a_conversion_is_refused_with_the_range_to_install(
        runtime, headers):
    C = _C()
    msg = C._nccl_version_verdict(runtime, headers)
    v = "%d.%d.%d" % (runtime // 10000, runtime % 10000 // 100, runtime % 100)
    assert msg is not None and f"NCCL {v}" in msg, msg
    assert f"'{_pkg(C)}>=" in msg, msg


@pytest.mark.parametrize("runtime,build", [
    (22809, 0), (22812, 0), (22907, 1), (23007, 1), (23102, 1), (23203, 1)])
def test_import_picks_the_build_that_runs_on_the_library(runtime, build):
    assert _C()._nccl_pick_build(runtime, BUILDS) == build


def test_import_picks_the_newest_build_that_runs_on_the_library():
    """With a 2.30.7 build as well, 2.30.7 to 2.32 run it, 2.29 keeps the
    2.29.7 build (2.29 is older than the 2.30.7 headers)."""
    C = _C()
    assert C._nccl_pick_build(23203, (B28, B29, 23007)) == 2
    assert C._nccl_pick_build(23007, (B29, 23007, B28)) == 1
    assert C._nccl_pick_build(22907, (B28, B29, 23007)) == 1


@pytest.mark.parametrize("runtime,words", [
    (22903, ("2.29.3", "older than the NCCL 2.29.7 headers",
             ">=2.29.7,<2.30'")),
    # a library in the gap of 2.30 patches without the conversion read: the
    # ranges say so, and -U moves pip off it
    (23005, ("2.30.5", "2.29.7 to 2.29.x, 2.30.7 to 2.32.x",
             "pip install -U 'nvidia-nccl-cu")),
    (23300, ("2.33.0", "2.29.7 to 2.29.x, 2.30.7 to 2.32.x", ",<2.33'")),
    (22710, ("2.27.10", "2.30.7 to 2.32.x"))])
def test_no_build_for_the_library_is_the_import_error_s_message(runtime,
                                                                words):
    msg = _C()._nccl_pick_build(runtime, BUILDS)
    assert isinstance(msg, str), msg
    for w in words:
        assert w in msg, msg


def test_support_tables_are_exported_for_the_docs():
    C = _C()
    conv = C.NCCL_SUPPORT["conversions"]
    assert {"headers": ("2.29.5", "2.29.7"),
            "libraries": ("2.30.7", f"2.{C.NCCL_NEWEST_MINOR}.99")} in [
        {k: r[k] for k in ("headers", "libraries")} for r in conv]
    proven = {(r["library"], r["headers"]) for r in
              C.NCCL_SUPPORT["proven"]}
    assert ("2.28.9", "2.28.9") in proven and ("2.29.7", "2.29.7") in proven


def test_each_build_records_headers_of_its_minor_and_the_one_in_use_runs():
    """The import went through, so the build in use may run on the loaded
    library (else ImportError)."""
    C = _C()
    heads = C.NCCL_DEVICE_API_HEADERS
    assert sorted(heads) == sorted(m for _, m in C.NCCL_DEVICE_API_BUILDS)
    for minor, code in heads.items():
        assert code // 10000 == 2 and code % 10000 // 100 == minor, heads
    run = C.nccl_runtime_version()
    used = heads[C.nccl_device_api()[1]]
    assert C._nccl_version_verdict(run, used) is None, (run, used)
    assert run >= used


def test_headers_recorded_here_are_those_setup_py_builds():
    """EXPECTED's patches match the build's (when it holds that minor)."""
    C = _C()
    for minor, code in C.NCCL_DEVICE_API_HEADERS.items():
        if minor in EXPECTED:
            assert code == EXPECTED[minor]["NCCL_VERSION_CODE"], \
                (minor, code)



# --------------------------------------------- the device API, in use

@pytest.mark.gpu
def test_device_api_reason_is_none_where_the_kernels_run(uid):
    """A communicator on which symnccl's kernels run says so with None;
    one that runs without them says why (never a silent downgrade)."""
    import symnccl
    with symnccl.Communicator(uid, 0, 1, device=0) as c:
        if c.symmetric:
            assert c.device_api_reason is None
        else:
            assert isinstance(c.device_api_reason, str) and \
                c.device_api_reason, c.symmetric_reason
    team = symnccl.Communicator._loopback(4, 0)
    try:
        assert [c.device_api_reason for c in team] == [None] * 4
        assert [(c.lsa_rank, c.lsa_size) for c in team] == \
            [(q, 4) for q in range(4)]
    finally:
        for c in team:
            c.close()


SHIM = r"""
/* ncclGetVersion of a library older than the build's headers: preloaded,
 * it answers for the real libnccl (symbol interposition). */
int ncclGetVersion(int *version) { *version = SHIM_VERSION; return 0; }
"""


def _import_with_version(tmp_path, code):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the version shim")
    shim = tmp_path / "libshim.so"
    src = tmp_path / "shim.c"
    src.write_text(SHIM.replace("SHIM_VERSION", str(code)))
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(shim), str(src)],
                   check=True, capture_output=True, timeout=120)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, LD_PRELOAD=str(shim), PYTHONPATH=root)
    return subprocess.run([sys.executable, "-c", "import symnccl"], env=env,
                          capture_output=True, text=True, timeout=120)


def test_import_refuses_a_library_older_than_its_build_s_headers(tmp_path):
    """The whole path: `import symnccl` beside a libnccl that reports an
    older patch of a built minor than that build's headers fails with
    ImportError naming both versions and what to install."""
    C = _C()
    minor, headers = max(C.NCCL_DEVICE_API_HEADERS.items())
    if headers % 100 == 0:
        pytest.skip(f"the 2.{minor} build's headers are patch 0")
    older = headers - 1
    r = _import_with_version(tmp_path, older)
    assert r.returncode != 0, r.stdout
    v = f"2.{minor}.{older % 100}", f"2.{minor}.{headers % 100}"
    assert "ImportError" in r.stderr, r.stderr[-2000:]
    assert v[0] in r.stderr and v[1] in r.stderr, r.stderr[-2000:]
    assert f"'{_pkg(C)}>={v[1]},<2.{minor + 1}'" in r.stderr, \
        r.stderr[-2000:]


def test_import_refuses_a_library_newer_than_any_checked(tmp_path):
    """NCCL 2.33 has not been read for its conversions: the import fails
    naming it and the range to install, rather than run kernels whose
    device communicator that library may lay out otherwise."""
    C = _C()
    newer = 2 * 10000 + (C.NCCL_NEWEST_MINOR + 1) * 100
    r = _import_with_version(tmp_path, newer)
    assert r.returncode != 0, r.stdout
    assert "ImportError" in r.stderr, r.stderr[-2000:]
    assert f"NCCL 2.{C.NCCL_NEWEST_MINOR + 1}.0" in r.stderr, \
        r.stderr[-2000:]
    assert f",<2.{C.NCCL_NEWEST_MINOR + 1}'" in r.stderr, r.stderr[-2000:]
