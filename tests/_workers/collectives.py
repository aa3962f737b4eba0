"""Rank bodies for the multi-GPU tests (run by symnccl.bootstrap.spawn)."""
import numpy as np

import symnccl
from symnccl import _check

ODD_SIZES = (1, 3, 1031, 65537, 1000003)


def _fill(buf, arr):
    buf.copy_from_host(np.ascontiguousarray(arr).view(np.uint8))


def _read(buf, npdt):
    return np.frombuffer(buf.to_bytes(), npdt)


def all_reduce_every_dtype_on_windows(rank, nranks, uid, seed):
    """Every dtype x op on SymmetricBuffers, in and out of place, poisoned
    outputs. Returns [(dtype, op, count, wrong)]."""
    comm = symnccl.Communicator(uid, rank, nranks, device=rank, timeout=120)
    assert comm.symmetric, comm.symmetric_reason
    assert comm.lsa_size == nranks and not comm.multicast
    rows = []
    for dtype in symnccl.DTYPES:
        npdt = _check.numpy_dtype(dtype)
        for count in ODD_SIZES[:4]:
            x, y = comm.empty(count, dtype), comm.empty(count, dtype)
            for op in symnccl.OPS:
                ins = [_check.make_input(dtype, count, r, seed, op)
                       for r in range(nranks)]
                _fill(x, ins[rank])
                _fill(y, _check.poison(y.nbytes))
                assert comm.all_reduce(x, out=y, op=op) is y
                rows.append((dtype, op, count,
                             _check.count_wrong(_read(y, npdt), op, ins,
                                                dtype)))
                assert comm.all_reduce(x, op=op) is x
                rows.append((dtype, op + "(in place)", count,
                             _check.count_wrong(_read(x, npdt), op, ins,
                                                dtype)))
    comm.close()
    return rows


def torch_collectives(rank, nranks, uid, seed):
    """torch tensors (caching-allocator memory, not windows) through every
    collective, results compared with float64 references."""
    import torch
    torch.cuda.set_device(rank)
    comm = symnccl.Communicator(uid, rank, nranks, device=rank, timeout=120)
    rows = []
    g = torch.Generator(device="cpu").manual_seed(seed)
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int32):
        for count in ODD_SIZES:
            def inp(r, c=count):
                gg = torch.Generator().manual_seed(seed * 1000 + r * 7 + c)
                if dtype.is_floating_point:
                    return (torch.rand(c, generator=gg, dtype=torch.float64)
                            * 2 - 1)
                return torch.randint(-100, 100, (c,), generator=gg,
                                     dtype=torch.float64)
            ref = sum(inp(r) for r in range(nranks))
            x = inp(rank).to(dtype).cuda()
            out = torch.full_like(x, float("nan") if dtype.is_floating_point
                                  else -1)
            y = comm.all_reduce(x, out=out)
            assert y is out and isinstance(y, torch.Tensor)
            got = y.double().cpu()
            refq = sum(inp(r).to(dtype).double() for r in range(nranks))
            eps = {torch.float32: 2**-23, torch.bfloat16: 2**-7,
                   torch.float16: 2**-10, torch.int32: 0}[dtype]
            tol = (nranks + 1) * eps * sum(inp(r).abs() for r in range(nranks))
            wrong = int(((got - refq).abs() > tol + 1e-30).sum()
                        + (~torch.isfinite(got)).sum())
            rows.append(("all_reduce", str(dtype), count, wrong))
            del ref
            # reduce_scatter: new tensor of x's type and first-dim shape
            xs = inp(rank, count * nranks).to(dtype).cuda()
            part = comm.reduce_scatter(xs)
            assert isinstance(part, torch.Tensor) and part.shape == (count,)
            want = sum(inp(r, count * nranks).to(dtype).double()
                       for r in range(nranks))[rank * count:(rank + 1) * count]
            tol = (nranks + 1) * eps * nranks
            rows.append(("reduce_scatter", str(dtype), count,
                         int(((part.double().cpu() - want).abs() > tol).sum())))
            # all_gather: exact
            full = comm.all_gather(x)
            assert full.shape == (count * nranks,)
            want = torch.cat([inp(r).to(dtype) for r in range(nranks)])
            rows.append(("all_gather", str(dtype), count,
                         int((full.cpu() != want).sum())))
            # broadcast in place from the last rank: exact
            b = inp(rank).to(dtype).cuda()
            assert comm.broadcast(b, root=nranks - 1) is b
            rows.append(("broadcast", str(dtype), count,
                         int((b.cpu() != inp(nranks - 1).to(dtype)).sum())))
    del g
    # 2-D reduce_scatter keeps trailing dims
    x = torch.ones(nranks * 3, 5, device="cuda")
    assert comm.reduce_scatter(x).shape == (3, 5)
    assert comm.all_gather(torch.ones(2, 5, device="cuda")).shape == \
        (2 * nranks, 5)
    # runs on torch's current stream: a side stream orders correctly
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        t = torch.full((4099,), float(rank + 1), device="cuda")
        comm.all_reduce(t)
        t.mul_(2)
    s.synchronize()
    rows.append(("stream", "float32", 4099,
                 int((t.cpu() != nranks * (nranks + 1)).sum())))
    comm.barrier(blocking=True)
    comm.close()
    return rows


def errors_and_lifetime(rank, nranks, uid):
    import torch
    torch.cuda.set_device(rank)
    comm = symnccl.Communicator(uid, rank, nranks, device=rank, timeout=120)
    msgs = {}
    other = (rank + 1) % nranks
    try:
        comm.all_reduce(torch.ones(4, device=f"cuda:{other}"))
    except ValueError as e:
        msgs["device"] = str(e)
    try:
        comm.all_reduce(torch.ones(4), )
    except ValueError as e:
        msgs["cpu"] = str(e)
    try:
        comm.all_reduce(torch.ones(4, device="cuda"),
                        out=torch.ones(4, device="cuda", dtype=torch.half))
    except TypeError as e:
        msgs["dtype"] = str(e)
    try:
        comm.reduce_scatter(torch.ones(nranks * 2 + 1, device="cuda"))
    except ValueError as e:
        msgs["divisible"] = str(e)
    # views outlive the buffer object and the communicator
    buf = comm.zeros(1000, "float32")
    t = torch.from_dlpack(buf)
    t.fill_(rank + 1)
    comm.all_reduce(t)
    del buf
    torch.cuda.synchronize()
    total = float(t.sum())
    comm.close()
    comm.close()   # idempotent
    after_close = float(t.sum())
    try:
        comm.all_reduce(t)
    except RuntimeError as e:
        msgs["closed"] = str(e)
    del t
    return msgs, total, after_close


def init_all_in_one_process(devices, seed):
    """One process driving several GPUs: every collective call inside
    symnccl.group()."""
    comms = symnccl.Communicator.init_all(devices, timeout=120)
    n = len(comms)
    assert [c.rank for c in comms] == list(range(n))
    assert all(c.symmetric and c.lsa_size == n for c in comms)
    rows = []
    for dtype in ("float32", "bfloat16", "int64", "float8_e4m3fn"):
        npdt = _check.numpy_dtype(dtype)
        count = 65537
        with symnccl.group():
            bufs = [c.empty(count, dtype) for c in comms]
        ins = [_check.make_input(dtype, count, r, seed) for r in range(n)]
        for b, a in zip(bufs, ins):
            _fill(b, a)
        with symnccl.group():
            for c, b in zip(comms, bufs):
                c.all_reduce(b)
        for b in bufs:
            rows.append((dtype, _check.count_wrong(_read(b, npdt), "sum", ins,
                                                   dtype)))
    symnccl.close_all(comms)
    return rows


def reduce_scatter_windows_odd_blocks(rank, nranks, uid, seed):
    """reduce_scatter between SymmetricBuffers with per-rank blocks that are
    not 16-byte multiples (NCCL 2.28.9's symmetric kernel gets these wrong;
    symnccl must not)."""
    comm = symnccl.Communicator(uid, rank, nranks, device=rank, timeout=120)
    rows = []
    for dtype in ("bfloat16", "float16", "float8_e4m3fn", "float32"):
        npdt = _check.numpy_dtype(dtype)
        for count in (1, 1031, 4096, 4099, 65537):
            ins = [_check.make_input(dtype, count * nranks, r, seed)
                   for r in range(nranks)]
            x, y = comm.empty(count * nranks, dtype), comm.empty(count, dtype)
            _fill(x, ins[rank])
            _fill(y, _check.poison(y.nbytes))
            comm.reduce_scatter(x, out=y)
            part = [a[rank * count:(rank + 1) * count] for a in ins]
            rows.append((dtype, count, _check.count_wrong(_read(y, npdt),
                                                          "sum", part,
                                                          dtype)))
    comm.close()
    return rows
