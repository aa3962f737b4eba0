"""Kernel cost on one GPU: every symnccl algorithm on a 1-rank communicator,
in place on a window, CUDA-graph replay, median of --reps.

With one rank no byte crosses NVLink and no peer is waited for, so this
measures what a kernel costs on its own (launch, loops, loads and stores of
local memory): a build-to-build comparison of kernel code when only a
1-GPU machine is at hand. It says nothing about NVLink.

    python scripts/bench_one_rank.py --sizes 4K,1M,256M
    PYTHONPATH=/tmp/ab/old python scripts/bench_one_rank.py   # another build
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "benchmarks"))
from bench_allreduce import parse_sizes  # noqa: E402

ALGOS = ("ll", "ll128", "one_shot", "two_shot", "push")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="4K,64K,256K,1M,16M,256M")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--dtype", default="bfloat16")
    a = p.parse_args()
    import torch
    import symnccl
    comm = symnccl.Communicator(symnccl.get_unique_id(), 0, 1, device=0)
    dt = getattr(torch, a.dtype)
    print(f"{'size':>8} " + " ".join(f"{x:>9}" for x in ALGOS), flush=True)
    for nbytes in parse_sizes(a.sizes):
        count = nbytes // torch.empty(0, dtype=dt).element_size()
        t = torch.from_dlpack(comm.empty(count, a.dtype))
        t.normal_()
        row = []
        for algo in ALGOS:
            iters = a.iters if nbytes <= (4 << 20) else max(3, a.iters // 10)
            comm.all_reduce(t, algo=algo)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(iters):
                    comm.all_reduce(t, algo=algo)
            g.replay()
            times = []
            for _ in range(a.reps):
                s, e = (torch.cuda.Event(enable_timing=True) for _ in "se")
                s.record()
                g.replay()
                e.record()
                e.synchronize()
                times.append(s.elapsed_time(e) * 1000 / iters)
            row.append(sorted(times)[len(times) // 2])
        del t
        print(f"{nbytes:>8} " + " ".join(f"{x:9.2f}" for x in row),
              flush=True)
    comm.close()


if __name__ == "__main__":
    main()
