"""Tensor-parallel step benchmark: a decode step (T tokens through an MLP
stack, one all-reduce per layer) and a sequence-parallel training step
(all-gather and reduce-scatter per layer, forward and backward), with
symnccl and with torch.distributed, in one run.

Each step is also run with its collectives replaced by local copies of the
same shapes ("none": the compute alone); the communication share of a step
is its time minus that. Times: CUDA-graph replay of --iters steps, device
events, median of --reps repeats.

    python benchmarks/bench_step.py --nranks 2
    python benchmarks/bench_step.py --nranks 2 --sp-algo ll128
    python benchmarks/bench_step.py --report \
        benchmarks/results/step_h200x2_bfloat16.json

A run writes its JSON and a PNG beside it (plot: per step kind, bars of
us per step by T for symnccl, torch.distributed and none, and the
communication, time - none, of the first two against T); --report prints
a JSON's table and writes its PNG beside it.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_allreduce import (  # noqa: E402
    add_results_args, bar_panel, bar_slots, median_us, plot_beside, pyplot,
    refuse_torchrun, report, run_info, us_panel, write_results)

KINDS = ("symnccl", "torch.distributed", "none")


def _time(fn, iters, reps, torch):
    """Median microseconds per fn() over CUDA-graph replays (warm-up on a
    side stream, as a capture of a backward needs)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):   # warm-up outside the capture
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(iters):
            fn()
    return median_us(g.replay, iters, reps, torch)


def _collectives(kind, comm, n, rank, torch, dist, sp_algo="auto"):
    """(all_reduce, all_gather, reduce_scatter) out of place along dim 0,
    differentiable, for `kind`; symnccl's all_gather and reduce_scatter on
    sp_algo."""
    import symnccl.torch as snt
    from torch.distributed import _functional_collectives as fc
    if kind == "symnccl":
        return (lambda x: snt.all_reduce(x, comm),
                lambda x: snt.all_gather(x, comm, algo=sp_algo),
                lambda x: snt.reduce_scatter(x, comm, algo=sp_algo))
    if kind == "torch.distributed":
        def all_reduce(x):
            y = x.clone()
            dist.all_reduce(y)
            return y
        group = dist.group.WORLD
        return (all_reduce,
                lambda x: fc.all_gather_tensor_autograd(x, 0, group),
                lambda x: fc.reduce_scatter_tensor_autograd(x, "sum", 0,
                                                            group))
    # none: local copies of the same shapes
    return (lambda x: x.clone(),
            lambda x: x.repeat(n, *([1] * (x.dim() - 1))),
            lambda x: x.chunk(n)[rank].clone())


def worker(rank, nranks, uid, opts):
    import torch
    import torch.distributed as dist

    import symnccl
    import symnccl.torch as snt
    from symnccl.bootstrap import init_torch
    init_torch(rank, nranks, opts["port"])
    comm = snt.wrap(symnccl.Communicator(uid, rank, nranks, device=rank))
    dtype = getattr(torch, opts["dtype"])
    H, L, n = opts["hidden"], opts["layers"], nranks
    F = 4 * H // n
    g = torch.Generator(device="cuda").manual_seed(0)
    w1 = [torch.randn(H, F, generator=g, device="cuda", dtype=dtype) / H**.5
          for _ in range(L)]
    w2 = [torch.randn(F, H, generator=g, device="cuda", dtype=dtype) / F**.5
          for _ in range(L)]
    rows = []

    # decode: replicated activations, row-parallel output all-reduced
    for T in opts["tokens"]:
        x = torch.randn(T, H, generator=g, device="cuda", dtype=dtype)
        row = {"step": "decode", "tokens": T}
        outs = {}
        for kind in KINDS:
            ar, _, _ = _collectives(kind, comm, n, rank, torch, dist)

            def step(ar=ar):
                h = x
                for a, b in zip(w1, w2):
                    h = ar(torch.nn.functional.gelu(h @ a) @ b)
                outs[kind] = h
            row[kind] = _time(step, opts["iters"], opts["reps"], torch)
        row["same_output"] = bool(torch.equal(outs["symnccl"],
                                              outs["torch.distributed"]))
        rows.append(row)

    # training: sequence parallel, forward and backward
    for T in opts["train_tokens"]:
        x = torch.randn(T // n, H, generator=g, device="cuda", dtype=dtype,
                        requires_grad=True)
        ws = [(a.clone().requires_grad_(True), b.clone().requires_grad_(True))
              for a, b in zip(w1, w2)]
        row = {"step": "train", "tokens": T}
        for kind in KINDS:
            _, ag, rs = _collectives(kind, comm, n, rank, torch, dist,
                                     opts["sp_algo"])

            def step(ag=ag, rs=rs):
                h = x
                for a, b in ws:
                    h = h + rs(torch.nn.functional.gelu(ag(h) @ a) @ b)
                h.float().square().mean().backward()
            row[kind] = _time(step, max(1, opts["iters"] // 10),
                              opts["reps"], torch)
        rows.append(row)
    comm.close()
    dist.destroy_process_group()
    return rows


def print_table(doc):
    print(f"# {doc['gpu']} x{doc['nranks']}, {doc['dtype']}, H={doc['hidden']}"
          f", {doc['layers']} layers, training all_gather/reduce_scatter "
          f"algo {doc.get('sp_algo', 'auto')}, CUDA graph, median us per "
          "step")
    print(f"{'step':>6} {'T':>5} {'symnccl':>9} {'torch.d':>9} {'none':>9} "
          f"{'comm sym':>9} {'comm t.d':>9} {'ratio':>6}")
    for r in doc["rows"]:
        cs = r["symnccl"] - r["none"]
        ct = r["torch.distributed"] - r["none"]
        ratio = f"{cs / ct:.2f}" if ct > 0 else "-"
        print(f"{r['step']:>6} {r['tokens']:>5} {r['symnccl']:>9.1f} "
              f"{r['torch.distributed']:>9.1f} {r['none']:>9.1f} {cs:>9.1f} "
              f"{ct:>9.1f} {ratio:>6}")


#: the plotted columns: (row key, legend label, line style)
COLUMNS = (("symnccl", "symnccl", "-o"),
           ("torch.distributed", "torch.distributed", "--s"),
           ("none", "none (local copies)", ":^"))


def plot(doc, path):
    """A row of two panels per step kind (decode, train): bars of us per
    step, a group per T (symnccl, torch.distributed, none; each one's
    communication, time - none, beside it, and their ratio in the
    heading); the communication against T, log scale, where a step's that
    is not above its none (noise, at one rank) is left out and counted in
    the legend."""
    plt = pyplot()
    steps = list(dict.fromkeys(r["step"] for r in doc["rows"]))
    panels = []
    for step in steps:
        rows = [r for r in doc["rows"] if r["step"] == step]
        groups = []
        for r in rows:
            cs = r["symnccl"] - r["none"]
            ct = r["torch.distributed"] - r["none"]
            head = f"T={r['tokens']}"
            if cs > 0 and ct > 0:
                head += f"  (comm {cs / ct:.2f}x torch.distributed's)"
            if r.get("same_output") is False:
                head += "  outputs differ"
            groups.append((head, [
                (label, r.get(key), key,
                 f"  (comm {r[key] - r['none']:+.1f})" if key != "none"
                 else "") for key, label, _ in COLUMNS]))
        panels.append((step, rows, groups))
    slots = [max(bar_slots(g), 9) for _, _, g in panels]
    fig, axes = plt.subplots(len(panels), 2, squeeze=False,
                             figsize=(13, 1.2 + 0.2 * sum(slots)),
                             gridspec_kw={"height_ratios": slots,
                                          "width_ratios": (3, 2)})
    colors = {}
    for (a1, a2), (step, rows, groups) in zip(axes, panels):
        bar_panel(a1, groups, f"{step}: µs per step (median, CUDA graph)",
                  "µs per step", colors=colors)
        comm = [{"tokens": r["tokens"],
                 **{k: r[k] - r["none"] for k, _, _ in COLUMNS[:2]}}
                for r in rows]
        us_panel(a2, comm, "tokens", COLUMNS[:2], "tokens (T)",
                 f"{step}: communication, µs per step - none's",
                 negative="not above none", ylabel="µs per step - none's")
    fig.suptitle(f"{doc['gpu']} x{doc['nranks']}, {doc['dtype']}, "
                 f"H={doc['hidden']}, {doc['layers']} layers, training "
                 f"all_gather/reduce_scatter algo "
                 f"{doc.get('sp_algo', 'auto')}; {doc.get('date', '')}"
                 + (f"\n{doc['note']}" if doc.get("note") else ""),
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nranks", type=int, default=None)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--hidden", type=int, default=8192)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--tokens", default="1,4,16,64,256,1024",
                   help="decode token counts")
    p.add_argument("--train-tokens", default="2048,8192",
                   help="sequence lengths of the training step")
    p.add_argument("--sp-algo", default="auto",
                   help="algorithm of symnccl's all_gather and "
                        "reduce_scatter in the training step")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--reps", type=int, default=7)
    add_results_args(p)
    args = p.parse_args(argv)
    if report(args, print_table, plot) is not None:
        return 0
    refuse_torchrun("bench_step.py")
    import torch

    from symnccl.bootstrap import free_port, local_device_count, spawn
    n = args.nranks or local_device_count()
    ints = lambda s: [int(v) for v in s.split(",") if v]  # noqa: E731
    opts = dict(dtype=args.dtype, hidden=args.hidden, layers=args.layers,
                tokens=ints(args.tokens), train_tokens=ints(args.train_tokens),
                iters=args.iters, reps=args.reps, sp_algo=args.sp_algo,
                port=free_port())
    res = spawn(worker, n, args=(opts,), timeout=1800)
    doc = run_info(n, torch.cuda.get_device_name(0), torch.__version__,
                   dtype=args.dtype, hidden=args.hidden, layers=args.layers,
                   sp_algo=args.sp_algo, iters=args.iters, reps=args.reps,
                   rows=res[0])
    path = write_results(doc, "step_", args.out)
    print_table(doc)
    plot_beside(plot, doc, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
