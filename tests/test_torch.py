"""PyTorch integration: torch.distributed bootstrap, custom ops under
eager, torch.compile(fullgraph=True) and CUDA graphs."""
import pytest

from conftest import ranks_param, symnccl_ops_dispatched
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


@pytest.mark.slow   # spawned ranks compile a training-style step
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


@pytest.mark.slow   # ~30 s of torch.compile
@ranks_param(1, 2)
def test_sequence_parallel_block_compiled_and_in_one_cuda_graph(nranks):
    from _workers import autograd as A
    res = spawn(A.compiled_and_graphed, nranks, args=(free_port(), 11),
                timeout=600)
    for rank, r in enumerate(res):
        assert max(r["compiled"]) < 1e-5, (rank, r["compiled"])
        assert max(r["tp_compiled"]) < 1e-5, (rank, r["tp_compiled"])
        for diffs in r["graph"]:
            assert max(diffs) < 1e-5, (rank, r["graph"])
        assert r["requires_grad_ok"], rank
        assert r["inplace_grad"] == 2 * nranks, (rank, r["inplace_grad"])


class _MirrorComm:
    """A CPU stand-in for rank 0 of a 2-rank team whose ranks all hold the
    same tensor: a sum is 2x, a gather repeats x. Enough to tell the
    gradients apart (2x the gradient, or the gradient itself)."""
    rank, nranks = 0, 2

    def _reduced(self, x, op):
        return x * 2 if op == "sum" else x * x if op == "prod" else x.clone()

    def all_reduce(self, x, out=None, op="sum", algo="auto"):
        out = x if out is None else out
        return out.copy_(self._reduced(x, op))

    # out=None: a new tensor, as the methods make one
    def reduce_scatter(self, x, out=None, op="sum", algo="auto"):
        r = self._reduced(x, op)[:x.shape[0] // 2]
        return r.clone() if out is None else out.copy_(r)

    def all_gather(self, x, out=None, algo="auto"):
        r = torch.cat([x.reshape(-1, *x.shape[1:])] * 2)
        return r if out is None else out.copy_(r)

    def broadcast(self, x, root=0, out=None, algo="auto"):
        return out.copy_(x)

    def reduce(self, x, root=0, out=None, op="sum", algo="auto"):
        return out.copy_(self._reduced(x, op))


def _mirror():
    import symnccl.torch as snt
    return snt.wrap(_MirrorComm())


def _value_and_grad(f, x0, gy):
    x = x0.detach().clone().requires_grad_(True)
    y = f(x)
    y.backward(gy)
    return y.detach(), x.grad


def test_tp_pair_gradients_differ_from_all_reduce_as_documented():
    """On a 2-rank stand-in: tp_all_reduce sums forward and passes the
    gradient through; tp_copy passes x through and sums the gradient;
    all_reduce sums both ways. Eager and torch.compile(fullgraph=True)
    agree."""
    import symnccl.torch as snt
    comm = _mirror()
    x = torch.randn(6, 4, dtype=torch.float64)
    gy = torch.randn(6, 4, dtype=torch.float64)
    want = {  # op -> (y, dx)
        snt.tp_all_reduce: (2 * x, gy),
        snt.tp_copy: (x, 2 * gy),
        snt.all_reduce: (2 * x, 2 * gy),
    }
    for op, (wy, wdx) in want.items():
        for f in (lambda t: op(t, comm),
                  torch.compile(lambda t: op(t, comm), fullgraph=True,
                                backend="aot_eager")):
            y, dx = _value_and_grad(f, x, gy)
            assert torch.equal(y, wy) and torch.equal(dx, wdx), op.__name__
    # without autograd tp_copy is x itself, and runs nothing
    assert snt.tp_copy(x, comm) is x


@pytest.fixture
def cpu_eager():
    """Let the eager path take CPU tensors (its gate, _C._torch_eager, asks
    for CUDA ones), so that its autograd Functions run here on the
    stand-in communicator, through the same gate."""
    import symnccl.torch as snt
    snt._install_gate("is_cpu")
    yield
    snt._install_gate()


def test_eager_functions_give_the_ops_values_and_gradients(cpu_eager):
    """The eager path's autograd Functions and the custom ops' registered
    formulas: the same values and gradients for every op with a gradient,
    and the eager path dispatches no custom op (forward or backward)."""
    import symnccl.torch as snt
    comm = _mirror()
    ops = torch.ops.symnccl
    cid = comm.cid
    cases = [  # (name, public call, the op itself)
        ("all_reduce sum", lambda t: snt.all_reduce(t, comm),
         lambda t: ops.all_reduce(t, cid, "sum", "auto")),
        ("all_reduce avg", lambda t: snt.all_reduce(t, comm, op="avg"),
         lambda t: ops.all_reduce(t, cid, "avg", "auto")),
        ("all_reduce max", lambda t: snt.all_reduce(t, comm, op="max"),
         lambda t: ops.all_reduce(t, cid, "max", "auto")),
        ("reduce_scatter sum", lambda t: snt.reduce_scatter(t, comm),
         lambda t: ops.reduce_scatter(t, cid, "sum", "auto")),
        ("reduce_scatter avg",
         lambda t: snt.reduce_scatter(t, comm, op="avg"),
         lambda t: ops.reduce_scatter(t, cid, "avg", "auto")),
        ("all_gather", lambda t: snt.all_gather(t, comm),
         lambda t: ops.all_gather(t, cid, "auto")),
        ("broadcast", lambda t: snt.broadcast(t, comm, root=0),
         lambda t: ops.broadcast(t, cid, 0, "auto")),
        ("broadcast other root", lambda t: snt.broadcast(t, comm, root=1),
         lambda t: ops.broadcast(t, cid, 1, "auto")),
        ("reduce avg", lambda t: snt.reduce(t, comm, op="avg"),
         lambda t: ops.reduce(t, cid, 0, "avg", "auto")),
        ("tp_all_reduce", lambda t: snt.tp_all_reduce(t, comm),
         lambda t: ops.tp_all_reduce(t, cid, "auto")),
    ]
    x = torch.randn(8, 3, dtype=torch.float64)
    for name, public, op in cases:
        gy = _gy_like(op, x)
        (y1, dx1), n1 = symnccl_ops_dispatched(
            lambda: _value_and_grad(public, x, gy))
        (y2, dx2), n2 = symnccl_ops_dispatched(
            lambda: _value_and_grad(op, x, gy))
        assert n1 == 0 and n2 >= 1, (name, n1, n2)
        assert torch.equal(y1, y2) and torch.equal(dx1, dx2), name
    # without autograd, too; in place, with the version bump
    y, n = symnccl_ops_dispatched(lambda: snt.all_reduce(x, comm))
    assert n == 0 and torch.equal(y, 2 * x)
    t = x.clone()
    v = t._version
    _, n = symnccl_ops_dispatched(lambda: snt.all_reduce_(t, comm))
    assert n == 0 and torch.equal(t, 2 * x) and t._version > v
    # gradients that do not exist still say so
    with pytest.raises(NotImplementedError, match="all_reduce: op 'prod'"):
        _value_and_grad(lambda t: snt.all_reduce(t, comm, op="prod"), x,
                        torch.ones_like(x))


def _symnccl_frames(fn):
    """The names of the Python frames of symnccl's own that fn() enters."""
    import os
    import sys

    import symnccl
    root = os.path.dirname(symnccl.__file__)
    names = []

    def prof(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(root):
            names.append(frame.f_code.co_name)
    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return names


def test_eager_calls_enter_no_more_python_frames_than_counted(cpu_eager):
    """The eager path's Python cost, in symnccl's frames per call: the
    public function, the gate, _eager_call, the communicator's unwrap and
    the op's work (autograd recording: the Function's forward, the id
    lookup and the formula's setup instead of the unwrap). A frame more
    here is a cost on every eager call (docs/PERFORMANCE.md, 'Eager host
    path')."""
    import symnccl.torch as snt
    comm = _mirror()
    x = torch.randn(8, 3, dtype=torch.float64)
    xr = x.clone().requires_grad_(True)
    plain = ["_eager", "_eager_call", "_raw"]
    want = {
        "all_reduce": (lambda t: snt.all_reduce(t, comm),
                       plain + ["_all_reduce_impl"]),
        "reduce_scatter": (lambda t: snt.reduce_scatter(t, comm),
                           plain + ["_reduce_scatter_impl"]),
        "all_gather": (lambda t: snt.all_gather(t, comm),
                       plain + ["_all_gather_impl"]),
        "broadcast": (lambda t: snt.broadcast(t, comm),
                      plain + ["_broadcast_impl"]),
        "reduce": (lambda t: snt.reduce(t, comm), plain + ["_reduce_impl"]),
        "tp_all_reduce": (lambda t: snt.tp_all_reduce(t, comm),
                          plain + ["_tp_all_reduce_impl",
                                   "_all_reduce_impl"]),
    }
    for name, (f, frames) in want.items():
        f(x)
        assert _symnccl_frames(lambda: f(x)) == [name] + frames, name
    recorded = _symnccl_frames(lambda: snt.all_reduce(xr * 1, comm))
    assert recorded == ["all_reduce", "_eager", "_eager_call", "comm_id",
                        "forward", "get_communicator", "_all_reduce_impl",
                        "_setup_all_reduce"], recorded
    t = x.clone()
    assert _symnccl_frames(lambda: snt.all_reduce_(t, comm)) == [
        "all_reduce_", "_eager", "_raw"]


def _gy_like(f, x):
    """A fixed upstream gradient of f(x)'s shape."""
    with torch.no_grad():
        shape = f(x).shape
    g = torch.Generator().manual_seed(9)
    return torch.randn(shape, generator=g, dtype=x.dtype)


def test_compiled_graphs_hold_the_custom_ops_forward_and_backward():
    """torch.compile(fullgraph=True) of a tensor- and sequence-parallel
    block: AOTAutograd's forward graph calls the forward ops, its backward
    graph their transposes (tp_copy's all_reduce among them), and the
    results are eager's."""
    import symnccl.torch as snt
    from torch._dynamo.testing import AotEagerAndRecordGraphs
    comm = _mirror()
    w1 = torch.randn(8, 16, dtype=torch.float64, requires_grad=True)
    w2 = torch.randn(16, 8, dtype=torch.float64, requires_grad=True)

    def block(x):
        h = torch.nn.functional.gelu(snt.tp_copy(x, comm) @ w1)
        y = snt.tp_all_reduce(h @ w2, comm)
        z = snt.reduce_scatter(snt.all_gather(y, comm), comm)
        return snt.all_reduce(z, comm)

    x = torch.randn(4, 8, dtype=torch.float64)
    gy = torch.randn(4, 8, dtype=torch.float64)

    def run(f):
        w1.grad = w2.grad = None
        y, dx = _value_and_grad(f, x, gy)
        return y, dx, w1.grad, w2.grad

    torch._dynamo.reset()
    rec = AotEagerAndRecordGraphs()
    compiled = run(torch.compile(block, fullgraph=True, backend=rec))
    eager = run(block)
    for a, b in zip(compiled, eager):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)

    def called(graphs):
        return [n.target._schema.name.split("::")[1]
                for g in graphs for n in g.graph.nodes
                if n.op == "call_function" and
                getattr(n.target, "namespace", "") == "symnccl"]
    assert called(rec.fw_graphs) == ["tp_all_reduce", "all_gather",
                                     "reduce_scatter", "all_reduce"]
    assert called(rec.bw_graphs) == ["all_reduce", "all_gather",
                                     "reduce_scatter", "all_reduce"]


def test_frameworks_alloc_makes_tensors_of_like_s_dtype_and_device():
    """The methods that return a new tensor allocate it through
    symnccl._frameworks.alloc: torch's dtype and device, a plain tensor
    for a Parameter too, and None (symnccl allocates) for anything else."""
    from symnccl import _frameworks
    like = torch.empty(4, dtype=torch.bfloat16)
    t = _frameworks.alloc(like, (2, 3), 0)
    assert type(t) is torch.Tensor and t.shape == (2, 3)
    assert t.dtype == torch.bfloat16 and t.device == like.device
    p = torch.nn.Parameter(torch.empty(4, dtype=torch.float16))
    t = _frameworks.alloc(p, (5,), 0)
    assert type(t) is torch.Tensor and t.dtype == torch.float16
    assert not t.requires_grad
    assert _frameworks.alloc(object(), (5,), 0) is None


def test_eager_path_yields_to_compile_tracing_and_modes(cpu_eager):
    """With the eager path open to CPU tensors, everything that must see
    the custom ops still does: torch.compile's graphs, make_fx, a
    TorchDispatchMode, a TorchFunctionMode, torch.jit.trace."""
    import symnccl.torch as snt
    from torch._dynamo.testing import AotEagerAndRecordGraphs
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode
    comm = _mirror()
    x = torch.randn(6, 2)

    def f(t):
        return snt.all_reduce(t, comm, algo="ll")

    def ops_in(graph):
        return [str(n.target) for n in graph.nodes if n.op ==
                "call_function" and "symnccl" in str(n.target)]

    _, n = symnccl_ops_dispatched(lambda: f(x))
    assert n == 0   # the eager path is open
    torch._dynamo.reset()
    rec = AotEagerAndRecordGraphs()
    assert torch.equal(torch.compile(f, fullgraph=True, backend=rec)(x),
                       2 * x)
    assert ops_in(rec.fw_graphs[0].graph) == ["symnccl.all_reduce.default"]
    assert ops_in(make_fx(f)(x).graph) == ["symnccl.all_reduce.default"]

    class Names(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(str(func))
            return func(*args, **(kwargs or {}))

    with Names() as mode:
        f(x)
    assert "symnccl.all_reduce.default" in mode.seen

    class Funcs(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.seen.append(str(func))
            return func(*args, **(kwargs or {}))

    with Funcs() as fmode:
        f(x)
    assert any(s.startswith("symnccl.all_reduce") for s in fmode.seen), \
        fmode.seen
    traced = torch.jit.trace(f, (x,), check_trace=False)
    assert "symnccl::all_reduce" in str(traced.graph)
