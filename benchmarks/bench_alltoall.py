"""All-to-all (issue 32): symnccl's push_all_to_all kernel against a
copy-engine floor of the same bytes, its device-split path against its
host-split path, and the host cost of an eager call; every cell checked
before it is timed.

Where (--nranks):
  1        one GPU, a 1-rank Communicator: the host cost of an eager call
           (all_to_all_v with host splits, with device splits, all_to_all)
           and of NCCL's path (algo="nccl", which synchronises for
           all_to_all_v)
  2, 4     a loopback team on one GPU (Communicator._loopback): each rank
           on a stream of its own, CUDA-graph replay of --iters calls,
           median of --reps. The ranks' "remote" stores land in this GPU's
           memory and the ranks share its SMs: compare columns of one run,
           never with NVLink numbers.

Methods per size (bytes of one rank's x, split evenly):
  push:equal      comm.all_to_all(x, out, algo="push")
  push:v-device   comm.all_to_all_v(x, out, splits_on_device, algo="push")
  push:v-host     ... with a list of splits (copied into the launch)
  ll:v-device     all_to_all_v(..., algo="ll"): LL packets, one launch,
                  where x fits one row of packets (else "-")
  nccl:v-host     all_to_all_v on NCCL with host splits (a real NCCL
                  communicator only: --nranks 1 here; the multi-GPU issue
                  runs it under torchrun), which synchronises: eager only
  copy:ce         every rank copies x into out with cudaMemcpyAsync on its
                  stream (the copy engine): the same bytes, no exchange

    PYTHONPATH=. python benchmarks/bench_alltoall.py --nranks 2 \
        --sizes 64K,1M,16M
    python benchmarks/bench_alltoall.py --nranks 1 --out results/x.json
    python benchmarks/bench_alltoall.py --report results/x.json
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_allreduce import (  # noqa: E402
    _fmt_size, add_results_args, parse_sizes, report, run_info,
    write_results)

SIZES = "16K,256K,1M,4M,16M,64M"
METHODS = ("push:equal", "push:v-device", "push:v-host", "ll:v-device",
           "copy:ce")


def _team(nranks, ctas):
    import symnccl
    if nranks == 1:
        uid = symnccl.get_unique_id()
        return [symnccl.Communicator(uid, 0, 1, device=0, timeout=60.0)]
    # every rank's grid resident at once on one GPU (the ranks wait for
    # each other's CTAs)
    os.environ["SYMNCCL_PUSH_CTAS"] = str(ctas or 128 // nranks)
    return symnccl.Communicator._loopback(nranks, 0, timeout=60.0)


def _inputs(torch, team, nbytes, dt):
    n = len(team)
    es = torch.empty(0, dtype=dt).element_size()
    rows = max(n, nbytes // es // 256 // n * n)      # rows of 256 elements
    gen = torch.Generator(device="cuda").manual_seed(nbytes)
    xs = [torch.randint(-8, 9, (rows, 256), generator=gen, device="cuda")
          .to(dt) for _ in team]
    outs = [torch.empty_like(x) for x in xs]
    m = rows // n
    host = [m] * n
    dev = [torch.tensor(host, device="cuda") for _ in team]
    return xs, outs, host, dev, m


def _call(method, c, x, o, host, dev, s):
    if method == "push:equal":
        c.all_to_all(x, o, "push", s)
    elif method == "push:v-device":
        c.all_to_all_v(x, o, dev, None, "push", s)
    elif method == "push:v-host":
        c.all_to_all_v(x, o, host, None, "push", s)
    elif method == "ll:v-device":
        c.all_to_all_v(x, o, dev, None, "ll", s)
    elif method == "nccl:v-host":
        c.all_to_all_v(x, o, host, None, "nccl", s)
    else:
        c._copy(o.data_ptr(), x.data_ptr(), x.numel() * x.element_size(),
                s.cuda_stream, "memcpy")


def cell(torch, team, streams, method, nbytes, dt, reps, iters):
    """Median us per call on every rank at once; -1.0: a wrong result;
    None: the method cannot take the size."""
    n = len(team)
    xs, outs, host, dev, m = _inputs(torch, team, nbytes, dt)
    if method.startswith("ll:") and xs[0].numel() * xs[0].element_size() \
            + 8 > team[0]._staging_layout()["ll_row"] // 2:
        return None

    def calls(k):
        for c, s, x, o, d in zip(team, streams, xs, outs, dev):
            for _ in range(k):
                _call(method, c, x, o, host, d, s)

    torch.cuda.synchronize()
    calls(1)
    torch.cuda.synchronize()
    for j, o in enumerate(outs):
        want = xs[j] if method == "copy:ce" else \
            torch.cat([x[j * m:(j + 1) * m] for x in xs])
        if not torch.equal(o, want):
            return -1.0
    graphs = [torch.cuda.CUDAGraph() for _ in streams]
    for c, s, x, o, d, g in zip(team, streams, xs, outs, dev, graphs):
        with torch.cuda.graph(g, stream=s):
            for _ in range(iters):
                _call(method, c, x, o, host, d, s)
    times = []
    cur = torch.cuda.current_stream()
    for _ in range(reps + 1):
        a, b = (torch.cuda.Event(enable_timing=True) for _ in "ab")
        a.record(cur)
        for g, s in zip(graphs, streams):
            s.wait_stream(cur)
            with torch.cuda.stream(s):
                g.replay()
        for s in streams:
            cur.wait_stream(s)
        b.record(cur)
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / iters)
    times = sorted(times[1:])
    return times[len(times) // 2]


def host_cost(torch, comm, method, reps, iters):
    """Median host microseconds of one eager call (1 rank, 1 KiB rows)."""
    s = torch.cuda.current_stream()
    xs, outs, host, dev, _ = _inputs(torch, [comm], 4096, torch.bfloat16)
    for _ in range(3):
        _call(method, comm, xs[0], outs[0], host, dev[0], s)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(iters):
            _call(method, comm, xs[0], outs[0], host, dev[0], s)
        times.append((time.perf_counter() - t) * 1e6 / iters)
        torch.cuda.synchronize()
    return sorted(times)[len(times) // 2]


def print_table(doc):
    print(f"{doc['gpu']}, {doc['nranks']} rank(s) "
          f"({'loopback team' if doc['nranks'] > 1 else 'one GPU'}), "
          f"{doc['dtype']}, {doc['date']}; us per call (-1: wrong)")
    if doc.get("host_us"):
        print("eager host cost, us per call: " + ", ".join(
            f"{k} {v:.2f}" for k, v in doc["host_us"].items()))
    methods = doc["methods"]
    print(f"{'size':>8} " + " ".join(f"{m:>14}" for m in methods))
    for row in doc["rows"]:
        print(f"{_fmt_size(row['bytes']):>8} " + " ".join(
            f"{row[m]:14.1f}" if row.get(m) is not None else f"{'-':>14}"
            for m in methods))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nranks", type=int, default=2)
    p.add_argument("--sizes", default=SIZES)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--ctas", type=int, default=0,
                   help="push grid per rank of a loopback team (0: 128 / "
                        "nranks)")
    add_results_args(p)
    a = p.parse_args(argv)
    if report(a, print_table) is not None:
        return
    import torch
    torch.cuda._sleep(1)    # loaded before any rank waits (loopback.c)
    dt = getattr(torch, a.dtype)
    team = _team(a.nranks, a.ctas)
    streams = [torch.cuda.Stream() for _ in team]
    rows = []
    host_us = {}
    try:
        if a.nranks == 1:
            for m in ("push:equal", "push:v-host", "push:v-device",
                      "nccl:v-host"):
                host_us[m] = host_cost(torch, team[0], m, a.reps, 200)
        for nb in parse_sizes(a.sizes):
            row = {"bytes": nb}
            for m in METHODS:
                row[m] = cell(torch, team, streams, m, nb, dt, a.reps,
                              a.iters)
            rows.append(row)
    finally:
        for c in team:
            c.close()
    doc = run_info(a.nranks, torch.cuda.get_device_name(), torch.__version__,
                   dtype=a.dtype, loopback=a.nranks > 1,
                   methods=list(METHODS), host_us=host_us, rows=rows)
    print_table(doc)
    print("wrote", write_results(doc, "alltoall_", a.out))


if __name__ == "__main__":
    main()
