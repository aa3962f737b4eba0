"""CPU tier: runs everywhere, no GPU or driver needed."""
import os
import subprocess
import sys

import numpy as np
import pytest

import symnccl
from symnccl import _C, _check, _loader
from symnccl.bootstrap import local_device_count, spawn


def test_import_reports_matching_nccl_versions():
    v = symnccl.versions()
    assert v["nccl_build"].split(".")[:2] == v["nccl_runtime"].split(".")[:2]
    assert v["nccl_build"].startswith("2.28.")
    assert "libnccl.so" in v["nccl_library"]


def test_loaded_nccl_is_the_wheel_or_nccl_home():
    path = _loader.loaded_nccl_path()
    assert path is not None
    home = os.environ.get("NCCL_HOME")
    assert "nvidia/nccl/lib" in path or (home and path.startswith(home))


def test_version_tuple_decodes_nccl_version_codes():
    assert _loader.version_tuple(22809) == (2, 28, 9)
    assert _loader.version_tuple(22903) == (2, 29, 3)
    assert _loader.version_tuple(2708) == (2, 7, 8)


def test_check_version_accepts_same_major_minor():
    _loader.check_version(22809, 22803)


def test_check_version_names_both_versions_on_mismatch():
    with pytest.raises(ImportError, match=r"built against NCCL 2\.28\.9.*"
                                          r"is 2\.29\.1"):
        _loader.check_version(22809, 22901, "/x/libnccl.so.2")


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


def test_spawn_returns_results_in_rank_order():
    assert spawn(_double, 3, args=(10,), timeout=120) == [0, 10, 20]


def test_spawn_names_the_failing_rank():
    with pytest.raises(RuntimeError, match="rank 1 of 2 failed: ValueError: "
                                           "planted failure"):
        spawn(_fail_on_one, 2, timeout=120)


@pytest.mark.skipif(local_device_count() > 0, reason="a GPU is visible")
def test_cli_reports_versions_and_no_gpu():
    r = subprocess.run([sys.executable, "-m", "symnccl"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1
    assert "NCCL    2.28" in r.stdout and "no CUDA device" in r.stdout
    assert "NCCL_NVLS_ENABLE=" in r.stdout


def test_bench_report_rebuilds_table_from_recorded_json(tmp_path):
    import json
    import shutil
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    src = os.path.join(root, "benchmarks", "results", "h200x2_bfloat16.json")
    dst = tmp_path / "r.json"
    shutil.copy(src, dst)
    r = subprocess.run([sys.executable, os.path.join(root, "benchmarks",
                                                     "bench_allreduce.py"),
                        "--report", str(dst)], capture_output=True, text=True,
                       timeout=120)
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
                             "h200x2_bfloat16_ll128.json"), dst2)
    r2 = subprocess.run([sys.executable, os.path.join(root, "benchmarks",
                                                      "bench_allreduce.py"),
                         "--report", str(dst2)],
                        capture_output=True, text=True, timeout=120)
    assert r2.returncode == 0 and "symnccl:ll128" in r2.stdout, r2.stderr
    # the ceiling's GB/s is bytes / time (no all-reduce bus factor)
    last = doc["rows"][-1]
    us = last["nvlink:memcpy"]["us"]
    assert f"({last['bytes'] / us / 1e3:7.1f})" in r.stdout
    assert (tmp_path / "r.png").exists() or "no plot" in r.stdout


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


def test_examples_compile():
    import py_compile
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for name in os.listdir(os.path.join(root, "examples")):
        if name.endswith(".py"):
            py_compile.compile(os.path.join(root, "examples", name),
                               doraise=True)


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
    src = os.path.join(root, "csrc", "kernels", "multimem_allreduce.cu")
    ptx = tmp_path / "mm.ptx"
    subprocess.run([nvcc, "-std=c++17", "-arch=compute_90", "--ptx",
                    f"-I{inc}", "-I" + os.path.join(root, "csrc", "kernels"),
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


def test_multimem_algo_is_gated_by_multicast():
    class FakeComm:
        symmetric, lsa_size, nranks, staging_bytes = True, 2, 2, 1 << 25
        multicast = False
    assert not symnccl.algo_supported(FakeComm, "multimem", "bfloat16")
    FakeComm.multicast = True
    assert symnccl.algo_supported(FakeComm, "multimem", "bfloat16", "max")
    assert not symnccl.algo_supported(FakeComm, "multimem", "float32", "max")
    assert not symnccl.algo_supported(FakeComm, "multimem", "int32")
    with pytest.raises(ValueError, match="unknown algo"):
        symnccl.algo_supported(FakeComm, "fast", "bfloat16")


def test_algo_codes_come_from_the_c_module_and_cover_every_algorithm():
    codes = _C.ALGO_CODES
    assert set(codes) == set(symnccl.ALGORITHMS) | {"auto"}
    assert codes["auto"] == -1 and codes["nccl"] == 0
    assert sorted(codes.values()) == list(range(-1, len(codes) - 1))


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
    prof = os.path.join(root, "benchmarks", "results", "profiles")
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
