"""What device memory a 2-rank communicator leaves in its process after
close(), after abort(), and after abort() once the peer exited (the
failure tests' leak check; docs/PERFORMANCE.md, 'Device memory after
close').

    python tools/gpu/memory_after_close.py      # 2 GPUs

Per rank, MiB below the free memory before the communicator: after its
creation, after two ll all-reduces, after close/abort, 2 s later, and what
torch's allocator still holds."""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
import symnccl  # noqa: E402
from symnccl.bootstrap import spawn  # noqa: E402


def worker(rank, nranks, uid, mode):
    import torch
    torch.cuda.set_device(rank)

    def free():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        return torch.cuda.mem_get_info()[0]

    f0 = free()
    comm = symnccl.Communicator(uid, rank, nranks, device=rank, timeout=3)
    f1 = free()
    x = torch.randn(4096 * nranks, device="cuda")
    for _ in range(2):
        comm.all_reduce(x, algo="ll")
    torch.cuda.synchronize()
    comm.barrier(blocking=True)
    f2 = free()
    if mode == "exit" and rank == 1:
        return {}
    if mode == "exit":   # the survivor's call times out, then abort
        try:
            comm.all_reduce(x, algo="ll")
            torch.cuda.synchronize()
            comm.check()
        except symnccl.PeerTimeoutError:
            pass
    if mode == "close":
        comm.close()
    else:
        comm.abort()
    del x
    f3 = free()
    time.sleep(2)
    f4 = free()
    return {"mode": mode, "rank": rank, "comm_MiB": (f0 - f1) >> 20,
            "after_calls_MiB": (f0 - f2) >> 20,
            "after_end_MiB": (f0 - f3) >> 20,
            "after_2s_MiB": (f0 - f4) >> 20,
            "torch_alloc_MiB": torch.cuda.memory_allocated() >> 20}


if __name__ == "__main__":
    for mode in ("close", "abort", "exit"):
        print(spawn(worker, 2, args=(mode,), timeout=120))
