"""Rank bodies for tests/test_inputs.py's multi-GPU tests (run by
symnccl.bootstrap.spawn)."""
import warnings

import symnccl


def all_to_all_v_uneven_every_algo(rank, nranks, uid):
    """all_to_all_v with inputs that differ by rank around every size cap:
    rank 0's x is larger than ll's rows and sends all of it to the last
    rank, whose out holds fewer rows than it is sent; the other ranks send
    one row to rank 0. For each algorithm: this rank's outcome (None or
    the exception's type and message), what its out_splits say, and
    whether the communicator is still usable (check())."""
    import torch
    torch.cuda.set_device(rank)
    comm = symnccl.Communicator(uid, rank, nranks, device=rank, timeout=20)
    room = comm._staging_layout()["ll_row"] // 16 * 8
    d = 4
    cap = (room - 8) // (d * 4)
    rows = cap + 5 if rank == 0 else 1
    x = torch.arange(rows * d, device="cuda",
                     dtype=torch.float32).reshape(rows, d)
    results = {}
    for algo in ("ll", "push", "nccl"):
        for device_splits in (False, True):
            s = [0] * nranks
            s[nranks - 1 if rank == 0 else 0] = rows
            splits = torch.tensor(s, device="cuda") if device_splits else s
            out_rows = cap // 2 if rank == nranks - 1 else nranks
            out = torch.zeros(out_rows, d, device="cuda")
            got = torch.full((nranks,), -1, dtype=torch.int64, device="cuda")
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    comm.all_to_all_v(x, out, splits, out_splits=got,
                                      algo=algo)
                torch.cuda.synchronize()
                outcome = None
            except Exception as e:    # noqa: BLE001 (the outcome is data)
                outcome = (type(e).__name__, str(e))
            try:
                comm.check()
                usable = True
            except Exception as e:    # noqa: BLE001
                usable = f"{type(e).__name__}: {e}"
            # rank 0's first rows (its x is arange, as this rank builds it)
            first = torch.arange(out_rows * d, device="cuda",
                                 dtype=torch.float32).reshape(out_rows, d)
            ok = bool(torch.equal(out, first)) \
                if rank == nranks - 1 and outcome is None else None
            results[(algo, device_splits)] = (outcome, got.tolist(), usable,
                                              ok)
            if usable is not True:
                comm.abort()
                return results
    comm.close()
    return results
