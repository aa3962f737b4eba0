"""What one call of a kernel costs back to back, per GPU, from CUPTI's kernel
timestamps (torch.profiler): a graph-replay benchmark's event timing of a
small call spreads by +-0.5-1 µs between runs, these periods by ~0.05 µs,
so a change of a few tenths of a µs to a decode-size kernel can be told
from the spread (docs/PERFORMANCE.md, 'Kernel periods').

    torchrun --standalone --nproc-per-node 2 scripts/kernel_periods.py \\
        --hidden 1024,4096,8192 --out /tmp/periods.json
    python scripts/kernel_periods.py --report /tmp/periods.json   # no GPU

One process per GPU under torchrun. For each token count T (--tokens, 1
by default), hidden size H and method, T x H rows (--dtype, bf16 by
default): `--iters` calls captured in one CUDA
graph, replayed 5 times timed with events (the median per call, as
benchmarks/bench_fused.py times its rows), then once under the profiler. Of that replay's
kernels the first `--skip` are dropped (the ranks' start skew) and the
rest give the medians of
  dur     a kernel's start to its end,
  gap     its end to the next kernel's start (negative where the next
          kernel's CTAs start before the last one ends: programmatic
          dependent launch),
  period  a start to the next start: one call back to back.
The ranks' periods agree when the calls are coupled (each waits for its
peers); the copy kernel is not (each rank pulls alone).

Methods (--methods, any of them):
  fused_lamport, fused_ll, fused_ll128
          all_reduce_rmsnorm(x, residual, weight, out=, residual_out=,
          algo=...) of the rows
  ar_ll, ar_ll128, ar_lamport
          all_reduce(x, out=, algo=...) of the same bytes
  copy    symnccl's copy kernel pulling the same bytes from the next
          rank's window (Communicator._copy, "kernel", 128 CTAs): a
          kernel's launch and completion and one NVLink round trip, no
          synchronisation between ranks
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "benchmarks"))
from bench_allreduce import (add_results_args, report,  # noqa: E402
                             run_info, write_results)
from bench_fused import capture, replay_us  # noqa: E402

METHODS = ("fused_lamport", "fused_ll", "fused_ll128", "ar_ll", "ar_ll128",
           "ar_lamport", "copy")
DEFAULT_METHODS = ("fused_lamport", "fused_ll", "ar_ll", "ar_lamport",
                   "copy")
EPS = 1e-6


def kernel_stats(events, skip):
    """events: (name, start µs, duration µs) of one replay's kernels, in
    any order. The medians of dur, gap and period over the kernels after
    the first `skip` (by start), their count and the first one's name;
    None when fewer than two are left."""
    ev = sorted(events, key=lambda e: e[1])[skip:]
    if len(ev) < 2:
        return None
    med = lambda v: round(statistics.median(v), 3)  # noqa: E731
    return {"kernel": ev[0][0],
            "n": len(ev),
            "dur": med([d for _, _, d in ev]),
            "gap": med([ev[i + 1][1] - ev[i][1] - ev[i][2]
                        for i in range(len(ev) - 1)]),
            "period": med([ev[i + 1][1] - ev[i][1]
                           for i in range(len(ev) - 1)])}


def _kernels(prof):
    """(name, start µs, duration µs) of the profiled CUDA kernels, from the
    profiler's Chrome trace (its kernel events carry CUPTI's timestamps)."""
    import json
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    return [(e["name"], e["ts"], e["dur"]) for e in events
            if e.get("cat") == "kernel"]


def _measure(torch, fn, iters, skip, sync):
    from torch.profiler import ProfilerActivity, profile
    g = capture(torch, fn, iters)
    row = {"graph_us": round(replay_us(torch, g, iters, 5, sync), 3)}
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        g.replay()
        torch.cuda.synchronize()
    del g
    row.update(kernel_stats(_kernels(prof), skip) or {})
    return row


def _methods(torch, comm, T, H, dtype, rank, n):
    """name -> the call, on buffers of T x H rows of this rank."""
    g = torch.Generator(device="cuda").manual_seed(    # T 1: as before
        H + 7919 * (rank + 1) + 65537 * (T - 1))
    x = torch.randn(T, H, device="cuda", generator=g).to(dtype)
    res = torch.randn(T, H, device="cuda", generator=g).to(dtype)
    w = (1 + 0.5 * torch.randn(H, device="cuda", generator=g)).to(dtype)
    y, h, s = (torch.empty_like(x) for _ in range(3))
    win = comm.empty(T * H, str(dtype).split(".")[-1])
    torch.from_dlpack(win).copy_(x.reshape(-1))
    peer = comm._lsa_pointer(win, (rank + 1) % n)
    nbytes = T * H * x.element_size()
    stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731

    def fused(algo):
        return lambda: comm.all_reduce_rmsnorm(x, res, w, EPS, out=y,
                                               residual_out=h, algo=algo)

    def ar(algo):
        return lambda: comm.all_reduce(x, out=s, algo=algo)
    calls = {f"fused_{a}": fused(a) for a in ("lamport", "ll", "ll128")}
    calls.update({f"ar_{a}": ar(a) for a in ("ll", "ll128", "lamport")})
    calls["copy"] = lambda: comm._copy(s.data_ptr(), peer, nbytes, stream(),
                                       "kernel", 128)
    return calls, win


def run(opts):
    import torch
    import torch.distributed as dist
    import symnccl.torch as snt
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    comm = snt.communicator().comm
    dtype = getattr(torch, opts.dtype)
    sync = lambda: comm.barrier(blocking=True)  # noqa: E731
    rows = []
    try:
        for T in [int(v) for v in opts.tokens.split(",")]:
            for H in [int(v) for v in opts.hidden.split(",")]:
                calls, win = _methods(torch, comm, T, H, dtype, rank, n)
                for m in opts.methods.split(","):
                    r = _measure(torch, calls[m], opts.iters, opts.skip,
                                 sync)
                    rows.append({"T": T, "H": H, "method": m, "rank": rank,
                                 **r})
                del calls, win
    finally:
        comm.close()
    every = [None] * n
    dist.all_gather_object(every, rows)
    doc = None
    if rank == 0:
        doc = run_info(n, torch.cuda.get_device_name(), torch.__version__,
                       dtype=opts.dtype, iters=opts.iters, skip=opts.skip,
                       rows=[r for rank_rows in every for r in rank_rows])
    dist.destroy_process_group()
    return doc


def print_table(doc):
    print(f"{doc['gpu']}, {doc['nranks']} ranks, {doc['dtype']}, "
          f"{doc['date']}; µs, rank 0 / rank 1 / ...")
    by = {}
    for r in doc["rows"]:
        by.setdefault((r.get("T", 1), r["H"], r["method"]), {})[
            r["rank"]] = r
    print(f"{'T':>4} {'H':>6} {'method':14} {'graph':>14} {'period':>14} "
          f"{'dur':>14} {'gap':>14}  kernel")
    for (T, H, m), ranks in by.items():
        rs = [ranks[k] for k in sorted(ranks)]
        col = lambda key: " / ".join(  # noqa: E731
            f"{r.get(key, float('nan')):.2f}" for r in rs)
        print(f"{T:>4} {H:>6} {m:14} {col('graph_us'):>14} "
              f"{col('period'):>14} {col('dur'):>14} {col('gap'):>14}  "
              f"{rs[0].get('kernel', '')[:50]}")


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tokens", default="1")
    p.add_argument("--hidden", default="1024,4096,8192")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--methods", default=",".join(DEFAULT_METHODS))
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--skip", type=int, default=10,
                   help="kernels of the replay left out at its start")
    add_results_args(p)
    opts = p.parse_args(argv)
    if report(opts, print_table) is not None:
        return 0
    bad = [m for m in opts.methods.split(",") if m not in METHODS]
    if bad:
        p.error(f"--methods: unknown {bad}; known: {', '.join(METHODS)}")
    if "WORLD_SIZE" not in os.environ:
        p.error("run it under torchrun (one process per GPU, 2 or more)")
    doc = run(opts)
    if doc is not None:
        print_table(doc)
        if opts.out:
            print("wrote", write_results(doc, "periods_", opts.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
