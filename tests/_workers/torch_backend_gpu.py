"""Rank bodies of tests/test_torch_backend.py's GPU tests: the "symnccl"
torch.distributed backend against the NCCL backend on the same ranks."""
import datetime
import os


def _init(rank, nranks, port, backend="nccl", timeout=None):
    import torch
    import torch.distributed as dist

    import symnccl.torch  # noqa: F401  (registers "symnccl")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    os.environ["LOCAL_RANK"] = str(rank)
    torch.cuda.set_device(rank)
    kw = {} if timeout is None else {"timeout": timeout}
    dist.init_process_group(backend, rank=rank, world_size=nranks,
                            device_id=torch.device("cuda", rank), **kw)


def _launches(group):
    from symnccl import torch_backend as tb
    comm = tb.communicator_of(group)
    return 0 if comm is None else sum(comm._launches().values())


def collectives(rank, nranks, uid, port):
    """init_process_group("symnccl"): every routed call, sync and async,
    gives NCCL's values; the symnccl communicator ran them; a CUDA graph
    captures dist.all_reduce on the group."""
    import torch
    import torch.distributed as dist
    from symnccl import torch_backend as tb
    _init(rank, nranks, port, backend="symnccl")
    g = dist.group.WORLD
    dev = torch.device("cuda", rank)
    n, r = nranks, rank
    out = {"backend": dist.get_backend(g), "routed": None}
    checks = {}
    for dtype in (torch.float32, torch.bfloat16):
        for op, want in (("SUM", n * (n + 1) / 2), ("AVG", (n + 1) / 2),
                         ("MAX", n), ("MIN", 1), ("PRODUCT", None)):
            x = torch.full((1031,), float(r + 1), device=dev, dtype=dtype)
            dist.all_reduce(x, getattr(dist.ReduceOp, op), group=g)
            if want is None:
                want = float(torch.arange(1, n + 1).prod())
            checks[f"all_reduce {op} {dtype}"] = bool((x == want).all())
    out["routed"] = tb.routed(g)
    before = _launches(g)
    x = torch.full((4096,), float(r + 1), device=dev)
    w = dist.all_reduce(x, group=g, async_op=True)
    fut = w.get_future()
    w.wait()
    checks["async all_reduce"] = bool((x == n * (n + 1) / 2).all())
    checks["future"] = bool((fut.wait()[0] == n * (n + 1) / 2).all())
    checks["symnccl ran it"] = _launches(g) > before
    # DDP's pattern: the future only, a then() callback on the values
    # (stream-ordered after the collective: no host wait anywhere), at a
    # packet size and at a push size (8 MiB), the tensor's name dropped
    for count in (4096, 2 << 20):
        t = torch.full((count,), float(r + 1), device=dev)
        fut = dist.all_reduce(t, group=g, async_op=True).get_future()
        del t
        twice = fut.then(lambda f: f.value()[0] * 2)
        checks[f"future then() {count}"] = bool(
            (twice.wait() == n * (n + 1)).all())
    # several in flight, waited out of order (pooled completion events),
    # the current stream writing the tensors right after each wait
    xs = [torch.full((1 << 18,), float(r + k), device=dev)
          for k in range(4)]
    works = [dist.all_reduce(t, group=g, async_op=True) for t in xs]
    ok = True
    for k in (3, 0, 2, 1):
        works[k].wait()
        want = sum(q + k for q in range(n))
        ok &= bool((xs[k] == want).all())
        xs[k].fill_(-1.0)
    torch.cuda.synchronize()
    # (is_completed() is not asked: from torch 2.14 the Work a caller gets
    # passes on only wait() and get_future(), docs/FRAMEWORKS.md)
    checks["async out of order"] = ok and all(
        w.get_future().done() for w in works)
    # async on a side stream (FSDP's explicit prefetch): the backend's
    # stream waits for the side stream's fill
    side = torch.cuda.Stream()
    o = torch.empty(n * (1 << 20), device=dev)
    with torch.cuda.stream(side):
        i = torch.full((1 << 20,), float(r), device=dev)
        torch.cuda._sleep(int(2e-3 * 1.5e9))    # the fill lands late
        i.fill_(float(r + 10))
        w = dist.all_gather_into_tensor(o, i, group=g, async_op=True)
        w.wait()
        got = bool((o.view(n, -1) == (torch.arange(n, device=dev)
                                      + 10)[:, None]).all())
    checks["async all_gather after a side stream"] = got
    o = torch.empty(n * 1024, device=dev)
    dist.all_gather_into_tensor(o, torch.full((1024,), float(r), device=dev),
                                group=g)
    checks["all_gather_into_tensor"] = bool(
        (o.view(n, -1) == torch.arange(n, device=dev)[:, None]).all())
    o = torch.empty(1024, device=dev)
    src = torch.arange(n * 1024, device=dev, dtype=torch.float32) + r
    dist.reduce_scatter_tensor(o, src, group=g)
    want = (torch.arange(n * 1024, device=dev, dtype=torch.float32)
            .view(n, -1)[r] * n + n * (n - 1) / 2)
    checks["reduce_scatter_tensor"] = bool((o == want).all())
    with dist._coalescing_manager(group=g, device=dev, async_ops=True) as cm:
        outs = [torch.empty(n * 64, device=dev) for _ in range(3)]
        for o in outs:
            dist.all_gather_into_tensor(
                o, torch.full((64,), float(r), device=dev), group=g)
    cm.wait()
    checks["all_gather coalesced"] = all(
        bool((o.view(n, -1) == torch.arange(n, device=dev)[:, None]).all())
        for o in outs)
    # the same with tensors symnccl does not take (bool): NCCL's
    # coalesced calls, inside the manager's own coalesced group
    with dist._coalescing_manager(group=g, device=dev, async_ops=True) as cm:
        outs = [torch.empty(n * 64, device=dev, dtype=torch.bool)
                for _ in range(2)]
        for o in outs:
            dist.all_gather_into_tensor(
                o, torch.full((64,), bool(r), device=dev), group=g)
    cm.wait()
    checks["all_gather coalesced, NCCL's"] = all(
        bool((o.view(n, -1) == (torch.arange(n, device=dev) > 0)[:, None])
             .all()) for o in outs)
    x = torch.arange(n * 8, device=dev, dtype=torch.float32) + 100 * r
    o = torch.empty_like(x)
    dist.all_to_all_single(o, x, group=g)
    want = torch.cat([torch.arange(8, device=dev, dtype=torch.float32)
                      + 8 * r + 100 * q for q in range(n)])
    checks["all_to_all_single even"] = bool((o == want).all())
    ins = [q + 1 + r for q in range(n)]            # rows to rank q
    outs_ = [r + 1 + q for q in range(n)]          # rows from rank q
    x = torch.full((sum(ins), 4), float(r), device=dev)
    o = torch.empty(sum(outs_), 4, device=dev)
    dist.all_to_all_single(o, x, outs_, ins, group=g)
    want = torch.cat([torch.full((outs_[q], 4), float(q), device=dev)
                      for q in range(n)])
    checks["all_to_all_single uneven"] = bool((o == want).all())
    x = torch.full((333,), float(r), device=dev)
    dist.broadcast(x, src=n - 1, group=g)
    checks["broadcast"] = bool((x == n - 1).all())
    x = torch.full((333,), float(r + 1), device=dev)
    dist.reduce(x, dst=0, group=g)
    checks["reduce"] = r != 0 or bool((x == n * (n + 1) / 2).all())
    dist.barrier(group=g)
    # delegated: send/recv and the object collectives
    box = [{"rank": r}]
    dist.broadcast_object_list(box, src=0, group=g)
    checks["broadcast_object_list"] = box[0] == {"rank": 0}
    objs = [None] * n
    dist.all_gather_object(objs, r, group=g)
    checks["all_gather_object"] = objs == list(range(n))
    if n >= 2 and r < 2:
        t = torch.full((5,), float(r), device=dev)
        if r == 0:
            dist.send(t + 7, dst=1, group=g)
        else:
            dist.recv(t, src=0, group=g)
            checks["send/recv"] = bool((t == 7).all())
    # CUDA graphs: a warm call first (NCCL and symnccl connect lazily)
    gx = torch.full((8192,), float(r + 1), device=dev)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        dist.all_reduce(gx, group=g)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.all_reduce(gx, group=g)
    ok = True
    for k in range(3):
        gx.fill_(float(r + 1 + k))
        graph.replay()
        torch.cuda.synchronize()
        ok &= bool((gx == sum(q + 1 + k for q in range(n))).all())
    checks["cuda graph"] = ok
    out["checks"] = checks
    dist.destroy_process_group()
    return out


def _data(step, rank, shape):
    import torch
    gen = torch.Generator(device="cuda").manual_seed(1000 * step + rank)
    return torch.randn(*shape, device="cuda", generator=gen)


def _model(seed=0, d=64):
    import torch
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(),
                               torch.nn.Linear(4 * d, 4 * d),
                               torch.nn.GELU(),
                               torch.nn.Linear(4 * d, d)).cuda()


def training(rank, nranks, uid, port, which, steps=20):
    """Losses of `steps` fp32 steps of `which` (ddp, fsdp2, tp) on a group
    of the NCCL backend and on one of the symnccl backend, same data; and
    whether symnccl's communicator ran the symnccl group's collectives."""
    import torch
    import torch.distributed as dist
    _init(rank, nranks, port)
    groups = {b: dist.new_group(list(range(nranks)), backend=b)
              for b in ("nccl", "symnccl")}
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    losses = {}
    for b, g in groups.items():
        model, fwd = _build(which, g, nranks)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        row = []
        for step in range(steps):
            x = _data(step, rank if which != "tp" else 0, (8, 64))
            loss = fwd(model, x).square().mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            v = loss.detach().clone()
            dist.all_reduce(v, group=groups["nccl"])
            row.append(float(v) / nranks)
        losses[b] = row
    ran = _launches(groups["symnccl"])
    dist.destroy_process_group()
    return {"losses": losses, "symnccl_launches": ran}


def _mesh(g):
    from torch.distributed.device_mesh import DeviceMesh
    return DeviceMesh.from_group(g, "cuda")


def _build(which, g, nranks):
    """The model on group g and its forward."""
    import torch
    if which == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        m = DDP(_model(), process_group=g, bucket_cap_mb=0.05)
        return m, lambda m, x: m(x)
    if which == "fsdp2":
        try:
            from torch.distributed.fsdp import fully_shard
        except ImportError:
            from torch.distributed._composable.fsdp import fully_shard
        m = _model()
        mesh = _mesh(g)
        for layer in m:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(m, mesh=mesh)
        return m, lambda m, x: m(x)
    if which == "tp":
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import (
            ColwiseParallel, RowwiseParallel, SequenceParallel,
            parallelize_module)

        class Block(torch.nn.Module):
            def __init__(self, d=64):
                super().__init__()
                torch.manual_seed(0)
                self.norm = torch.nn.LayerNorm(d)
                self.up = torch.nn.Linear(d, 4 * d)
                self.down = torch.nn.Linear(4 * d, d)

            def forward(self, x):
                return x + self.down(torch.nn.functional.gelu(
                    self.up(self.norm(x))))

        m = Block().cuda()
        mesh = _mesh(g)
        parallelize_module(m, mesh, {
            "norm": SequenceParallel(),
            "up": ColwiseParallel(input_layouts=Shard(1)),
            # down's output a DTensor, as the residual x is
            "down": RowwiseParallel(output_layouts=Shard(1),
                                    use_local_output=False)})
        from torch.distributed.tensor import DTensor

        def fwd(m, x):
            x = x.view(2, 4, 64)                   # (batch, seq, hidden)
            xs = DTensor.from_local(
                x.chunk(nranks, dim=1)[g.rank()], mesh, [Shard(1)])
            y = m(xs)
            return y.redistribute(mesh, [Replicate()]).to_local()
        return m, fwd
    raise ValueError(which)


def compiled_funcol(rank, nranks, uid, port):
    """Functional collectives in a torch.compile(fullgraph=True) function
    on a symnccl group: NCCL's values, and symnccl ran them."""
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    _init(rank, nranks, port)
    groups = {b: dist.new_group(list(range(nranks)), backend=b)
              for b in ("nccl", "symnccl")}

    def make(g):
        def step(x):
            a = funcol.all_reduce(x * 2, "sum", g)
            b = funcol.all_gather_tensor(a, 0, g)
            c = funcol.reduce_scatter_tensor(b + 1, "sum", 0, g)
            d = funcol.all_to_all_single(c, None, None, g)
            return d * 3
        return step

    x = torch.arange(nranks * 256, device="cuda", dtype=torch.float32) + rank
    res = {}
    for b, g in groups.items():
        torch._dynamo.reset()
        f = torch.compile(make(g), fullgraph=True)
        f(x)
        res[b] = f(x)
    before = _launches(groups["symnccl"])
    res["again"] = f(x)       # the symnccl group's, compiled last
    torch.cuda.synchronize()
    out = {"equal": bool(torch.equal(res["nccl"], res["symnccl"])),
           "symnccl ran": _launches(groups["symnccl"]) > before}
    # in CUDA graphs (the async calls' stream fork and join captured)
    torch._dynamo.reset()
    f = torch.compile(make(groups["symnccl"]), mode="reduce-overhead",
                      fullgraph=True)
    ok = True
    for _ in range(4):
        ok &= bool(torch.equal(f(x).clone(), res["nccl"]))
    out["cuda graphs"] = ok
    dist.destroy_process_group()
    return out


def never_arrives(rank, nranks, uid, port, timeout_s=5.0):
    """The last rank never makes the all_reduce: the others' Work.wait()
    raises PeerTimeoutError naming it, the process survives; then the
    group is aborted and a new symnccl group among all ranks works."""
    import time

    import torch
    import torch.distributed as dist

    import symnccl
    from symnccl import torch_backend as tb
    _init(rank, nranks, port)
    store = dist.distributed_c10d._get_default_store()
    g = dist.new_group(list(range(nranks)),
                       backend="symnccl",
                       timeout=datetime.timedelta(seconds=timeout_s))
    x = torch.ones(4096, device="cuda")
    dist.all_reduce(x, group=g)                   # warm: creates the comm
    torch.cuda.synchronize()
    out = {}
    last = nranks - 1
    if rank != last:
        t0 = time.monotonic()
        w = dist.all_reduce(x, group=g, async_op=True)
        try:
            w.wait(timeout=datetime.timedelta(seconds=timeout_s + 30))
            out["raised"] = None
        except symnccl.PeerTimeoutError as e:
            out["raised"] = "PeerTimeoutError"
            out["rank"] = e.rank
            out["message"] = str(e)
        out["took"] = time.monotonic() - t0
        out["gpu usable"] = float(torch.arange(8., device="cuda").sum()) == 28
        tb.abort(g)
        store.set(f"done/{rank}", "1")
    else:
        for q in range(last):
            store.wait([f"done/{q}"], datetime.timedelta(seconds=120))
        tb.abort(g)
    dist.destroy_process_group(g)
    g2 = dist.new_group(list(range(nranks)), backend="symnccl")
    y = torch.full((1024,), float(rank + 1), device="cuda")
    dist.all_reduce(y, group=g2)
    out["rebuilt"] = bool((y == nranks * (nranks + 1) / 2).all())
    dist.destroy_process_group()
    return out


def per_device_string(rank, nranks, uid, port):
    """init_process_group("cpu:gloo,cuda:symnccl"): CUDA tensors on
    symnccl, CPU tensors on gloo (the ProcessGroup form carries gloo
    itself, the per-device form gets torch's)."""
    import torch
    import torch.distributed as dist
    _init(rank, nranks, port, backend="cpu:gloo,cuda:symnccl")
    g = dist.group.WORLD
    x = torch.full((1024,), float(rank + 1), device="cuda")
    dist.all_reduce(x, group=g)
    c = torch.full((16,), float(rank + 1))
    dist.all_reduce(c, group=g)
    want = nranks * (nranks + 1) / 2
    out = {"cuda": bool((x == want).all()), "cpu": bool((c == want).all()),
           "symnccl ran": _launches(g) > 0}
    dist.destroy_process_group()
    return out
