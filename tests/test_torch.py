"""PyTorch integration: torch.distributed bootstrap, custom ops under
eager, torch.compile(fullgraph=True) and CUDA graphs."""
import pytest

from conftest import ranks_param
from symnccl.bootstrap import free_port, spawn

torch = pytest.importorskip("torch", reason="torch is not installed")


class _FakeComm:
    rank, nranks = 0, 4


def test_custom_ops_are_registered_with_fake_kernels():
    """Every op traces under FakeTensorMode with the shapes of
    torch.distributed's collectives (no GPU, no communicator)."""
    import symnccl.torch as snt
    cid = snt.comm_id(_FakeComm())
    from torch._subclasses.fake_tensor import FakeTensorMode
    ops = torch.ops.symnccl
    with FakeTensorMode():
        x = torch.empty(8, 3)
        assert ops.all_reduce(x, cid, "sum", "auto").shape == (8, 3)
        assert ops.all_reduce_(x, cid, "sum", "auto") is None
        assert ops.reduce_scatter(x, cid, "sum", "auto").shape == (2, 3)
        assert ops.all_gather(x, cid, "auto").shape == (32, 3)
        assert ops.all_gather(torch.empty(()), cid, "auto").shape == (4,)
        assert ops.broadcast(x, cid, 1, "auto").shape == (8, 3)
        assert ops.reduce(x, cid, 0, "sum", "one_shot").shape == (8, 3)
        with pytest.raises(ValueError, match="multiple of nranks \\(4\\)"):
            ops.reduce_scatter(torch.empty(6, 3), cid, "sum", "auto")


def test_every_op_has_an_autograd_formula():
    """The ops are registered with autograd: a backward through them is
    traced (by make_fx, as AOTAutograd does) into the transposed
    collectives, without a GPU."""
    import symnccl.torch as snt
    from torch.fx.experimental.proxy_tensor import make_fx
    cid = snt.comm_id(_FakeComm())
    ops = torch.ops.symnccl
    want = {  # forward op -> the ops its backward calls
        "all_reduce": lambda x: ops.all_reduce(x, cid, "sum", "ll"),
        "reduce_scatter": lambda x: ops.reduce_scatter(x, cid, "sum",
                                                       "auto"),
        "all_gather": lambda x: ops.all_gather(x, cid, "auto"),
        "broadcast": lambda x: ops.broadcast(x, cid, 0, "one_shot"),
        "reduce": lambda x: ops.reduce(x, cid, 0, "sum", "auto"),
    }
    transposed = {"all_reduce": "all_reduce", "reduce_scatter": "all_gather",
                  "all_gather": "reduce_scatter", "broadcast": "reduce",
                  "reduce": "broadcast"}
    def fwd_bwd(f):
        def run(x):
            y = f(x)
            return torch.autograd.grad(y, x, torch.ones_like(y))[0]
        return run
    for name, f in want.items():
        x = torch.empty(8, 3, requires_grad=True)
        g = make_fx(fwd_bwd(f), tracing_mode="fake")(x)
        called = [n.target._schema.name.split("::")[1]
                  for n in g.graph.nodes if n.op == "call_function" and
                  getattr(n.target, "namespace", "") == "symnccl"]
        assert called == [name, transposed[name]], (name, called)
    # ops without a gradient say so when the backward runs, never a wrong
    # gradient
    for name, f in (
            ("all_reduce", lambda x: ops.all_reduce(x, cid, "prod", "ll")),
            ("reduce_scatter",
             lambda x: ops.reduce_scatter(x, cid, "prod", "auto")),
            ("reduce", lambda x: ops.reduce(x, cid, 0, "max", "auto"))):
        x = torch.empty(8, 3, requires_grad=True)
        with pytest.raises(NotImplementedError, match=f"{name}: op"):
            make_fx(fwd_bwd(f), tracing_mode="fake")(x)


def test_the_private_torch_apis_symnccl_prefers_are_where_they_were():
    """symnccl reads torch's current raw stream (0.2 us instead of 4 for
    torch.cuda.current_stream) and shares unique ids through the default
    store; both have public fallbacks, and this fails when torch moves
    them, so that the fast paths are not lost silently."""
    import torch.distributed as dist
    assert callable(getattr(torch._C, "_cuda_getCurrentRawStream", None))
    assert callable(getattr(dist.distributed_c10d, "_get_default_store",
                            None))


def test_communicator_needs_torch_distributed():
    import symnccl.torch as snt
    if torch.distributed.is_initialized():
        pytest.skip("torch.distributed is initialized in this process")
    with pytest.raises(RuntimeError, match="init_process_group"):
        snt.communicator()


@ranks_param(2)
def test_torch_bootstrap_eager_compile_and_graph(nranks):
    from _workers import torch_integration as T
    res = spawn(T.run, nranks, args=(free_port(),), timeout=600)
    for rank, r in enumerate(res):
        assert r["devices"] == (rank, rank)
        assert r["eager_out"] and r["eager_inplace"], r
        assert r["compiled"], r
        assert r["graph"], r
        assert r["delegates"], r


@ranks_param(1, 2)
def test_gradients_equal_torch_distributed(nranks):
    """Forward values and gradients of every op equal torch.distributed's
    differentiable collectives on the same random inputs and upstream
    gradients (float32 and bfloat16); with a symnccl algo both passes ran
    its kernels: the forward's and its transpose's, once each."""
    from _workers import autograd as A
    res = spawn(A.differentiable_ops, nranks, args=(free_port(), 7),
                timeout=600)
    kernels = {  # case -> the launches of its forward and backward
        "all_reduce sum ll": {"ll": 2},
        "reduce_scatter sum push": {"push_reduce_scatter": 1,
                                    "push_all_gather": 1},
        "all_gather ll": {"ll_all_gather": 1, "ll_reduce_scatter": 1},
        "broadcast one_shot": {"one_shot_broadcast": 1,
                               "one_shot_reduce": 1},
        "reduce one_shot": {"one_shot_reduce": 1, "one_shot_broadcast": 1},
    }
    seen = set()
    for rank, rows in enumerate(res):
        for case, dy, dx, tol, ran in rows:
            assert dy <= tol and dx <= tol, (rank, case, dy, dx, tol)
            name = case.rsplit(" ", 1)[0]   # less the dtype
            if name in kernels:
                seen.add(name)
                assert ran == kernels[name], (case, ran)
    assert seen == set(kernels), seen


@ranks_param(1, 2)
def test_sequence_parallel_block_compiled_and_in_one_cuda_graph(nranks):
    from _workers import autograd as A
    res = spawn(A.compiled_and_graphed, nranks, args=(free_port(), 11),
                timeout=600)
    for rank, r in enumerate(res):
        assert max(r["compiled"]) < 1e-5, (rank, r["compiled"])
        for diffs in r["graph"]:
            assert max(diffs) < 1e-5, (rank, r["graph"])
        assert r["requires_grad_ok"], rank
        assert r["inplace_grad"] == 2 * nranks, (rank, r["inplace_grad"])
