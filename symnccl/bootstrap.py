"""Starting ranks: one process per local GPU, unique id shared by the parent.

Example::

    from symnccl.bootstrap import spawn

    def work(rank, nranks, uid):
        comm = symnccl.Communicator(uid, rank, nranks, device=rank)
        ...
        return result

    results = spawn(work, nranks=2)   # [result of rank 0, result of rank 1]
"""
from __future__ import annotations

import multiprocessing as mp
import queue
import socket
import time
import traceback
import warnings

from . import _C

__all__ = ["spawn", "local_device_count", "free_port", "init_torch",
           "init_torch_launched"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for the
    torch.distributed / jax.distributed coordinators of spawned ranks)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_torch(rank: int, nranks: int, port: int) -> None:
    """torch.distributed for a spawned rank: an NCCL process group over
    127.0.0.1:port, with GPU `rank` current and LOCAL_RANK set, as torchrun
    would have it.

    Example::

        def work(rank, nranks, uid, port):
            init_torch(rank, nranks, port)
            comm = symnccl.torch.communicator()

        spawn(work, 2, args=(free_port(),))
    """
    import os

    import torch
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    os.environ["LOCAL_RANK"] = str(rank)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=nranks,
                            device_id=torch.device("cuda", rank))


def init_torch_launched():
    """torch.distributed as a script's launcher set it up (torchrun's RANK,
    WORLD_SIZE, LOCAL_RANK), or a one-rank group on GPU 0 when the script
    runs without one; returns (rank, nranks, device).

    Example::

        rank, nranks, device = init_torch_launched()
        comm = symnccl.torch.communicator()
    """
    import os

    import torch
    import torch.distributed as dist
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                          MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(free_port()))
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    return rank, n, device


def local_device_count() -> int:
    """Number of CUDA devices this process sees (0 without a driver)."""
    return _C.cuda_versions()["device_count"]


def _child(target, rank, nranks, uid, args, q):
    try:
        q.put((rank, True, target(rank, nranks, uid, *args)))
    except BaseException as e:  # report every failure to the parent
        q.put((rank, False, f"{type(e).__name__}: {e}\n"
                            f"{traceback.format_exc()}"))


class SlowExitWarning(RuntimeWarning):
    """A spawned rank returned its result but its process did not end
    within spawn's exit_timeout (it was terminated)."""


def spawn(target, nranks: int, args: tuple = (), timeout: float = 900.0,
          exit_timeout: float = 60.0):
    """Run target(rank, nranks, unique_id, *args) in nranks fresh processes
    (multiprocessing 'spawn'; children inherit this environment unchanged)
    and return their results in rank order. Raises RuntimeError naming the
    rank that failed, and TimeoutError if the ranks do not finish in time;
    no child outlives the call: one still running exit_timeout seconds
    after the results came is terminated, with a SlowExitWarning naming
    it. Both timeouts pass the communicators' check (finite, > 0, at most
    MAX_TIMEOUT): a nan deadline would never pass."""
    timeout = _C._check_timeout(timeout)
    exit_timeout = _C._check_timeout(exit_timeout)
    ctx = mp.get_context("spawn")
    uid = _C.get_unique_id()
    q = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(target, r, nranks, uid, args,
                                              q), daemon=True)
             for r in range(nranks)]
    for p in procs:
        p.start()
    results, errors = {}, {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) + len(errors) < nranks:
            if errors:   # peers of a failed rank would wait on it: end soon
                deadline = min(deadline, time.monotonic() + 20.0)
            left = deadline - time.monotonic()
            if left <= 0 and errors:
                break
            if left <= 0:
                raise TimeoutError(
                    f"ranks {sorted(set(range(nranks)) - set(results) - set(errors))} "
                    f"did not finish within {timeout:.0f} s")
            try:
                rank, ok, val = q.get(timeout=min(left, 1.0))
            except queue.Empty:
                dead = [r for r, p in enumerate(procs)
                        if p.exitcode not in (None, 0)
                        and r not in results and r not in errors]
                for r in dead:
                    errors[r] = f"process exited with code {procs[r].exitcode}"
                continue
            (results if ok else errors)[rank] = val
        if errors:
            r = min(errors)
            raise RuntimeError(f"rank {r} of {nranks} failed: {errors[r]}")
        exit_deadline = time.monotonic() + exit_timeout
        for r, p in enumerate(procs):
            p.join(timeout=max(0.0, exit_deadline - time.monotonic()))
            if p.is_alive():
                warnings.warn(f"rank {r} of {nranks} was still running "
                              f"{exit_timeout:.0f} s after the ranks "
                              "returned (terminated)", SlowExitWarning,
                              stacklevel=2)
        return [results[r] for r in range(nranks)]
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(5)
                if p.is_alive():
                    p.kill()
