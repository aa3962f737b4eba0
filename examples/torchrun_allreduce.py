"""torchrun --nproc-per-node=2 examples/torchrun_allreduce.py

symnccl inside a torchrun job: bootstrap over torch.distributed, a symmetric
buffer viewed as a torch tensor, in-place and out-of-place all-reduce, and
the same op inside torch.compile.
"""
import torch
import torch.distributed as dist

import symnccl.torch as snt


def main():
    dist.init_process_group("nccl")
    rank, n = dist.get_rank(), dist.get_world_size()
    comm = snt.communicator()              # cuda:LOCAL_RANK
    torch.cuda.set_device(comm.device)

    buf = comm.empty((1 << 20,), "bfloat16")
    t = torch.from_dlpack(buf)             # zero-copy view of the window
    t.fill_(rank + 1)
    comm.all_reduce(t)                     # in place: no copy at all
    assert float(t[0]) == n * (n + 1) / 2

    x = torch.randn(4096, device="cuda")
    y = snt.all_reduce(x, comm, op="max")  # torch custom op

    @torch.compile(fullgraph=True)
    def step(a):
        return snt.all_reduce(a * 2, comm) / n

    z = step(x)
    torch.cuda.synchronize()
    if rank == 0:
        print(f"{n} ranks: in-place sum ok, max {float(y.max()):.3f}, "
              f"compiled mean*2 {float(z[0]):.3f}")
    comm.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
