"""Rank bodies for the failure tests (tests/test_faults.py): a peer that
exits, sleeps past the timeout, calls with another size, or a collective
aborted from another thread. Each returns what the rank observed; the test
judges it."""
import os
import threading
import time

import symnccl

# What each algo's call launches on 2 ranks (the failure names it).
KERNEL = {"ll": "ll", "ll128": "ll128", "one_shot": "one_shot",
          "two_shot": "two_shot", "push": "push", "nccl": "nccl"}
COUNT = 1 << 16
# What abort() may leave behind (the staging window alone is over 100 MiB),
# and how long a peer that is still running (aborting, or a process
# exiting) may hold this rank's memory through its mapping of it: the
# physical pages go back when the last process holding them lets go.
LEAK = 64 << 20
LEAK_SETTLE = 15.0


def _call(comm, x, collective, algo):
    if collective == "all_reduce":
        return comm.all_reduce(x, algo=algo)
    if collective == "reduce_scatter":
        return comm.reduce_scatter(x, algo=algo)
    if collective == "all_gather":
        return comm.all_gather(x, algo=algo)
    # rooted at rank 1, the rank that leaves (or sleeps): the survivors
    # wait to receive. A root only sends, and over NVLink NCCL's sends to
    # a peer that left its communicator open complete (2x H100)
    return comm.broadcast(x, root=1, algo=algo)


def _free_bytes(torch):
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info()[0]


def _leaked(torch, free0):
    """Device memory not back since free0, once every peer that mapped it
    has let go (polled up to LEAK_SETTLE seconds: a real leak never comes
    back), and how long that took."""
    t0 = time.monotonic()
    while True:
        leaked = free0 - _free_bytes(torch)
        waited = time.monotonic() - t0
        if leaked < LEAK or waited > LEAK_SETTLE:
            return leaked, waited
        time.sleep(0.25)


def _usable(torch):
    """The CUDA context still works: a kernel runs and copies back."""
    return torch.arange(8, device="cuda", dtype=torch.float32).sum().item()


def _error(fn):
    try:
        fn()
    except symnccl.PeerTimeoutError as e:
        return {"type": "PeerTimeoutError", "rank": e.rank,
                "collective": e.collective, "kernel": e.kernel,
                "reason": e.reason, "waited": e.waited,
                "timeout_error": isinstance(e, TimeoutError),
                "message": str(e)}
    except symnccl.CallMismatchError as e:
        return {"type": "CallMismatchError", "message": str(e)}
    except Exception as e:   # noqa: BLE001 (reported to the test)
        return {"type": type(e).__name__, "message": str(e)}
    return None


def _warm_up(comm, x, collective, algo):
    for _ in range(2):   # every kernel loaded and NCCL connected
        _call(comm, x, collective, algo)
    import torch
    torch.cuda.synchronize()
    comm.barrier(blocking=True)


def peer_failure(rank, nranks, uid, scenario, collective, algo, timeout,
                 rehearsal_uid, survivors_uid):
    """scenario: "exit" (rank 1 leaves after the warm-up), "sleep" (rank 1
    sleeps past the timeout, then makes the call), "mismatch" (rank 1 passes
    8 more elements; SYMNCCL_CHECK=1 when checked), "abort" (rank 1 leaves,
    and every other rank's call is ended by abort() from another thread).

    After abort() the ranks still running (all but rank 1 where it left)
    make a new communicator among themselves (survivors_uid, renumbered
    0, 1, ... in rank order, on the same GPUs) and all-reduce ones:
    "fresh_ok" when every element is the number of survivors.

    "leaked" is measured against the device memory after a rehearsal: a
    communicator (rehearsal_uid) that makes the same calls and is closed
    cleanly. What a process's first communicator leaves for the process's
    lifetime is no leak: the CUDA modules of symnccl's and NCCL's kernels,
    loaded at their first launch (about 380 MiB on 2x H200 with NCCL 2.28,
    docs/PERFORMANCE.md, 'Device memory after close'), are in the baseline that way."""
    import torch
    torch.cuda.set_device(rank)
    if scenario == "mismatch_checked":
        os.environ["SYMNCCL_CHECK"] = "1"
    # a rank that "exits" returns, and its interpreter's exit then closes
    # its communicator, bounded by SYMNCCL_EXIT_TIMEOUT (default 30 s): 3 s
    # here, so that the test's bound on every process's exit is short
    os.environ["SYMNCCL_EXIT_TIMEOUT"] = "3"
    x = torch.randn(COUNT * nranks, device="cuda")
    with symnccl.Communicator(rehearsal_uid, rank, nranks, device=rank,
                              timeout=timeout) as rehearsal:
        _warm_up(rehearsal, x, collective, algo)
    free0 = _free_bytes(torch)
    comm = symnccl.Communicator(uid, rank, nranks, device=rank,
                                timeout=timeout)
    _warm_up(comm, x, collective, algo)
    out = {"rank": rank}
    if rank == 1 and scenario in ("exit", "abort"):
        out["left"] = True   # the process ends: its memory and contexts go
        return out
    if rank == 1 and scenario == "sleep":
        time.sleep(timeout + 3)
    if rank == 1 and scenario.startswith("mismatch"):
        x = torch.randn(COUNT * nranks + 8 * nranks, device="cuda")
    if scenario == "abort":
        threading.Timer(1.0, comm.abort).start()
    t0 = time.monotonic()
    out["call_error"] = _error(lambda: _call(comm, x, collective, algo))
    torch.cuda.synchronize()
    out["sync_seconds"] = time.monotonic() - t0
    out["check_error"] = _error(comm.check)
    if scenario == "sleep" and out["call_error"] is None and \
            out["check_error"] is None:
        # algo="nccl": the sleeper's call can complete after its peer gave
        # up (NCCL leaves an aborted collective's output undefined, and
        # nothing here says the peer left): its next call must fail
        out["completed_without_peer"] = True
        t1 = time.monotonic()
        out["next_error"] = _error(
            lambda: (_call(comm, x, collective, algo),
                     torch.cuda.synchronize(), comm.check()))
        out["next_seconds"] = time.monotonic() - t1
    if scenario.startswith("mismatch") and out["check_error"] is None and \
            out["call_error"] is None:
        # the smaller call may complete; the next one meets the failure
        out["second_error"] = _error(
            lambda: (_call(comm, x, collective, algo),
                     torch.cuda.synchronize(), comm.check()))
    out["refused"] = _error(lambda: _call(comm, x, collective, algo))
    out["failure"] = comm.failure
    out["usable"] = _usable(torch)
    comm.abort()
    out["closed"] = comm.closed
    del x
    out["leaked"], out["leak_settled_in"] = _leaked(torch, free0)
    # a new communicator among the survivors, which reach this point at
    # different times (a sleeper's later; each abort takes its own time):
    # its creation waits for them all, at least 60 s
    left = scenario in ("exit", "abort")
    survivors = [q for q in range(nranks) if not (left and q == 1)]
    with symnccl.Communicator(survivors_uid, survivors.index(rank),
                              len(survivors), device=rank,
                              timeout=max(timeout, 60.0)) as fresh:
        y = torch.ones(1031, device="cuda")
        fresh.all_reduce(y, algo=algo if collective == "all_reduce" and
                         algo != "nccl" else "auto")
        torch.cuda.synchronize()
        out["fresh_ok"] = bool((y == len(survivors)).all().item())
        out["fresh_nranks"] = fresh.nranks
    out["total_seconds"] = time.monotonic() - t0
    return out
