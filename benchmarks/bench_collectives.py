"""Reduce-scatter, all-gather, broadcast and reduce: symnccl against
torch.distributed, same run, one process per GPU (issue 16's baselines).

Methods (each skipped with a printed reason where unavailable):
  symnccl          Communicator.<collective> on torch tensors (whatever
                   algo="auto" runs)
  symnccl:<algo>   each algorithm with a kernel for the collective
                   (symnccl._C.COLLECTIVE_KERNELS): ll, ll128 and push
                   for reduce_scatter and all_gather, one_shot for
                   reduce and broadcast; torch tensors
  nccl:plain       the Communicator method with algo="nccl" on torch
                   tensors (symnccl's NCCL path: its host cost, eager)
  nccl:window      ... on SymmetricBuffers (NCCL's symmetric kernels;
                   runs before 2026-11-23 evening recorded this, with
                   "auto" then NCCL, as symnccl:window)
  torch.dist       reduce_scatter_tensor / all_gather_into_tensor /
                   broadcast / reduce
(PyTorch's symm_mem has none of the four without multicast: its
multimem_all_gather_out needs NVLS, which these machines keep off.)

Sizes are the issue's: a reduce-scatter's input per rank, an all-gather's
output per rank, a broadcast's or reduce's tensor. Timing as
bench_allreduce.py: CUDA-graph replay (or eager with --eager) of `iters`
calls over 4 buffers, device events, median of --reps; every method is
checked against a float64 reference first (#wrong).

    python benchmarks/bench_collectives.py --nranks 2 --eager
    python benchmarks/bench_collectives.py --report results/x.json

It starts its own process per GPU: run it with python, never under
torchrun (it refuses WORLD_SIZE > 1).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_allreduce import (  # noqa: E402
    NBUF, _fmt_size, _time, add_results_args, parse_sizes, plot_beside,
    refuse_torchrun, report, run_info, write_results)

COLLECTIVES = ("reduce_scatter", "all_gather", "broadcast", "reduce")
SIZES = "8K,16K,32K,64K,128K,256K,512K,1M,2M,4M,16M,64M"


def _calls(coll, comm, dist, n, rank, xs, ys, algo="auto"):
    """symnccl's and torch.distributed's fn(i) for one collective; xs
    inputs, ys outputs (lists of NBUF)."""
    def sym(i):
        x, y = xs[i % NBUF], ys[i % NBUF]
        if coll == "reduce_scatter":
            return comm.reduce_scatter(x, out=y, algo=algo)
        if coll == "all_gather":
            return comm.all_gather(x, out=y, algo=algo)
        if coll == "broadcast":
            return comm.broadcast(x, root=0, out=y, algo=algo)
        return comm.reduce(x, root=0, out=y, algo=algo)

    def td(i):   # broadcast and reduce in place on y, as torch has them
        x, y = xs[i % NBUF], ys[i % NBUF]
        if coll == "reduce_scatter":
            return dist.reduce_scatter_tensor(y, x)
        if coll == "all_gather":
            return dist.all_gather_into_tensor(y, x)
        if coll == "broadcast":
            return dist.broadcast(y, src=0)
        return dist.reduce(y, dst=0)
    return sym, td


def worker(rank, nranks, uid, opts):
    import torch
    import torch.distributed as dist

    import symnccl
    from symnccl.bootstrap import init_torch
    init_torch(rank, nranks, opts["port"])
    comm = symnccl.Communicator(uid, rank, nranks, device=rank)
    dtype = getattr(torch, opts["dtype"])
    esize = torch.empty(0, dtype=dtype).element_size()
    eps = {torch.bfloat16: 2**-7, torch.float16: 2**-10,
           torch.float32: 2**-23}[dtype]
    n = nranks
    rows, skipped = [], {}
    for coll in opts["collectives"]:
        for nbytes in opts["sizes"]:
            # per-rank element counts of input and output; a rank's block
            # a whole number of 16-byte vectors, as a model's tensors are
            # (at 3 ranks a block of a third of a power of two would start
            # every slice but the first off a vector's boundary)
            total = nbytes // esize
            vec = 16 // esize
            if coll == "reduce_scatter":
                cout = total // n // vec * vec
                cin = cout * n
            elif coll == "all_gather":
                cin = total // n // vec * vec
                cout = cin * n
            else:
                cin = cout = total
            if cin == 0:
                continue
            iters = opts["iters"] if nbytes <= (4 << 20) else max(
                3, opts["iters"] // 10)
            gen = torch.Generator(device="cuda")
            ins = []
            for r in range(n):
                gen.manual_seed(1000 * r + 11)
                ins.append(torch.rand(cin, generator=gen, device="cuda")
                           .mul_(2).sub_(1).to(dtype))
            if coll == "reduce_scatter":
                full = sum(t.double() for t in ins)
                ref = full[rank * cout:(rank + 1) * cout]
                tol = (n + 1) * eps * sum(t.double().abs() for t in ins)[
                    rank * cout:(rank + 1) * cout]
            elif coll == "all_gather":
                ref = torch.cat([t.double() for t in ins])
                tol = torch.zeros_like(ref)
            elif coll == "broadcast":
                ref, tol = ins[0].double(), torch.zeros(cout, device="cuda",
                                                        dtype=torch.float64)
            else:
                ref = sum(t.double() for t in ins)
                tol = (n + 1) * eps * sum(t.double().abs() for t in ins)
            mine = ins[rank]
            del ins

            def wrong(out):
                if coll == "reduce" and rank != 0:
                    return 0   # only the root's output is a result
                d = (out.double() - ref).abs()
                return int(((d > tol + 1e-30)
                            | ~torch.isfinite(out.double())).sum())
            wx = [torch.from_dlpack(comm.empty(cin, opts["dtype"]))
                  for _ in range(NBUF)]
            wy = [torch.from_dlpack(comm.empty(cout, opts["dtype"]))
                  for _ in range(NBUF)]
            px = [torch.empty(cin, dtype=dtype, device="cuda")
                  for _ in range(NBUF)]
            py = [torch.empty(cout, dtype=dtype, device="cuda")
                  for _ in range(NBUF)]
            nccl_w, _ = _calls(coll, comm, dist, n, rank, wx, wy, "nccl")
            nccl_p, _ = _calls(coll, comm, dist, n, rank, px, py, "nccl")
            sym_p, td = _calls(coll, comm, dist, n, rank, px, py)
            # name -> (inputs, outputs, fn, output starts as the input)
            in_place = coll in ("broadcast", "reduce")
            methods = {"symnccl": (px, py, sym_p, False)}
            for algo in symnccl._C.COLLECTIVE_KERNELS[coll]:
                fn, _ = _calls(coll, comm, dist, n, rank, px, py, algo)
                methods["symnccl:" + algo] = (px, py, fn, False)
            methods.update({"nccl:plain": (px, py, nccl_p, False),
                            "nccl:window": (wx, wy, nccl_w, False),
                            "torch.dist": (px, py, td, in_place)})
            row = {"collective": coll, "bytes": nbytes, "count_in": cin,
                   "count_out": cout, "iters": iters}
            for name, (xs, ys, fn, inp) in methods.items():
                try:
                    for x, y in zip(xs, ys):
                        x.copy_(mine)
                        if inp:
                            y.copy_(mine)
                    if not inp:
                        ys[0].fill_(float("nan"))   # poisoned
                    fn(0)
                    torch.cuda.synchronize()
                    nwrong = wrong(ys[0])
                    us = _time(fn, iters, opts["reps"], opts["eager"], torch)
                    row[name] = {"us": us, "wrong": nwrong}
                except Exception as e:
                    skipped[f"{coll} {name}"] = f"{type(e).__name__}: {e}"[:200]
            rows.append(row)
            del wx, wy, px, py, methods, ref, tol
            torch.cuda.empty_cache()
    comm.close()
    dist.destroy_process_group()
    return {"rows": rows, "skipped": skipped}


METHODS = ("symnccl", "symnccl:ll", "symnccl:ll128", "symnccl:push",
           "symnccl:one_shot", "nccl:plain", "nccl:window", "symnccl:window",
           "torch.dist")


def _methods(doc):
    """METHODS that doc's rows have, in order."""
    return [m for m in METHODS if any(m in r for r in doc["rows"])]


def print_table(doc):
    print(f"# {doc['gpu']} x{doc['nranks']}, {doc['dtype']}, "
          f"{'eager' if doc['eager'] else 'CUDA graph'}, median us per call "
          "(#wrong)")
    methods = _methods(doc)
    print(f"{'collective':>15} {'size':>8} " +
          " ".join(f"{m:>16}" for m in methods))
    for r in doc["rows"]:
        cells = []
        for m in methods:
            v = r.get(m)
            cells.append(f"{v['us']:9.2f} ({v['wrong']})" if v else "-")
        print(f"{r['collective']:>15} {_fmt_size(r['bytes']):>8} " +
              " ".join(f"{c:>16}" for c in cells))
    for k, v in doc.get("skipped", {}).items():
        print(f"skipped {k}: {v}")


def plot(doc, path):
    """Latency per collective (one panel each), every method."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colls = [c for c in COLLECTIVES
             if any(r["collective"] == c for r in doc["rows"])]
    fig, axes = plt.subplots(1, len(colls), figsize=(5 * len(colls), 4.5),
                             squeeze=False)
    for ax, coll in zip(axes[0], colls):
        rows = [r for r in doc["rows"] if r["collective"] == coll]
        for m in _methods(doc):
            pts = [(r["bytes"], r[m]["us"]) for r in rows if m in r]
            if pts:
                xs, ys = zip(*pts)
                ax.loglog(xs, ys, "-o" if m.startswith("symnccl") else "--s",
                          label=m, ms=3)
        ax.set_title(f"{coll}, {doc['gpu']} x{doc['nranks']}, "
                     f"{'eager' if doc['eager'] else 'graph'}", fontsize=9)
        ax.set_xlabel("bytes (RS input, AG output, tensor)")
        ax.set_ylabel("us (median)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nranks", type=int, default=None)
    p.add_argument("--dtype", default="bfloat16",
                   choices=["bfloat16", "float32", "float16"])
    p.add_argument("--collectives", default=",".join(COLLECTIVES))
    p.add_argument("--sizes", default=SIZES)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--eager", action="store_true",
                   help="no CUDA graph: include the host path")
    add_results_args(p)
    args = p.parse_args(argv)
    if report(args, print_table, plot) is not None:
        return 0
    refuse_torchrun("bench_collectives.py")
    colls = [c for c in args.collectives.split(",") if c]
    bad = [c for c in colls if c not in COLLECTIVES]
    if bad:
        p.error(f"unknown collective(s) {bad}: expected some of "
                f"{COLLECTIVES}")
    import torch

    from symnccl.bootstrap import free_port, local_device_count, spawn
    n = args.nranks or local_device_count()
    opts = dict(dtype=args.dtype, collectives=colls,
                sizes=parse_sizes(args.sizes), iters=args.iters,
                reps=args.reps, eager=args.eager, port=free_port())
    res = spawn(worker, n, args=(opts,), timeout=1800)
    doc = run_info(
        n, torch.cuda.get_device_name(0), torch.__version__,
        dtype=args.dtype, eager=args.eager, iters=args.iters, reps=args.reps,
        rows=res[0]["rows"],
        skipped={k: v for r in res for k, v in r["skipped"].items()})
    plot_beside(plot, doc, write_results(doc, "collectives_", args.out))
    print_table(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
