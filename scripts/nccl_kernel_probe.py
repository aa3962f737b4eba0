"""Does the loaded libnccl's own kernel run on this GPU and driver? One
rank, one GPU: a grouped ncclSend/ncclRecv to itself, which NCCL carries
out with a kernel of its own (a one-rank all-reduce launches none), and the
data checked. For NCCL 2.30.7, which failed on 2x H200 with "invalid device
function" at its first collective while every check on one GPU passed
(benchmarks/NOTES.md, 30): run it with that libnccl preloaded.

    LD_PRELOAD=/path/to/libnccl.so.2 NCCL_DEBUG=WARN \\
        python3 scripts/nccl_kernel_probe.py
"""
import ctypes
import sys


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def main():
    nccl = ctypes.CDLL("libnccl.so.2")   # the preloaded one, if any
    import torch                         # device memory and a stream only
    v = ctypes.c_int()
    nccl.ncclGetVersion(ctypes.byref(v))
    nccl.ncclGetErrorString.restype = ctypes.c_char_p
    nccl.ncclGetLastError.restype = ctypes.c_char_p
    print(f"NCCL {v.value} ({torch.cuda.get_device_name()}, torch "
          f"{torch.__version__})", flush=True)

    def check(what, r, comm=None):
        if r != 0:
            last = nccl.ncclGetLastError(comm).decode(errors="replace")
            print(f"{what}: {nccl.ncclGetErrorString(r).decode()} ({r}): "
                  f"{last}")
            sys.exit(1)

    uid = UniqueId()
    check("ncclGetUniqueId", nccl.ncclGetUniqueId(ctypes.byref(uid)))
    comm = ctypes.c_void_p()
    check("ncclCommInitRank",
          nccl.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0))
    n = 1 << 20
    x = torch.randn(n, device="cuda")
    y = torch.full_like(x, float("nan"))
    s = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    f32 = 7   # ncclFloat32
    check("ncclGroupStart", nccl.ncclGroupStart())
    check("ncclSend", nccl.ncclSend(ctypes.c_void_p(x.data_ptr()),
                                    ctypes.c_size_t(n), f32, 0, comm, s), comm)
    check("ncclRecv", nccl.ncclRecv(ctypes.c_void_p(y.data_ptr()),
                                    ctypes.c_size_t(n), f32, 0, comm, s), comm)
    check("ncclGroupEnd", nccl.ncclGroupEnd(), comm)
    try:
        torch.cuda.synchronize()
    except RuntimeError as e:
        print(f"synchronize after the send/recv kernel: {e}")
        sys.exit(1)
    same = torch.equal(x, y)
    print(f"send/recv to self through NCCL's kernel: "
          f"{'right' if same else 'WRONG'}", flush=True)
    nccl.ncclCommDestroy(comm)
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
