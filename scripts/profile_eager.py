"""Host cost of one eager all_reduce call, piece by piece (1 GPU, 1 rank).

    python scripts/profile_eager.py
"""
import time

import torch

import symnccl


def per_call(fn, n=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def main():
    comm = symnccl.Communicator(symnccl.get_unique_id(), 0, 1, device=0,
                                multicast=False)
    buf = comm.empty(2048, "bfloat16")
    t = torch.from_dlpack(buf)
    plain = torch.ones(2048, dtype=torch.bfloat16, device="cuda")
    s = torch.cuda.current_stream().cuda_stream
    sd = s if s else 1   # DLPack's name for the legacy default stream
    rows = [
        ("torch.cuda.current_stream(0).cuda_stream",
         lambda: torch.cuda.current_stream(0).cuda_stream),
        ("torch._C._cuda_getCurrentRawStream(0)",
         lambda: torch._C._cuda_getCurrentRawStream(0)),
        ("t.__dlpack__(stream=sd)", lambda: t.__dlpack__(stream=sd)),
        ("t.__dlpack__(stream=sd, max_version=(1, 1))",
         lambda: t.__dlpack__(stream=sd, max_version=(1, 1))),
        ("t.__dlpack_device__()", lambda: t.__dlpack_device__()),
        ("t.data_ptr()", lambda: t.data_ptr()),
        ("_frameworks.default_stream(t, 0)",
         lambda: symnccl._frameworks.default_stream(t, 0)),
    ]
    for algo in ("ll", "one_shot", "nccl"):
        rows += [
            (f"all_reduce(torch window view, algo={algo})",
             lambda a=algo: comm.all_reduce(t, algo=a)),
            (f"all_reduce(torch window view, algo={algo}, stream=int)",
             lambda a=algo: comm.all_reduce(t, algo=a, stream=s)),
            (f"all_reduce(SymmetricBuffer, algo={algo}, stream=int)",
             lambda a=algo: comm.all_reduce(buf, algo=a, stream=s)),
            (f"all_reduce(plain torch tensor, algo={algo})",
             lambda a=algo: comm.all_reduce(plain, algo=a)),
        ]
    for name, fn in rows:
        print(f"{per_call(fn):8.2f} us  {name}", flush=True)
    import cProfile
    import pstats
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(2000):
        comm.all_reduce(t, algo="ll")
    pr.disable()
    torch.cuda.synchronize()
    pstats.Stats(pr).sort_stats("tottime").print_stats(12)
    comm.close()


if __name__ == "__main__":
    main()
