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

A run writes its JSON and a PNG beside it (plot: us per call against the
size, a line per method); --report prints a JSON's table and writes its
PNG beside it.

Several GPUs (issue 32): launched by torchrun (WORLD_SIZE set), one
process per GPU over NVLink; --nranks, if given, must equal WORLD_SIZE.
Every cell is checked, then CUDA-graph replay of --iters calls, the ranks
aligned by a barrier before each of --reps replays, rank 0's median:

    torchrun --standalone --nproc-per-node 2 benchmarks/bench_alltoall.py \
        --out results/alltoall_h200x2_bfloat16.json
    torchrun --standalone --nproc-per-node 8 benchmarks/bench_alltoall.py \
        --sizes 16K,1M,64M

There the methods are push:equal, push:v-device, push:v-host, ll:v-device
and the anchors (equal splits, so every method moves the same bytes):
  torch:a2a-single    torch.distributed.all_to_all_single(out, x, splits,
                      splits) (NCCL; host split sizes)
  symm_mem:a2a-vdev   PyTorch symmetric memory's all_to_all_vdev (NVSHMEM
                      backend; device splits), on symm_mem buffers; where
                      torch lacks it or NVSHMEM, the column is empty and
                      the JSON's "skipped" says why
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_allreduce import (  # noqa: E402
    _fmt_size, add_results_args, median_us, parse_sizes, plot_beside,
    pyplot, report, run_info, team_replay_us, us_panel, write_results)

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
    return team_replay_us(torch, graphs, streams, iters, reps)


DIST_METHODS = ("push:equal", "push:v-device", "push:v-host", "ll:v-device",
                "torch:a2a-single", "symm_mem:a2a-vdev")


def _symm_mem(torch):
    """torch's symmetric memory on NVSHMEM with all_to_all_vdev, or None
    and why not."""
    try:
        import torch.distributed._symmetric_memory as symm
        if hasattr(symm, "is_nvshmem_available") and \
                not symm.is_nvshmem_available():
            return None, "NVSHMEM is not available to torch"
        if not hasattr(torch.ops.symm_mem, "all_to_all_vdev"):
            return None, "torch.ops.symm_mem has no all_to_all_vdev"
        n = torch.distributed.get_world_size()
        if n & (n - 1):
            # its kernel splits a peer's block over blocks_per_peer CTAs
            # and asserts block_size * blocks_per_peer == peer_size: at 3
            # ranks (4x H100, torch 2.11) the device assert ended both
            # processes, so it is not launched at all
            return None, (f"all_to_all_vdev's kernel asserts at {n} ranks "
                          "(block_size * blocks_per_peer == peer_size; "
                          "seen at 3): not a power of two")
        symm.set_backend("NVSHMEM")
        return symm, None
    except Exception as e:
        return None, f"{type(e).__name__}: {e}"[:200]


class _VDev:
    """all_to_all_vdev on symm_mem buffers of `numel` elements, equal
    splits of `per` elements: the op's two schemas (torch 2.8: one
    (3, n) splits tensor; later: in_splits and (2, n) out splits and
    offsets) told apart by its argument count."""

    def __init__(self, torch, dist, symm, numel, per, dt):
        n = dist.get_world_size()
        self.group = dist.group.WORLD.group_name
        # NVSHMEM's team manager keeps the first device it sees and refuses
        # any other, "cuda" (no index) included: every buffer on this
        # rank's device by index ("Detected use of TeamManager on multiple
        # devices" otherwise)
        dev = torch.device("cuda", torch.cuda.current_device())
        self.x = symm.empty(numel, dtype=dt, device=dev)
        self.out = symm.empty(numel, dtype=dt, device=dev)
        op = torch.ops.symm_mem.all_to_all_vdev
        self.new = len(op.default._schema.arguments) >= 5
        if self.new:
            self.splits = symm.empty(n, dtype=torch.int64, device=dev)
            self.splits.fill_(per)
            self.so = symm.empty((2, n), dtype=torch.int64, device=dev)
            bufs = (self.x, self.out, self.splits, self.so)
        else:
            self.splits = symm.empty((3, n), dtype=torch.int64,
                                     device=dev)
            self.splits[0].fill_(per)
            bufs = (self.x, self.out, self.splits)
        for b in bufs:
            symm.rendezvous(b, self.group)
        self.op = op

    def __call__(self):
        if self.new:
            self.op(self.x, self.out, self.splits, self.so, self.group)
        else:
            self.op(self.x, self.out, self.splits, self.group)


def dist_cell(torch, dist, comm, method, nbytes, dt, reps, iters, symm):
    """One process's cell under torchrun: median us per call on rank 0's
    clock; -1.0: a wrong result; None: the method cannot take the size."""
    rank, n = dist.get_rank(), dist.get_world_size()
    es = torch.empty(0, dtype=dt).element_size()
    rows = max(n, nbytes // es // 256 // n * n)      # rows of 256 elements
    m = rows // n

    def rank_x(j):        # every rank can rebuild every rank's input
        g = torch.Generator(device="cuda").manual_seed(nbytes * 64 + j)
        return torch.randint(-8, 9, (rows, 256), generator=g,
                             device="cuda").to(dt)

    x = rank_x(rank)
    want = torch.cat([rank_x(j)[rank * m:(rank + 1) * m] for j in range(n)])
    out = torch.empty_like(x)
    host = [m] * n
    dev = torch.tensor(host, device="cuda")
    if method.startswith("ll:") and x.numel() * es + 8 > \
            comm._staging_layout()["ll_row"] // 2:
        return None
    if method == "symm_mem:a2a-vdev":
        v = _VDev(torch, dist, symm, x.numel(), m * 256, dt)
        v.x.copy_(x.view(-1))
        out = v.out.view(rows, 256)
        call = v
    elif method == "torch:a2a-single":
        def call():
            dist.all_to_all_single(out, x, host, host)
    else:
        def call():
            _call(method, comm, x, out, host, dev,
                  torch.cuda.current_stream())
    dist.barrier()
    call()
    torch.cuda.synchronize()
    if not torch.equal(out, want):
        return -1.0
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for _ in range(iters):
            call()
    g.replay()   # untimed
    us = median_us(g.replay, iters, reps, torch)
    del g
    return us


def torchrun_main(a):
    """One process per GPU (WORLD_SIZE set): rank 0 prints and writes."""
    import torch
    import torch.distributed as dist
    import symnccl.torch as snt
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if a.nranks not in (None, n):
        raise SystemExit(f"--nranks {a.nranks} under torchrun of {n} "
                         "processes: leave it out or make them equal")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    dt = getattr(torch, a.dtype)
    symm, why = _symm_mem(torch)
    skipped = {"symm_mem:a2a-vdev": why} if why else {}
    comm = snt.communicator().comm
    rows = []
    try:
        for nb in parse_sizes(a.sizes):
            row = {"bytes": nb}
            for m in DIST_METHODS:
                if m.startswith("symm_mem") and symm is None:
                    row[m] = None
                    continue
                try:
                    row[m] = dist_cell(torch, dist, comm, m, nb, dt, a.reps,
                                       a.iters, symm)
                except Exception as e:    # an anchor this torch lacks
                    if not m.startswith(("torch:", "symm_mem:")):
                        raise
                    skipped[f"{m} {nb}"] = f"{type(e).__name__}: {e}"[:200]
                    row[m] = None
            rows.append(row)
    finally:
        comm.close()
    if rank == 0:
        doc = run_info(n, torch.cuda.get_device_name(), torch.__version__,
                       dtype=a.dtype, loopback=False,
                       methods=list(DIST_METHODS), host_us={}, rows=rows,
                       skipped=skipped)
        print_table(doc)
        for k, v in skipped.items():
            print(f"skipped {k}: {v}")
        where = write_results(doc, "alltoall_", a.out)
        plot_beside(plot, doc, where)
        print("wrote", where)
    dist.destroy_process_group()


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
    print(f"{doc['gpu']}, {doc['nranks']} rank(s) ({_where(doc)}), "
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


def _where(doc):
    return "one GPU" if doc["nranks"] == 1 else \
        "loopback team" if doc.get("loopback", True) else "one per GPU"


def plot(doc, path):
    """us per call (log) against bytes of one rank's x (log2), a line per
    method column (copy:ce, the copy-engine floor, dotted; the torch and
    symm_mem anchors dashed); a 1-rank run's eager host cost in a note."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    cols = [(m, m, ":" if m.startswith("copy:") else
             "--s" if m.startswith(("torch:", "symm_mem:", "nccl:")) else
             "-o") for m in doc["methods"]]
    us_panel(ax, doc["rows"], "bytes", cols, "bytes of one rank's x "
             "(split evenly over the ranks)",
             f"all-to-all, {doc['gpu']}, {doc['nranks']} rank(s) "
             f"({_where(doc)}), {doc['dtype']}, {doc['date']}",
             xfmt=_fmt_size)
    if doc.get("host_us"):
        fig.text(0.01, 0.01, "eager host cost, us per call: " + ", ".join(
            f"{k} {v:.1f}" for k, v in doc["host_us"].items()), fontsize=7)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nranks", type=int, default=None,
                   help="1: one GPU; 2+: a loopback team on one GPU "
                        "(default 2); under torchrun the processes "
                        "(WORLD_SIZE if left out)")
    p.add_argument("--sizes", default=SIZES)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--ctas", type=int, default=0,
                   help="push grid per rank of a loopback team (0: 128 / "
                        "nranks)")
    add_results_args(p)
    a = p.parse_args(argv)
    doc = report(a, print_table)
    if doc is not None:
        plot_beside(plot, doc, a.report)
        return
    if "WORLD_SIZE" in os.environ:
        return torchrun_main(a)
    if a.nranks is None:
        a.nranks = 2
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
    where = write_results(doc, "alltoall_", a.out)
    plot_beside(plot, doc, where)
    print("wrote", where)


if __name__ == "__main__":
    main()
