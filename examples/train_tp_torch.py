"""Tensor- and sequence-parallel training of a transformer MLP block with
symnccl, next to the same training with torch.distributed.

Each rank holds 1/n of the sequence (sequence parallel) and 1/n of the MLP
(tensor parallel, Megatron style):

    x (T/n, H) -> LayerNorm -> all_gather (T, H) -> x @ W1[:, shard] -> GELU
      -> @ W2[shard, :] (partial sums) -> reduce_scatter (T/n, H) -> + x

With --tp-only (tensor parallel, no sequence parallelism) every rank holds
the whole sequence, and the pair of conjugate all-reduces opens and closes
the parallel region:

    x (T, H) -> LayerNorm -> tp_copy -> x @ W1[:, shard] -> GELU
      -> @ W2[shard, :] (partial sums) -> tp_all_reduce (T, H) -> + x

tp_copy is the identity forward and sums the input's gradient over the
ranks backward; tp_all_reduce sums forward and passes the gradient through
(an all_reduce there would give every shard n times its gradient). On the
torch.distributed side the same pair is written with torch.autograd.Function
around its functional all_reduce.

Both runs start from the same weights and see the same data; the script
prints both loss curves, their largest difference, and the median step
time of each. Run it as is:

    torchrun --nproc-per-node 2 examples/train_tp_torch.py
    torchrun --nproc-per-node 2 examples/train_tp_torch.py --compile
    torchrun --nproc-per-node 2 examples/train_tp_torch.py --algo ll128
    torchrun --nproc-per-node 2 examples/train_tp_torch.py --tp-only

--algo picks symnccl's all_gather / reduce_scatter algorithm ("auto" is
NCCL for them until their crossovers are measured; "ll" and "ll128" run
its packet kernels, "push" its store kernels, in both directions); with
--tp-only, the algorithm of the all-reduces.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch.distributed import _functional_collectives as fc

import symnccl.torch as snt


def _dist_all_reduce(t, group_name):
    """torch.distributed's functional all_reduce (sum), waited for: a plain
    tensor in eager mode, and traceable by torch.compile."""
    c10d = torch.ops._c10d_functional
    return c10d.wait_tensor(c10d.all_reduce(t, "sum", group_name))


class _DistCopy(torch.autograd.Function):
    """torch.distributed's tp_copy: identity forward, all_reduce backward."""

    @staticmethod
    def forward(ctx, x, group_name):
        ctx.group_name = group_name
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _dist_all_reduce(grad, ctx.group_name), None


class _DistReduce(torch.autograd.Function):
    """torch.distributed's tp_all_reduce: all_reduce forward, identity
    backward."""

    @staticmethod
    def forward(ctx, x, group_name):
        return _dist_all_reduce(x, group_name)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class Collectives:
    """all_gather / reduce_scatter / all_reduce along dim 0 and the
    tensor-parallel pair, differentiable: symnccl's custom ops, or
    torch.distributed's autograd collectives."""

    def __init__(self, kind: str, comm=None, algo: str = "auto"):
        self.kind, self.comm, self.algo = kind, comm, algo
        self.group_name = dist.group.WORLD.group_name

    def tp_copy(self, x):
        if self.kind == "symnccl":
            return snt.tp_copy(x, self.comm, algo=self.algo)
        return _DistCopy.apply(x, self.group_name)

    def tp_all_reduce(self, x):
        if self.kind == "symnccl":
            return snt.tp_all_reduce(x, self.comm, algo=self.algo)
        return _DistReduce.apply(x, self.group_name)

    def all_gather(self, x):
        if self.kind == "symnccl":
            return snt.all_gather(x, self.comm, algo=self.algo)
        return fc.all_gather_tensor_autograd(x, 0, dist.group.WORLD)

    def reduce_scatter(self, x):
        if self.kind == "symnccl":
            return snt.reduce_scatter(x, self.comm, algo=self.algo)
        return fc.reduce_scatter_tensor_autograd(x, "sum", 0,
                                                 dist.group.WORLD)

    def all_reduce_(self, x):
        """In place, outside autograd (gradients of replicated weights)."""
        if self.kind == "symnccl":
            snt.all_reduce_(x, self.comm)
        else:
            dist.all_reduce(x)


class ParallelMLP(torch.nn.Module):
    def __init__(self, hidden, ffn, layers, rank, nranks, dtype, seed,
                 tp_only=False):
        super().__init__()
        self.tp_only = tp_only
        g = torch.Generator().manual_seed(seed)   # the full model, then
        shard = ffn // nranks                     # this rank's slices
        self.norms = torch.nn.ModuleList()
        self.w1 = torch.nn.ParameterList()
        self.w2 = torch.nn.ParameterList()
        for _ in range(layers):
            w1 = torch.randn(hidden, ffn, generator=g) / hidden ** 0.5
            w2 = torch.randn(ffn, hidden, generator=g) / ffn ** 0.5
            cols = slice(rank * shard, (rank + 1) * shard)
            self.w1.append(torch.nn.Parameter(w1[:, cols].to(dtype)))
            self.w2.append(torch.nn.Parameter(w2[cols, :].to(dtype)))
            self.norms.append(torch.nn.LayerNorm(hidden, dtype=dtype))

    def forward(self, x, coll: Collectives):
        for norm, w1, w2 in zip(self.norms, self.w1, self.w2):
            if self.tp_only:                               # x: (T, H)
                h = coll.tp_copy(norm(x))                  # (T, H)
                h = torch.nn.functional.gelu(h @ w1)       # (T, F/n)
                x = x + coll.tp_all_reduce(h @ w2)         # (T, H)
                continue
            h = coll.all_gather(norm(x))                   # (T, H)
            h = torch.nn.functional.gelu(h @ w1)           # (T, F/n)
            x = x + coll.reduce_scatter(h @ w2)            # (T/n, H)
        return x

    def replicated(self):
        """Parameters every rank holds whole whose gradients must be summed
        over the ranks: with sequence parallelism each rank saw 1/n of the
        sequence; with --tp-only every rank saw all of it, and tp_copy
        already summed what flows through it, so there are none."""
        if self.tp_only:
            return []
        return [p for n in self.norms for p in n.parameters()]


def data(step, rank, nranks, seq, hidden, dtype, device, tp_only=False):
    """This rank's sequence shard of batch `step` (with tp_only, all of
    it): a fixed random input and a target that a smooth function of it
    gives."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(seq, hidden, generator=g)
    y = torch.tanh(x @ torch.randn(hidden, hidden, generator=g)
                   / hidden ** 0.5)
    rows = slice(0, seq) if tp_only else \
        slice(rank * seq // nranks, (rank + 1) * seq // nranks)
    return x[rows].to(device, dtype), y[rows].to(device, dtype)


def train(kind, args, rank, nranks, device, comm):
    dtype = getattr(torch, args.dtype)
    model = ParallelMLP(args.hidden, args.ffn, args.layers, rank, nranks,
                        dtype, seed=0, tp_only=args.tp_only).to(device)
    coll = Collectives(kind, comm, args.algo)
    fwd = model.forward
    if args.compile:
        fwd = torch.compile(model.forward, fullgraph=True)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    batches = [data(s % 8, rank, nranks, args.seq, args.hidden, dtype,
                    device, args.tp_only) for s in range(args.steps)]
    losses, times = [], []
    for step in range(args.steps):
        x, y = batches[step]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fwd(x, coll)
        loss = torch.nn.functional.mse_loss(out.float(), y.float())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        for p in model.replicated():
            coll.all_reduce_(p.grad)
        opt.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        # the global loss: the mean of the ranks' (equal-sized) shards;
        # with --tp-only every rank's is the whole sequence's
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(float(total) / nranks)
    return losses, times


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--ffn", type=int, default=4096)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile(fullgraph=True) the forward")
    p.add_argument("--algo", default="auto",
                   help="symnccl's all_gather/reduce_scatter algorithm "
                        "(with --tp-only, its all_reduce's)")
    p.add_argument("--tp-only", action="store_true",
                   help="tensor parallel without sequence parallelism: "
                        "tp_copy and tp_all_reduce open and close each "
                        "layer")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args()
    rank = int(os.environ["RANK"])
    nranks = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if (args.seq % nranks and not args.tp_only) or args.ffn % nranks:
        raise SystemExit(f"--seq and --ffn must divide by {nranks} ranks")
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    comm = snt.communicator()
    res = {}
    for kind in ("symnccl", "torch.distributed"):
        losses, times = train(kind, args, rank, nranks, device, comm)
        warm = sorted(times[5:] or times)
        res[kind] = {"losses": losses,
                     "step_ms": 1e3 * warm[len(warm) // 2]}
    a, b = res["symnccl"]["losses"], res["torch.distributed"]["losses"]
    res["max_rel_diff"] = max(abs(x - y) / abs(y) for x, y in zip(a, b))
    res["args"] = vars(args) | {"nranks": nranks}
    # which of symnccl's kernels ran ("nccl": NCCL's calls), for the tests
    # (a diagnostic hook, not API)
    res["kernels"] = {k: v for k, v in comm.comm._launches().items() if v}
    if rank == 0:
        print(f"{'step':>5} {'symnccl':>12} {'torch.dist':>12}")
        for s in list(range(0, args.steps, 10)) + [args.steps - 1]:
            print(f"{s:>5} {a[s]:>12.6f} {b[s]:>12.6f}")
        print(f"largest relative loss difference: {res['max_rel_diff']:.2e}")
        for kind in ("symnccl", "torch.distributed"):
            print(f"{kind:>18}: {res[kind]['step_ms']:.3f} ms/step "
                  "(median after 5 steps)")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1)
    comm.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
