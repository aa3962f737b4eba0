"""Tensor-parallel decode steps of a decoder layer stack with symnccl's
fused all-reduce + residual add + RMSNorm, captured in one CUDA graph and
replayed, next to the same stack written unfused on torch.distributed.

Every rank holds 1/n of each matmul (Megatron style: the first matmul of
a block split by columns, the second by rows), and each block's
row-parallel output goes through the all-reduce fused with the residual
add and the norm that follow it:

    y, res (T, H): the normed hidden states and the residual stream
    mixer: p = (y @ Wv[:, shard]) @ Wo[shard, :]              partial sums
           y, res = all_reduce_add_rmsnorm(p, res, norm_1)
    mlp:   p = (silu(y @ Wg[:, shard]) * (y @ Wu[:, shard])) @ Wd[shard, :]
           y, res = all_reduce_add_rmsnorm(p, res, norm_2)

The mixer is a token-wise stand-in for attention: a decode step's
attention reads a KV cache, which changes nothing about the all-reduce
after its o_proj. The fused stack calls symnccl.torch.all_reduce_add_rmsnorm
(h = all_reduce(p) + res, y = rms_norm(h) * w in one kernel); the reference
calls torch.distributed.all_reduce, then torch.add and
torch.nn.functional.rms_norm. For each token count T both stacks are
captured in a CUDA graph of all --layers layers and replayed; their outputs
(y and res) must agree within bf16 tolerance (relative L2 error below
--rtol), else the script exits 1. Per-step latency of each graph is
printed for information (median of --reps replays), not as a claim:

    torchrun --nproc-per-node 2 examples/decode_tp_torch.py
    torchrun --nproc-per-node 8 examples/decode_tp_torch.py --tokens 1,32,256
    torchrun --nproc-per-node 2 examples/decode_tp_torch.py --compile
    python examples/decode_tp_torch.py         # one rank, no launcher

--compile also runs the fused stack through torch.compile(fullgraph=True)
(the custom op symnccl::all_reduce_add_rmsnorm in Inductor's graph),
captured the same way, and checks it against the reference too.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import symnccl.torch as snt
from symnccl.bootstrap import init_torch_launched

EPS = 1e-6


class Layers:
    """This rank's shards of every layer's weights: the full matrices drawn
    from one seed on every rank (the same on every rank), then sliced."""

    def __init__(self, hidden, ffn, layers, rank, n, device, dtype):
        g = torch.Generator(device=device).manual_seed(0)

        def shard(rows, cols, dim):
            w = torch.randn(rows, cols, device=device, generator=g) \
                / rows ** 0.5
            k = w.shape[dim] // n
            return w.narrow(dim, rank * k, k).to(dtype).contiguous()

        def norm():
            return (1 + 0.1 * torch.randn(hidden, device=device,
                                          generator=g)).to(dtype)

        self.norm_0 = norm()
        self.layers = []
        for _ in range(layers):
            self.layers.append({
                "wv": shard(hidden, hidden, 1), "wo": shard(hidden, hidden, 0),
                "norm_1": norm(),
                "wg": shard(hidden, ffn, 1), "wu": shard(hidden, ffn, 1),
                "wd": shard(ffn, hidden, 0), "norm_2": norm()})


def fused_norm(comm, algo):
    def f(p, res, w):
        return snt.all_reduce_add_rmsnorm(p, res, w, EPS, comm, algo=algo)
    return f


def unfused_norm(p, res, w):
    """The reference: NCCL's all-reduce (torch.distributed), the add and
    torch's rms_norm, one kernel each."""
    dist.all_reduce(p)                    # in place: p is this step's own
    h = p + res
    return F.rms_norm(h, (h.shape[-1],), w, EPS), h


def stack(model: Layers, norm_fn):
    """One decode step through every layer: (y, res) -> (y, res)."""
    def step(y, res):
        for L in model.layers:
            p = (y @ L["wv"]) @ L["wo"]
            y, res = norm_fn(p, res, L["norm_1"])
            p = (F.silu(y @ L["wg"]) * (y @ L["wu"])) @ L["wd"]
            y, res = norm_fn(p, res, L["norm_2"])
        return y, res
    return step


def capture(fn, y, res):
    """fn(y, res) in a CUDA graph, after two eager runs on a side stream
    (NCCL connects lazily; torch.compile compiles there). Returns the graph
    and its outputs, which every replay rewrites."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn(y, res)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn(y, res)
    return g, out


def replay_us(g, iters, reps):
    """Median microseconds of one replay, the ranks aligned before each
    timed batch of `iters` replays."""
    times = []
    for _ in range(reps):
        dist.barrier()
        torch.cuda.synchronize()
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / iters)
    return sorted(times)[len(times) // 2]


def rel_err(a, b):
    """||a - b|| / ||b|| in float32."""
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", default="1,16,64,256",
                   help="decode batch sizes T, comma-separated")
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--ffn", type=int, default=14336)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--algo", default="auto",
                   help="all_reduce_add_rmsnorm's algo (auto, one_shot, "
                        "two_shot)")
    p.add_argument("--compile", action="store_true",
                   help="also the fused stack under "
                        "torch.compile(fullgraph=True)")
    p.add_argument("--rtol", type=float, default=2e-2,
                   help="largest relative L2 error of y and res allowed")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args()
    # torchrun, or one rank without a launcher
    rank, n, device = init_torch_launched()
    if args.hidden % n or args.ffn % n:
        raise SystemExit(f"--hidden and --ffn must divide by {n} ranks")
    dtype = torch.bfloat16
    comm = snt.communicator()
    model = Layers(args.hidden, args.ffn, args.layers, rank, n, device,
                   dtype)
    kinds = {"symnccl fused": stack(model, fused_norm(comm, args.algo)),
             "torch.dist unfused": stack(model, unfused_norm)}
    if args.compile:
        kinds["symnccl fused, compiled"] = torch.compile(
            kinds["symnccl fused"], fullgraph=True, dynamic=False)
    ref = "torch.dist unfused"
    rows = []
    with torch.no_grad():
        for T in [int(t) for t in args.tokens.split(",")]:
            # the step's input: a residual stream the same on every rank
            # and its norm (the previous layer's fused output)
            gen = torch.Generator(device=device).manual_seed(1000 + T)
            res = torch.randn(T, args.hidden, device=device,
                              generator=gen).to(dtype)
            y = F.rms_norm(res, (args.hidden,), model.norm_0, EPS)
            row = {"T": T, "us": {}, "rel_err": {}}
            outs, graphs = {}, {}
            for kind, fn in kinds.items():
                graphs[kind], outs[kind] = capture(fn, y, res)
                graphs[kind].replay()
            torch.cuda.synchronize()
            for kind in kinds:
                if kind != ref:
                    row["rel_err"][kind] = max(
                        rel_err(outs[kind][0], outs[ref][0]),
                        rel_err(outs[kind][1], outs[ref][1]))
                row["us"][kind] = round(replay_us(graphs[kind], args.iters,
                                                  args.reps), 2)
            del graphs, outs
            rows.append(row)
    worst = max((e for r in rows for e in r["rel_err"].values()),
                default=0.0)
    # every rank's verdict: all ranks exit alike
    bad = torch.tensor([float(worst > args.rtol or worst != worst)],
                       device=device)
    dist.all_reduce(bad)
    ok = float(bad) == 0
    doc = {"rows": rows, "max_rel_err": worst, "ok": ok,
           "args": vars(args) | {"nranks": n},
           # which of symnccl's kernels ran, for the tests (a diagnostic
           # hook, not API)
           "kernels": {k: v for k, v in comm.comm._launches().items() if v}}
    if rank == 0:
        names = list(kinds)
        print(f"{n} rank(s), {args.layers} layers, H {args.hidden}, "
              f"ffn {args.ffn}, bf16; us per decode step (CUDA graph "
              "replay, median; for information)")
        print(f"{'T':>5} " + " ".join(f"{k:>24}" for k in names)
              + f" {'rel. error':>10}")
        for r in rows:
            print(f"{r['T']:>5} " + " ".join(f"{r['us'][k]:>24.1f}"
                                              for k in names)
                  + f" {max(r['rel_err'].values()):>10.2e}")
        print(f"fused == unfused within {args.rtol:g} (relative L2 of y "
              f"and the residual): {ok}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=1)
    comm.close()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
