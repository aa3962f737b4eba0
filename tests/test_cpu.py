"""CPU tier: runs everywhere, no GPU or driver needed."""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import symnccl
from symnccl import _C, _check, _loader
from symnccl.bootstrap import local_device_count, spawn
# the order symnccl.h's header comment declares
from layering import LAYERS


def test_loaded_nccl_is_the_wheel_or_nccl_home():
    path = _loader.loaded_nccl_path()
    assert path is not None
    home = os.environ.get("NCCL_HOME")
    assert "nvidia/nccl/lib" in path or (home and path.startswith(home))


def test_version_tuple_decodes_nccl_version_codes():
    assert _loader.version_tuple(22809) == (2, 28, 9)
    assert _loader.version_tuple(22903) == (2, 29, 3)
    assert _loader.version_tuple(2708) == (2, 7, 8)


def test_kernels_are_built_for_every_nccl_release_the_build_was_asked_for():
    """One build per release of setup.py's NCCL_HEADERS (or of the
    SYMNCCL_NCCL_MINORS the build was given, a GPU machine's one-build
    developer build; pyproject's range: tests/test_build.py), each against
    that release's headers; the one in use is the newest that may run on
    the loaded library (csrc/runtime/nccl_policy.c)."""
    import re
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, root)
    try:
        import setup
    finally:
        sys.path.pop(0)
    asked = os.environ.get("SYMNCCL_NCCL_MINORS")
    minors = (tuple(sorted(int(m) for m in re.split(r"[,; ]+", asked) if m))
              if asked else tuple(setup.NCCL_MINORS))
    assert set(minors) <= set(setup.NCCL_MINORS), minors
    assert _C.NCCL_DEVICE_API_BUILDS == tuple((2, m) for m in minors)
    heads = _C.NCCL_DEVICE_API_HEADERS
    runtime = _C.nccl_runtime_version()
    codes = tuple(heads[m] for m in minors)
    pick = _C._nccl_pick_build(runtime, codes)
    assert _C.nccl_device_api() == (2, minors[pick])
    v = symnccl.versions()
    assert v["nccl_kernels"] == ".".join(
        map(str, _loader.version_tuple(codes[pick])))
    assert v["nccl_kernel_builds"] == ", ".join(
        ".".join(map(str, _loader.version_tuple(c))) for c in codes)


def _cached_nccl(minor):
    root = os.environ.get("SYMNCCL_NCCL_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "symnccl", "nccl")
    home = os.path.join(root, f"2.{minor}", "nvidia", "nccl")
    lib = os.path.join(home, "lib", "libnccl.so.2")
    return home if os.path.exists(lib) else None


@pytest.mark.parametrize("minor", [28, 29, 30, 31, 32])
def test_import_with_each_supported_nccl_uses_the_build_that_runs_on_it(
        minor):
    """With each NCCL at hand loaded (this process's, or one in the build
    cache: setup.py's downloads, or any a developer unpacked there),
    import picks the newest build that may run on it: the 2.28.9 build on
    2.28, the 2.29.7 build on 2.29 to 2.32."""
    own = tuple(int(x) for x in
                symnccl.versions()["nccl_runtime"].split(".")[:2])
    home = None if own == (2, minor) else _cached_nccl(minor)
    if own != (2, minor) and home is None:
        pytest.skip(f"no NCCL 2.{minor} library here (loaded, or in the "
                    "build cache)")
    want = 28 if minor == 28 else 29
    if (2, want) not in _C.NCCL_DEVICE_API_BUILDS:
        pytest.skip(f"this build has no 2.{want} kernels "
                    "(SYMNCCL_NCCL_MINORS)")
    env = dict(os.environ)
    if home is not None:
        env["NCCL_HOME"] = home
    r = subprocess.run([sys.executable, "-c",
                        "import symnccl, symnccl._C as C; "
                        "print(C.nccl_device_api(), "
                        "symnccl.versions()['nccl_runtime'], "
                        "len(symnccl.get_unique_id()))"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith(f"(2, {want}) 2.{minor}.") and \
        r.stdout.strip().endswith(" 128"), r.stdout


def test_unique_id_is_128_fresh_bytes():
    a, b = symnccl.get_unique_id(), symnccl.get_unique_id()
    assert isinstance(a, bytes) and len(a) == 128 and a != b


@pytest.mark.parametrize("requested", [False, True, None])
def test_multicast_never_requested_when_nvls_disabled(requested):
    req, why = _C._multicast_gate(requested, "0", None, None)
    assert req is False and "NCCL_NVLS_ENABLE=0" in why


@pytest.mark.parametrize("requested", [True, None])
@pytest.mark.parametrize("value", ["1", "true", "yes"])
def test_multicast_never_requested_when_torch_disables_it(value, requested):
    req, why = _C._multicast_gate(requested, None, value, None)
    assert req is False and "TORCH_SYMM_MEM_DISABLE_MULTICAST" in why


@pytest.mark.parametrize("requested", [True, None])
def test_multicast_never_requested_when_nvshmem_disables_nvls(requested):
    req, why = _C._multicast_gate(requested, None, None, "1")
    assert req is False and "NVSHMEM_DISABLE_NVLS" in why


def test_multicast_requested_on_opt_in_or_auto_never_when_off():
    assert _C._multicast_gate(False, None, None, None) == (
        False, "not requested (multicast=False)")
    assert _C._multicast_gate(True, None, None, None) == (True, "requested")
    assert _C._multicast_gate(True, None, "0", "0") == (True, "requested")
    # auto (the default): asked for only where NCCL's own auto mode could
    # grant it, i.e. nothing disables it
    assert _C._multicast_gate(None, None, None, None) == (
        True, "requested (auto)")
    assert _C._multicast_gate(None, "1", "0", None) == (
        True, "requested (auto)")


def test_this_machine_never_requests_multicast_when_the_safety_variables_are_set():
    """On the lent GPU machines the safety variables are set: whatever the
    caller passes, the gate built from this process's environment says no."""
    import os
    env = (os.environ.get("NCCL_NVLS_ENABLE"),
           os.environ.get("TORCH_SYMM_MEM_DISABLE_MULTICAST"),
           os.environ.get("NVSHMEM_DISABLE_NVLS"))
    if env == (None, None, None):
        pytest.skip("none of the multicast safety variables is set here")
    for requested in (True, None, False):
        assert _C._multicast_gate(requested, *env)[0] is False


def test_communicator_rejects_a_short_unique_id():
    with pytest.raises(ValueError, match="128 bytes"):
        symnccl.Communicator(b"x" * 16, 0, 1, 0)


@pytest.mark.parametrize("rank,nranks", [(2, 2), (-1, 2), (0, 0)])
def test_communicator_rejects_rank_out_of_range(uid, rank, nranks):
    with pytest.raises(ValueError, match="out of range"):
        symnccl.Communicator(uid, rank, nranks, 0)


def test_communicator_rejects_bad_timeout(uid):
    with pytest.raises(ValueError, match="timeout"):
        symnccl.Communicator(uid, 0, 1, 0, timeout=0)


@pytest.mark.skipif(local_device_count() > 0, reason="a GPU is visible")
def test_communicator_without_gpu_raises_cuda_error(uid):
    with pytest.raises(symnccl.CudaError) as e:
        symnccl.Communicator(uid, 0, 1, 0)
    assert isinstance(e.value, RuntimeError) and e.value.code != 0


def test_error_types_are_runtime_errors():
    assert issubclass(symnccl.NcclError, RuntimeError)
    assert issubclass(symnccl.CudaError, RuntimeError)


def test_buffers_cannot_be_constructed_directly():
    with pytest.raises(TypeError, match="Communicator.empty"):
        symnccl.SymmetricBuffer()


@pytest.mark.parametrize("spec,name,bits", [
    ("bf16", "bfloat16", 16), ("float32", "float32", 32),
    (np.float16, "float16", 16), (np.dtype("int64"), "int64", 64),
    ("float8_e4m3fn", "float8_e4m3fn", 8), ("fp8_e5m2", "float8_e5m2", 8)])
def test_dtype_spellings(spec, name, bits):
    assert _C._dtype_info(spec)[0] == name and _C._dtype_info(spec)[2] == bits


def test_unsupported_dtype_names_it_and_the_supported_ones():
    with pytest.raises(TypeError, match="unsupported dtype complex64: "
                                        "expected one of float32, bfloat16"):
        _C._dtype_info("complex64")


# ---------------------------------------------------------------- DLPack in

def test_import_rejects_cpu_tensor_with_both_devices_named():
    with pytest.raises(ValueError, match="expected a CUDA tensor on cuda:0, "
                                         "got a CPU tensor"):
        _C._import_info(np.ones(4, np.float32), 0)


def test_import_rejects_objects_without_dlpack():
    with pytest.raises(TypeError, match="supports DLPack.*list"):
        _C._import_info([1.0, 2.0], 0)


def test_import_rejects_non_contiguous_with_strides_named():
    a = np.ones((4, 6), np.float32)[:, ::2]
    with pytest.raises(ValueError, match="not contiguous.*stride 2, "
                                         "expected 1"):
        _C._import_info(a, -1)


def test_import_rejects_unsupported_dtype():
    with pytest.raises(TypeError, match="unsupported dtype.*code 5"):
        _C._import_info(np.ones(3, np.complex64), -1)


def test_import_applies_byte_offset_and_reads_shape():
    base = np.arange(20, dtype=np.int32)
    info = _C._import_info(base[3:], -1)
    assert info["ptr"] == base.ctypes.data + 12
    assert info["shape"] == (17,) and info["count"] == 17
    assert info["dtype"] == "int32"


def test_import_accepts_versioned_capsules_and_reads_readonly_flag():
    a = np.ones(5, np.float64)
    a.flags.writeable = False
    info = _C._import_info(a, -1)
    assert info["versioned"] is True and info["readonly"] is True


class LegacyProducer:
    """A producer that predates max_version: TypeError on the keyword."""

    def __init__(self, arr):
        self.arr = arr

    def __dlpack__(self, stream=None):
        return self.arr.__dlpack__()

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


def test_import_falls_back_to_legacy_capsules():
    a = np.arange(6, dtype=np.uint8).reshape(2, 3)
    info = _C._import_info(LegacyProducer(a), -1)
    assert info["versioned"] is False and info["shape"] == (2, 3)


def test_import_releases_the_producer_reference():
    a = np.ones(8, np.float32)
    before = sys.getrefcount(a)
    for _ in range(50):
        _C._import_info(a, -1)
    assert sys.getrefcount(a) == before


# --------------------------------------------------------------- DLPack out

def test_export_is_zero_copy_and_round_trips():
    buf = _C._host_buffer((3, 5), "float32")
    view = np.from_dlpack(buf)
    view[:] = np.arange(15, dtype=np.float32).reshape(3, 5)
    assert view.shape == (3, 5) and view.dtype == np.float32
    back = np.frombuffer(buf.to_bytes(), np.float32).reshape(3, 5)
    np.testing.assert_array_equal(back, view)
    assert _C._import_info(buf, -1)["ptr"] == buf.ptr


def test_export_legacy_without_max_version():
    buf = _C._host_buffer(4, "int32")
    cap = buf.__dlpack__()
    assert "dltensor" in repr(cap) and "versioned" not in repr(cap)


def test_export_versioned_with_max_version():
    buf = _C._host_buffer(4, "int32")
    assert "dltensor_versioned" in repr(buf.__dlpack__(max_version=(1, 0)))


def test_export_rejects_copy_and_foreign_device():
    buf = _C._host_buffer(4, "int32")
    with pytest.raises(BufferError, match="copy=True"):
        buf.__dlpack__(copy=True)
    with pytest.raises(BufferError, match=r"dl_device \(2, 0\) requested"):
        buf.__dlpack__(dl_device=(2, 0))


def test_export_rejects_ambiguous_stream_zero():
    buf = _C._host_buffer(4, "int32")
    with pytest.raises(ValueError, match="stream=0 is ambiguous"):
        buf.__dlpack__(stream=0)


def test_unconsumed_capsule_releases_the_buffer():
    buf = _C._host_buffer(4, "int32")
    cap = buf.__dlpack__(max_version=(1, 0))
    assert buf._exports == 1
    del cap
    assert buf._exports == 0


@pytest.mark.parametrize("drop_buffer_first", [True, False])
def test_view_outlives_buffer_in_either_order(drop_buffer_first):
    buf = _C._host_buffer(1000, "float64")
    view = np.from_dlpack(buf)
    view[:] = 7.0
    if drop_buffer_first:
        del buf
        assert view.sum() == 7000.0
        del view
    else:
        del view
        assert buf._exports == 0
        del buf


def test_copy_from_host_checks_size():
    buf = _C._host_buffer(4, "float32")
    with pytest.raises(ValueError, match="source has 8 bytes, buffer has 16"):
        buf.copy_from_host(np.ones(2, np.float32))


# ------------------------------------------------------------- references

def test_count_wrong_catches_one_bad_element_and_nan():
    ins = [_check.make_input("bfloat16", 1000, r, 1) for r in range(4)]
    out = _check.reference("sum", ins, "bfloat16").astype(ins[0].dtype)
    assert _check.count_wrong(out, "sum", ins, "bfloat16") == 0
    bad = out.copy()
    bad[17] = bad[17] + np.float32(0.5)
    assert _check.count_wrong(bad, "sum", ins, "bfloat16") == 1
    poisoned = np.frombuffer(_check.poison(bad.nbytes).tobytes(), bad.dtype)
    assert _check.count_wrong(poisoned, "sum", ins, "bfloat16") == 1000


@pytest.mark.parametrize("dtype", symnccl.DTYPES)
def test_inputs_are_random_and_nonzero(dtype):
    a = _check.make_input(dtype, 4099, 0, 7)
    b = _check.make_input(dtype, 4099, 1, 7)
    assert np.count_nonzero(a.astype(np.float64)) > 3000
    assert not np.array_equal(a, b)


def test_integer_reference_wraps_like_the_hardware():
    ins = [np.array([100], np.int8), np.array([100], np.int8)]
    assert _check.count_wrong(np.array([-56], np.int8), "sum", ins,
                              "int8") == 0


# ------------------------------------------------------------- bootstrap

def _double(rank, nranks, uid, k):
    assert len(uid) == 128
    return rank * k


def _fail_on_one(rank, nranks, uid):
    if rank == 1:
        raise ValueError("planted failure")
    return rank


def _linger_on_one(rank, nranks, uid):
    """Rank 1 returns, then its process cannot end for a minute (a thread
    that is not a daemon), as a process stuck in its exit would."""
    if rank == 1:
        import threading
        threading.Thread(target=time.sleep, args=(60,)).start()
    return rank


def test_spawn_returns_results_in_rank_order():
    assert spawn(_double, 3, args=(10,), timeout=120) == [0, 10, 20]


def test_spawn_names_a_rank_whose_process_does_not_end():
    """A rank that returned but whose process does not end is terminated
    after exit_timeout, with a SlowExitWarning naming it (the failure tests
    fail on it)."""
    from symnccl.bootstrap import SlowExitWarning
    t0 = time.monotonic()
    with pytest.warns(SlowExitWarning, match="rank 1 of 2 was still "
                      "running 2 s after the ranks returned"):
        assert spawn(_linger_on_one, 2, timeout=120,
                     exit_timeout=2.0) == [0, 1]
    assert time.monotonic() - t0 < 50


def test_spawn_names_the_failing_rank():
    with pytest.raises(RuntimeError, match="rank 1 of 2 failed: ValueError: "
                                           "planted failure"):
        spawn(_fail_on_one, 2, timeout=120)


@pytest.mark.skipif(local_device_count() > 0, reason="a GPU is visible")
def test_cli_reports_versions_and_no_gpu():
    r = subprocess.run([sys.executable, "-m", "symnccl"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1
    v = symnccl.versions()
    assert f"NCCL    {v['nccl_runtime']} from {v['nccl_library']}" \
        in r.stdout and "no CUDA device" in r.stdout
    # what runs: the kernel build and its headers, never read as a
    # mismatch ("built against" the host code's nccl.h)
    assert (f"kernels built against NCCL {v['nccl_kernels']}'s headers, "
            f"running on NCCL {v['nccl_runtime']}") in r.stdout
    assert "(built against" not in r.stdout
    assert "NCCL_NVLS_ENABLE=" in r.stdout


def test_bench_report_rebuilds_table_from_recorded_json(tmp_path):
    import json
    import shutil
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    src = os.path.join(root, "benchmarks", "results", "allreduce_h200x2_bfloat16.json")
    dst = tmp_path / "r.json"
    shutil.copy(src, dst)
    # --report writes its PNG into the current directory (never beside
    # a JSON it only reads)
    r = subprocess.run([sys.executable, os.path.join(root, "benchmarks",
                                                     "bench_allreduce.py"),
                        "--report", str(dst)], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(dst.read_text())
    lines = [ln for ln in r.stdout.splitlines() if ln.strip().endswith("x")]
    assert len(lines) == len(doc["rows"])   # one row per size, speedup last
    assert "symnccl:one_shot" in r.stdout and "nccl:window" in r.stdout
    assert "symnccl:ll" in r.stdout and "nvlink:memcpy" in r.stdout
    assert "symnccl:push" in r.stdout and "symnccl:push(tensor)" in r.stdout
    assert "NVIDIA H200 x2" in r.stdout
    # a copy: --report writes the PNG beside the JSON it reads
    dst2 = tmp_path / "ll128.json"
    shutil.copy(os.path.join(root, "benchmarks", "results",
                             "allreduce_h200x4_bfloat16.json"), dst2)
    r2 = subprocess.run([sys.executable, os.path.join(root, "benchmarks",
                                                      "bench_allreduce.py"),
                         "--report", str(dst2)],
                        capture_output=True, text=True, timeout=120,
                        cwd=tmp_path)
    assert r2.returncode == 0 and "symnccl:ll128" in r2.stdout, r2.stderr
    # the ceiling's GB/s is bytes / time (no all-reduce bus factor)
    last = doc["rows"][-1]
    us = last["nvlink:memcpy"]["us"]
    assert f"({last['bytes'] / us / 1e3:7.1f})" in r.stdout
    assert (tmp_path / "r.png").exists() or "no plot" in r.stderr


def test_bench_parses_size_lists():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(root, "benchmarks"))
    try:
        import bench_allreduce as b
    finally:
        sys.path.pop(0)
    assert b.parse_sizes("4K, 1M,256MiB,1000,1.5KiB") == [
        4096, 1 << 20, 256 << 20, 1000, 1536]
    assert b.parse_sizes("") == []


def test_results_files_carry_the_run_and_are_named_by_it(tmp_path,
                                                         monkeypatch):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(root, "benchmarks"))
    try:
        import bench_allreduce as b
    finally:
        sys.path.pop(0)
    monkeypatch.setenv("SYMNCCL_PDL", "0")
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    doc = b.run_info(2, "NVIDIA H200", "2.11.0", dtype="bfloat16",
                     eager=True, rows=[1])
    assert doc["gpu"] == "NVIDIA H200" and doc["nranks"] == 2
    assert doc["versions"]["torch"] == "2.11.0" and "nccl_runtime" in \
        doc["versions"]
    assert doc["env"]["SYMNCCL_PDL"] == "0" and \
        doc["env"]["NCCL_NVLS_ENABLE"] == "0" and "PATH" not in doc["env"]
    assert doc["rows"] == [1]
    assert b.results_name(doc, "step_") == "step_h200x2_bfloat16_eager.json"
    path = b.write_results(doc, "", str(tmp_path / "r.json"))
    assert json.loads(open(path).read())["rows"] == [1]


def test_step_and_collectives_benchmarks_report_a_results_file(tmp_path):
    """--report prints a results JSON without a GPU: the table has a row per
    result, with each method's time and the communication share."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    step = {"gpu": "NVIDIA H200", "nranks": 2, "dtype": "bfloat16",
            "hidden": 8192, "layers": 8,
            "rows": [{"step": "decode", "tokens": 1, "symnccl": 110.0,
                      "torch.distributed": 130.0, "none": 100.0}]}
    coll = {"gpu": "NVIDIA H200", "nranks": 2, "dtype": "bfloat16",
            "eager": False, "skipped": {"all_gather symnccl:window": "x"},
            "rows": [{"collective": "reduce_scatter", "bytes": 8192,
                      "symnccl": {"us": 3.25, "wrong": 0},
                      "torch.dist": {"us": 8.5, "wrong": 0}}]}
    out = {}
    for name, doc in (("bench_step", step), ("bench_collectives", coll)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(doc))
        r = subprocess.run([sys.executable, f"benchmarks/{name}.py",
                            "--report", str(path)], cwd=root,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        out[name] = r.stdout
    line = out["bench_step"].splitlines()[-1].split()
    assert line[:2] == ["decode", "1"] and line[-3:] == ["10.0", "30.0",
                                                          "0.33"], line
    assert "reduce_scatter" in out["bench_collectives"]
    assert "3.25 (0)" in out["bench_collectives"]
    assert "8.50 (0)" in out["bench_collectives"]
    assert "skipped all_gather symnccl:window: x" in out["bench_collectives"]


@pytest.mark.parametrize("name", ["bench_alltoall", "bench_fused",
                                  "bench_eager", "bench_backend",
                                  "bench_step"])
def test_benchmarks_report_their_results_with_a_png(tmp_path, name):
    """--report on every committed JSON of the benchmark (a copy): the
    table, and the PNG beside the JSON it read (as bench_collectives)."""
    import glob
    import shutil
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    prefix = name.split("_")[1]
    srcs = sorted(glob.glob(os.path.join(root, "benchmarks", "results",
                                         f"{prefix}_*.json")))
    assert srcs
    for src in srcs:
        dst = tmp_path / os.path.basename(src)
        shutil.copy(src, dst)
        r = subprocess.run([sys.executable, f"benchmarks/{name}.py",
                            "--report", str(dst)], cwd=root,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (src, r.stderr)
        assert json.loads(dst.read_text())["gpu"] in r.stdout
        assert dst.with_suffix(".png").exists() or "no plot" in r.stderr


def test_examples_use_only_the_public_api_that_exists():
    """Every symnccl name an example reads (symnccl.x, symnccl.torch.x via
    its alias, comm methods it calls) exists: examples cannot drift from
    the API while they need GPUs to run."""
    import ast
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    comm_api = set(dir(symnccl.Communicator))
    # symnccl.torch.communicator() returns a wrapper (_torch_ids.py's
    # Communicator, read from its syntax tree: torch may be missing here)
    # that adds the attributes its __init__ sets
    wrapper = next(n for n in ast.parse(open(os.path.join(
        root, "symnccl", "_torch_ids.py")).read()).body
        if isinstance(n, ast.ClassDef) and n.name == "Communicator")
    added = {t.attr for f in wrapper.body
             if isinstance(f, ast.FunctionDef) and f.name == "__init__"
             for st in ast.walk(f) if isinstance(st, ast.Assign)
             for t in st.targets if isinstance(t, ast.Attribute)}
    assert "comm" in added, added   # the wrapped Communicator
    comm_api |= added
    checked = 0
    for name in sorted(os.listdir(os.path.join(root, "examples"))):
        if not name.endswith(".py"):
            continue
        tree = ast.parse(open(os.path.join(root, "examples", name)).read())
        aliases = {}   # local name -> module path
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("symnccl"):
                        aliases[a.asname or a.name] = a.name
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            if isinstance(node.value, ast.Name) and \
                    node.value.id in aliases:
                mod = aliases[node.value.id]
                if mod == "symnccl.jax" or mod == "symnccl.torch":
                    src = open(os.path.join(root, *mod.split(".")) +
                               ".py").read()
                    if mod == "symnccl.torch":   # and its parts
                        src += "".join(
                            open(os.path.join(root, "symnccl", f)).read()
                            for f in sorted(os.listdir(os.path.join(
                                root, "symnccl")))
                            if f.startswith("_torch_"))
                    assert f"def {node.attr}" in src or \
                        f"{node.attr} =" in src, (name, mod, node.attr)
                else:
                    assert hasattr(symnccl, node.attr), (name, node.attr)
                checked += 1
            elif isinstance(node.value, ast.Name) and \
                    node.value.id == "comm":
                assert node.attr in comm_api, (name, "comm." + node.attr)
                checked += 1
    assert checked >= 8


def test_symnccl_torch_keeps_its_names_after_the_split():
    """symnccl.torch is split into parts (symnccl/_torch_*.py: the id
    registry, the bootstrap, the ops, the eager path, the autograd); every
    public name (__all__) and every private one the tests read is still
    symnccl.torch's, and every name symnccl/torch.py imports from a part
    is defined there (read from the syntax trees: torch may be missing
    here)."""
    import ast
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    pkg = os.path.join(root, "symnccl")
    facade = ast.parse(open(os.path.join(pkg, "torch.py")).read())
    names = {n.name for n in facade.body if isinstance(n, ast.FunctionDef)}
    public = None
    for node in facade.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and \
                node.module.startswith("_torch_"):
            part = ast.parse(open(os.path.join(
                pkg, node.module + ".py")).read())
            defined = {n.name for n in part.body
                       if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
            defined |= {t.id for n in part.body if isinstance(n, ast.Assign)
                        for t in n.targets if isinstance(t, ast.Name)}
            defined |= {n.target.id for n in part.body
                        if isinstance(n, ast.AnnAssign)}
            for a in node.names:
                assert a.name in defined, (node.module, a.name)
                names.add(a.asname or a.name)
        elif isinstance(node, ast.Assign) and \
                getattr(node.targets[0], "id", None) == "__all__":
            public = set(ast.literal_eval(node.value))
    assert public and public <= names, public - names
    assert {"all_to_all", "all_to_all_v"} <= names
    # the private names the tests read (test_inputs.py, test_torch.py)
    assert {"_COMMS", "_IDS", "_register", "_lock", "_prune",
            "_install_gate"} <= names


def test_bench_rejects_unknown_dtype():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, os.path.join(root, "benchmarks",
                                                     "bench_allreduce.py"),
                        "--dtype", "int3"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "invalid choice" in r.stderr


def test_multimem_kernel_compiles_to_multimem_ptx(tmp_path):
    """The multicast kernel is never run on the development machines (NVLink
    multicast is disabled there): check that it compiles for sm_90 and that
    its PTX holds the switch reductions and stores it is built on."""
    import os
    import shutil
    import subprocess
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if
                                    os.path.exists("/usr/local/cuda/bin/nvcc")
                                    else None)
    if nvcc is None:
        pytest.skip("nvcc is not installed here")
    try:
        import nvidia.nccl as m
        inc = next(os.path.join(r, "include") for r in m.__path__
                   if os.path.exists(os.path.join(r, "include",
                                                  "nccl_device.h")))
    except (ImportError, StopIteration):
        pytest.skip("the NCCL wheel's headers are not installed")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    src = os.path.join(root, "csrc", "kernels", "multimem.cu")
    ptx = tmp_path / "mm.ptx"
    import re
    with open(os.path.join(inc, "nccl.h")) as f:   # the wheel's own minor
        minor = int(re.search(r"#define NCCL_MINOR (\d+)", f.read()).group(1))
    subprocess.run([nvcc, "-std=c++17", "-arch=compute_90", "--ptx",
                    f"-DSYMNCCL_NCCL_MINOR={minor}",
                    f"-I{inc}", "-I" + os.path.join(root, "csrc", "kernels"),
                    "-I" + os.path.join(root, "csrc"),
                    src, "-o", str(ptx)], check=True, capture_output=True,
                   timeout=300)
    text = ptx.read_text()
    for insn in ("multimem.ld_reduce.relaxed.sys.global.add.acc::f32.v4.bf16x2",
                 "multimem.ld_reduce.relaxed.sys.global.add.acc::f32.v4.f16x2",
                 "multimem.ld_reduce.relaxed.sys.global.max.v4.bf16x2",
                 "multimem.ld_reduce.relaxed.sys.global.min.v4.f16x2",
                 "multimem.ld_reduce.relaxed.sys.global.add.v4.f32",
                 "multimem.st.relaxed.sys.global.v4.f32"):
        assert insn in text, insn


TOPO_2 = dict(nranks=2, lsa_size=2, symmetric=1, staging=1, push=1,
              multicast=0)


def test_multimem_is_gated_by_multicast_in_the_c_registry():
    """The C gate every call goes through (_algo_unavailable_for builds the
    same topology struct a communicator does): no multicast, no multimem;
    with it, only the dtype/op pairs the PTX has."""
    gate = _C._algo_unavailable_for
    assert "multicast" in gate(TOPO_2, "multimem", "bfloat16", "sum")
    mc = dict(TOPO_2, multicast=1)
    assert gate(mc, "multimem", "bfloat16", "max") is None
    assert gate(mc, "multimem", "float32", "sum") is None
    assert "no multimem reduction" in gate(mc, "multimem", "float32", "max")
    assert "no multimem reduction" in gate(mc, "multimem", "int32", "sum")
    for dtype, ops in symnccl.MULTIMEM_OPS.items():
        for op in symnccl.LSA_OPS:
            assert (gate(mc, "multimem", dtype, op) is None) == (op in ops)


def test_kernel_algorithms_need_the_device_api_nvlink_and_a_kernel_dtype():
    gate = _C._algo_unavailable_for
    for algo in ("one_shot", "two_shot", "ll", "ll128", "push"):
        assert gate(TOPO_2, algo, "bfloat16", "sum") is None
        assert "device API" in gate(dict(TOPO_2, symmetric=0), algo,
                                    "bfloat16", "sum")
        assert "NVLink" in gate(dict(TOPO_2, lsa_size=1), algo, "bfloat16",
                                "sum")
        assert "no symnccl kernel" in gate(TOPO_2, algo, "uint8", "sum")
        assert "no symnccl kernel" in gate(TOPO_2, algo, "float32", "prod")
    assert "push region" in gate(dict(TOPO_2, push=0), "push", "bfloat16",
                                 "sum")
    assert gate(dict(TOPO_2, symmetric=0), "nccl", "uint8", "prod") is None


def test_lamport_takes_float_sums_and_auto_stands_ll128_in_for_it(
        monkeypatch):
    """lamport's empty word is a float NaN: float32, float16 and bfloat16
    only, and sums (max and min would pass a stand-in NaN's bits through),
    each refusal naming why. Where a row of the auto table gives a size to
    lamport, a call it cannot take runs ll128 (or NCCL where ll128 cannot
    take it either)."""
    gate = _C._algo_unavailable_for
    for dt in ("float32", "float16", "bfloat16"):
        for op in ("sum", "avg"):
            assert gate(TOPO_2, "lamport", dt, op) is None, (dt, op)
        for op in ("max", "min"):
            assert "sum and avg only" in gate(TOPO_2, "lamport", dt, op)
    for dt in ("float64", "float8_e4m3fn", "int32", "int64"):
        assert "float32, float16 and bfloat16" in \
            gate(TOPO_2, "lamport", dt, "sum"), dt
    assert "no symnccl kernel" in gate(TOPO_2, "lamport", "float32", "prod")
    monkeypatch.delenv("SYMNCCL_ALGO", raising=False)
    auto = _C._auto_algo_for
    rows = [r for r in symnccl.AUTO_TABLE if r["lamport"]]
    assert {r["collective"] for r in rows} == {"all_reduce",
                                               "all_reduce_rmsnorm"}
    for r in rows:
        coll, nbytes = r["collective"], r["lamport"]
        topo = dict(TOPO_2, nranks=r["max_ranks"], lsa_size=r["max_ranks"])
        assert auto(topo, nbytes, "bfloat16", "sum", False, coll) == \
            "lamport", r
        for dt, op in (("bfloat16", "max"), ("int32", "sum"),
                       ("float64", "sum")):
            want = "ll128" if gate(topo, "ll128", dt, op, coll) is None \
                else "nccl"
            assert auto(topo, nbytes, dt, op, False, coll) == want, \
                (r, dt, op)


def test_each_collective_takes_the_algorithms_with_a_kernel_for_it():
    """reduce_scatter, all_gather, reduce and broadcast: nccl and the
    algorithms COLLECTIVE_KERNELS lists run (a refusal names exactly
    those), under the same topology, dtype and op gates as all_reduce's
    kernels; all_gather and broadcast move bytes, so every dtype."""
    gate = _C._algo_unavailable_for
    for coll, kernels in _C.COLLECTIVE_KERNELS.items():
        others = ", ".join(list(kernels) + ["nccl"])
        for algo in _C.ALGORITHMS:
            why = gate(TOPO_2, algo, "float32", "sum", coll)
            if algo == "nccl" or algo in kernels:
                assert why is None, (coll, algo, why)
            else:
                assert why == ("no kernel of this algorithm runs this "
                               f"collective (those that do: {others})"), why
        for algo in kernels:
            assert "NVLink" in gate(dict(TOPO_2, lsa_size=1), algo,
                                    "float32", "sum", coll)
            bytes_only = coll in ("all_gather", "broadcast", "all_to_all")
            assert (gate(TOPO_2, algo, "uint8", "prod", coll) is None) == \
                bytes_only, (coll, algo)
    assert "push region" in gate(dict(TOPO_2, push=0), "push", "float32",
                                 "sum", "reduce_scatter")
    assert gate(TOPO_2, "auto", "uint8", "prod", "reduce") is None
    with pytest.raises(ValueError, match="unknown collective 'barrier'"):
        gate(TOPO_2, "ll", "float32", "sum", "barrier")


@pytest.mark.parametrize("nranks,nbytes,in_window,algo", [
    (2, 4096, True, "ll"), (2, 64 << 10, False, "ll"),
    (2, 256 << 10, True, "ll128"), (2, 1 << 20, False, "lamport"),
    (2, 4 << 20, True, "lamport"), (2, (4 << 20) + 2, True, "push"),
    (2, 256 << 20, True, "push"), (3, 4096, True, "ll128"),
    (3, 2 << 20, True, "push"), (4, 1 << 20, False, "ll128"),
    (4, 2 << 20, False, "two_shot"), (4, 3 << 20, False, "push"),
    (4, 3 << 20, True, "two_shot"), (8, 4096, True, "nccl"),
    (1, 4096, True, "ll")])
def test_auto_picks_from_the_measured_table(nranks, nbytes, in_window, algo,
                                            monkeypatch):
    monkeypatch.delenv("SYMNCCL_ALGO", raising=False)
    topo = dict(TOPO_2, nranks=nranks, lsa_size=nranks)
    assert _C._auto_algo_for(topo, nbytes, "bfloat16", "sum",
                             in_window) == algo


def test_auto_falls_back_to_nccl_where_no_kernel_can_run(monkeypatch):
    monkeypatch.delenv("SYMNCCL_ALGO", raising=False)
    assert _C._auto_algo_for(TOPO_2, 4096, "uint8", "sum", True) == "nccl"
    assert _C._auto_algo_for(TOPO_2, 4096, "float32", "prod", True) == "nccl"
    assert _C._auto_algo_for(dict(TOPO_2, symmetric=0), 4096, "float32",
                             "sum", True) == "nccl"


def test_symnccl_algo_overrides_auto_where_it_can_run(monkeypatch):
    monkeypatch.setenv("SYMNCCL_ALGO", "one_shot")
    assert _C._auto_algo_for(TOPO_2, 4096, "bfloat16", "sum", True) == \
        "one_shot"
    assert _C._auto_algo_for(TOPO_2, 4096, "uint8", "sum", True) == "nccl"
    monkeypatch.setenv("SYMNCCL_ALGO", "oneshot")
    with pytest.raises(ValueError, match="SYMNCCL_ALGO=oneshot is not an "
                                         "algorithm: expected one of 'auto', "
                                         "'nccl', 'one_shot'"):
        _C._auto_algo_for(TOPO_2, 4096, "bfloat16", "sum", True)
    monkeypatch.setenv("SYMNCCL_ALGO", "auto")
    monkeypatch.setenv("SYMNCCL_LL_CTAS", "many")
    with pytest.raises(ValueError, match="SYMNCCL_LL_CTAS=many is not an "
                                         "integer"):
        _C._auto_algo_for(TOPO_2, 4096, "bfloat16", "sum", True)


def test_auto_walks_one_table_for_every_collective(monkeypatch):
    """algo="auto" takes the first algorithm of the AUTO_TABLE row serving
    the collective and world size whose limit the call's larger buffer is
    within (ll, ll128, lamport, one_shot, two_shot, push), else the row's
    `above`; NCCL
    where no row serves the world size or the kernel cannot take the
    dtype/op. all_reduce's rows are ordinary rows of the same table."""
    monkeypatch.delenv("SYMNCCL_ALGO", raising=False)
    auto = _C._auto_algo_for
    rows = symnccl.AUTO_TABLE
    assert {r["collective"] for r in rows} == \
        {r["collective"] for r in _C.KERNEL_TABLE}
    for i, r in enumerate(rows):
        coll = r["collective"]
        algos = ({a for a, ks in _C.ALGO_KERNELS.items() if ks}
                 if coll == "all_reduce" else set(_C.COLLECTIVE_KERNELS[coll]))
        topo = dict(TOPO_2, nranks=r["max_ranks"], lsa_size=r["max_ranks"])
        limits = [(a, r[k]) for a, k in (("ll", "ll"), ("ll128", "ll128"),
                                         ("lamport", "lamport"),
                                         ("one_shot", "one_shot"),
                                         ("two_shot", "two_shot_tensor"),
                                         ("push", "push"))
                  if r[k]]
        assert [v for _, v in limits] == sorted(v for _, v in limits), r
        prev = 0
        for algo, limit in limits:
            assert algo in algos, r
            # the first byte past the previous limit, and the limit itself
            for nbytes in (prev + 1, limit):
                assert auto(topo, nbytes, "bfloat16", "sum", False,
                            coll) == algo, (r, nbytes)
            prev = limit
        above = limits[-1][1] + 1
        assert auto(topo, above, "bfloat16", "sum", False, coll) == \
            r["above"], r
        assert auto(topo, max(above, 1 << 30), "float32", "max", False,
                    coll) == r["above"], r
        # a world size no row serves runs on NCCL
        if not any(o["collective"] == coll for o in rows[i + 1:]):
            big = dict(TOPO_2, nranks=r["max_ranks"] + 1,
                       lsa_size=r["max_ranks"] + 1)
            assert auto(big, 4096, "bfloat16", "sum", False, coll) == "nccl"
        # ranks out of NVLink reach (a 1-rank row has no peer to reach),
        # or no staging window: NCCL
        if r["max_ranks"] > 1:
            assert auto(dict(topo, lsa_size=1), 4096, "bfloat16", "sum",
                        False, coll) == "nccl"
        assert auto(dict(topo, staging=0), 4096, "bfloat16", "sum", False,
                    coll) == "nccl"
    # the measured choices on 2 GPUs (docs/PERFORMANCE.md, 'The auto tables')
    assert auto(TOPO_2, 8 << 10, "bfloat16", "sum", False,
                "reduce_scatter") == "ll128"
    assert auto(TOPO_2, 16 << 20, "bfloat16", "sum", False,
                "reduce_scatter") == "push"
    assert auto(TOPO_2, 8 << 10, "bfloat16", "sum", False,
                "all_gather") == "ll"
    assert auto(TOPO_2, 1 << 20, "bfloat16", "sum", False,
                "all_gather") == "ll128"
    assert auto(TOPO_2, 64 << 20, "bfloat16", "sum", False,
                "all_gather") == "push"
    # 3 GPUs (session 23, blocks of whole vectors): ll to 128 KiB, ll128
    # to 4 MiB, then push; all_gather's push to 64 MiB, then NCCL
    topo_3 = dict(TOPO_2, nranks=3, lsa_size=3)
    for coll, nbytes, algo in (
            ("reduce_scatter", 128 << 10, "ll"),
            ("reduce_scatter", 4 << 20, "ll128"),
            ("reduce_scatter", (4 << 20) + 2, "push"),
            ("reduce_scatter", 1 << 30, "push"),
            ("all_gather", 128 << 10, "ll"),
            ("all_gather", (128 << 10) + 2, "ll128"),
            ("all_gather", 4 << 20, "ll128"),
            ("all_gather", 64 << 20, "push"),
            ("all_gather", (64 << 20) + 2, "nccl")):
        assert auto(topo_3, nbytes, "bfloat16", "sum", False, coll) == \
            algo, (coll, nbytes)
    for coll in ("reduce", "broadcast"):
        assert auto(TOPO_2, 1 << 20, "bfloat16", "sum", False, coll) == \
            "one_shot"
        assert auto(TOPO_2, 16 << 20, "bfloat16", "sum", False, coll) == \
            "nccl"
    # the kernels' gates: all_gather and broadcast move any dtype as bytes,
    # a reduction needs a dtype and op of the kernels; push needs its region
    assert auto(TOPO_2, 64, "uint8", "sum", False, "all_gather") == "ll"
    assert auto(TOPO_2, 64, "uint8", "sum", False, "broadcast") == \
        "one_shot"
    assert auto(TOPO_2, 64, "uint8", "sum", False, "reduce_scatter") == \
        "nccl"
    assert auto(TOPO_2, 64, "float32", "prod", False, "reduce") == "nccl"
    assert auto(dict(TOPO_2, push=0), 64 << 20, "bfloat16", "sum", False,
                "all_gather") == "nccl"


def test_symnccl_algo_sets_the_auto_of_every_collective_it_can_run(
        monkeypatch):
    """SYMNCCL_ALGO overrides every collective's table wherever that
    algorithm has a kernel for the call; elsewhere the table decides."""
    auto = _C._auto_algo_for
    others = ("reduce_scatter", "all_gather", "reduce", "broadcast")
    for knob in _C.ALGORITHMS:
        monkeypatch.setenv("SYMNCCL_ALGO", knob)
        for coll in others:
            monkeypatch.delenv("SYMNCCL_ALGO")
            table = auto(TOPO_2, 1 << 20, "float32", "sum", True, coll)
            monkeypatch.setenv("SYMNCCL_ALGO", knob)
            want = knob if knob in _C.COLLECTIVE_KERNELS[coll] else (
                "nccl" if knob == "nccl" else table)
            assert auto(TOPO_2, 1 << 20, "float32", "sum", True, coll) == \
                want, (knob, coll)
    monkeypatch.setenv("SYMNCCL_ALGO", "ll")
    # the gates still hold: all_gather moves any dtype, reduce_scatter not
    assert auto(TOPO_2, 64, "uint8", "sum", False, "all_gather") == "ll"
    assert auto(TOPO_2, 64, "uint8", "sum", False, "reduce_scatter") == \
        "nccl"
    assert auto(dict(TOPO_2, lsa_size=1), 64, "float32", "sum", False,
                "all_gather") == "nccl"
    with pytest.raises(ValueError, match="unknown collective 'scatter'"):
        auto(TOPO_2, 64, "float32", "sum", False, "scatter")


def test_python_views_of_the_registry_agree_with_c():
    """What Python code keeps per dtype or op covers exactly what the C
    registry declares."""
    assert set(_C.ALGO_CODES) == set(_C.ALGORITHMS) | {"auto"}
    assert set(_C.KERNEL_DTYPES) <= set(_C.DTYPES)
    assert set(_C.KERNEL_OPS) <= set(_C.OPS) == set(_C.OP_CODES)
    for dtype, ops in _C.MULTIMEM_OPS.items():
        assert dtype in _C.KERNEL_DTYPES and set(ops) <= set(_C.KERNEL_OPS)
    for name in _C.DTYPES:
        # each name parses to itself, and numpy's spelling to the same
        assert _C._dtype_info(name)[0] == name
        npdt = _check.numpy_dtype(name)
        if npdt is not None:
            assert _C._dtype_info(npdt)[0] == name
        code = _C._dtype_info(name)[1]
        is_float = code in (2, 4) or code >= 7   # DLPack float codes
        assert _check.is_float(name) == is_float, name
    # the reference checks know every op
    ins = [_check.make_input("float32", 8, r, 1) for r in range(2)]
    for op in _C.OPS:
        _check.reference(op, ins, "float32")


def test_every_view_of_the_kernel_table_holds_every_kernel_once():
    """The kernel table (csrc/kernels/table.h) is the one list of kernels:
    KERNELS, ALGO_KERNELS (all_reduce), COLLECTIVE_KERNELS (the others),
    the resolver and the launch counters each show every kernel exactly
    once, and agree with its row. A kernel added to one view and not to the
    table (or the reverse) fails here."""
    table = _C.KERNEL_TABLE
    names = [r["name"] for r in table]
    assert tuple(names) == _C.KERNELS and len(set(names)) == len(names)
    assert [r["id"] for r in table] == list(range(len(table)))
    seen = []
    for algo, kernels in _C.ALGO_KERNELS.items():
        for shot, k in zip(("one", "two"), kernels):
            row = table[names.index(k)]
            assert (row["collective"], row["algo"], row["shot"]) == \
                ("all_reduce", algo, shot), row
            seen.append(k)
    for coll, by_algo in _C.COLLECTIVE_KERNELS.items():
        assert coll != "all_reduce"
        for algo, k in by_algo.items():
            row = table[names.index(k)]
            assert (row["collective"], row["algo"], row["shot"]) == \
                (coll, algo, "one"), row
            seen.append(k)
    assert sorted(seen) == sorted(names)
    # every algorithm but nccl has a kernel; nccl has none
    assert _C.ALGO_KERNELS["nccl"] == ()
    assert {r["algo"] for r in table} == set(_C.ALGORITHMS) - {"nccl"}
    # a two-shot row is the two-shot of an algorithm that has a one-shot
    for r in table:
        if r["shot"] == "two":
            assert any(o["shot"] == "one" and o["algo"] == r["algo"] and
                       o["collective"] == r["collective"] for o in table), r
    # kernels that share slots share a family, and a family one layout:
    # every packet kernel of a format, every push kernel; all_reduce's
    # lamport has a family (region, counters, grid) of its own
    fam = {r["name"]: r["family"] for r in table}
    assert fam["lamport"] == "lamport_ar"
    for r in table:
        if r["name"] == "lamport":
            continue
        if r["algo"] in ("ll", "ll128", "lamport", "push"):
            assert fam[r["name"]] == r["algo"], r
        else:
            assert fam[r["name"]] == "barrier", r
    # a collective without an op moves bytes
    for r in table:
        assert r["bytes"] == (r["collective"] in ("all_gather", "broadcast",
                                                  "all_to_all")), r
    # the collectives the resolver knows are those the table has rows for
    colls = {r["collective"] for r in table}
    for coll in colls:
        assert _C._algo_unavailable_for(TOPO_2, "nccl", "float32", "sum",
                                        coll) is None
    for coll in ("barrier", "call check"):
        with pytest.raises(ValueError, match="unknown collective"):
            _C._algo_unavailable_for(TOPO_2, "nccl", "float32", "sum", coll)
    # each row's (collective, algo) is what the resolver reports runnable
    for r in table:
        if r["shot"] == "one" and r["algo"] != "multimem":
            assert _C._algo_unavailable_for(
                TOPO_2, r["algo"], "float32", "sum", r["collective"]) is None


# csrc/xla/xla_ffi_abi.h against jaxlib's xla/ffi/api/c_api.h: every size,
# offset and constant the handlers rely on, as static assertions.
XLA_ABI_CHECK = r"""
#include <stddef.h>
#include "xla/ffi/api/c_api.h"
#include "xla_ffi_abi.h"
#if XLA_FFI_API_MINOR >= 4
typedef XLA_FFI_InternalExtension xla_ext;
#else
typedef XLA_FFI_Extension_Base xla_ext;
#endif
#define SAME(x, y) _Static_assert((x) == (y), #x " != " #y)
#define FIELD(s, f, t, g) SAME(offsetof(s, f), offsetof(t, g)); \
    SAME(sizeof(((s *)0)->f), sizeof(((t *)0)->g))
#define HEAD(s, t) SAME(sizeof(s) <= sizeof(t), 1); \
    FIELD(s, struct_size, t, struct_size); \
    FIELD(s, extension_start, t, extension_start)
FIELD(snx_extension, struct_size, xla_ext, struct_size);
FIELD(snx_extension, type, xla_ext, type);
FIELD(snx_extension, next, xla_ext, next);
HEAD(snx_error_create_args, XLA_FFI_Error_Create_Args);
FIELD(snx_error_create_args, message, XLA_FFI_Error_Create_Args, message);
FIELD(snx_error_create_args, errc, XLA_FFI_Error_Create_Args, errc);
SAME(SNX_STRUCT_SIZE(snx_error_create_args, errc),
     XLA_FFI_Error_Create_Args_STRUCT_SIZE);
HEAD(snx_buffer, XLA_FFI_Buffer);
FIELD(snx_buffer, dtype, XLA_FFI_Buffer, dtype);
FIELD(snx_buffer, data, XLA_FFI_Buffer, data);
FIELD(snx_buffer, rank, XLA_FFI_Buffer, rank);
FIELD(snx_buffer, dims, XLA_FFI_Buffer, dims);
FIELD(snx_bytes, ptr, XLA_FFI_ByteSpan, ptr);
FIELD(snx_bytes, len, XLA_FFI_ByteSpan, len);
FIELD(snx_scalar, dtype, XLA_FFI_Scalar, dtype);
FIELD(snx_scalar, value, XLA_FFI_Scalar, value);
HEAD(snx_args, XLA_FFI_Args);
FIELD(snx_args, size, XLA_FFI_Args, size);
FIELD(snx_args, types, XLA_FFI_Args, types);
FIELD(snx_args, args, XLA_FFI_Args, args);
HEAD(snx_rets, XLA_FFI_Rets);
FIELD(snx_rets, size, XLA_FFI_Rets, size);
FIELD(snx_rets, types, XLA_FFI_Rets, types);
FIELD(snx_rets, rets, XLA_FFI_Rets, rets);
HEAD(snx_attrs, XLA_FFI_Attrs);
FIELD(snx_attrs, size, XLA_FFI_Attrs, size);
FIELD(snx_attrs, types, XLA_FFI_Attrs, types);
FIELD(snx_attrs, names, XLA_FFI_Attrs, names);
FIELD(snx_attrs, attrs, XLA_FFI_Attrs, attrs);
HEAD(snx_call_frame, XLA_FFI_CallFrame);
FIELD(snx_call_frame, api, XLA_FFI_CallFrame, api);
FIELD(snx_call_frame, ctx, XLA_FFI_CallFrame, ctx);
FIELD(snx_call_frame, stage, XLA_FFI_CallFrame, stage);
FIELD(snx_call_frame, args, XLA_FFI_CallFrame, args);
FIELD(snx_call_frame, rets, XLA_FFI_CallFrame, rets);
FIELD(snx_call_frame, attrs, XLA_FFI_CallFrame, attrs);
HEAD(snx_stream_get_args, XLA_FFI_Stream_Get_Args);
FIELD(snx_stream_get_args, ctx, XLA_FFI_Stream_Get_Args, ctx);
FIELD(snx_stream_get_args, stream, XLA_FFI_Stream_Get_Args, stream);
SAME(SNX_STRUCT_SIZE(snx_stream_get_args, stream),
     XLA_FFI_Stream_Get_Args_STRUCT_SIZE);
HEAD(snx_device_ordinal_get_args, XLA_FFI_DeviceOrdinal_Get_Args);
FIELD(snx_device_ordinal_get_args, ctx, XLA_FFI_DeviceOrdinal_Get_Args, ctx);
FIELD(snx_device_ordinal_get_args, device_ordinal,
      XLA_FFI_DeviceOrdinal_Get_Args, device_ordinal);
SAME(SNX_STRUCT_SIZE(snx_device_ordinal_get_args, device_ordinal),
     XLA_FFI_DeviceOrdinal_Get_Args_STRUCT_SIZE);
HEAD(snx_api_version, XLA_FFI_Api_Version);
FIELD(snx_api_version, major_version, XLA_FFI_Api_Version, major_version);
FIELD(snx_api_version, minor_version, XLA_FFI_Api_Version, minor_version);
FIELD(snx_metadata, struct_size, XLA_FFI_Metadata, struct_size);
FIELD(snx_metadata, api_version, XLA_FFI_Metadata, api_version);
FIELD(snx_metadata, traits, XLA_FFI_Metadata, traits);
FIELD(snx_metadata_extension, extension_base, XLA_FFI_Metadata_Extension,
      extension_base);
FIELD(snx_metadata_extension, metadata, XLA_FFI_Metadata_Extension,
      metadata);
HEAD(snx_api, XLA_FFI_Api);
FIELD(snx_api, api_version, XLA_FFI_Api, api_version);
FIELD(snx_api, internal_api, XLA_FFI_Api, internal_api);
FIELD(snx_api, error_create, XLA_FFI_Api, XLA_FFI_Error_Create);
FIELD(snx_api, stream_get, XLA_FFI_Api, XLA_FFI_Stream_Get);
FIELD(snx_api, run_id_get, XLA_FFI_Api, XLA_FFI_RunId_Get);
FIELD(snx_api, device_ordinal_get, XLA_FFI_Api, XLA_FFI_DeviceOrdinal_Get);
SAME(SNX_API_MAJOR, XLA_FFI_API_MAJOR);
SAME(SNX_API_MINOR <= XLA_FFI_API_MINOR, 1);
SAME(SNX_EXTENSION_METADATA, XLA_FFI_Extension_Metadata);
SAME(SNX_ERR_INVALID_ARGUMENT, XLA_FFI_Error_Code_INVALID_ARGUMENT);
SAME(SNX_ERR_FAILED_PRECONDITION, XLA_FFI_Error_Code_FAILED_PRECONDITION);
SAME(SNX_ERR_ABORTED, XLA_FFI_Error_Code_ABORTED);
SAME(SNX_ERR_INTERNAL, XLA_FFI_Error_Code_INTERNAL);
SAME(SNX_ARG_BUFFER, XLA_FFI_ArgType_BUFFER);
SAME(SNX_RET_BUFFER, XLA_FFI_RetType_BUFFER);
SAME(SNX_ATTR_SCALAR, XLA_FFI_AttrType_SCALAR);
SAME(SNX_STAGE_EXECUTE, XLA_FFI_ExecutionStage_EXECUTE);
SAME(SNX_S8, XLA_FFI_DataType_S8); SAME(SNX_S32, XLA_FFI_DataType_S32);
SAME(SNX_S64, XLA_FFI_DataType_S64); SAME(SNX_U8, XLA_FFI_DataType_U8);
SAME(SNX_U32, XLA_FFI_DataType_U32); SAME(SNX_U64, XLA_FFI_DataType_U64);
SAME(SNX_F16, XLA_FFI_DataType_F16); SAME(SNX_F32, XLA_FFI_DataType_F32);
SAME(SNX_F64, XLA_FFI_DataType_F64); SAME(SNX_BF16, XLA_FFI_DataType_BF16);
SAME(SNX_F8E5M2, XLA_FFI_DataType_F8E5M2);
SAME(SNX_F8E4M3FN, XLA_FFI_DataType_F8E4M3FN);
"""


def _xla_include():
    """jaxlib's include dir with xla/ffi/api/c_api.h: SYMNCCL_TEST_XLA_INCLUDE
    (.ci/run unpacks one there), else the installed jaxlib's."""
    inc = os.environ.get("SYMNCCL_TEST_XLA_INCLUDE")
    if inc is None:
        import importlib.util
        spec = importlib.util.find_spec("jaxlib")
        roots = list(spec.submodule_search_locations or []) if spec else []
        inc = next((os.path.join(r, "include") for r in roots), None)
    if inc and os.path.exists(os.path.join(inc, "xla/ffi/api/c_api.h")):
        return inc
    return None


def test_own_xla_ffi_declarations_match_jaxlib_s_header(tmp_path):
    """The handlers are built on csrc/xla/xla_ffi_abi.h in every build: its
    layout must be XLA's, field by field."""
    import shutil
    inc = _xla_include()
    cc = shutil.which("cc") or shutil.which("gcc")
    if inc is None or cc is None:
        pytest.skip("needs jaxlib's xla/ffi/api/c_api.h (jaxlib installed, "
                    "or SYMNCCL_TEST_XLA_INCLUDE) and a C compiler")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    src = tmp_path / "abi_check.c"
    src.write_text(XLA_ABI_CHECK)
    r = subprocess.run([cc, "-std=c11", "-fsyntax-only", f"-I{inc}",
                        f"-I{os.path.join(root, 'csrc', 'xla')}", str(src)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]


def test_xla_handlers_are_in_every_build():
    for name in ("all_reduce", "reduce_scatter", "all_gather"):
        cap = _C._xla_handler(name)
        assert type(cap).__name__ == "PyCapsule"
    with pytest.raises(ValueError, match="all_reduce"):
        _C._xla_handler("broadcast")


def test_ranks_whose_settings_differ_are_named_with_every_ranks_value():
    """What creation compares across ranks (sn_agreed_differ): equal sets
    pass; one rank off in staging_bytes, in any knob of the table, or in
    SYMNCCL_ALGO is named with every rank's value; staging_bytes first,
    then the table's order; every rank, reading the same records, gets
    the same words."""
    differ = _C._settings_differ
    assert differ([{}, {}, {}]) is None
    big = 32 << 20
    assert differ([{}, {"staging_bytes": big - 4096}]) == (
        f"staging_bytes (rank 0: {big}, rank 1: {big - 4096})")
    # SYMNCCL_ALGO (a name) below; SYMNCCL_EXIT_TIMEOUT is the process's,
    # read at exit, not a communicator's
    for knob, (dflt, lo, hi, _doc) in _C.KNOBS.items():
        if knob in ("SYMNCCL_ALGO", "SYMNCCL_EXIT_TIMEOUT"):
            continue
        other = lo if dflt != lo else hi
        sets = [{}, {knob: other}, {}]
        assert differ(sets) == (
            f"{knob} (rank 0: {dflt}, rank 1: {other}, rank 2: {dflt})"), \
            knob
        assert differ([{knob: other}] * 3) is None, knob
        assert differ([{knob: other, "staging_bytes": 4096},
                       {"staging_bytes": 8192}]).startswith(
            "staging_bytes ("), knob
    assert differ([{}, {"SYMNCCL_EXIT_TIMEOUT": 5}]) is None
    assert differ([{}, {"SYMNCCL_ALGO": "ll"}]) == \
        "SYMNCCL_ALGO (rank 0: auto, rank 1: ll)"
    both = [{}, {"SYMNCCL_PDL": 0, "SYMNCCL_LL_CTAS": 8}]
    assert differ(both).startswith("SYMNCCL_LL_CTAS (")
    with pytest.raises(ValueError, match="SYMNCCL_ALGO xx"):
        differ([{"SYMNCCL_ALGO": "xx"}])
    with pytest.raises(ValueError, match="SYMNCCL_LL_CTAS must be"):
        differ([{"SYMNCCL_LL_CTAS": 10 ** 12}])


def test_readme_names_every_algorithm_and_knob():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    readme = open(os.path.join(root, "README.md")).read()
    for algo in _C.ALGORITHMS:
        assert f'"{algo}"' in readme, algo
    for knob in _C.KNOBS:
        assert knob in readme, knob


# Host files in layer order (csrc/symnccl.h): each may call only files
# before it.
def test_c_files_call_only_the_layers_above_them():
    """No circle of C files: a function defined in csrc/D/X.c is called only
    by X.c and files after it in LAYERS."""
    import re
    from layering import c_files, source
    files = c_files()
    assert sorted(LAYERS) == files
    text = {f: source(f + ".c") for f in files}
    owner = {}
    for f, t in text.items():
        for m in re.finditer(r"^(?:[a-zA-Z_][\w ]*\*?\s*\n)?(sn_\w+)\(",
                             t, re.M):
            owner[m.group(1)] = f
    assert len(owner) > 40
    bad = []
    for f, t in text.items():
        for fn, home in owner.items():
            if home != f and re.search(r"\b" + fn + r"\(", t) and \
                    LAYERS.index(home) > LAYERS.index(f):
                bad.append(f"{f}.c calls {fn} of {home}.c")
    assert not bad, bad


def test_runtime_and_xla_call_no_python_api():
    """No Python API on XLA's threads: no file of csrc/runtime/ or
    csrc/xla/ calls the Python API or a function of csrc/python/ (nor a
    macro or inline function of symnccl.h or runtime.h that does)."""
    from layering import c_files, python_uses
    checked = [f for f in c_files() if not f.startswith("python/")]
    assert "xla/xla_ffi" in checked and "runtime/lifecycle" in checked
    # the check sees Python where there is some
    assert "Py_BEGIN_ALLOW_THREADS" in python_uses("python/lifetime")
    bad = {f: uses for f in checked for uses in [python_uses(f)] if uses}
    assert not bad, ("uses of Python in runtime/ or xla/", bad)


def test_runtime_and_xla_never_include_python_h():
    """runtime/ and xla/ are compiled without Python's declarations: no
    file of theirs includes Python.h, directly or through csrc/'s headers
    (they include runtime.h; symnccl.h, which adds the Python face to it,
    is python/'s)."""
    from layering import HEADER, c_files, includes, path
    # the check sees Python.h where it is included
    assert "Python.h" in includes(path("python/comm.c"))
    bad = {}
    for f in c_files():
        seen = includes(path(f + ".c"))
        if not f.startswith("python/") and ("Python.h" in seen or
                                            HEADER in seen):
            bad[f] = sorted(x for x in seen
                            if x in ("Python.h", HEADER))
    assert not bad, bad


# CommObject's parts (csrc/runtime.h): each is declared in its owner's
# section and changed by its owner; the other files that change one, and
# what they change, are these exactly.
COMM_PARTS = {
    "life": ("runtime/lifecycle", {
        "runtime/faults": {"state", "teardown"},   # the watchdog's take-over
        "python/comm": {"user_aborted"},           # abort()
    }),
    "mem": ("runtime/staging", {
        # a loopback rank's staging is its team's
        "runtime/loopback": {"staging", "staging_win"},
        # registers the staging window; forgets the memory an abort leaves
        "runtime/lifecycle": {"staging", "staging_win", "scratch",
                              "check_dev", "check_host"},
    }),
    "order": ("runtime/launch", {
        "runtime/staging": {"event"},     # created and freed with the scratch
        "runtime/lifecycle": {"event"},   # forgotten where an abort leaks
    }),
    "count": ("runtime/launch", {"python/comm": {"inject"}}),   # testing
    "fail": ("runtime/faults", {
        "runtime/lifecycle": {"fault", "fault_dev", "fault_src",
                              "ctl_stream"},   # forgotten where an abort leaks
    }),
    "watch": ("runtime/faults", {"runtime/lifecycle": {"event"}}),
    "a2a": ("python/alltoall", {
        "runtime/lifecycle": {"dev", "host", "lost_dev", "lost_host"},
    }),
    "xla": ("xla/xla_ffi", {}),
}


def test_each_part_of_the_communicator_is_changed_by_its_owner():
    """CommObject is split into parts (life, mem, order, count, fail,
    watch, a2a, xla), each changed (assigned, incremented) only by the file
    that owns it and the exceptions COMM_PARTS names; the parts' types are
    declared in their owner's section of runtime.h (CommObject's
    header)."""
    import re
    from layering import RUNTIME_HEADER, _code, c_files, source
    header = open(RUNTIME_HEADER).read()
    obj = header[header.index("typedef struct CommObject {"):]
    parts = dict(re.findall(r"^    sn_comm_(\w+) (\w+);", obj, re.M))
    assert sorted(parts.values()) == sorted(COMM_PARTS)
    for ty, part in parts.items():
        owner = COMM_PARTS[part][0].split("/")[1]
        section = header[:header.index(f"}} sn_comm_{ty};")]
        assert section.rindex(f"/* {owner}.c") > \
            section.rindex("/* ----"), (part, owner)
    seen = {}
    for f in c_files():
        code = _code(source(f + ".c"))
        for part in COMM_PARTS:
            fields = set(re.findall(
                r"->" + part + r"\.(\w+)(?:\[[^\]]*\])?\s*"
                r"(?:[-+*/|&]?=(?!=)|\+\+|--)", code))
            fields |= set(re.findall(r"(?:\+\+|--)\s*\w+->" + part +
                                     r"\.(\w+)", code))
            if fields:
                seen.setdefault(part, {})[f] = fields
    for part, (owner, others) in COMM_PARTS.items():
        got = dict(seen.get(part, {}))
        assert got.pop(owner, None), (part, owner)
        assert got == others, (part, got)


def test_profile_ncu_reads_recorded_csv_and_groups_metrics(monkeypatch,
                                                           capsys, tmp_path):
    import importlib.util
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location(
        "profile_ncu", os.path.join(root, "scripts", "profile_ncu.py"))
    pn = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pn)
    cases = ("ll:4K,ll:256K,two_shot:1M,push:1M,push:16M,push:256M,"
             "nccl:256M").split(",")
    prof = os.path.join(root, "tests", "data")
    d = pn.report(os.path.join(prof, "ncu_2ranks_time_dram.csv"), cases, 3,
                  2, ["gpu__time_duration.sum", "dram__bytes_read.sum"])
    assert set(d) == set(cases)
    assert abs(d["push:256M"] - 778.56) < 0.01      # fastest rep, in us
    out = capsys.readouterr().out
    assert "21 profiled kernels" in out and "busbw" in out
    # byte counters of a run without durations are read against `durations`
    pn.report(os.path.join(prof, "ncu_2ranks_nvlink.csv"), cases, 3, 2,
              ["nvltx__bytes_data_user.sum"], d)
    out = capsys.readouterr().out
    assert "nvltx__bytes_data_user=268.5MB(345GB/s)" in out
    # one-pass grouping: NVLink counters need a pass of their own
    monkeypatch.setenv("TMPDIR", os.fspath(tmp_path))
    monkeypatch.setattr(pn, "passes", lambda m: 1 if "nvl" not in m
                        or "gpu__" not in m and "dram" not in m else 2)
    g = pn.one_pass_groups(["gpu__time_duration.sum", "dram__bytes_read.sum",
                            "nvltx__bytes.sum", "nvlrx__bytes.sum"])
    assert g == [["gpu__time_duration.sum", "dram__bytes_read.sum"],
                 ["nvltx__bytes.sum", "nvlrx__bytes.sum"]]


def test_bench_fused_capture_and_replay_us_with_a_fake_torch():
    """bench_fused's graph timing, shared with scripts/kernel_periods.py:
    one call before the capture, `iters` inside it, one replay after it;
    then the median of `reps` timed replays, each after sync()."""
    import importlib.util
    import types
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location(
        "bench_fused", os.path.join(root, "benchmarks", "bench_fused.py"))
    bf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bf)
    log = []
    ms = iter([0.5, 0.1, 0.3, 0.2, 0.4])   # ms a replay of 100 calls

    class Graph:
        def replay(self):
            log.append("replay")

    class Capture:
        def __init__(self, g):
            pass

        def __enter__(self):
            log.append("capture")

        def __exit__(self, *a):
            log.append("end")

    class Event:
        def __init__(self, enable_timing):
            pass

        def record(self):
            pass

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return next(ms)

    cuda = types.SimpleNamespace(
        synchronize=lambda: log.append("sync"), CUDAGraph=Graph,
        graph=Capture, Event=Event)
    torch = types.SimpleNamespace(cuda=cuda)
    g = bf.capture(torch, lambda: log.append("call"), 3)
    assert log == ["call", "sync", "capture", "call", "call", "call", "end",
                   "replay", "sync"]
    log.clear()
    us = bf.replay_us(torch, g, 100, 5, sync=lambda: log.append("barrier"))
    assert us == 3.0                          # the median 0.3 ms / 100
    assert log == ["barrier", "replay"] * 5


def test_kernel_periods_medians_and_report(monkeypatch, capsys, tmp_path):
    """scripts/kernel_periods.py: the medians of a replay's kernels after
    the skipped ones (a negative gap where the next kernel starts first),
    its table from a results file, and its refusals without torchrun."""
    import importlib.util
    import json
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location(
        "kernel_periods", os.path.join(root, "scripts", "kernel_periods.py"))
    kp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kp)
    # 2 skipped kernels (slow starts), then one every 3.0 us lasting 3.2
    ev = [("k", 0.0, 9.0), ("k", 9.5, 8.0)]
    ev += [("k", 20.0 + 3.0 * i, 3.2) for i in range(6)]
    st = kp.kernel_stats(list(reversed(ev)), skip=2)
    assert st == {"kernel": "k", "n": 6, "dur": 3.2, "gap": -0.2,
                  "period": 3.0}
    assert kp.kernel_stats(ev[:3], skip=2) is None
    doc = {"gpu": "NVIDIA H100 80GB HBM3", "nranks": 2, "dtype": "bfloat16",
           "date": "2026-11-27",
           "rows": [{"H": 8192, "method": "ar_ll", "rank": r,
                     "graph_us": 3.4, "kernel": "packet_one_shot", **st}
                    for r in (1, 0)]
           + [{"T": 16, "H": 4096, "method": "fused_lamport", "rank": 0,
               "graph_us": 5.0, "kernel": "lamport_rmsnorm", **st}]}
    path = tmp_path / "periods.json"
    path.write_text(json.dumps(doc))
    assert kp.main(["--report", os.fspath(path)]) == 0
    out = capsys.readouterr().out
    assert "3.00 / 3.00" in out and "-0.20 / -0.20" in out
    # rows without T (files before --tokens) are T 1
    assert [line.split()[:3] for line in out.splitlines()[2:4]] == [
        ["1", "8192", "ar_ll"], ["16", "4096", "fused_lamport"]], out
    with pytest.raises(SystemExit):
        kp.main(["--methods", "ar_ll,bogus"])
    assert "unknown ['bogus']" in capsys.readouterr().err
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(SystemExit):
        kp.main([])
    assert "under torchrun" in capsys.readouterr().err


def test_cli_version_and_bench_help_and_bench_without_torch():
    run = lambda *a: subprocess.run([sys.executable, "-m", "symnccl", *a],
                                    capture_output=True, text=True,
                                    timeout=120)
    r = run("--version")
    assert r.returncode == 0 and r.stdout.strip() == \
        f"symnccl {symnccl.__version__}"
    r = run("bench", "--help")   # the benchmark's own options
    assert r.returncode == 0 and "--sizes" in r.stdout and \
        "--methods" in r.stdout, r.stdout + r.stderr
    try:
        import torch  # noqa: F401
    except ImportError:
        r = run("bench", "--sizes", "4K")
        if local_device_count() < 2:   # the GPUs are checked first
            assert r.returncode == 1 and "GPU" in r.stderr, r.stderr
        else:
            assert r.returncode == 2 and "needs PyTorch" in r.stderr and \
                "symnccl[bench]" in r.stderr
        assert "Traceback" not in r.stderr


def test_c_functions_have_signatures_and_the_stub_agrees():
    """inspect.signature works on the C extension's functions (IDEs), and
    the .pyi stub names the same parameters."""
    import ast
    import inspect
    stub = ast.parse(open(os.path.join(os.path.dirname(_C.__file__),
                                       "_C.pyi")).read())
    cls = next(n for n in stub.body if isinstance(n, ast.ClassDef)
               and n.name == "Communicator")
    stubbed = {f.name: [a.arg for a in f.args.posonlyargs + f.args.args +
                        f.args.kwonlyargs]
               for f in cls.body if isinstance(f, ast.FunctionDef)}
    for name in ("all_reduce", "reduce_scatter", "all_gather", "broadcast",
                 "barrier", "empty", "zeros", "check", "close", "abort"):
        sig = inspect.signature(getattr(symnccl.Communicator, name))
        assert list(sig.parameters) == stubbed[name], name
    assert list(inspect.signature(symnccl.Communicator).parameters) == \
        stubbed["__init__"][1:]
    assert inspect.signature(symnccl.get_unique_id).parameters == {}
    assert os.path.exists(os.path.join(os.path.dirname(_C.__file__),
                                       "py.typed"))


def test_loopback_arguments_are_checked_before_any_gpu_work():
    """Communicator._loopback refuses bad arguments with a ValueError that
    names them, before it touches CUDA (so also on a machine without a
    GPU)."""
    for bad, match in (({"nranks": 0}, "nranks must be 1..32, got 0"),
                       ({"nranks": 33}, "nranks must be 1..32, got 33"),
                       ({"nranks": 2, "staging_bytes": 100},
                        "multiple of 4096"),
                       ({"nranks": 2, "timeout": 0},
                        "timeout must be a finite number of seconds > 0")):
        with pytest.raises(ValueError, match=match):
            symnccl.Communicator._loopback(**bad)


def test_self_check_report_names_the_failing_cells_last(capsys):
    """`python -m symnccl`'s report ends with every cell that had wrong
    elements (collective, algo, dtype, op, count, rank), so the tail of a
    log says what broke; a clean run says PASS."""
    from symnccl.__main__ import _report
    info = dict(rank=0, device=0, lsa_size=2, symmetric=True,
                multicast=False, multicast_reason="off")
    rows = [("all_reduce", "ll", "float32", "sum", 4099, 0),
            ("reduce_scatter", "push", "bfloat16", "max", 1 << 20, 17)]
    results = [dict(info=dict(info, rank=q), rows=rows[:1 + q], skipped=[])
               for q in range(2)]
    assert not _report(results, 2)
    out = capsys.readouterr().out.splitlines()
    assert out[-3] == ("wrong: reduce_scatter algo push bfloat16 op max "
                       "count 1048576 rank 1: 17")
    assert out[-1].endswith("17 wrong elements: FAIL")
    assert _report([dict(results[0])], 1)
    assert capsys.readouterr().out.splitlines()[-1].endswith(": PASS")


def test_only_pairs_passed_on_two_gpus_go_without_a_warning():
    """A communicator of 2+ ranks warns (once per process) unless its
    library and kernel build have passed `python -m symnccl` on two GPUs:
    NCCL 2.28.9 and 2.29.7 with their own builds (2x H100, 2026-11-26),
    2.30.7 and 2.32.3 (2x H200) and 2.31.2 (2x H100) with the 2.29.7 build
    (2026-11-26).
    Another patch, or a pair not run, warns until a run passes
    (docs/FAILURES.md, 'NCCL versions')."""
    caveat = _C._nccl_multi_gpu_caveat
    for runtime, headers in ((22809, 22809), (22907, 22907),
                             (23007, 22907), (23102, 22907),
                             (23203, 22907)):
        assert caveat(runtime, headers) is None, (runtime, headers)
    for runtime, headers in ((23101, 22907), (23006, 22907),
                             (23204, 22907), (22810, 22809)):
        why = caveat(runtime, headers)
        v = _loader.version_tuple(runtime)
        assert why is not None and "has not passed" in why, why
        assert "%d.%d.%d loaded" % v in why, why
        assert "python -m symnccl" in why, why
        assert "2x H200" not in why and "use NCCL 2.28" not in why, why
    runtime = _C.nccl_runtime_version()
    minor = _C.nccl_device_api()[1]
    assert _C._multi_gpu_caveat() == caveat(
        runtime, _C.NCCL_DEVICE_API_HEADERS[minor])
