"""Do the loaded libnccl's own kernels run on these GPUs and this driver?
One process per GPU (--nranks, default: every GPU), NCCL called through
ctypes, torch for device memory only: a ring ncclSend/ncclRecv (to itself
on one rank, which NCCL carries out with a kernel of its own, where a
one-rank all-reduce launches none), then ncclAllReduce on plain buffers;
every result checked exactly. For NCCL 2.30.7, which failed on 2x H200
with "invalid device function" at its first collective (docs/PERFORMANCE.md,
'NCCL versions'): run it with that libnccl preloaded.

    LD_PRELOAD=/path/to/libnccl.so.2 NCCL_DEBUG=WARN \\
        python3 tools/gpu/nccl_kernel_probe.py [--nranks 2]
"""
import argparse
import ctypes
import multiprocessing as mp
import sys

N = 1 << 20
FLOAT32 = 7          # ncclFloat32
SUM = 0              # ncclSum


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def _nccl():
    lib = ctypes.CDLL("libnccl.so.2")    # the preloaded one, if any
    lib.ncclGetErrorString.restype = ctypes.c_char_p
    lib.ncclGetLastError.restype = ctypes.c_char_p
    return lib


def rank_main(rank, nranks, uid_raw, q):
    """Rank `rank` on GPU `rank`: what it saw, as lines, through q."""
    lines = []
    try:
        nccl = _nccl()
        import torch
        torch.cuda.set_device(rank)

        def check(what, r, comm=None):
            if r != 0:
                raise RuntimeError(
                    f"{what}: {nccl.ncclGetErrorString(r).decode()} ({r}): "
                    f"{nccl.ncclGetLastError(comm).decode(errors='replace')}")

        uid = UniqueId()
        ctypes.memmove(ctypes.byref(uid), uid_raw, 128)
        comm = ctypes.c_void_p()
        check("ncclCommInitRank", nccl.ncclCommInitRank(
            ctypes.byref(comm), nranks, uid, rank))
        s = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        base = torch.arange(N, device="cuda", dtype=torch.float32)
        x = base + 1000 * rank
        y = torch.full_like(x, float("nan"))
        to, frm = (rank + 1) % nranks, (rank - 1) % nranks
        ptr = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731
        check("ncclGroupStart", nccl.ncclGroupStart())
        check("ncclSend", nccl.ncclSend(ptr(x), ctypes.c_size_t(N), FLOAT32,
                                        to, comm, s), comm)
        check("ncclRecv", nccl.ncclRecv(ptr(y), ctypes.c_size_t(N), FLOAT32,
                                        frm, comm, s), comm)
        check("ncclGroupEnd", nccl.ncclGroupEnd(), comm)
        torch.cuda.synchronize()
        ok = torch.equal(y, base + 1000 * frm)
        lines.append(f"rank {rank}: send/recv (from rank {frm}): "
                     f"{'right' if ok else 'WRONG'}")
        z = torch.full_like(x, float("nan"))
        check("ncclAllReduce", nccl.ncclAllReduce(
            ptr(x), ptr(z), ctypes.c_size_t(N), FLOAT32, SUM, comm, s), comm)
        torch.cuda.synchronize()
        want = nranks * base + 1000 * sum(range(nranks))
        ok2 = torch.equal(z, want)
        lines.append(f"rank {rank}: all_reduce sum on plain buffers: "
                     f"{'right' if ok2 else 'WRONG'}")
        nccl.ncclCommDestroy(comm)
        q.put((rank, lines, ok and ok2))
    except Exception as e:   # the probe reports, it does not hide
        lines.append(f"rank {rank}: {type(e).__name__}: {e}")
        q.put((rank, lines, False))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nranks", type=int, default=0,
                   help="processes, one per GPU (0: every GPU)")
    a = p.parse_args()
    nccl = _nccl()
    v = ctypes.c_int()
    nccl.ncclGetVersion(ctypes.byref(v))
    import torch
    n = a.nranks or torch.cuda.device_count()
    if not 1 <= n <= torch.cuda.device_count():
        print(f"--nranks {n}: this machine has {torch.cuda.device_count()} "
              "GPUs (one rank per GPU)")
        return 2
    print(f"NCCL {v.value}, {n} x {torch.cuda.get_device_name()}, torch "
          f"{torch.__version__}", flush=True)
    uid = UniqueId()
    r = nccl.ncclGetUniqueId(ctypes.byref(uid))
    if r != 0:
        print(f"ncclGetUniqueId: {nccl.ncclGetErrorString(r).decode()}")
        return 1
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=rank_main,
                         args=(k, n, ctypes.string_at(ctypes.addressof(uid),
                                                      128), q))
             for k in range(n)]
    for pr in procs:
        pr.start()
    results = []
    for _ in procs:
        try:
            results.append(q.get(timeout=120))
        except Exception:
            results.append((-1, ["a rank gave no answer in 120 s"], False))
            break
    for pr in procs:
        pr.join(timeout=10)
        if pr.is_alive():
            pr.terminate()
    for _, lines, _ in sorted(results):
        print("\n".join(lines))
    return 0 if all(ok for _, _, ok in results) and len(results) == n else 1


if __name__ == "__main__":
    sys.exit(main())
