"""Rank bodies for the PyTorch integration tests."""
from symnccl.bootstrap import init_torch


def run(rank, nranks, uid, port):
    import torch
    import torch.distributed as dist

    import symnccl.torch as snt
    init_torch(rank, nranks, port)
    out = {}
    comm = snt.communicator()
    comm2 = snt.communicator()   # a second one: a fresh key in the store
    out["devices"] = (comm.device, comm2.device)
    want = nranks * (nranks + 1) / 2

    x = torch.full((4099,), float(rank + 1), device="cuda")
    y = snt.all_reduce(x, comm)
    out["eager_out"] = bool((y == want).all()) and bool((x == rank + 1).all())
    snt.all_reduce_(x, comm2, op="max")
    out["eager_inplace"] = bool((x == nranks).all())

    @torch.compile(fullgraph=True)
    def step(t):
        return snt.all_reduce(t * 2, comm, op="sum") + 1

    t = torch.full((1031,), float(rank + 1), device="cuda")
    out["compiled"] = bool((step(t) == 2 * want + 1).all())

    g_in = torch.full((65537,), float(rank + 1), device="cuda")
    g_out = snt.all_reduce(g_in, comm)   # eager first: NCCL connects lazily
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        g_out = snt.all_reduce(g_in, comm)
    ok = True
    for k in range(3):
        g_in.fill_(float(rank + 1 + k))
        g.replay()
        torch.cuda.synchronize()
        ok &= bool((g_out == want + nranks * k).all())
    out["graph"] = ok
    dist.barrier()
    # a wrapped communicator delegates everything
    buf = comm.empty(16, "float32")
    out["delegates"] = buf.registered and comm.rank == rank
    del buf
    comm.close()
    comm2.close()
    dist.destroy_process_group()
    return out
