"""Host cost of one eager call, every collective, one GPU, one run: the
Communicator's method, symnccl.torch's function (without autograd, and with
an input that requires grad), the custom op dispatched directly (what the
function cost before its eager path), torch.distributed (NCCL), PyTorch's
symmetric-memory ops where torch has them, symnccl's NCCL path
(algo="nccl"), and torch's x.add_(1) for scale.

A 1-rank communicator and a 1-rank torch.distributed group (NCCL, a TCP
store on 127.0.0.1): the kernels have no peer to wait for, so what is
measured is what a call costs the host. Each row: --calls calls in a loop
made while a sleep kernel holds the GPU (so that the GPU's own time per
call, several us for a small kernel and its copies, can neither fill the
launch queue and show as host time nor hide host time), the median over
--loops loops of the microseconds per call; the loops go round the rows
(one loop of every row, then the next), so that the machine's drift
moves every row alike, and a ratio is the median of the two rows'
ratios round by round. Every row's result is checked
once against its input (at 1 rank every reduction is the identity).

The targets of issue 29, as ratios in the same run:
  - every symnccl.torch call without autograd <= 1.25x the method doing
    the same work, and <= symm_mem's two_shot_all_reduce_;
  - with an input that requires grad <= 2x the method;
  - every method that returns a new tensor <= 1.25x the in-place
    all_reduce of the same bytes.

    python benchmarks/bench_eager.py
    python benchmarks/bench_eager.py --size 64K --loops 50
    python benchmarks/bench_eager.py --report \
        benchmarks/results/eager_h100x1_bfloat16.json

A run writes its JSON and a PNG beside it (plot: host us per call, a bar
per row, grouped by collective, x.add_(1) as the scale); --report prints
a JSON's table and writes its PNG beside it.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_allreduce import (  # noqa: E402
    add_results_args, bar_panel, bar_slots, parse_sizes, plot_beside,
    pyplot, report, run_info, write_results)

# the targets, as (name, limit): checked by targets() below
TARGET_OP = 1.25          # symnccl.torch call / the method's
TARGET_GRAD = 2.0         # ... with requires_grad / the method's
TARGET_NEW = 1.25         # method returning a new tensor / in-place AR


def _rows(torch, snt, comm, dist, dtype, count):
    """[(collective, kind, call, fn, want)]: fn() makes one call; want()
    (or None) is the tensor its result must equal bitwise."""
    raw = comm.comm
    cid = comm.cid
    ops = torch.ops.symnccl
    g = torch.Generator(device="cpu").manual_seed(1)
    x0 = torch.randn(count, generator=g).to(dtype).cuda()
    x = x0.clone()
    xg = x0.clone().requires_grad_(True)       # a leaf that requires grad
    o = torch.empty_like(x0)
    rows = []

    def add(coll, kind, call, fn, check=True):
        rows.append((coll, kind, call, fn, check))

    add("scale", "torch", "x.add_(1)", lambda: x.add_(1), False)
    # what a new output costs (the functions' and the methods' allocation)
    add("scale", "alloc", "torch.empty_like(x)",
        lambda: torch.empty_like(x), False)
    add("scale", "alloc new_empty", "x.new_empty(x.shape)",
        lambda: x.new_empty(x.shape), False)
    # all_reduce, in place
    add("all_reduce_", "method", "comm.all_reduce(x)",
        lambda: raw.all_reduce(x))
    add("all_reduce_", "method ll", 'comm.all_reduce(x, algo="ll")',
        lambda: raw.all_reduce(x, algo="ll"))
    add("all_reduce_", "op", "snt.all_reduce_(x, comm)",
        lambda: snt.all_reduce_(x, comm))
    add("all_reduce_", "grad", "snt.all_reduce_(leaf, comm)",
        lambda: snt.all_reduce_(xg, comm))
    add("all_reduce_", "dispatch", "torch.ops.symnccl.all_reduce_",
        lambda: ops.all_reduce_(x, cid, "sum", "auto"))
    # all_reduce, out of place
    add("all_reduce", "method", "comm.all_reduce(x, out=empty_like(x))",
        lambda: raw.all_reduce(x, out=torch.empty_like(x)))
    add("all_reduce", "method out", "comm.all_reduce(x, out=o)",
        lambda: raw.all_reduce(x, out=o))
    add("all_reduce", "method ll", 'comm.all_reduce(x, out=o, algo="ll")',
        lambda: raw.all_reduce(x, out=o, algo="ll"))
    add("all_reduce", "op", "snt.all_reduce(x, comm)",
        lambda: snt.all_reduce(x, comm))
    add("all_reduce", "grad", "snt.all_reduce(x_grad, comm)",
        lambda: snt.all_reduce(xg, comm))
    add("all_reduce", "dispatch", "torch.ops.symnccl.all_reduce",
        lambda: ops.all_reduce(x, cid, "sum", "auto"))
    # tensor-parallel pair
    add("tp_all_reduce", "method", "comm.all_reduce(x, out=empty_like(x))",
        lambda: raw.all_reduce(x, out=torch.empty_like(x)))
    add("tp_all_reduce", "op", "snt.tp_all_reduce(x, comm)",
        lambda: snt.tp_all_reduce(x, comm))
    add("tp_all_reduce", "grad", "snt.tp_all_reduce(x_grad, comm)",
        lambda: snt.tp_all_reduce(xg, comm))
    add("tp_copy", "grad", "snt.tp_copy(x_grad, comm) (forward only)",
        lambda: snt.tp_copy(xg, comm))
    # reduce_scatter and all_gather: the methods return new tensors
    for coll in ("reduce_scatter", "all_gather"):
        meth = getattr(raw, coll)
        fn = getattr(snt, coll)
        op = getattr(ops, coll)
        args = ("sum", "auto") if coll == "reduce_scatter" else ("auto",)
        add(coll, "method", f"comm.{coll}(x)", lambda m=meth: m(x))
        add(coll, "method ll", f'comm.{coll}(x, algo="ll")',
            lambda m=meth: m(x, algo="ll"))
        add(coll, "method out", f"comm.{coll}(x, out=o)",
            lambda m=meth: m(x, out=o))
        add(coll, "op", f"snt.{coll}(x, comm)", lambda f=fn: f(x, comm))
        add(coll, "grad", f"snt.{coll}(x_grad, comm)",
            lambda f=fn: f(xg, comm))
        add(coll, "dispatch", f"torch.ops.symnccl.{coll}",
            lambda op=op, a=args: op(x, cid, *a))
    # broadcast and reduce: the methods work in place, the functions make
    # a new tensor
    for coll in ("broadcast", "reduce"):
        meth = getattr(raw, coll)
        fn = getattr(snt, coll)
        op = getattr(ops, coll)
        args = (0, "auto") if coll == "broadcast" else (0, "sum", "auto")
        add(coll, "method", f"comm.{coll}(x, out=empty_like(x))",
            lambda m=meth: m(x, out=torch.empty_like(x)))
        add(coll, "method out", f"comm.{coll}(x, out=o)",
            lambda m=meth: m(x, out=o))
        add(coll, "op", f"snt.{coll}(x, comm)", lambda f=fn: f(x, comm))
        add(coll, "grad", f"snt.{coll}(x_grad, comm)",
            lambda f=fn: f(xg, comm))
        add(coll, "dispatch", f"torch.ops.symnccl.{coll}",
            lambda op=op, a=args: op(x, cid, *a))
    # symnccl's NCCL path (issue 29, item 4)
    buf = raw.empty(count, str(dtype).split(".")[1])   # a window
    win = torch.from_dlpack(buf)
    win.copy_(x0)
    add("all_reduce_", "nccl", 'comm.all_reduce(x, algo="nccl")',
        lambda: raw.all_reduce(x, algo="nccl"))
    add("all_reduce_", "nccl window",
        'comm.all_reduce(window, algo="nccl")',
        lambda: raw.all_reduce(win, algo="nccl"))
    for coll in ("reduce_scatter", "all_gather", "broadcast", "reduce"):
        meth = getattr(raw, coll)
        add(coll, "nccl", f'comm.{coll}(x, out=o, algo="nccl")',
            lambda m=meth: m(x, out=o, algo="nccl"))
    # torch.distributed (NCCL)
    add("all_reduce_", "torch.distributed", "dist.all_reduce(x)",
        lambda: dist.all_reduce(x))
    add("reduce_scatter", "torch.distributed",
        "dist.reduce_scatter_tensor(o, x)",
        lambda: dist.reduce_scatter_tensor(o, x))
    add("all_gather", "torch.distributed",
        "dist.all_gather_into_tensor(o, x)",
        lambda: dist.all_gather_into_tensor(o, x))
    add("broadcast", "torch.distributed", "dist.broadcast(x, 0)",
        lambda: dist.broadcast(x, 0))
    add("reduce", "torch.distributed", "dist.reduce(x, 0)",
        lambda: dist.reduce(x, 0))
    return rows, x0, x, xg, o, (buf, win)


def _symm_mem_rows(torch, dist, dtype, x0):
    """PyTorch's symmetric-memory all-reduces, or the reason they are
    absent."""
    try:
        import torch.distributed._symmetric_memory as symm_mem
        group = dist.group.WORLD.group_name
        s = symm_mem.empty(x0.numel(), dtype=dtype, device="cuda")
        symm_mem.rendezvous(s, group)
        s.copy_(x0)
        ops = torch.ops.symm_mem
        ops.two_shot_all_reduce_(s, "sum", group)   # fails here if absent
        torch.cuda.synchronize()
        return [("all_reduce_", "symm_mem", "symm_mem.two_shot_all_reduce_",
                 lambda: (ops.two_shot_all_reduce_(s, "sum", group), s)[1],
                 s),
                ("all_reduce", "symm_mem", "symm_mem.one_shot_all_reduce",
                 lambda: ops.one_shot_all_reduce(s, "sum", group), s)], None
    except Exception as e:   # depends on the torch build and the GPU
        return [], f"{type(e).__name__}: {e}"[:300]


def _loop(fn, calls, torch, cycles):
    """Host microseconds per call of `calls` back-to-back calls, made
    while the GPU is held by a sleep kernel (torch.cuda._sleep, `cycles`
    long): nothing the calls launched runs before the loop ends, so the
    GPU's time neither shows in the host's (a queue filling up) nor hides
    it. Returns (us, whether the hold ended before the last call)."""
    torch.cuda.synchronize()
    torch.cuda._sleep(cycles)
    held = torch.cuda.Event()
    held.record()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    us = (time.perf_counter() - t0) / calls * 1e6
    return us, held.query()   # the sleep ended: the GPU ran calls


def targets(doc):
    """The issue's ratios from a results doc: [(target, measured, limit,
    ok)]. A ratio is the median over the loops of the two rows' ratio
    within one round (the rounds go through the rows in turn, so a round's
    two loops ran on the same phase of the host, whose speed drifts ~20%
    between rounds); the ratio of the medians where the doc has no loops."""
    rows = {(r["collective"], r["kind"]): r for r in doc["rows"]
            if r.get("us") is not None}

    def ratio(a, b):
        la, lb = rows[a].get("loops_us"), rows[b].get("loops_us")
        if la and lb and len(la) == len(lb):
            return statistics.median(x / y for x, y in zip(la, lb))
        return rows[a]["us"] / rows[b]["us"]

    out = []
    two_shot = ("all_reduce_", "symm_mem")
    for coll, kind in sorted(rows):
        method = (coll, "method")
        if kind == "op" and method in rows:
            out.append((f"{coll}: op / method", ratio((coll, kind), method),
                        TARGET_OP))
            if two_shot in rows:
                out.append((f"{coll}: op / symm_mem two_shot (us)",
                            ratio((coll, kind), two_shot), 1.0))
        if kind == "grad" and method in rows:
            out.append((f"{coll}: requires_grad / method",
                        ratio((coll, kind), method), TARGET_GRAD))
    for coll in ("reduce_scatter", "all_gather"):   # new-tensor methods
        for kind, name in (("method", f"comm.{coll}(x) / comm.all_reduce(x)"),
                           ("method ll", f'comm.{coll}(x, algo="ll") / '
                                         "all_reduce ll")):
            if (coll, kind) in rows and ("all_reduce_", kind) in rows:
                out.append((name, ratio((coll, kind), ("all_reduce_", kind)),
                            TARGET_NEW))
    return [(name, round(r, 3), lim, r <= lim) for name, r, lim in out]


def print_table(doc):
    print(f"# {doc['gpu']}, {doc['nranks']} rank, {doc['bytes']} B "
          f"{doc['dtype']}, {doc['calls']} calls x {doc['loops']} loops"
          f"{', GPU held' if doc.get('hold_ms') else ''}, "
          f"{doc['date']}; torch {doc['versions']['torch']}, NCCL "
          f"{doc['versions']['nccl_runtime']}, symnccl "
          f"{doc['versions']['symnccl']}")
    if doc.get("skipped"):
        for k, v in doc["skipped"].items():
            print(f"# skipped {k}: {v}")
    us = {(r["collective"], r["kind"]): r["us"] for r in doc["rows"]}
    print(f"{'collective':<15} {'kind':<18} {'us/call':>8} {'x method':>9}"
          f" {'ok':>3}  call")
    for r in doc["rows"]:
        method = us.get((r["collective"], "method"))
        ratio = f"{r['us'] / method:.2f}" if method and r["us"] else "-"
        t = f"{r['us']:.2f}" if r["us"] is not None else "error"
        ok = {True: "yes", False: "NO", None: "-"}[r["ok"]]
        late = (f"  [{r['overran_loops']} loops outlasted the hold]"
                if r.get("overran_loops") else "")
        print(f"{r['collective']:<15} {r['kind']:<18} {t:>8} {ratio:>9} "
              f"{ok:>3}  {r['call']}{late}")
    print()
    print(f"{'target':<52} {'ratio':>7} {'limit':>6}  met")
    for name, ratio, lim, ok in doc["targets"]:
        print(f"{name:<52} {ratio:>7.3f} {lim:>6.2f}  "
              f"{'yes' if ok else 'NO'}")


#: the order of a collective's bars in the plot (kinds not named: after)
KIND_ORDER = ("method", "method out", "method ll", "op", "grad", "dispatch",
              "nccl", "nccl window", "torch.distributed", "symm_mem")


def plot(doc, path):
    """Host us per call, horizontal bars: the scale rows first (by their
    call, x.add_(1) also as a dotted line across), then a group per
    collective, a bar per kind, each with its ratio to the collective's
    method; wrong results, errors and loops that outlasted the hold
    noted."""
    plt = pyplot()
    order = {k: i for i, k in enumerate(KIND_ORDER)}
    colls = list(dict.fromkeys(r["collective"] for r in doc["rows"]))
    colls.sort(key=lambda c: c != "scale")
    groups, ref = [], None
    for coll in colls:
        rows = [r for r in doc["rows"] if r["collective"] == coll]
        rows.sort(key=lambda r: order.get(r["kind"], len(order)))
        method = next((r["us"] for r in rows if r["kind"] == "method"),
                      None)
        bars = []
        for r in rows:
            note = ""
            if method and r["us"] and r["kind"] != "method":
                note += f"  {r['us'] / method:.2f}x"
            if r["ok"] is False:
                note += "  WRONG"
            if r.get("overran_loops"):
                note += f"  [{r['overran_loops']} loops outlasted the hold]"
            if r["us"] is None:
                note = f"error: {r.get('error', '?')[:70]}"
            label = r["call"] if coll == "scale" else r["kind"]
            bars.append((label, r["us"], "scale" if coll == "scale"
                         else r["kind"], note))
            if coll == "scale" and r["kind"] == "torch" and r["us"]:
                ref = (r["us"], f"{r['call']}: {r['us']:.2f} µs")
        groups.append((coll, bars))
    met = sum(1 for t in doc.get("targets", []) if t[3])
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.16 * bar_slots(groups)))
    bar_panel(ax, groups,
              f"{doc['gpu']}, {doc['nranks']} rank, {doc['bytes']} B "
              f"{doc['dtype']}: host µs per call, median of "
              f"{doc['loops']} loops x {doc['calls']} calls"
              f"{', GPU held' if doc.get('hold_ms') else ''}\n"
              f"{doc['date']}; torch {doc['versions']['torch']}, NCCL "
              f"{doc['versions']['nccl_runtime']}; issue 29 targets met "
              f"{met}/{len(doc.get('targets', []))}", ref=ref)
    fig.text(0.01, 0.003,
             "beside a bar: its median / the collective's method's. "
             "method: comm.<coll>(x) (out: into o; ll: algo=\"ll\"), op: "
             "snt.<coll>(x, comm), grad: its input requires grad, "
             "dispatch: torch.ops.symnccl.<coll>,\nnccl: "
             "comm.<coll>(algo=\"nccl\"), torch.distributed: NCCL, "
             "symm_mem: torch's symmetric-memory all-reduce",
             fontsize=6, va="bottom")
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _gpu_tag(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100'."""
    m = re.search(r"\b([A-Z]+\d+[A-Za-z]*)\b", name.replace("NVIDIA", ""))
    return (m.group(1) if m else name.split()[-1]).lower()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="4K",
                   help="bytes per tensor (4K, 64K, 1M, ...)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--calls", type=int, default=200,
                   help="calls per loop (each launches 1-3 operations: "
                   "keep their sum below the GPU's queue, ~1000)")
    p.add_argument("--loops", type=int, default=25)
    p.add_argument("--hold-ms", type=float, default=30.0,
                   help="the sleep kernel that holds the GPU during a "
                   "loop; loops that outlast it are counted in the JSON "
                   "(overran_loops)")
    p.add_argument("--only", default=None,
                   help="comma-separated collectives to run")
    add_results_args(p, "JSON path (default: benchmarks/results/"
                        "eager_<gpu>x1_<dtype>.json)")
    args = p.parse_args(argv)
    if report(args, print_table, plot) is not None:
        return
    import torch
    import torch.distributed as dist

    import symnccl
    import symnccl.torch as snt
    from symnccl.bootstrap import free_port
    torch.cuda.set_device(0)
    os.environ.setdefault("LOCAL_RANK", "0")
    dist.init_process_group("nccl", rank=0, world_size=1,
                            init_method=f"tcp://127.0.0.1:{free_port()}",
                            device_id=torch.device("cuda", 0))
    comm = snt.communicator()
    dtype = getattr(torch, args.dtype)
    nbytes = parse_sizes(args.size)[0]
    count = max(1, nbytes // torch.empty(0, dtype=dtype).element_size())
    rows, x0, x, xg, o, (buf, win) = _rows(torch, snt, comm, dist, dtype,
                                           count)
    symm, why = _symm_mem_rows(torch, dist, dtype, x0)
    skipped = {"symm_mem": why} if why else {}
    only = set(args.only.split(",")) if args.only else None
    cycles = int(args.hold_ms * 1e-3 *
                 torch.cuda.get_device_properties(0).clock_rate * 1e3)
    results, timed = [], []
    for coll, kind, call, fn, check in rows + [
            (c, k, n, f, True) for c, k, n, f, _ in symm]:
        if only and coll not in only and coll != "scale":
            continue
        row = {"collective": coll, "kind": kind, "call": call, "us": None,
               "ok": None}
        try:
            if check:   # one call on the input, its result against it
                for t in (x, o, win):
                    t.copy_(x0)
                with torch.no_grad():
                    xg.copy_(x0)
                r = fn()
                torch.cuda.synchronize()
                if not torch.is_tensor(r):   # torch.distributed's: None
                    r = o if coll in ("reduce_scatter", "all_gather") \
                        else x
                row["ok"] = bool(torch.equal(r.detach().reshape(-1),
                                             x0.reshape(-1)))
            for _ in range(min(args.calls, 200)):   # warm
                fn()
            torch.cuda.synchronize()
            timed.append((row, fn))
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        results.append(row)
    # loop by loop, every row once per round: the machine's drift (seen:
    # 2x between runs) moves every row alike, and the ratios hold
    per = {id(row): [] for row, _ in timed}
    overran = {id(row): 0 for row, _ in timed}
    for _ in range(args.loops):
        for row, fn in timed:
            if "error" in row:
                continue
            try:
                us, late = _loop(fn, args.calls, torch, cycles)
                per[id(row)].append(us)
                overran[id(row)] += late
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {e}"[:300]
    torch.cuda.synchronize()
    for row, _ in timed:
        if per[id(row)] and "error" not in row:
            row["us"] = round(statistics.median(per[id(row)]), 3)
            row["loops_us"] = [round(v, 3) for v in per[id(row)]]
            if overran[id(row)]:
                row["overran_loops"] = overran[id(row)]
    for row in results:
        print(f"{row['collective']:<15} {row['kind']:<18} "
              f"{row['us'] if row['us'] is not None else row.get('error')}",
              file=sys.stderr)
    doc = run_info(1, torch.cuda.get_device_name(0), torch.__version__,
                   dtype=args.dtype, bytes=count * x0.element_size(),
                   count=count, calls=args.calls, loops=args.loops,
                   hold_ms=args.hold_ms,
                   command=" ".join([os.path.basename(sys.executable)]
                                    + sys.argv),
                   skipped=skipped, rows=results)
    doc["targets"] = targets(doc)
    out = args.out or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "results",
        f"eager_{_gpu_tag(doc['gpu'])}x1_{args.dtype}.json")
    path = write_results(doc, "eager_", out)
    # the communicator and its window close at exit (symnccl's atexit),
    # after everything that holds them
    dist.destroy_process_group()
    print(f"wrote {path}", file=sys.stderr)
    print_table(doc)
    plot_beside(plot, doc, path)


if __name__ == "__main__":
    main()
