"""Which torch.distributed calls reach a backend written in Python, per torch
version: the measurement behind docs/FRAMEWORKS.md, 'symnccl as a
torch.distributed backend'. CPU only (gloo), no symnccl, no GPU.

Two ranks on 127.0.0.1 (torch.multiprocessing spawn). A recording backend
logs every method torch calls on it and delegates the work to gloo, so the
results are real; the call through the backend is then checked against the
same call on a plain gloo group. Two ways to plug the recorder in:

- "pg":      Backend.register_backend(name, creator) where the creator
             returns a Python subclass of torch.distributed.ProcessGroup
             (the PyProcessGroup trampoline; it replaces the whole group);
- "backend": the creator returns a Python subclass of the C++
             c10d Backend class (a per-device backend, "cpu:NAME", next to
             the group's others), where the torch version allows one.

Each workload reports the recorder methods it reached, or the error that
stopped it ("unsupported: ..."). Workloads: the c10d calls one by one, DDP
(gradient buckets), FSDP2 fully_shard, DTensor TP + SP (parallelize_module),
functional collectives eager and under torch.compile (aot_eager: the same
_c10d_functional ops inductor emits, without a C++ compiler).

    python scripts/probe_torch_backend.py            # prints JSON
    python scripts/probe_torch_backend.py --markdown # the docs table rows
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import sys
import traceback

NRANKS = 2
# seconds a collective may wait (gloo's timeout): a call that a backend
# leaves hanging on one rank fails instead
WORKLOAD_TIMEOUT = 30

# every method a recorder may be called with, and how it delegates to gloo
# (gloo's own method of the same name unless a fallback is given below)
METHODS = ("allreduce", "allreduce_coalesced", "allgather",
           "_allgather_base", "allgather_into_tensor_coalesced",
           "allgather_coalesced", "reduce_scatter", "_reduce_scatter_base",
           "reduce_scatter_tensor_coalesced", "alltoall_base", "alltoall",
           "broadcast", "reduce", "barrier", "send", "recv", "gather",
           "scatter", "recv_anysource", "monitored_barrier",
           # the names of torch 2.14's c10d Backend
           "all_gather_single", "all_gather_single_coalesced",
           "reduce_scatter_single", "reduce_scatter_single_coalesced",
           "all_to_all_single", "gather_single")


def _each(method):
    """A coalesced call that gloo's binding lacks, as one call per pair
    (waited for in turn; the last one's Work is returned)."""
    def run(gloo, outputs, inputs, *opts):
        work = None
        for o, i in zip(outputs, inputs):
            work = getattr(gloo, method)(o, i, *opts)
            work.wait()
        return work
    return run


FALLBACKS = {
    "allgather_into_tensor_coalesced": _each("_allgather_base"),
    "reduce_scatter_tensor_coalesced": _each("_reduce_scatter_base"),
    "all_gather_single_coalesced": _each("_allgather_base"),
    "reduce_scatter_single_coalesced": _each("_reduce_scatter_base"),
    "all_gather_single": lambda g, *a: g._allgather_base(*a),
    "reduce_scatter_single": lambda g, *a: g._reduce_scatter_base(*a),
    "all_to_all_single": lambda g, *a: g.alltoall_base(*a),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _recorder_classes(torch, dist):
    """The two recorders: a ProcessGroup subclass and, where the C++
    Backend class is constructible from Python, a Backend subclass."""
    from torch._C._distributed_c10d import Backend as CBackend

    calls: list[str] = []

    def method(name):
        def call(self, *args, **kwargs):
            calls.append(name)
            if hasattr(self._gloo, name):
                return getattr(self._gloo, name)(*args, **kwargs)
            # torch 2.12-2.13 call the names of 2.14 that gloo's binding
            # does not have yet
            return FALLBACKS[name](self._gloo, *args, **kwargs)
        call.__name__ = name
        return call

    body = {m: method(m) for m in METHODS}
    body["getBackendName"] = lambda self: "recorder"
    body["name"] = lambda self: "recorder"

    def pg_init(self, store, rank, size, timeout):
        dist.ProcessGroup.__init__(self, rank, size)
        self._gloo = dist.ProcessGroupGloo(
            dist.PrefixStore("gloo", store), rank, size, timeout)
        # A ProcessGroup keeps its name on its backends: without one,
        # group_name (functional collectives, DeviceMesh) raises. gloo as
        # the group's CPU backend also serves what the trampoline does not
        # forward to Python (visible as calls that reach nothing).
        t = dist.ProcessGroup.BackendType.GLOO
        self._register_backend(torch.device("cpu"), t, self._gloo)
        self._set_default_backend(t)

    def be_init(self, store, rank, size, timeout):
        CBackend.__init__(self, rank, size)
        self._gloo = dist.ProcessGroupGloo(
            dist.PrefixStore("gloo", store), rank, size, timeout)

    pg_cls = type("RecorderPG", (dist.ProcessGroup,),
                  dict(body, __init__=pg_init))
    be_cls = type("RecorderBackend", (CBackend,),
                  dict(body, __init__=be_init))
    return calls, pg_cls, be_cls


def _backend_constructible(CBackend) -> bool:
    try:
        type("Probe", (CBackend,), {})(0, 1)
        return True
    except TypeError:
        return False


# ------------------------------------------------------------ workloads
# Each takes (torch, dist, group, rank) and raises if the result through
# the recorder is wrong.

def w_all_reduce(torch, dist, g, r):
    for op in ("SUM", "AVG", "MAX", "MIN", "PRODUCT"):
        x = torch.full((4,), float(r + 2))
        dist.all_reduce(x, op=getattr(dist.ReduceOp, op), group=g)
        want = {"SUM": 5., "AVG": 2.5, "MAX": 3., "MIN": 2., "PRODUCT": 6.}
        assert torch.allclose(x, torch.full((4,), want[op])), (op, x)


def w_all_reduce_async(torch, dist, g, r):
    x = torch.ones(4)
    w = dist.all_reduce(x, group=g, async_op=True)
    w.get_future().wait()
    w.wait()
    assert x.eq(2).all()


def w_all_gather_into_tensor(torch, dist, g, r):
    out = torch.empty(2 * NRANKS)
    dist.all_gather_into_tensor(out, torch.full((2,), float(r)), group=g)
    assert out.tolist() == [0., 0., 1., 1.]


def w_all_gather(torch, dist, g, r):
    outs = [torch.empty(2) for _ in range(NRANKS)]
    dist.all_gather(outs, torch.full((2,), float(r)), group=g)
    assert [o.tolist() for o in outs] == [[0., 0.], [1., 1.]]


def w_reduce_scatter_tensor(torch, dist, g, r):
    out = torch.empty(2)
    dist.reduce_scatter_tensor(out, torch.arange(4.) + r, group=g)
    assert out.tolist() == [[1., 3.], [5., 7.]][r]


def w_reduce_scatter(torch, dist, g, r):
    out = torch.empty(2)
    dist.reduce_scatter(out, [torch.full((2,), float(r + q))
                              for q in range(NRANKS)], group=g)
    assert out.tolist() == [float(2 * r + 1)] * 2


def w_all_reduce_coalesced(torch, dist, g, r):
    xs = [torch.ones(3), torch.ones(5)]
    with dist._coalescing_manager(group=g, async_ops=True) as cm:
        for x in xs:
            dist.all_reduce(x, group=g)
    cm.wait()
    assert all(x.eq(2).all() for x in xs)


def w_all_gather_into_tensor_coalesced(torch, dist, g, r):
    outs = [torch.empty(2 * NRANKS) for _ in range(2)]
    with dist._coalescing_manager(group=g, async_ops=True) as cm:
        for o in outs:
            dist.all_gather_into_tensor(o, torch.full((2,), float(r)),
                                        group=g)
    cm.wait()
    assert all(o.tolist() == [0., 0., 1., 1.] for o in outs)


def w_reduce_scatter_tensor_coalesced(torch, dist, g, r):
    outs = [torch.empty(2) for _ in range(2)]
    with dist._coalescing_manager(group=g, async_ops=True) as cm:
        for o in outs:
            dist.reduce_scatter_tensor(o, torch.arange(4.) + r, group=g)
    cm.wait()
    assert all(o.tolist() == [[1., 3.], [5., 7.]][r] for o in outs)


def w_all_to_all_single(torch, dist, g, r):
    out = torch.empty(4)
    dist.all_to_all_single(out, torch.arange(4.) + 10 * r, group=g)
    assert out.tolist() == [[0., 1., 10., 11.], [2., 3., 12., 13.]][r]


def w_all_to_all_single_uneven(torch, dist, g, r):
    ins = [[1, 2], [3, 1]][r]          # rows r sends to rank 0, 1
    outs = [[1, 3], [2, 1]][r]
    x = torch.arange(float(sum(ins))) + 10 * r
    out = torch.empty(sum(outs))
    dist.all_to_all_single(out, x, outs, ins, group=g)
    want = [[0., 10., 11., 12.], [1., 2., 13.]][r]
    assert out.tolist() == want, out


def w_broadcast(torch, dist, g, r):
    x = torch.full((3,), float(r))
    dist.broadcast(x, src=1, group=g)
    assert x.eq(1).all()


def w_reduce(torch, dist, g, r):
    x = torch.full((3,), float(r + 1))
    dist.reduce(x, dst=0, group=g)
    if r == 0:
        assert x.eq(3).all()


def w_barrier(torch, dist, g, r):
    dist.barrier(group=g)


def w_send_recv(torch, dist, g, r):
    x = torch.full((2,), float(r))
    if r == 0:
        dist.send(x + 5, dst=1, group=g)
    else:
        dist.recv(x, src=0, group=g)
        assert x.eq(5).all()


def w_broadcast_object_list(torch, dist, g, r):
    box = [{"r": r}]
    dist.broadcast_object_list(box, src=0, group=g)
    assert box[0] == {"r": 0}


def w_ddp(torch, dist, g, r):
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                            torch.nn.Linear(16, 4))
    ddp = DDP(m, process_group=g, bucket_cap_mb=1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(3):
        torch.manual_seed(100 + 10 * step + r)
        loss = ddp(torch.randn(5, 8)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    w = m[0].weight.detach().clone()
    other = [torch.empty_like(w) for _ in range(NRANKS)]
    dist.all_gather(other, w)          # the default group: gloo
    assert torch.equal(other[0], other[1])


def _mesh(torch, dist, g):
    from torch.distributed.device_mesh import DeviceMesh
    try:
        return DeviceMesh.from_group(g, "cpu")
    except TypeError:
        return DeviceMesh.from_group(g, device_type="cpu")


def w_fsdp2(torch, dist, g, r):
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                            torch.nn.Linear(16, 4))
    mesh = _mesh(torch, dist, g)
    for layer in m:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for step in range(2):
        torch.manual_seed(100 + r)
        loss = m(torch.randn(5, 8)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def w_dtensor_tp_sp(torch, dist, g, r):
    from torch.distributed.tensor.parallel import (
        ColwiseParallel, RowwiseParallel, SequenceParallel,
        parallelize_module)
    from torch.distributed.tensor import Shard
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(8)
            self.up = torch.nn.Linear(8, 16)
            self.down = torch.nn.Linear(16, 8)

        def forward(self, x):
            return self.down(torch.relu(self.up(self.norm(x))))

    m = Block()
    mesh = _mesh(torch, dist, g)
    parallelize_module(m, mesh, {
        "norm": SequenceParallel(),
        "up": ColwiseParallel(input_layouts=Shard(1)),
        "down": RowwiseParallel(output_layouts=Shard(1))})
    torch.manual_seed(1)
    x = torch.randn(2, 4, 8)
    y = m(x[:, 2 * r:2 * r + 2])       # this rank's sequence shard
    y = y.full_tensor() if hasattr(y, "full_tensor") else y
    y.sum().backward()


def _funcol_step(torch, funcol, g):
    def step(x):
        a = funcol.all_reduce(x, "sum", g)
        b = funcol.all_gather_tensor(a, 0, g)
        c = funcol.reduce_scatter_tensor(b, "sum", 0, g)
        d = funcol.all_to_all_single(c, None, None, g)
        return d
    return step


def w_funcol_eager(torch, dist, g, r):
    import torch.distributed._functional_collectives as funcol
    x = torch.arange(4.) + r
    out = _funcol_step(torch, funcol, g)(x)
    out = out.wait() if hasattr(out, "wait") else out
    assert out.shape == (4,), out.shape


def w_funcol_compiled(torch, dist, g, r):
    import torch.distributed._functional_collectives as funcol
    torch._dynamo.reset()
    f = torch.compile(_funcol_step(torch, funcol, g), backend="aot_eager",
                      fullgraph=True)
    x = torch.arange(4.) + r
    out = f(x)
    ref = _funcol_step(torch, funcol, dist.group.WORLD)(x)
    ref = ref.wait() if hasattr(ref, "wait") else ref
    assert torch.equal(out, ref), (out, ref)


WORKLOADS = {
    "all_reduce (SUM AVG MAX MIN PRODUCT)": w_all_reduce,
    "all_reduce async_op=True": w_all_reduce_async,
    "all_gather_into_tensor": w_all_gather_into_tensor,
    "all_gather (list)": w_all_gather,
    "reduce_scatter_tensor": w_reduce_scatter_tensor,
    "reduce_scatter (list)": w_reduce_scatter,
    "all_reduce coalesced": w_all_reduce_coalesced,
    "all_gather_into_tensor coalesced": w_all_gather_into_tensor_coalesced,
    "reduce_scatter_tensor coalesced": w_reduce_scatter_tensor_coalesced,
    "all_to_all_single (even)": w_all_to_all_single,
    "all_to_all_single (uneven)": w_all_to_all_single_uneven,
    "broadcast": w_broadcast,
    "reduce": w_reduce,
    "barrier": w_barrier,
    "send / recv": w_send_recv,
    "broadcast_object_list": w_broadcast_object_list,
    "DDP (3 steps)": w_ddp,
    "FSDP2 fully_shard (2 steps)": w_fsdp2,
    "DTensor TP + SP (parallelize_module)": w_dtensor_tp_sp,
    "functional collectives, eager": w_funcol_eager,
    "functional collectives, torch.compile": w_funcol_compiled,
}


def _rank(rank, port, mode, q):
    import warnings
    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      RANK=str(rank), WORLD_SIZE=str(NRANKS))
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    calls, pg_cls, be_cls = _recorder_classes(torch, dist)
    name = "recorder"
    cls = pg_cls if mode == "pg" else be_cls
    kw = {"devices": ["cpu"]}
    dist.Backend.register_backend(
        name, lambda store, rank, size, timeout: cls(store, rank, size,
                                                     timeout), **kw)
    timeout = datetime.timedelta(seconds=WORKLOAD_TIMEOUT)
    dist.init_process_group("gloo", rank=rank, world_size=NRANKS,
                            timeout=timeout)
    g = dist.new_group(list(range(NRANKS)), backend=name, timeout=timeout)
    results = {}
    for wname, fn in WORKLOADS.items():
        del calls[:]
        print(f"rank {rank} {mode}: {wname}", file=sys.stderr, flush=True)
        dist.barrier()      # gloo: the workloads start together
        try:
            fn(torch, dist, g, rank)
            results[wname] = sorted(set(calls))
        except Exception as e:
            msg = f"{type(e).__name__}: {e}".splitlines()[0][:160]
            results[wname] = {"error": msg, "reached": sorted(set(calls)),
                              "trace": traceback.format_exc()[-800:]}
            dist.barrier()
    dist.destroy_process_group()
    q.put((rank, results))


def probe(mode: str) -> dict:
    import torch.multiprocessing as mp
    if mode == "backend":
        from torch._C._distributed_c10d import Backend as CBackend
        if not _backend_constructible(CBackend):
            return {"unavailable": "torch's c10d Backend has no Python "
                    "constructor in this version"}
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, mode, q))
             for r in range(NRANKS)]
    for p in procs:
        p.start()
    out = {}
    for _ in procs:
        r, res = q.get(timeout=900)
        out[r] = res
    for p in procs:
        p.join(60)
    # the traces name the rank's frames: compare what was reached
    def brief(res):
        return {k: v if isinstance(v, list) else (v["error"], v["reached"])
                for k, v in res.items()}
    if brief(out[0]) != brief(out[1]):
        return {"rank0": out[0], "rank1": out[1]}
    return out[0]


def summary(res):
    """One line per mode and workload: the methods reached, or the error."""
    lines = [f"torch {res['torch']}"]
    for mode in ("pg", "backend"):
        v = res.get(mode)
        if v is None:
            continue
        if "unavailable" in v:
            lines.append(f"  {mode}: unavailable: {v['unavailable']}")
            continue
        per_rank = [v["rank0"], v["rank1"]] if "rank0" in v else [v]
        for k in per_rank[0]:
            reached, errors = set(), set()
            for res_r in per_rank:
                r = res_r[k]
                if isinstance(r, list):
                    reached.update(r)
                else:
                    reached.update(r["reached"])
                    errors.add(r["error"])
            got = " ".join(sorted(reached)) or "-"
            if errors:
                got = f"ERROR {'; '.join(sorted(errors))} (reached: {got})"
            lines.append(f"  {mode:7s} {k:40s} {got}")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("pg", "backend", "both"),
                    default="both")
    ap.add_argument("--out", help="write the JSON here too")
    ap.add_argument("--summary", action="store_true",
                    help="print one line per workload instead of the JSON")
    args = ap.parse_args(argv)
    import torch
    res = {"torch": torch.__version__, "python": sys.version.split()[0],
           "date": datetime.date.today().isoformat()}
    for mode in (("pg", "backend") if args.mode == "both" else (args.mode,)):
        res[mode] = probe(mode)
    text = json.dumps(res, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print("\n".join(summary(res)) if args.summary else text)


if __name__ == "__main__":
    main()
