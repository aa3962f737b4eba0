"""Expert-parallel training of a top-k routed mixture-of-experts layer with
symnccl's all_to_all_v: splits computed on the GPU, the whole training
step (forward, backward, gradient all-reduce, optimizer step) captured in
one CUDA graph and replayed; next to the same layer trained eagerly on
torch.distributed's all_to_all_single with host splits.

Every rank holds --experts-per-rank experts (E = n * experts-per-rank in
all; expert e lives on rank e // experts-per-rank) and its own T tokens:

    h = x @ W_in                                   (T, H), replicated W_in
    top-k of softmax(h @ W_router) -> k experts and weights per token
    pairs (token, expert), sorted by expert: grouped by destination rank
    counts per expert (E,)  --all_to_all-->  rows per (source, my expert)
    h[pairs]  --all_to_all_v, splits = counts per rank (device)-->  rows
    each of my experts' MLP on its rows
    --all_to_all_v, splits = the rows received (device)-->  back in pair
    order; out = h + sum over the k pairs of weight * expert output

symnccl's side moves everything with algo="push": its kernels exchange the
counts on the GPU, so nothing waits for the host and a CUDA graph replays
with the routing of each new batch. The receive buffer is sized for the
worst case (every token of every rank sends min(k, experts-per-rank) rows
here: n * T * min(k, E_local) rows); rows past those received are zero,
and each expert masks the rows that are not its own (a dense stand-in for
a grouped GEMM). all_to_all_v's backward sends the gradients back along the
transposed splits. The reference reads the counts back to the host
(.tolist()) for all_to_all_single's split sizes, then pads what it received
to the same worst case, so both sides run the same matmuls on the same
shapes.

Both start from the same weights (one seed) and see the same batches; the
script prints both loss curves and the median step time of each, and exits
1 unless every step's losses agree within --rtol:

    torchrun --nproc-per-node 2 examples/moe_ep_torch.py
    torchrun --nproc-per-node 8 examples/moe_ep_torch.py --top-k 4
    python examples/moe_ep_torch.py             # one rank, no launcher

--eager runs symnccl's step without the CUDA graph.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
import torch.nn.functional as F

import symnccl.torch as snt
from symnccl.bootstrap import init_torch_launched


class SymncclExchange:
    """Dispatch and combine on symnccl: device splits, nothing on the host."""

    def __init__(self, comm):
        self.comm = comm

    def counts(self, c):
        """Block q of c (this rank's rows for rank q's experts) to rank q."""
        return snt.all_to_all(c, self.comm, algo="push")

    def dispatch(self, send, splits, recv_splits, cap):
        """send's rows, splits[q] of them to rank q, into a buffer of cap
        rows; returns it and the rows received from each rank (written by
        the kernel: recv_splits is not needed)."""
        out = send.new_empty((cap, send.shape[1]))
        return snt.all_to_all_v(send, out, splits, self.comm, algo="push")

    def combine(self, y, got, rows):
        out = y.new_empty((rows, y.shape[1]))
        back, _ = snt.all_to_all_v(y, out, got, self.comm, algo="push")
        return back

    def all_reduce_(self, t):
        snt.all_reduce_(t, self.comm)


class DistExchange:
    """The same on torch.distributed: the counts read back to the host."""

    def counts(self, c):
        out = torch.empty_like(c)
        dist.all_to_all_single(out, c)
        return out

    def dispatch(self, send, splits, recv_splits, cap):
        self.sent = splits.tolist()                       # host syncs
        self.recvd = recv_splits.tolist()
        recv = dist_fn.all_to_all_single(
            send.new_empty((sum(self.recvd), send.shape[1])), send,
            self.recvd, self.sent)
        # padded with zeros to the worst case, as symnccl's buffer is
        return F.pad(recv, (0, 0, 0, cap - recv.shape[0])), recv_splits

    def combine(self, y, got, rows):
        y = y[:sum(self.recvd)]
        return dist_fn.all_to_all_single(
            y.new_empty((rows, y.shape[1])), y, self.sent, self.recvd)

    def all_reduce_(self, t):
        dist.all_reduce(t)


class MoE(torch.nn.Module):
    def __init__(self, hidden, ffn, epr, k, rank, n, dtype, device):
        super().__init__()
        self.n, self.epr, self.k = n, epr, k
        E = n * epr
        g = torch.Generator(device=device).manual_seed(0)

        def rnd(*shape):
            return torch.randn(*shape, device=device, generator=g) \
                / shape[-2] ** 0.5

        mine = slice(rank * epr, (rank + 1) * epr)
        P = torch.nn.Parameter
        self.w_in = P(rnd(hidden, hidden).to(dtype))          # replicated
        self.router = P(rnd(hidden, E).to(dtype))             # replicated
        self.w1 = P(rnd(E, hidden, ffn)[mine].to(dtype).contiguous())
        self.w2 = P(rnd(E, ffn, hidden)[mine].to(dtype).contiguous())

    def replicated(self):
        """Parameters every rank holds whole: their gradients are summed
        over the ranks (each rank's loss is its share of the mean)."""
        return [self.w_in, self.router]

    def experts(self, recv, recv_counts):
        """Each local expert's MLP on its rows of recv: the rows arrive by
        source rank, then by expert (recv_counts (n * epr,), source-major);
        rows past the last received belong to none."""
        cap = recv.shape[0]
        ends = recv_counts.cumsum(0)
        seg = torch.searchsorted(ends, torch.arange(cap, device=recv.device),
                                 right=True)
        local = torch.where(seg < ends.numel(), seg % self.epr, -1)
        y = torch.zeros_like(recv)
        for j in range(self.epr):
            mask = (local == j).unsqueeze(1).to(recv.dtype)
            y = y + mask * (F.gelu(recv @ self.w1[j]) @ self.w2[j])
        return y

    def forward(self, x, ex):
        T, H = x.shape
        n, epr, k = self.n, self.epr, self.k
        h = x @ self.w_in
        probs = (h @ self.router).float().softmax(-1)
        top_w, top_e = probs.topk(k, dim=-1)                  # (T, k)
        weight = (top_w / top_w.sum(-1, keepdim=True)).to(h.dtype)
        expert = top_e.reshape(-1)                            # pair t*k + i
        order = torch.argsort(expert, stable=True)
        counts = torch.zeros(n * epr, dtype=torch.int64, device=x.device)
        counts.scatter_add_(0, expert, torch.ones_like(expert))
        recv_counts = ex.counts(counts)     # (source, my expert) flat
        cap = n * T * min(k, epr)           # the most rows this rank gets
        recv, got = ex.dispatch(h[order // k], counts.view(n, epr).sum(1),
                                recv_counts.view(n, epr).sum(1), cap)
        y = self.experts(recv, recv_counts)
        back = ex.combine(y, got, T * k)                     # pair order
        back = back[torch.argsort(order)].view(T, k, H)
        return h + (back * weight.unsqueeze(-1)).sum(1)


def batches(count, rank, T, H, dtype, device):
    """A fixed set of batches per rank: random tokens and a target that a
    smooth function of them gives (the teacher the same on every rank)."""
    teacher = torch.randn(H, H, device=device,
                          generator=torch.Generator(device=device)
                          .manual_seed(7)) / H ** 0.5
    out = []
    for b in range(count):
        g = torch.Generator(device=device).manual_seed(1000 * (b + 1) + rank)
        x = torch.randn(T, H, device=device, generator=g)
        out.append((x.to(dtype), torch.tanh(x @ teacher).to(dtype)))
    return out


def train(kind, args, rank, n, device, comm):
    dtype = getattr(torch, args.dtype)
    model = MoE(args.hidden, args.ffn, args.experts_per_rank, args.top_k,
                rank, n, dtype, device)
    ex = SymncclExchange(comm) if kind == "symnccl" else DistExchange()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    data = batches(4, rank, args.tokens, args.hidden, dtype, device)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        # this rank's share of the mean over every rank's tokens
        loss = F.mse_loss(model(x, ex).float(), y.float()) / n
        loss.backward()
        for p in model.replicated():
            ex.all_reduce_(p.grad)
        opt.step()
        return loss.detach()

    run = step
    if kind == "symnccl" and not args.eager:
        static_x, static_y = (t.clone() for t in data[0])
        start = [p.detach().clone() for p in model.parameters()]
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):            # warm-up steps, then undone
            for _ in range(2):
                step(static_x, static_y)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            static_loss = step(static_x, static_y)
        with torch.no_grad():
            for p, p0 in zip(model.parameters(), start):
                p.copy_(p0)

        def run(x, y):
            static_x.copy_(x)
            static_y.copy_(y)
            graph.replay()
            return static_loss

    losses, times = [], []
    for i in range(args.steps):
        x, y = data[i % len(data)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = run(x, y)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        total = loss.clone()
        dist.all_reduce(total)
        losses.append(float(total))
    return losses, times


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--tokens", type=int, default=256, help="per rank")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--ffn", type=int, default=1024)
    p.add_argument("--experts-per-rank", type=int, default=2)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--lr", type=float, default=2.0)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--rtol", type=float, default=None,
                   help="largest relative loss difference allowed "
                        "(default 1e-3 for float32, 3e-2 otherwise)")
    p.add_argument("--eager", action="store_true",
                   help="symnccl's step without the CUDA graph")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args()
    # torchrun, or one rank without a launcher
    rank, n, device = init_torch_launched()
    if args.top_k > n * args.experts_per_rank:
        raise SystemExit(f"--top-k {args.top_k} is more than the "
                         f"{n * args.experts_per_rank} experts")
    rtol = args.rtol if args.rtol is not None else \
        1e-3 if args.dtype == "float32" else 3e-2
    comm = snt.communicator()
    res = {}
    for kind in ("symnccl", "torch.distributed"):
        losses, times = train(kind, args, rank, n, device, comm)
        warm = sorted(times[3:] or times)
        res[kind] = {"losses": losses, "step_ms": 1e3 * warm[len(warm) // 2]}
    a, b = res["symnccl"]["losses"], res["torch.distributed"]["losses"]
    finite = all(math.isfinite(v) for v in a + b)
    diff = max(abs(x - y) / abs(y) for x, y in zip(a, b)) if finite \
        else float("inf")      # max() would skip a NaN
    ok = diff <= rtol          # the same losses on every rank: one verdict
    res.update(max_rel_diff=diff, ok=ok, rtol=rtol,
               graph=("none (eager)" if args.eager else
                      "forward + backward + all-reduce + SGD step"),
               args=vars(args) | {"nranks": n},
               # which of symnccl's kernels ran, for the tests (a
               # diagnostic hook, not API)
               kernels={k: v for k, v in comm.comm._launches().items()
                        if v})
    if rank == 0:
        print(f"{n} rank(s), {n * args.experts_per_rank} experts, top-"
              f"{args.top_k}, {args.tokens} tokens per rank, {args.dtype}; "
              f"symnccl's step in a CUDA graph: {not args.eager}")
        print(f"{'step':>5} {'symnccl':>12} {'torch.dist':>12}")
        for s in range(args.steps):
            print(f"{s:>5} {a[s]:>12.6f} {b[s]:>12.6f}")
        print(f"largest relative loss difference: {diff:.2e}"
              f"{'' if finite else ' (a loss is not finite)'} "
              f"(allowed {rtol:g}): {'ok' if ok else 'MISMATCH'}")
        for kind in ("symnccl", "torch.distributed"):
            print(f"{kind:>18}: {res[kind]['step_ms']:.3f} ms/step "
                  "(median after 3 steps)")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1)
    comm.close()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
