"""symnccl as a torch.distributed backend (symnccl/torch_backend.py;
docs/FRAMEWORKS.md, 'symnccl as a torch.distributed backend').

CPU: registration, and the routing of every c10d call on two gloo ranks
with a communicator that records what it runs (the backend's own classes,
this torch version's). GPU (2 GPUs): the backend against the NCCL backend
on the same ranks, for the c10d calls, DDP, FSDP2, DTensor TP + SP,
compiled functional collectives, and a rank that never arrives."""
import re

import pytest

from conftest import ranks_param
from symnccl.bootstrap import free_port, spawn

torch = pytest.importorskip("torch", reason="torch is not installed")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("this torch has no torch.distributed",
                allow_module_level=True)


def _torch_version():
    return tuple(int(v) for v in
                 re.match(r"(\d+)\.(\d+)", torch.__version__).groups())


def _cpu(fn):
    if not dist.is_gloo_available():
        pytest.skip("this torch has no gloo backend (the CPU ranks' "
                    "transport)")
    from _workers import torch_backend_cpu as W
    return W.spawn(fn)


def test_importing_symnccl_torch_registers_the_backend_for_cuda():
    import symnccl.torch  # noqa: F401
    from symnccl import torch_backend as tb
    assert "symnccl" in dist.Backend.backend_list
    assert dist.Backend.backend_capability["symnccl"] == ["cuda"]
    creator = dist.Backend._plugins["SYMNCCL"].creator_fn
    tb.register()                                   # again: a no-op
    assert dist.Backend._plugins["SYMNCCL"].creator_fn is creator


def test_per_device_backend_strings_follow_the_measured_torch_versions():
    """docs/FRAMEWORKS.md's matrix: torch's c10d Backend takes a Python
    subclass from 2.14, so "cpu:gloo,cuda:symnccl" works from there;
    before, the backend is a Python ProcessGroup (with gloo for CPU)."""
    from symnccl import torch_backend as tb
    assert tb.PER_DEVICE == (_torch_version() >= (2, 14))
    if tb.PER_DEVICE:
        assert issubclass(tb.SymncclBackend, torch._C._distributed_c10d.Backend)
    cfg = dist.distributed_c10d.BackendConfig("cpu:gloo,cuda:symnccl")
    assert cfg.get_device_backend_map() == {"cpu": "gloo",
                                            "cuda": "symnccl"}


def test_every_routed_call_runs_on_symnccl_with_auto_and_the_rest_on_nccl():
    """Two CPU ranks: the backend hands each c10d call symnccl has a
    kernel for to its communicator with algo "auto" (uneven all-to-all:
    "push", a choice no rank's sizes can change; one call per tensor
    of a coalesced call), and the others (send/recv, list all_gather,
    ops and dtypes symnccl lacks, non-contiguous tensors, what the
    registry refuses, what symnccl's resolver gives NCCL) to its
    fallback; every result is the collective's."""
    res = _cpu("routing")
    assert res[0].keys() == res[1].keys()
    to_symnccl = {
        "all_reduce SUM": ["all_reduce"], "all_reduce AVG": ["all_reduce"],
        "all_reduce MAX": ["all_reduce"], "all_reduce MIN": ["all_reduce"],
        "all_reduce PRODUCT": ["all_reduce"],
        "all_reduce async_op": ["all_reduce"],
        "all_gather_into_tensor": ["all_gather"],
        "reduce_scatter_tensor": ["reduce_scatter"],
        "all_reduce coalesced": ["all_reduce"] * 2,
        "all_gather coalesced": ["all_gather"] * 2,
        "reduce_scatter coalesced": ["reduce_scatter"] * 2,
        "all_to_all_single even": ["all_to_all"],
        "all_to_all_single uneven": ["all_to_all_v"],
        "broadcast": ["broadcast"], "reduce": ["reduce"],
        "barrier": ["barrier"],
        # two tensor broadcasts (size, then bytes)
        "broadcast_object_list": ["broadcast"] * 2,
        # the bucket's all_reduce, the parameters' broadcasts (how many:
        # the torch version's business)
        "DDP": {"broadcast", "all_reduce"},
        "functional collectives": ["all_reduce", "reduce_scatter"],
    }
    to_fallback = {"send/recv", "all_gather list", "all_reduce BAND",
                   "all_reduce bool", "all_reduce non-contiguous",
                   "all_reduce the registry refuses",
                   "all_reduce the resolver gives NCCL",
                   "all_gather_into_tensor, all_to_all_single bool"}
    assert set(res[0]) == set(to_symnccl) | to_fallback
    for rank, rows in enumerate(res):
        for name, (ok, calls, algos) in rows.items():
            assert ok, (rank, name)
            if name in to_symnccl:
                want = to_symnccl[name]
                got = set(calls) if isinstance(want, set) else calls
                assert got == want, (rank, name, calls)
                # uneven all-to-all: push, whose choice reads no size (each
                # rank's output is sized for what it receives)
                assert algos == ["push" if name.endswith("uneven")
                                 else "auto"], (rank, name, algos)
            else:
                assert calls == [], (rank, name, calls)


def test_a_communicator_failure_comes_out_of_work_wait():
    """The communicator's failure is raised by Work.wait() of an
    async_op call and by the synchronous call (which waits), as
    symnccl.PeerTimeoutError; abort() closes the communicator, and the
    group's later calls say it was aborted (no new communicator)."""
    for rank, seen in enumerate(_cpu("failure")):
        assert [s[0] for s in seen] == ["wait", "sync", "aborted",
                                        "after abort"], seen
        assert "rank 1 did not arrive" in seen[0][1]
        assert seen[2][1] is True
        assert "was aborted; make a new group" in seen[3][1]


def test_the_async_path_forks_launches_on_the_current_stream_and_reuses_events():
    """async_op=True, as ProcessGroupNCCL: the backend's stream waits for
    the current one (the group's one fork event), is torch's current
    stream for the launch (symnccl handed stream=None: its torch fast
    path, not DLPack's stream handshake) and is set back, even when the
    launch raises; the completion event comes from the same pool and
    goes back when the Work goes; the Work keeps the tensors until
    wait(), a Work dropped unwaited records them on the backend's stream;
    get_future() completes on the backend's stream, once; synchronous
    calls make no stream or event call. torch's CUDA calls are a fake
    here (tests/_workers/torch_backend_cpu.py, FakeCuda); the GPU tests
    run the real ones."""
    cur = ("stream", (7, 0, 1))
    back = ("stream", (9, 0, 1))
    # the pool's first event forks the call and, free again once the
    # wait is queued, marks its end
    fork = done = ("event", 1)
    for rank, r in enumerate(_cpu("async_path")):
        n = 2
        assert r["launch stream"] is None, r
        assert r["async log"] == [
            ("current", 0), ("stream", (7, 0, 1)), ("record", fork, cur),
            ("wait", fork, back), ("set", (9, 0, 1)), ("set", (7, 0, 1)),
            ("record", done, back)], r["async log"]
        assert r["keeps"], r
        assert r["wait log"] == [("current", 0), ("wait", done, cur)], r
        assert r["kept after wait"] is None, r
        assert r["value"] == [n * (n + 1) / 2] * 4, r
        assert r["future log"] == [("current", 0), ("set", (9, 0, 1)),
                                   ("set", (7, 0, 1))], r
        assert r["future value"] == r["value"] and r["same future"], r
        # waited: nothing to record, the event back in the pool
        assert r["waited work dropped"] == [], r
        assert r["pool"] == [done], r
        assert r["new events"] == 0 and r["pooled event used"] == done, r
        assert r["all_gather"] == [0., 0., 1., 1.], r
        assert r["unwaited work dropped"] == [
            ("record_stream", "output", back),
            ("record_stream", "input", back)], r
        assert r["other device launch stream"] == back, r
        assert r["other device sets"] == [], r
        assert r["raised"] is True, r
        assert r["current after raise"] == (7, 0, 1), r
        assert r["sync log"] == [], r


def test_the_private_torch_apis_the_backend_reads_are_where_they_were():
    """What symnccl/torch_backend.py reads of torch beyond the documented
    API, so a torch release that moves one fails here, not on 2 GPUs."""
    c10d = dist.distributed_c10d
    assert callable(c10d._process_group_color)
    assert callable(c10d._get_default_group)
    assert hasattr(dist.Backend, "_plugins")
    opts = c10d._DistributedBackendOptions()
    for field in ("store", "group_rank", "group_size", "timeout",
                  "group_id", "global_ranks_in_group"):
        assert hasattr(opts, field), field
    for name in ("_register_backend", "_set_default_backend",
                 "_get_backend"):
        assert hasattr(dist.ProcessGroup, name), name
    assert hasattr(dist.ReduceOp.RedOpType, "PREMUL_SUM")
    # the async path's stream and event calls (torch_backend._Cuda): a
    # record or wait given another type would be cast unchecked in C
    for name in ("_cuda_getCurrentStream", "_cuda_getDevice",
                 "_cuda_setStream", "_CudaEventBase", "_CudaStreamBase"):
        assert hasattr(torch._C, name), name
    for name in ("record", "wait"):
        assert callable(getattr(torch._C._CudaEventBase, name)), name
    assert issubclass(torch.cuda.Stream, torch._C._CudaStreamBase)
    assert issubclass(torch.cuda.Event, torch._C._CudaEventBase)

    if dist.is_nccl_available():
        o = dist.ProcessGroupNCCL.Options()
        for field in ("_timeout", "split_from", "split_color",
                      "global_ranks_in_group", "group_name"):
            assert hasattr(o, field), field


# ------------------------------------------------------------------ GPUs

@ranks_param(2)
def test_gpu_c10d_calls_on_a_symnccl_world_give_nccls_values(nranks):
    from _workers import torch_backend_gpu as G
    for rank, r in enumerate(spawn(G.collectives, nranks,
                                   args=(free_port(),), timeout=600)):
        assert r["backend"] == "symnccl"
        assert r["routed"] is True
        bad = [k for k, ok in r["checks"].items() if not ok]
        assert not bad, (rank, bad)


@ranks_param(2)
def test_gpu_per_device_string_puts_cuda_on_symnccl_and_cpu_on_gloo(nranks):
    from _workers import torch_backend_gpu as G
    for r in spawn(G.per_device_string, nranks, args=(free_port(),),
                   timeout=600):
        assert r == {"cuda": True, "cpu": True, "symnccl ran": True}, r


def _losses_match(res, rtol=1e-6):
    for rank, r in enumerate(res):
        a, b = r["losses"]["nccl"], r["losses"]["symnccl"]
        assert len(a) == len(b) == 20
        for step, (x, y) in enumerate(zip(a, b)):
            assert abs(x - y) <= rtol * abs(x), (rank, step, x, y)
        assert r["symnccl_launches"] > 0, r


@pytest.mark.slow   # ~1 min: two trainings
@ranks_param(2)
def test_gpu_ddp_losses_equal_the_nccl_backends(nranks):
    from _workers import torch_backend_gpu as G
    _losses_match(spawn(G.training, nranks, args=(free_port(), "ddp"),
                        timeout=600))


@pytest.mark.slow
@ranks_param(2)
def test_gpu_fsdp2_losses_equal_the_nccl_backends(nranks):
    from _workers import torch_backend_gpu as G
    _losses_match(spawn(G.training, nranks, args=(free_port(), "fsdp2"),
                        timeout=600))


@pytest.mark.slow
@ranks_param(2)
def test_gpu_dtensor_tp_sp_losses_equal_the_nccl_backends(nranks):
    from _workers import torch_backend_gpu as G
    _losses_match(spawn(G.training, nranks, args=(free_port(), "tp"),
                        timeout=600))


@pytest.mark.slow   # torch.compile
@ranks_param(2)
def test_gpu_compiled_functional_collectives_run_on_symnccl(nranks):
    from _workers import torch_backend_gpu as G
    for r in spawn(G.compiled_funcol, nranks, args=(free_port(),),
                   timeout=600):
        assert r == {"equal": True, "symnccl ran": True,
                     "cuda graphs": True}, r


@pytest.mark.slow   # waits out a 5 s timeout
@ranks_param(2)
def test_gpu_a_rank_that_never_arrives_raises_through_work_wait(nranks):
    """PeerTimeoutError naming the last rank out of Work.wait(), within
    the group's timeout plus a few seconds; the GPU stays usable; after
    abort the ranks make a new symnccl group that works."""
    from _workers import torch_backend_gpu as G
    res = spawn(G.never_arrives, nranks, args=(free_port(), 5.0),
                timeout=600)
    for rank, r in enumerate(res[:-1]):
        assert r["raised"] == "PeerTimeoutError", r
        assert r["rank"] == nranks - 1, r
        assert 5.0 <= r["took"] < 15.0, r
        assert r["gpu usable"], r
    assert all(r["rebuilt"] for r in res), res
