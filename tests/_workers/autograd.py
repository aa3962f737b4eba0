"""Rank bodies for the training tests: symnccl.torch's differentiable ops
against torch.distributed's on the same inputs (forward values and
gradients), eagerly, under torch.compile(fullgraph=True) with backward, and
forward + backward captured in one CUDA graph."""
from symnccl.bootstrap import init_torch


def _inputs(rank, shape, dtype, seed):
    """Random values that differ per rank (never zeros), and a random
    upstream gradient that differs per rank as well."""
    import torch
    g = torch.Generator(device="cpu").manual_seed(seed * 100 + rank)
    x = torch.randn(shape, generator=g, dtype=torch.float64) + 0.1
    gy = torch.randn(shape, generator=g, dtype=torch.float64)
    return x.to(dtype).cuda(), gy


def _grad(fn, x, gy_of):
    """(y, dL/dx) for L = sum(y * gy), gy shaped like y."""
    x = x.detach().clone().requires_grad_(True)
    y = fn(x)
    gy = gy_of(y).to(y.dtype).cuda()
    (y * gy).sum().backward()
    return y.detach(), x.grad.detach()


def _close(a, b, dtype):
    import torch
    tol = {torch.float32: 1e-5, torch.float64: 1e-12,
           torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]
    a, b = a.double(), b.double()
    return float(((a - b).abs() / (b.abs() + 1)).max()) if a.numel() else 0.0, \
        tol


def differentiable_ops(rank, nranks, uid, port, seed):
    """Every op against torch.distributed's differentiable collectives.
    Returns rows (case, max relative difference of y, of dx, tolerance,
    launch counters that moved)."""
    import torch
    import torch.distributed as dist
    import torch.distributed.nn.functional as dnn
    from torch.distributed import _functional_collectives as fc
    init_torch(rank, nranks, port)
    import symnccl.torch as snt
    comm = snt.communicator()
    n = nranks
    group = dist.group.WORLD
    rows = []

    def theirs_max(x):   # the reference of max: gather, then amax
        return torch.stack(dnn.all_gather(x)).amax(0)

    def theirs_rs_max(x):
        return theirs_max(x).chunk(n)[rank]

    def theirs_tp_all_reduce(x):   # the sum forward, identity backward
        return x - x.detach() + dnn.all_reduce(x.detach())

    def theirs_tp_copy(x):         # identity forward, the sum backward
        s = dnn.all_reduce(x)
        return s - (s - x).detach()

    # (name, ours, theirs, input shape); theirs differentiable by torch
    cases = [
        ("all_reduce sum ll", lambda t: snt.all_reduce(t, comm, algo="ll"),
         lambda t: dnn.all_reduce(t), (1031, 3)),
        ("all_reduce sum auto", lambda t: snt.all_reduce(t, comm),
         lambda t: dnn.all_reduce(t), (4099,)),
        ("all_reduce sum one_shot",
         lambda t: snt.all_reduce(t, comm, algo="one_shot"),
         lambda t: dnn.all_reduce(t), (257, 5)),
        ("all_reduce avg", lambda t: snt.all_reduce(t, comm, op="avg"),
         lambda t: dnn.all_reduce(t, op=dist.ReduceOp.AVG), (1031,)),
        ("all_reduce max", lambda t: snt.all_reduce(t, comm, op="max"),
         theirs_max, (1031,)),
        ("reduce_scatter sum", lambda t: snt.reduce_scatter(t, comm),
         lambda t: fc.reduce_scatter_tensor_autograd(t, "sum", 0, group),
         (n * 129, 7)),
        ("reduce_scatter avg", lambda t: snt.reduce_scatter(t, comm,
                                                            op="avg"),
         lambda t: fc.reduce_scatter_tensor_autograd(t, "sum", 0, group) / n,
         (n * 64,)),
        ("reduce_scatter max", lambda t: snt.reduce_scatter(t, comm,
                                                            op="max"),
         theirs_rs_max, (n * 65,)),
        ("reduce_scatter sum push",
         lambda t: snt.reduce_scatter(t, comm, algo="push"),
         lambda t: fc.reduce_scatter_tensor_autograd(t, "sum", 0, group),
         (n * 129, 7)),
        ("all_gather", lambda t: snt.all_gather(t, comm),
         lambda t: fc.all_gather_tensor_autograd(t, 0, group), (131, 3)),
        ("all_gather ll", lambda t: snt.all_gather(t, comm, algo="ll"),
         lambda t: fc.all_gather_tensor_autograd(t, 0, group), (131, 3)),
        ("broadcast root=last", lambda t: snt.broadcast(t, comm, root=n - 1),
         lambda t: dnn.broadcast(t, src=n - 1), (1031,)),
        ("broadcast one_shot",
         lambda t: snt.broadcast(t, comm, root=n - 1, algo="one_shot"),
         lambda t: dnn.broadcast(t, src=n - 1), (1031,)),
        ("reduce root=0", lambda t: snt.reduce(t, comm, root=0),
         lambda t: dnn.reduce(t, dst=0), (1031,)),
        ("reduce one_shot",
         lambda t: snt.reduce(t, comm, root=0, algo="one_shot"),
         lambda t: dnn.reduce(t, dst=0), (1031,)),
        ("tp_all_reduce", lambda t: snt.tp_all_reduce(t, comm),
         theirs_tp_all_reduce, (1031, 3)),
        ("tp_copy", lambda t: snt.tp_copy(t, comm), theirs_tp_copy,
         (1031, 3)),
    ]
    for dtype in (torch.float32, torch.bfloat16):
        for name, ours, theirs, shape in cases:
            x, gy = _inputs(rank, shape, dtype, seed)

            def gy_of(y, gy=gy):   # the same upstream gradient for both
                flat = gy.flatten()
                reps = -(-y.numel() // flat.numel())
                return flat.repeat(reps)[:y.numel()].reshape(y.shape)
            before = comm.comm._launches()
            y1, dx1 = _grad(ours, x, gy_of)
            torch.cuda.synchronize()
            after = comm.comm._launches()
            y2, dx2 = _grad(theirs, x, gy_of)
            if name.startswith("reduce "):   # only the root's result
                if rank != 0:
                    y1, y2 = y1[:0], y2[:0]
            dy, tol = _close(y1, y2, dtype)
            dx, _ = _close(dx1, dx2, dtype)
            ran = {k: after[k] - before[k] for k in after
                   if after[k] != before[k]}
            rows.append((f"{name} {dtype}", dy, dx, tol, ran))
    comm.close()
    dist.destroy_process_group()
    return rows


def compiled_and_graphed(rank, nranks, uid, port, seed):
    """A sequence-parallel block (all_gather -> matmul -> reduce_scatter)
    under torch.compile(fullgraph=True) with backward, and forward + backward
    captured in one CUDA graph, against the same block in eager mode."""
    import torch
    import torch.distributed as dist
    init_torch(rank, nranks, port)
    import symnccl.torch as snt
    comm = snt.communicator()
    n = nranks
    torch.manual_seed(seed)   # same weights on every rank
    w = torch.randn(64, 64, device="cuda", dtype=torch.float32) / 8
    x0, _ = _inputs(rank, (16, 64), torch.float32, seed)

    def block(x, w):
        h = snt.all_gather(x, comm)                  # (n*16, 64)
        z = torch.nn.functional.gelu(h @ w)
        return snt.reduce_scatter(z, comm)           # (16, 64)

    def step(fn, x):
        xl = x.detach().clone().requires_grad_(True)
        wl = w.detach().clone().requires_grad_(True)
        y = fn(xl, wl)
        (y * y).sum().backward()
        return y.detach(), xl.grad.detach(), wl.grad.detach()

    eager = step(block, x0)
    compiled = step(torch.compile(block, fullgraph=True), x0)
    out = {"compiled": [_close(a, b, torch.float32)[0]
                        for a, b in zip(compiled, eager)]}

    # the tensor-parallel pair: every rank's x whole, w split by columns
    # then used by rows
    xt, _ = _inputs(0, (16, 64), torch.float32, seed)   # same on all ranks
    cols = slice(rank * 64 // n, (rank + 1) * 64 // n)

    def tp_block(x, w):
        h = torch.nn.functional.gelu(snt.tp_copy(x, comm) @ w[:, cols])
        return snt.tp_all_reduce(h @ w[cols, :], comm)

    eager = step(tp_block, xt)
    compiled = step(torch.compile(tp_block, fullgraph=True), xt)
    out["tp_compiled"] = [_close(a, b, torch.float32)[0]
                          for a, b in zip(compiled, eager)]

    # one CUDA graph: forward and backward, replayed on new inputs
    xs = x0.detach().clone().requires_grad_(True)
    ws = w.detach().clone().requires_grad_(True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):   # warm-up outside the capture
            xs.grad = ws.grad = None
            ys = block(xs, ws)
            (ys * ys).sum().backward()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    xs.grad = ws.grad = None
    with torch.cuda.graph(g):
        ys = block(xs, ws)
        (ys * ys).sum().backward()
    diffs = []
    for k in range(3):
        x_new, _ = _inputs(rank, (16, 64), torch.float32, seed + 1 + k)
        with torch.no_grad():
            xs.copy_(x_new)
        g.replay()
        torch.cuda.synchronize()
        ref = step(block, x_new)
        diffs.append([_close(a, b, torch.float32)[0]
                      for a, b in zip((ys.detach(), xs.grad, ws.grad), ref)])
    out["graph"] = diffs

    # Communicator methods take tensors that require grad, as
    # torch.distributed does (outside autograd)
    leaf = torch.full((33,), float(rank + 1), device="cuda",
                      requires_grad=True)
    y = comm.all_reduce(leaf, out=torch.empty(33, device="cuda"))
    snt.all_reduce_(leaf, comm)   # a leaf: reduced outside autograd
    out["requires_grad_ok"] = bool((y == n * (n + 1) / 2).all()) and \
        bool((leaf == n * (n + 1) / 2).all())
    nonleaf = leaf * 2
    snt.all_reduce_(nonleaf, comm)   # recorded: copy_ of the op
    nonleaf.sum().backward()
    out["inplace_grad"] = float(leaf.grad[0])   # d/dleaf of sum(AR(2 leaf))
    comm.close()
    dist.destroy_process_group()
    return out
