"""The correctness check run by `python -m symnccl`: every collective, algo,
dtype and op on SymmetricBuffers, against a float64 reference, with
poisoned outputs and sizes that are multiples of nothing."""
from __future__ import annotations

import os

import numpy as np

from . import _check

SIZES = (1, 7, 4099, 65537 * 3)   # elements
QUICK_SIZES = SIZES[:3]   # python -m symnccl --quick


def _fill(buf, arr):
    buf.copy_from_host(np.ascontiguousarray(arr).view(np.uint8))


def _read(buf, npdt):
    return np.frombuffer(buf.to_bytes(), npdt)


def _rooted_or_sliced(comm, coll, algo, dtype, npdt, count, rank, nranks,
                      seed):
    """One reduce_scatter, all_gather, reduce (to rank 0) or broadcast (from
    the last rank) into a poisoned output: its rows (only the root's counts
    for reduce)."""
    n = nranks
    if coll == "reduce_scatter":
        ins = [_check.make_input(dtype, count * n, r, seed) for r in range(n)]
        x, y = comm.empty((count * n,), dtype), comm.empty((count,), dtype)
        _fill(x, ins[rank])
        _fill(y, _check.poison(y.nbytes))
        comm.reduce_scatter(x, out=y, algo=algo)
        part = [a[rank * count:(rank + 1) * count] for a in ins]
        return [(coll, algo, dtype, "sum", count,
                 _check.count_wrong(_read(y, npdt), "sum", part, dtype))]
    small = [_check.make_input(dtype, count, r, seed + 1) for r in range(n)]
    y = comm.empty((count,), dtype)
    _fill(y, small[rank])
    if coll == "all_gather":
        x = comm.empty((count * n,), dtype)
        _fill(x, _check.poison(x.nbytes))
        comm.all_gather(y, out=x, algo=algo)
        got, want = _read(x, npdt), np.concatenate(small)
    elif coll == "reduce":
        z = comm.empty((count,), dtype)
        _fill(z, _check.poison(z.nbytes))
        comm.reduce(y, root=0, out=z, algo=algo)
        if rank != 0:
            return []
        return [(coll, algo, dtype, "sum", count,
                 _check.count_wrong(_read(z, npdt), "sum", small, dtype))]
    else:
        root = n - 1
        comm.broadcast(y, root=root, algo=algo)
        got, want = _read(y, npdt), small[root]
    return [(coll, algo, dtype, "-", count,
             int(np.count_nonzero(got.view(np.uint8) != want.view(np.uint8))))]


def worker(rank, nranks, uid, seed=1234, quick=False):
    import symnccl
    comm = symnccl.Communicator(uid, rank, nranks, device=rank)
    info = {
        "rank": rank, "device": comm.device, "lsa_size": comm.lsa_size,
        "symmetric": comm.symmetric,
        "symmetric_reason": comm.symmetric_reason,
        "multicast": comm.multicast,
        "multicast_reason": comm.multicast_reason,
    }
    rows, skipped = [], []
    sizes = QUICK_SIZES if quick else SIZES
    for dtype in symnccl.DTYPES:
        npdt = _check.numpy_dtype(dtype)
        if npdt is None:
            skipped.append((dtype, "ml_dtypes is not installed"))
            continue
        for count in sizes:
            x = comm.empty((count,), dtype)
            y = comm.empty((count,), dtype)
            for algo in symnccl.ALGORITHMS:
                for op in symnccl.OPS:
                    if not symnccl.algo_supported(comm, algo, dtype, op):
                        continue
                    ins = [_check.make_input(dtype, count, r, seed, op)
                           for r in range(nranks)]
                    for inplace in (False, True):
                        _fill(x, ins[rank])
                        if inplace:
                            comm.all_reduce(x, op=op, algo=algo)
                            out = _read(x, npdt)
                        else:
                            _fill(y, _check.poison(y.nbytes))
                            comm.all_reduce(x, out=y, op=op, algo=algo)
                            out = _read(y, npdt)
                        wrong = _check.count_wrong(out, op, ins, dtype)
                        rows.append(("all_reduce" + ("(in place)" if inplace
                                                     else ""), algo, dtype,
                                     op, count, wrong))
            del x, y
        # reduce_scatter / all_gather / reduce / broadcast, on NCCL and on
        # each of symnccl's kernels for them
        count = sizes[-1]
        for coll in ("reduce_scatter", "all_gather", "reduce", "broadcast"):
            for algo in ("nccl",) + tuple(symnccl._C.COLLECTIVE_KERNELS[coll]):
                if symnccl.algo_supported(comm, algo, dtype, "sum", coll):
                    rows.extend(_rooted_or_sliced(comm, coll, algo, dtype,
                                                  npdt, count, rank, nranks,
                                                  seed))
    comm.barrier(blocking=True)
    comm.close()
    return {"info": info, "rows": rows, "skipped": skipped,
            "pid": os.getpid()}
