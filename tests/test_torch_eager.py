"""GPU tier, one GPU: symnccl.torch's eager path (the Communicator's
methods without the custom ops' dispatch) against the custom ops that
torch.compile keeps, and the tensor-parallel pair (tp_copy, tp_all_reduce)
against a single-GPU model, at 1 rank and on loopback teams."""
import pytest

import symnccl
from conftest import one_rank_comm, symnccl_ops_dispatched

torch = pytest.importorskip("torch", reason="torch is not installed")
snt = pytest.importorskip("symnccl.torch")

pytestmark = pytest.mark.gpu

F = torch.nn.functional


@pytest.fixture
def comm(_module_comms):
    return one_rank_comm(_module_comms, snt.wrap)


# (name, call, input shape): every public op, with the arguments that
# give it a gradient
OPS = [
    ("all_reduce sum", lambda x, c: snt.all_reduce(x, c), (1031, 3)),
    ("all_reduce avg ll",
     lambda x, c: snt.all_reduce(x, c, op="avg", algo="ll"), (517,)),
    ("all_reduce max", lambda x, c: snt.all_reduce(x, c, op="max"), (1031,)),
    ("reduce_scatter", lambda x, c: snt.reduce_scatter(x, c), (64, 5)),
    ("reduce_scatter avg ll",
     lambda x, c: snt.reduce_scatter(x, c, op="avg", algo="ll"), (64, 5)),
    ("all_gather", lambda x, c: snt.all_gather(x, c), (33, 7)),
    ("broadcast", lambda x, c: snt.broadcast(x, c, root=0), (1031,)),
    ("reduce", lambda x, c: snt.reduce(x, c, root=0, algo="one_shot"),
     (1031,)),
    ("tp_all_reduce", lambda x, c: snt.tp_all_reduce(x, c), (257, 4)),
    ("tp_copy", lambda x, c: snt.tp_copy(x, c, algo="ll"), (257, 4)),
]
OP_IDS = [o[0] for o in OPS]


def _fwd_bwd(f, x0, gy_seed=5):
    """(y, dL/dx) for L = sum(y * gy), gy random of y's shape."""
    x = x0.detach().clone().requires_grad_(True)
    y = f(x)
    g = torch.Generator(device="cpu").manual_seed(gy_seed)
    gy = torch.randn(y.shape, generator=g).to(y.dtype).cuda()
    y.backward(gy)
    torch.cuda.synchronize()
    return y.detach(), x.grad.detach()


def _same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.detach().flatten().view(torch.uint8),
        b.detach().flatten().view(torch.uint8))


def _input(shape, dtype, seed=3):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return (torch.randn(shape, generator=g) + 0.1).to(dtype).cuda()


@pytest.mark.parametrize("name,call,shape", OPS, ids=OP_IDS)
def test_eager_calls_dispatch_no_custom_op(comm, name, call, shape):
    """In eager mode the ops run the method directly: the profiler sees no
    symnccl:: op, without autograd and with it (forward and backward)."""
    x = _input(shape, torch.float32)
    _, n = symnccl_ops_dispatched(lambda: call(x, comm))
    assert n == 0, name
    _, n = symnccl_ops_dispatched(lambda: _fwd_bwd(lambda t: call(t, comm),
                                                   x))
    assert n == 0, name


@pytest.mark.parametrize("name,call,shape", OPS, ids=OP_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16],
                         ids=["float32", "bfloat16"])
def test_eager_and_compiled_give_the_same_bits(comm, name, call, shape,
                                               dtype):
    """torch.compile(fullgraph=True) keeps the custom ops (forward and
    backward) and gives the eager path's bits, values and gradients."""
    from torch._dynamo.testing import AotEagerAndRecordGraphs
    torch._dynamo.reset()
    x = _input(shape, dtype)
    eager = _fwd_bwd(lambda t: call(t, comm), x)
    compiled = _fwd_bwd(torch.compile(lambda t: call(t, comm),
                                      fullgraph=True), x)
    for a, b in zip(eager, compiled):
        assert _same_bits(a, b), name
    # the ops are in the graphs that AOTAutograd traces
    rec = AotEagerAndRecordGraphs()
    torch._dynamo.reset()
    _, n = symnccl_ops_dispatched(lambda: _fwd_bwd(
        torch.compile(lambda t: call(t, comm), fullgraph=True, backend=rec),
        x))
    assert n >= 1, name   # the compiled graph dispatches them
    held = [str(node.target) for g in rec.fw_graphs + rec.bw_graphs
            for node in g.graph.nodes
            if node.op == "call_function" and "symnccl" in str(node.target)]
    assert held, name


def test_in_place_eager_call_bumps_the_version_as_the_op_does(comm):
    """autograd's check of saved tensors sees the in-place write: a tensor
    saved for backward and then reduced in place makes backward raise, as
    with the custom op."""
    w = torch.randn(8, device="cuda", requires_grad=True)
    x = torch.randn(8, device="cuda")
    y = (w * x).sum()          # saves x for w's gradient
    v = x._version
    _, n = symnccl_ops_dispatched(lambda: snt.all_reduce_(x, comm))
    assert n == 0 and x._version > v
    with pytest.raises(RuntimeError, match="modified by an inplace"):
        y.backward()


def test_a_dispatch_mode_sees_the_custom_ops(comm):
    """A TorchDispatchMode (a tracer, a logger) is never bypassed: with one
    active the calls dispatch the ops, and the mode sees them."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(str(func))
            return func(*args, **(kwargs or {}))

    x = _input((64,), torch.float32)
    with Seen() as mode:
        y = snt.all_reduce(x, comm)
        snt.all_reduce_(x, comm)
        z = snt.tp_all_reduce(x, comm)
    assert "symnccl.all_reduce.default" in mode.names, mode.names
    assert "symnccl.all_reduce_.default" in mode.names, mode.names
    assert "symnccl.tp_all_reduce.default" in mode.names, mode.names
    assert torch.equal(y, z)


def test_eager_errors_are_the_ops_errors(comm):
    x = _input((6, 3), torch.float32)
    with pytest.raises(ValueError, match="contiguous"):
        snt.all_reduce_(x.t(), comm)
    with pytest.raises(ValueError, match="op 'nope' is not supported"):
        snt.all_reduce(x, comm, op="nope")
    with pytest.raises(NotImplementedError, match="all_reduce: op 'prod'"):
        _fwd_bwd(lambda t: snt.all_reduce(t, comm, op="prod"), x)


# -------------------------------------------------- the tensor-parallel pair

T, H, FF = 16, 32, 64   # tokens, hidden, ffn (a multiple of 1, 2, 3, 4)


def _full_params(dtype, seed=17):
    g = torch.Generator(device="cpu").manual_seed(seed)
    p = [torch.randn(H, FF, generator=g) / H ** 0.5,
         torch.randn(FF, generator=g) / 10,
         torch.randn(FF, H, generator=g) / FF ** 0.5,
         torch.randn(H, generator=g) / 10]
    return [t.to(dtype).cuda() for t in p]


def _shard(params, q, n):
    """Rank q's Megatron slices: w1 and b1 by columns, w2 by rows, b2
    whole."""
    w1, b1, w2, b2 = params
    cols = slice(q * FF // n, (q + 1) * FF // n)
    return [t.detach().clone().requires_grad_(True)
            for t in (w1[:, cols], b1[cols], w2[cols, :], b2)]


def _reference(x, params):
    w1, b1, w2, b2 = params
    return F.gelu(x @ w1 + b1) @ w2 + b2


def _tp(x, params, comm, algo="auto", copy=None, reduce=None):
    """The column-parallel then row-parallel MLP, on symnccl's pair (or the
    stand-ins given)."""
    copy = copy or snt.tp_copy
    reduce = reduce or snt.tp_all_reduce
    w1, b1, w2, b2 = params
    h = F.gelu(copy(x, comm, algo=algo) @ w1 + b1)
    return reduce(h @ w2, comm, algo=algo) + b2


def _ref_grads(x0, params, gy):
    x = x0.detach().clone().requires_grad_(True)
    ps = [p.detach().clone().requires_grad_(True) for p in params]
    y = _reference(x, ps)
    y.backward(gy)
    return y.detach(), x.grad, [p.grad for p in ps]


def _rel(a, b):
    a, b = a.double(), b.double()
    return float(((a - b).abs() / (b.abs() + 1)).max())


TOL = {torch.float64: 1e-12, torch.float32: 1e-5}


def _check_rank(q, n, ref, y, xg, grads, dtype):
    """Rank q's output and gradients against the single-GPU model's."""
    ry, rx, (rw1, rb1, rw2, rb2) = ref
    cols = slice(q * FF // n, (q + 1) * FF // n)
    want = [ry, rx, rw1[:, cols], rb1[cols], rw2[cols, :], rb2]
    got = [y, xg, *grads]
    names = ["y", "dx", "dw1", "db1", "dw2", "db2"]
    for name, a, b in zip(names, got, want):
        assert a.shape == b.shape, (q, name)
        assert _rel(a, b) <= TOL[dtype], (q, name, _rel(a, b))


def _data(dtype, seed=23):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(dtype).cuda()
    gy = torch.randn(T, H, generator=g).to(dtype).cuda()
    return x, gy


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32],
                         ids=["float64", "float32"])
def test_tp_mlp_one_rank_eager_compiled_and_graph_match_the_model(comm,
                                                                  dtype):
    params = _full_params(dtype)
    x0, gy = _data(dtype)
    ref = _ref_grads(x0, params, gy)

    def step(fn):
        x = x0.detach().clone().requires_grad_(True)
        ps = _shard(params, 0, 1)
        y = fn(x, ps)
        y.backward(gy)
        torch.cuda.synchronize()
        return y.detach(), x.grad, [p.grad for p in ps]

    eager = step(lambda x, ps: _tp(x, ps, comm))
    _check_rank(0, 1, ref, eager[0], eager[1], eager[2], dtype)
    torch._dynamo.reset()
    compiled = step(torch.compile(lambda x, ps: _tp(x, ps, comm),
                                  fullgraph=True))
    _check_rank(0, 1, ref, compiled[0], compiled[1], compiled[2], dtype)

    # forward and backward captured in one CUDA graph, replayed
    xs = x0.detach().clone().requires_grad_(True)
    ps = _shard(params, 0, 1)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            xs.grad = None
            for p in ps:
                p.grad = None
            _tp(xs, ps, comm).backward(gy)
    torch.cuda.current_stream().wait_stream(s)
    xs.grad = None
    for p in ps:
        p.grad = None
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ys = _tp(xs, ps, comm)
        ys.backward(gy)
    g.replay()
    torch.cuda.synchronize()
    _check_rank(0, 1, ref, ys.detach(), xs.grad, [p.grad for p in ps],
                dtype)


def _loopback_team(monkeypatch, n):
    from test_loopback import _team
    return _team(monkeypatch, n)


@pytest.mark.parametrize("nranks", [2, 4])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32],
                         ids=["float64", "float32"])
@pytest.mark.parametrize("algo", ["one_shot", "ll"])
def test_tp_mlp_on_a_loopback_team_matches_the_model(monkeypatch, nranks,
                                                     dtype, algo):
    """Every rank of a loopback team runs its slices of the MLP: its output
    is the model's, its weights' gradients are the model's slices, and the
    input's gradient is the model's (tp_copy sums the ranks' parts); then
    the same step captured in a CUDA graph per rank and replayed."""
    from test_loopback import _close
    team = [snt.wrap(c) for c in _loopback_team(monkeypatch, nranks)]
    streams = [torch.cuda.Stream() for _ in team]
    params = _full_params(dtype)
    x0, gy = _data(dtype)
    ref = _ref_grads(x0, params, gy)
    try:
        xs = [x0.detach().clone().requires_grad_(True) for _ in team]
        ps = [_shard(params, q, nranks) for q in range(nranks)]
        torch.cuda.synchronize()

        def ident(t, c, algo):
            return t

        # Load every kernel of the step before ranks wait on each other
        # (csrc/runtime/loopback.c: a kernel's first launch waits for running
        # ones): the step with stand-ins for the pair, then the team's
        # all_reduce of this shape and algo.
        for q, s in enumerate(streams):
            with torch.cuda.stream(s):
                _tp(xs[q], ps[q], None, copy=ident, reduce=ident
                    ).backward(gy)
        torch.cuda.synchronize()
        warm = [torch.zeros(T, H, dtype=dtype, device="cuda") for _ in team]
        for c, s, w in zip(team, streams, warm):
            c.all_reduce(w, algo=algo, stream=s)
        torch.cuda.synchronize()

        def clear():
            for q in range(nranks):
                xs[q].grad = None
                for p in ps[q]:
                    p.grad = None

        clear()
        ys = [None] * nranks
        for q, (c, s) in enumerate(zip(team, streams)):
            with torch.cuda.stream(s):
                ys[q] = _tp(xs[q], ps[q], c, algo=algo)
        for q, s in enumerate(streams):
            with torch.cuda.stream(s):
                ys[q].backward(gy)
        torch.cuda.synchronize()
        for q in range(nranks):
            _check_rank(q, nranks, ref, ys[q].detach(), xs[q].grad,
                        [p.grad for p in ps[q]], dtype)

        # one CUDA graph per rank (captured after the eager step loaded
        # every kernel), replayed on every rank's stream
        clear()
        graphs = []
        for q, (c, s) in enumerate(zip(team, streams)):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=s):
                ys[q] = _tp(xs[q], ps[q], c, algo=algo)
                ys[q].backward(gy)
            graphs.append(g)
        torch.cuda.synchronize()
        for g, s in zip(graphs, streams):
            with torch.cuda.stream(s):
                g.replay()
        torch.cuda.synchronize()
        for q in range(nranks):
            _check_rank(q, nranks, ref, ys[q].detach(), xs[q].grad,
                        [p.grad for p in ps[q]], dtype)
    finally:
        _close([c.comm for c in team])


def test_all_reduce_in_place_of_tp_all_reduce_gives_n_times_the_gradient(
        monkeypatch):
    """Why the pair exists: closing the row-parallel layer with all_reduce
    (torch.distributed.nn's gradient) multiplies the weights' gradients by
    the number of ranks; tp_all_reduce gives the model's."""
    from test_loopback import _close
    n, dtype, algo = 2, torch.float64, "one_shot"
    team = [snt.wrap(c) for c in _loopback_team(monkeypatch, n)]
    streams = [torch.cuda.Stream() for _ in team]
    params = _full_params(dtype)
    x0, gy = _data(dtype)
    ref = _ref_grads(x0, params, gy)

    def ar(t, c, algo):
        return snt.all_reduce(t, c, algo=algo)

    try:
        ps = [_shard(params, q, n) for q in range(n)]
        x = x0.detach().clone()
        torch.cuda.synchronize()
        for q, s in enumerate(streams):   # load the kernels (see above)
            with torch.cuda.stream(s):
                _tp(x, ps[q], None, copy=lambda t, c, algo: t,
                    reduce=lambda t, c, algo: t).backward(gy)
        torch.cuda.synchronize()
        for p in [p for r in ps for p in r]:
            p.grad = None
        ys = []
        for q, (c, s) in enumerate(zip(team, streams)):
            with torch.cuda.stream(s):
                ys.append(_tp(x, ps[q], c, algo=algo, reduce=ar))
        for y, s in zip(ys, streams):
            with torch.cuda.stream(s):
                y.backward(gy)
        torch.cuda.synchronize()
        cols = slice(0, FF // n)
        ratio = ps[0][2].grad / ref[2][2][cols, :]
        assert torch.allclose(ratio, torch.full_like(ratio, n)), ratio
    finally:
        _close([c.comm for c in team])


@pytest.mark.parametrize("nranks", [2, 3])
def test_eager_path_and_custom_ops_give_the_same_bits_on_a_team(
        monkeypatch, nranks):
    """At several ranks the eager path and the custom ops (called through
    torch.ops.symnccl) run the same kernels on the same bytes: values and
    gradients are bitwise equal."""
    from test_loopback import _close
    team = [snt.wrap(c) for c in _loopback_team(monkeypatch, nranks)]
    streams = [torch.cuda.Stream() for _ in team]
    ops = torch.ops.symnccl
    cases = [  # (name, eager call, op call, input shape)
        ("all_reduce sum",
         lambda x, c: snt.all_reduce(x, c, algo="one_shot"),
         lambda x, c: ops.all_reduce(x, c.cid, "sum", "one_shot"),
         (1031,)),
        ("all_reduce avg",
         lambda x, c: snt.all_reduce(x, c, op="avg", algo="ll"),
         lambda x, c: ops.all_reduce(x, c.cid, "avg", "ll"), (1031,)),
        ("reduce_scatter",
         lambda x, c: snt.reduce_scatter(x, c, algo="ll"),
         lambda x, c: ops.reduce_scatter(x, c.cid, "sum", "ll"),
         (nranks * 129, 3)),
        ("all_gather", lambda x, c: snt.all_gather(x, c, algo="push"),
         lambda x, c: ops.all_gather(x, c.cid, "push"), (129, 3)),
        ("tp_all_reduce",
         lambda x, c: snt.tp_all_reduce(x, c, algo="one_shot"),
         lambda x, c: ops.tp_all_reduce(x, c.cid, "one_shot"), (1031,)),
    ]
    try:
        for name, eager, op, shape in cases:
            xs = [_input(shape, torch.float32, seed=q) for q in range(nranks)]
            gys = None
            results = []
            for call in (eager, op, eager):   # the first loads the kernels
                leaves = [x.detach().clone().requires_grad_(True) for x in xs]
                torch.cuda.synchronize()
                ys = []
                for c, s, x in zip(team, streams, leaves):
                    with torch.cuda.stream(s):
                        ys.append(call(x, c))
                torch.cuda.synchronize()
                if gys is None:
                    gys = [_input(tuple(y.shape), torch.float32, seed=100 + q)
                           for q, y in enumerate(ys)]
                    torch.cuda.synchronize()
                for y, gy, s in zip(ys, gys, streams):
                    with torch.cuda.stream(s):
                        y.backward(gy)
                torch.cuda.synchronize()
                results.append([(y.detach(), x.grad)
                                for y, x in zip(ys, leaves)])
            for q in range(nranks):
                for a, b in zip(results[1][q], results[2][q]):
                    assert _same_bits(a, b), (name, q)
    finally:
        _close([c.comm for c in team])
