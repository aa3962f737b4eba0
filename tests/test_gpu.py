"""GPU tier, one GPU: a 1-rank communicator, zero-copy views per framework,
buffer lifetime, streams and CUDA graphs."""
import numpy as np
import pytest

import symnccl
from symnccl import _check
from conftest import one_rank_comm

pytestmark = pytest.mark.gpu


@pytest.fixture
def comm(_module_comms):
    return one_rank_comm(_module_comms)


def test_one_rank_communicator_properties(comm):
    assert (comm.rank, comm.nranks, comm.device) == (0, 1, 0)
    assert comm.symmetric, comm.symmetric_reason
    assert comm.lsa_size == 1
    assert comm.multicast is False and comm.multicast_reason
    assert "rank=0 nranks=1" in repr(comm)


def test_empty_registers_one_window_and_zeros_is_zero(comm):
    b = comm.zeros((3, 1000), "bfloat16")
    assert b.registered and b.shape == (3, 1000) and b.nbytes == 6000
    assert not any(b.to_bytes())


def test_torch_view_is_zero_copy(comm):
    torch = pytest.importorskip("torch")
    b = comm.empty((17, 3), "bfloat16")
    t = torch.from_dlpack(b)
    assert t.data_ptr() == b.ptr and t.dtype == torch.bfloat16
    assert t.shape == (17, 3) and t.device == torch.device("cuda", 0)


def test_cupy_view_is_zero_copy(comm):
    cupy = pytest.importorskip("cupy")
    b = comm.empty(1001, "float32")
    a = cupy.from_dlpack(b)
    assert a.data.ptr == b.ptr and a.shape == (1001,)


def test_jax_view_is_zero_copy(comm):
    jax = pytest.importorskip("jax")
    b = comm.empty(4096, "float32")
    b.copy_from_host(np.arange(4096, dtype=np.float32))
    a = jax.dlpack.from_dlpack(b)
    assert a.unsafe_buffer_pointer() == b.ptr
    assert float(a.sum()) == float(np.arange(4096, dtype=np.float32).sum())


@pytest.mark.parametrize("dtype", symnccl.DTYPES)
def test_all_reduce_one_rank_every_dtype_is_identity(comm, dtype):
    npdt = _check.numpy_dtype(dtype)
    if npdt is None:
        pytest.skip("ml_dtypes is not installed")
    x, y = comm.empty(4099, dtype), comm.empty(4099, dtype)
    for op in symnccl.OPS:
        ins = [_check.make_input(dtype, 4099, 0, 3, op)]
        x.copy_from_host(ins[0].view(np.uint8))
        y.copy_from_host(_check.poison(y.nbytes))
        comm.all_reduce(x, out=y, op=op)
        assert _check.count_wrong(np.frombuffer(y.to_bytes(), npdt), op, ins,
                                  dtype) == 0


def test_torch_in_place_returns_the_same_tensor(comm):
    torch = pytest.importorskip("torch")
    t = torch.randn(1000, device="cuda")
    assert comm.all_reduce(t) is t


def test_jax_all_reduce_returns_new_jax_array(comm):
    jax = pytest.importorskip("jax")
    x = jax.numpy.arange(1000, dtype=jax.numpy.float32)
    y = comm.all_reduce(x)
    assert isinstance(y, jax.Array) and y is not x
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x))


def test_cupy_out_of_place_returns_cupy(comm):
    cupy = pytest.importorskip("cupy")
    # host copies in and out, no cupy kernel: each would be compiled at
    # first use (seconds of NVRTC)
    host = np.arange(1000, dtype=np.float32)
    x = cupy.asarray(host)
    out = cupy.asarray(np.full(1000, np.nan, dtype=np.float32))
    assert comm.all_reduce(x, out=out) is out
    np.testing.assert_array_equal(cupy.asnumpy(out), host)
    g = comm.all_gather(x)
    assert isinstance(g, cupy.ndarray) and g.shape == (1000,)
    np.testing.assert_array_equal(cupy.asnumpy(g), host)


def test_closed_communicator_refuses_ops(uid):
    torch = pytest.importorskip("torch")
    c = symnccl.Communicator(uid, 0, 1, device=0)
    c.close()
    with pytest.raises(RuntimeError, match="is closed"):
        c.all_reduce(torch.ones(3, device="cuda"))
    with pytest.raises(RuntimeError, match="is closed"):
        c.empty(10)


def test_context_manager_closes(uid):
    with symnccl.Communicator(uid, 0, 1, device=0) as c:
        assert not c.closed
    assert c.closed


def test_view_outlives_buffer_and_communicator(uid):
    torch = pytest.importorskip("torch")
    c = symnccl.Communicator(uid, 0, 1, device=0)
    b = c.empty(1 << 20, "float32")
    t = torch.from_dlpack(b)
    t.fill_(3.0)
    del b
    c.close()
    assert float(t.sum()) == 3.0 * (1 << 20)


def test_window_lives_while_a_view_does_and_goes_with_the_last(uid):
    """The buffer object may die first: its window stays registered (and its
    memory allocated) while a DLPack view lives, and both go when the last
    view dies, before the communicator closes."""
    torch = pytest.importorskip("torch")
    c = symnccl.Communicator(uid, 0, 1, device=0)
    base = c._windows            # the staging window
    free0 = torch.cuda.mem_get_info(0)[0]
    b = c.empty(64 << 20, "float32")
    t = torch.from_dlpack(b)
    assert c._windows == base + 1
    del b
    assert c._windows == base + 1
    t.fill_(2.0)
    assert float(t[-1]) == 2.0
    del t
    assert c._windows == base
    # 256 MiB of ncclMemAlloc went back (allow for other allocations)
    assert torch.cuda.mem_get_info(0)[0] > free0 - (16 << 20)
    c.close()


def test_abort_is_final(uid):
    c = symnccl.Communicator(uid, 0, 1, device=0)
    c.abort()
    assert c.closed and "aborted" in repr(c)
    c.close()


def test_torch_cuda_graph_capture_and_replay(comm):
    torch = pytest.importorskip("torch")
    x = torch.randn(4099, device="cuda")
    out = torch.empty_like(x)
    comm.all_reduce(x, out=out)   # NCCL connects lazily: once eagerly
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    # the graph holds the call's kernel (on one rank the result is a copy
    # of x: the launch counter proves which kernel made it)
    kernel = symnccl._C.ALGO_KERNELS[comm._auto_algo(x.numel() * 4,
                                                     "float32", "max",
                                                     False)][0]
    before = comm._launches()[kernel]
    with torch.cuda.graph(g):
        comm.all_reduce(x, out=out, op="max")
    assert comm._launches()[kernel] == before + 1
    for _ in range(3):
        x.copy_(torch.randn(4099, device="cuda"))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, x)


@pytest.mark.parametrize("form", ["object", "int"])
@pytest.mark.parametrize("algo", ["ll", "nccl"])
def test_explicit_stream_is_the_stream_the_op_runs_on(comm, form, algo):
    """The op is enqueued on stream=: captured into a graph on that stream
    (a launch on any other stream would not be in the graph, or would fail
    the capture), it writes its output on every replay."""
    torch = pytest.importorskip("torch")
    s = torch.cuda.Stream()
    arg = s if form == "object" else s.cuda_stream
    x = torch.arange(4099, dtype=torch.float32, device="cuda")
    out = torch.empty_like(x)
    with torch.cuda.stream(s):
        comm.all_reduce(x, out=out, algo=algo, stream=arg)   # eager first
    s.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        comm.all_reduce(x, out=out, algo=algo, stream=arg)
    for k in range(2):
        x.add_(1.0)
        out.fill_(float("nan"))
        torch.cuda.synchronize()
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, x), (form, algo, k)


def test_bad_stream_argument_is_refused(comm):
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="stream must be"):
        comm.all_reduce(torch.ones(4, device="cuda"), stream="fast")


def test_multicast_reported_unavailable_and_multimem_refused(comm):
    """Where multicast is disabled (the lent machines), no communicator asks
    for it, and algo='multimem' raises naming why; auto never picks it."""
    import os
    if not any(os.environ.get(k) for k in (
            "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
            "NVSHMEM_DISABLE_NVLS")) and comm.multicast:
        pytest.skip("multicast is enabled and granted here")
    assert comm.multicast is False
    assert comm.multicast_reason
    assert not symnccl.algo_supported(comm, "multimem", "bfloat16")
    x = comm.empty(1024, "bfloat16")
    with pytest.raises(ValueError, match="algo 'multimem' cannot run") as e:
        comm.all_reduce(x, algo="multimem")
    assert comm.multicast_reason in str(e.value)
    comm.all_reduce(x)   # auto still works


@pytest.mark.parametrize("algo", ["ll", "ll128", "one_shot", "two_shot",
                                  "push", "lamport", "nccl"])
def test_each_algorithm_runs_its_own_kernel_on_one_rank(comm, algo):
    """algo=X launches X's kernel and no other (launch counters), and one
    rank's result is its input, bit for bit (lamport: float dtypes)."""
    for dtype in ("float32", "bfloat16", "int64"):
        npdt = _check.numpy_dtype(dtype)
        if npdt is None or (algo == "lamport" and
                            not symnccl.algo_supported(comm, algo, dtype)):
            continue
        x = _check.make_input(dtype, 1031, 0, 3)
        b = comm.empty(1031, dtype)
        b.copy_from_host(x.tobytes())
        before = comm._launches()
        comm.all_reduce(b, algo=algo)
        after = comm._launches()
        ran = {k for k in after if after[k] != before[k]}
        assert ran == {algo}, (algo, dtype, ran)
        assert after[algo] == before[algo] + 1
        assert b.to_bytes() == x.tobytes(), (algo, dtype)


def test_torch_fast_path_keeps_dlpack_rules(comm):
    """torch tensors skip __dlpack__ only where it would be a no-op: one
    used on another stream still gets DLPack's stream handshake (correct
    result). Tensors that require grad are taken as torch.distributed
    takes them, outside autograd, on both paths (torch's own __dlpack__
    refuses them)."""
    torch = pytest.importorskip("torch")
    x = torch.full((8,), 3.0, device="cuda", requires_grad=True)
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    for stream in (None, side):   # fast path, DLPack path
        out = torch.zeros(8, device="cuda", requires_grad=True)
        comm.all_reduce(x, out=out, stream=stream)
        torch.cuda.synchronize()
        assert (out == 3).all() and out.requires_grad
    assert comm.all_reduce(x) is x and x.requires_grad   # in place
    y = torch.arange(4099, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    y.mul_(2)   # queued on the current stream
    out = torch.empty_like(y)
    comm.all_reduce(y, out=out, stream=side)   # must see the mul_
    side.synchronize()
    assert torch.equal(out, torch.arange(4099, device="cuda") * 2.0)
    # the fast path proper: window view and plain tensor, every LSA algo.
    # On one rank an all-reduce is the identity, so each call must also be
    # seen to launch its algorithm's kernel (an in-place no-op would leave
    # b as it was), and out= starts poisoned.
    b = torch.from_dlpack(comm.empty(1031, "bfloat16"))
    for algo in ("ll", "ll128", "one_shot", "two_shot", "push", "lamport",
                 "nccl"):
        kernel = (symnccl._C.ALGO_KERNELS[algo] or ("nccl",))[0]
        before = comm._launches()[kernel]
        b.fill_(3)
        comm.all_reduce(b, algo=algo)
        t = torch.full((1031,), 5.0, device="cuda")
        r = comm.all_reduce(t, out=torch.full_like(t, float("nan")),
                            algo=algo)
        assert bool((b == 3).all()) and bool((r == 5).all()), algo
        assert comm._launches()[kernel] == before + 2, algo


@pytest.mark.parametrize("multicast", [None, True])
def test_multicast_is_not_requested_for_one_rank(uid, multicast):
    """NCCL 2.28.9 would accept the request and then fail every window
    registration on a system without NVLS (seen on one H100)."""
    c = symnccl.Communicator(uid, 0, 1, device=0, timeout=60,
                             multicast=multicast)
    assert c.multicast is False
    assert "not requested" in c.multicast_reason or \
        "disabled" in c.multicast_reason, c.multicast_reason
    c.empty(16, "float32")   # windows register
    c.close()


def test_symnccl_algo_is_read_at_creation_and_checked(uid, monkeypatch):
    monkeypatch.setenv("SYMNCCL_ALGO", "oneshot")
    with pytest.raises(ValueError, match="SYMNCCL_ALGO=oneshot is not an "
                                         "algorithm"):
        symnccl.Communicator(uid, 0, 1, device=0)
    monkeypatch.setenv("SYMNCCL_ALGO", "one_shot")
    with symnccl.Communicator(uid, 0, 1, device=0) as c:
        monkeypatch.delenv("SYMNCCL_ALGO")
        assert c.knobs["SYMNCCL_ALGO"] == "one_shot"
        # every knob of the table, each as read, but the process's own (read at exit, not per communicator)
        assert set(c.knobs) == {"SYMNCCL_ALGO", *symnccl._C.KNOBS} - \
            {"SYMNCCL_EXIT_TIMEOUT"}
        assert c.knobs["SYMNCCL_RMSNORM_LOCAL_CTAS"] == 0
        x = _check.make_input("float32", 517, 0, 3)
        b = c.empty(517, "float32")
        b.copy_from_host(x.tobytes())
        c.all_reduce(b)   # auto -> one_shot, fixed at creation
        assert c._launches()["one_shot"] == 1
        assert sum(c._launches().values()) == 1
        assert b.to_bytes() == x.tobytes()


def test_auto_runs_the_algorithm_the_registry_picks(comm):
    torch = pytest.importorskip("torch")
    for nbytes in (4096, 512 << 10, 8 << 20):
        x = torch.randn(nbytes // 4, device="cuda")
        want = comm._auto_algo(nbytes, "float32", "sum", False)
        kernels = symnccl._C.ALGO_KERNELS[want] or ("nccl",)
        before = comm._launches()
        comm.all_reduce(x)
        after = comm._launches()
        ran = {k for k in after if after[k] != before[k]}
        assert ran and ran <= set(kernels), (nbytes, want, ran)


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", [1, 0])
def test_programmatic_launch_waits_for_the_kernel_before_it(uid, pdl,
                                                            monkeypatch):
    """With SYMNCCL_PDL=1 a kernel may be launched while the kernel before
    it on the stream still runs (symnccl's own kernels let the next launch
    begin at their entry): it must still read what that kernel wrote. A
    chain of all-reduces, each reading the output of the one before, after
    a torch fill_; eager and inside a CUDA graph, every kernel algorithm,
    each launch proven by its counter."""
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("SYMNCCL_PDL", str(pdl))
    with symnccl.Communicator(uid, 0, 1, device=0, timeout=60) as c:
        assert c.knobs["SYMNCCL_PDL"] == pdl
        for algo in ("ll", "ll128", "one_shot", "two_shot", "push",
                     "lamport"):
            count = (4 << 20) + 3 if algo in ("one_shot", "two_shot",
                                              "push") else 4099
            bufs = [torch.empty(count, device="cuda") for _ in range(5)]

            def chain(value):
                bufs[0].fill_(value)
                for a, b in zip(bufs, bufs[1:]):
                    c.all_reduce(a, out=b, algo=algo)
            before = c._launches()[algo]
            for k in range(4):
                chain(float(k + 1))
                torch.cuda.synchronize()
                assert bool((bufs[-1] == k + 1).all()), (algo, pdl, k)
            assert c._launches()[algo] == before + 16
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                chain(7.0)
            for k in range(3):
                bufs[-1].zero_()
                g.replay()
                torch.cuda.synchronize()
                assert bool((bufs[-1] == 7).all()), (algo, pdl, "graph", k)
            del g
