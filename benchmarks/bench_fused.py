"""Fused all-reduce + residual add + RMSNorm against the unfused
composition, on one GPU: a one-rank communicator and loopback teams
(Communicator._loopback: every rank on this GPU, each on its own stream).

Methods:
  fused     comm.all_reduce_rmsnorm(x, residual, w, eps, out=, residual_out=,
            algo=--algo): auto by default, what a caller gets (one_shot
            within AUTO_TABLE's all_reduce_rmsnorm rows, past them
            all_reduce's own choice then symnccl's add+norm); the JSON's
            fused_kernels say which ran
  ll, ll128, lamport, one_shot, two_shot
            the same with that algo (2+ ranks: each fused kernel, whatever
            auto picks; the auto table's rows come from these columns)
  ar_ll, ar_ll128
            comm.all_reduce(x, out=s, algo="ll") (and "ll128") alone (2+
            ranks): the packet all-reduces of the same bytes, the floors
            the ll and ll128 kernels are measured against
  unfused   comm.all_reduce(x, out=s) (algo="auto"), then h = s + residual
            and torch.nn.functional.rms_norm(h, (H,), w, eps), torch's
            kernels

Timing: one CUDA graph holding `iters` calls of every rank of the team
(each rank's on its stream), replayed `reps` times; device events around
each replay; the median per call, in microseconds. At 2+ ranks a call's
time is the team's: both ranks' work shares the one GPU. With one rank
in the process (torchrun, or a team of 1) the calls go on the current
stream, as the anchors' do: forked onto a side stream and joined back,
each small call took 1-2 µs more in the graph (docs/PERFORMANCE.md,
'Fused all-reduce, all-to-all and steps'). Every shape is
checked first: the fused y and h against the unfused ones (max |diff| in
units of the dtype's epsilon, #wrong beyond 4 of them).

    python benchmarks/bench_fused.py                  # 1 rank and a team of 2
    python benchmarks/bench_fused.py --ranks 1 --tokens 1,16 --hidden 4096
    python benchmarks/bench_fused.py --nranks 2      # a loopback team of 2
    python benchmarks/bench_fused.py --report results/x.json  # no GPU

A run writes its JSON and a PNG beside it (plot: us per call against T,
a panel per team size and H); --report prints a JSON's table and writes
its PNG beside it.

Several GPUs (issue 31): launched by torchrun (WORLD_SIZE set), one
process per GPU, the ranks aligned by a barrier before each measurement,
rank 0's times reported (--nranks, if given, must equal WORLD_SIZE):

    torchrun --standalone --nproc-per-node 2 benchmarks/bench_fused.py
    torchrun --standalone --nproc-per-node 8 benchmarks/bench_fused.py \
        --tokens 1,16,128 --hidden 4096 --out results/fused_h200x8.json

There each row also times the anchors:
  nccl_unfused   torch.distributed.all_reduce (NCCL) + torch.add +
                 rms_norm, the unfused path of a framework without symnccl
  flashinfer     FlashInfer's fused all-reduce + residual + RMSNorm
                 (flashinfer.comm.trtllm_allreduce_fusion, pattern
                 kARResidualRMSNorm, its IPC workspace), checked against
                 the unfused result like the fused call; when flashinfer
                 is not importable (or its setup fails) the column is
                 empty and the JSON's "skipped" says why (on the device
                 machines, which reach no index, tools/gpu/
                 flashinfer_anchor.sh brings it)
Without torchrun, --nranks N is a loopback team of N on this GPU (as
--ranks N).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_allreduce import (  # noqa: E402
    add_results_args, plot_beside, pyplot, report, run_info, us_panel,
    write_results)

TOKENS = [1, 16, 128, 512, 2048]
HIDDEN = [4096, 8192]
EPS = 1e-6


def _grids(torch, nranks):
    """The knobs of a loopback team, whose ranks share one GPU: the fused
    kernels' grids must be resident at once (SYMNCCL_RMSNORM_CTAS; one
    512-thread CTA of them per SM), and the add+norm's resident CTAs
    (SYMNCCL_RMSNORM_LOCAL_CTAS's default: two per SM for the 512-thread
    rows of H 4096 and 8192 in bf16, the sizes measured) are shared among
    the ranks; so are the packet grids (the fused packet kernels' and the
    LL all-reduce's, SYMNCCL_LL_CTAS; the Lamport all-reduce's,
    SYMNCCL_LAMPORT_CTAS)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return {"SYMNCCL_RMSNORM_CTAS": str(min(128, sms) // nranks),
            "SYMNCCL_LL_CTAS": str(min(64, sms // nranks)),
            "SYMNCCL_LAMPORT_CTAS": str(min(64, sms // nranks)),
            "SYMNCCL_RMSNORM_LOCAL_CTAS": str(2 * sms // nranks)}


def _team(torch, nranks):
    import symnccl
    if nranks == 1:
        return [symnccl.Communicator(symnccl.get_unique_id(), 0, 1, 0)]
    knobs = _grids(torch, nranks)
    os.environ.update(knobs)
    try:
        return symnccl.Communicator._loopback(nranks, 0, timeout=60.0)
    finally:
        for k in knobs:
            del os.environ[k]


def _each(torch, team, streams, bufs, call):
    """call(c, b) for every rank of this process. One rank (torchrun, or a
    team of 1) calls on the current stream, as the anchors are timed; a
    loopback team's ranks each on their stream, forked from and joined to
    the current one (so a capture holds them all, and they run at once)."""
    if len(team) == 1:
        call(team[0], bufs[0])
        return
    cur = torch.cuda.current_stream()
    for c, s, b in zip(team, streams, bufs):
        s.wait_stream(cur)
        with torch.cuda.stream(s):
            call(c, b)
    for s in streams:
        cur.wait_stream(s)


def _calls(torch, team, streams, bufs, fused, algo="auto"):
    """Every rank's fused call, or its unfused path."""
    F = torch.nn.functional

    def call(c, b):
        if fused:
            c.all_reduce_rmsnorm(b["x"], b["res"], b["w"], EPS,
                                 out=b["y"], residual_out=b["h"], algo=algo)
        else:
            c.all_reduce(b["x"], out=b["s"])
            torch.add(b["s"], b["res"], out=b["h"])
            # rms_norm has no out=: its output replaces b["y"]
            b["y"] = F.rms_norm(b["h"], (b["h"].shape[-1],), b["w"], EPS)
    _each(torch, team, streams, bufs, call)


def _all_reduce(team, streams, bufs, algo):
    """Every rank's all-reduce of x alone (no add, no norm)."""
    import torch
    _each(torch, team, streams, bufs,
          lambda c, b: c.all_reduce(b["x"], out=b["s"], algo=algo))


# the fused kernels timed one by one at 2+ ranks (the kernel table's), and
# the packet all-reduces alone
KERNEL_ALGOS = ("ll", "ll128", "lamport", "one_shot", "two_shot")
FLOOR_ALGOS = ("ll", "ll128")


def capture(torch, fn, iters):
    """A CUDA graph of `iters` calls of fn(), after one call outside it (its
    lazy set-up) and replayed once (its first replay's own costs)."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(iters):
            fn()
    g.replay()
    torch.cuda.synchronize()
    return g


def replay_us(torch, g, iters, reps, sync=None):
    """Median microseconds per call of graph g (`iters` calls) over `reps`
    replays timed with device events; sync() (the ranks of separate
    processes: a barrier) before each."""
    times = []
    for _ in range(reps):
        if sync is not None:
            sync()
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0 / iters)
    times.sort()
    return times[len(times) // 2]


def _time(torch, fn, iters, reps, sync=None):
    """Median microseconds per call of fn() replayed from a CUDA graph of
    `iters` calls; sync() before each rep."""
    return replay_us(torch, capture(torch, fn, iters), iters, reps, sync)


def _check(torch, bufs_f, bufs_u, dtype):
    eps = torch.finfo(dtype).eps
    worst, wrong = 0.0, 0
    for bf, bu in zip(bufs_f, bufs_u):
        for k in ("y", "h"):
            d = (bf[k].float() - bu[k].float()).abs()
            scale = bu[k].float().abs().clamp_min(1.0) * eps
            worst = max(worst, float((d / scale).max()))
            wrong += int((d > 4 * scale).sum())
    return worst, wrong


def _measure(torch, team, n, rank, opts, sync=None, anchors=None,
             verbose=True):
    """The rows of one team: `team` holds this process's ranks (all n of a
    loopback team, or the one rank `rank` of n processes). anchors(T, H,
    b, ref, timer) (torchrun only) returns more fields of the row: b holds
    this rank's inputs, ref the unfused y and h, timer(fn) the median us
    of fn as the other methods are timed."""
    import symnccl
    dtype = getattr(torch, opts["dtype"])
    streams = [torch.cuda.Stream() for _ in team]
    # the fused kernels this build has (an older one, in an A/B run, may
    # lack one)
    kernel_algos = [a for a in KERNEL_ALGOS if a in symnccl.ALGORITHMS]
    rows = []
    for H in [int(v) for v in opts["hidden"].split(",")]:
        for T in [int(v) for v in opts["tokens"].split(",")]:
            # residual and weight: the same on every rank; x: each rank's
            g = torch.Generator(device="cuda").manual_seed(T * H + n)
            res = torch.randn(T, H, device="cuda", generator=g).to(dtype)
            w = (1 + 0.5 * torch.randn(H, device="cuda", generator=g)).to(
                dtype)
            bf = []
            for q in range(len(team)):
                gx = torch.Generator(device="cuda").manual_seed(
                    T * H + 7919 * (rank + q + 1))
                x = torch.randn(T, H, device="cuda", generator=gx).to(dtype)
                bf.append({"x": x, "res": res, "w": w,
                           "s": torch.empty_like(x), "y": torch.empty_like(x),
                           "h": torch.empty_like(x)})
            bu = [dict(b, y=torch.empty_like(b["y"]),
                       h=torch.empty_like(b["h"])) for b in bf]
            if sync is not None:
                sync()
            _calls(torch, team, streams, bf, True, opts["algo"])
            _calls(torch, team, streams, bu, False)
            torch.cuda.synchronize()
            worst, wrong = _check(torch, bf, bu, dtype)
            before = team[0]._launches()
            tf = _time(torch, lambda: _calls(torch, team, streams, bf, True,
                                             opts["algo"]),
                       opts["iters"], opts["reps"], sync)
            ran = {k: v - before[k] for k, v in team[0]._launches().items()
                   if v != before[k]}
            tu = _time(torch, lambda: _calls(torch, team, streams, bu, False),
                       opts["iters"], opts["reps"], sync)
            per = {}
            if n > 1:   # each fused kernel, and the LL all-reduce alone
                for algo in kernel_algos:
                    per[f"{algo}_us"] = round(_time(
                        torch, lambda: _calls(torch, team, streams, bf, True,
                                              algo),
                        opts["iters"], opts["reps"], sync), 2)
                for algo in FLOOR_ALGOS:
                    per[f"ar_{algo}_us"] = round(_time(
                        torch, lambda: _all_reduce(team, streams, bf, algo),
                        opts["iters"], opts["reps"], sync), 2)
            rows.append({"nranks": n, "T": T, "H": H,
                         "bytes": T * H * bf[0]["x"].element_size(),
                         "fused_us": round(tf, 2),
                         "unfused_us": round(tu, 2),
                         "ratio": round(tf / tu, 3),
                         **per,
                         "fused_kernels": ran,
                         "max_diff_eps": round(worst, 2),
                         "wrong": wrong})
            if anchors is not None:
                rows[-1].update(anchors(
                    T, H, bf[0], bu[0],
                    lambda fn: _time(torch, fn, opts["iters"], opts["reps"],
                                     sync)))
            if rank == 0 and verbose:
                print(rows[-1], flush=True)
    return rows


def _load_kernels(torch, opts):
    """Every torch kernel of the grid run once by a one-rank team, before a
    loopback team's first call: a kernel loaded lazily (CUDA's lazy module
    loading) while one rank's kernel spins waiting for the other would
    wait on it, and the team would stall until the timeout. (--ranks 1,2
    does this by its order; --nranks 2 alone needs it.)"""
    team = _team(torch, 1)
    try:
        _measure(torch, team, 1, 0, dict(opts, iters=1, reps=1),
                 verbose=False)
    finally:
        team[0].close()


class _Anchors:
    """The multi-GPU anchors of one torchrun rank: NCCL's unfused path and,
    where importable, FlashInfer's fused all-reduce (one IPC workspace per
    hidden size, for the largest T). Every rank makes the same calls in
    the same order; `skipped` names what could not run and why."""

    def __init__(self, torch, dist, rank, n, opts):
        self.torch, self.dist, self.rank, self.n = torch, dist, rank, n
        self.max_tokens = max(int(v) for v in opts["tokens"].split(","))
        self.dtype = getattr(torch, opts["dtype"])
        self.skipped, self.fi, self.ws = {}, None, {}
        try:
            import flashinfer.comm as fi
            self.fi = fi
        except Exception as e:    # not installed, or its import fails
            self.skipped["flashinfer"] = f"{type(e).__name__}: {e}"[:200]

    def _workspace(self, H):
        if H not in self.ws:
            make = self.fi.trtllm_create_ipc_workspace_for_all_reduce_fusion
            self.ws[H] = make(
                tp_rank=self.rank, tp_size=self.n,
                max_token_num=self.max_tokens, hidden_dim=H,
                group=self.dist.group.WORLD)
        return self.ws[H][1]

    def close(self):
        for handles, _ in self.ws.values():
            try:
                self.fi.trtllm_destroy_ipc_workspace_for_all_reduce(
                    handles, self.dist.group.WORLD)
            except Exception:
                pass

    def __call__(self, T, H, b, ref, timer):
        torch, F, dist = self.torch, self.torch.nn.functional, self.dist
        s, h, y = (torch.empty_like(b["x"]) for _ in range(3))

        def nccl_unfused():
            s.copy_(b["x"])         # all_reduce is in place: x stays
            dist.all_reduce(s)
            torch.add(s, b["res"], out=h)
            y.copy_(F.rms_norm(h, (H,), b["w"], EPS))

        row = {"nccl_unfused_us": round(timer(nccl_unfused), 2)}
        if self.fi is None:
            return row | {"flashinfer_us": None}
        fy, fh = torch.empty_like(b["x"]), torch.empty_like(b["x"])

        def flashinfer():
            fi = self.fi
            fi.trtllm_allreduce_fusion(
                allreduce_in=b["x"], world_size=self.n, world_rank=self.rank,
                token_num=T, hidden_dim=H, workspace_ptrs=self._workspace(H),
                launch_with_pdl=False, use_oneshot=None,
                trigger_completion_at_end=True, fp32_acc=True,
                pattern_code=fi.AllReduceFusionPattern.kARResidualRMSNorm,
                allreduce_out=None, residual_in=b["res"], residual_out=fh,
                norm_out=fy, quant_out=None, scale_out=None,
                rms_gamma=b["w"], rms_eps=EPS, scale_factor=None,
                layout_code=None)

        try:
            flashinfer()
            torch.cuda.synchronize()
            worst, wrong = _check(torch, [{"y": fy, "h": fh}], [ref],
                                  self.dtype)
            return row | {"flashinfer_us": round(timer(flashinfer), 2),
                          "flashinfer_max_diff_eps": round(worst, 2),
                          "flashinfer_wrong": wrong}
        except Exception as e:     # an API or size this version lacks
            self.skipped[f"flashinfer T={T} H={H}"] = \
                f"{type(e).__name__}: {e}"[:200]
            return row | {"flashinfer_us": None}


def _torchrun_main(opts):
    """One process per GPU under torchrun: rank 0's rows (None on the
    other ranks), every rank aligned by a barrier before each
    measurement."""
    import torch
    import torch.distributed as dist
    import symnccl.torch as snt
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if opts["nranks"] not in (0, n):
        raise SystemExit(f"--nranks {opts['nranks']} under torchrun of "
                         f"{n} processes: leave it out or make them equal")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    comm = snt.communicator().comm
    anchors = _Anchors(torch, dist, rank, n, opts)
    try:
        rows = _measure(torch, [comm], n, rank, opts,
                        sync=lambda: comm.barrier(blocking=True),
                        anchors=anchors)
    finally:
        anchors.close()
        comm.close()
    dist.destroy_process_group()
    return rank, n, rows, anchors.skipped


def print_table(doc, where=None):
    """The rows (every column of each team size), the torchrun anchors
    where the run has them, and the run's GPU, date and versions."""
    rows = doc["rows"]
    cols = [f"{a}_us" for a in KERNEL_ALGOS] + \
        [f"ar_{a}_us" for a in FLOOR_ALGOS]
    print(f"\n{'ranks':>5} {'T':>5} {'H':>5} {'bytes':>9} {'fused us':>9} "
          f"{'unfused us':>10} {'ratio':>6} "
          + " ".join(f"{c[:-3]:>9}" for c in cols) +
          f" {'maxdiff':>8} {'#wrong':>6}")
    for r in rows:
        print(f"{r['nranks']:>5} {r['T']:>5} {r['H']:>5} {r['bytes']:>9} "
              f"{r['fused_us']:>9.2f} {r['unfused_us']:>10.2f} "
              f"{r['ratio']:>6.3f} "
              + " ".join(f"{r.get(c) or '-':>9}" for c in cols) +
              f" {r['max_diff_eps']:>8.2f} {r['wrong']:>6}")
    if "skipped" in doc:      # torchrun: the anchors, us
        print(f"\n{'T':>5} {'H':>5} {'fused us':>9} {'nccl unfused':>12} "
              f"{'flashinfer':>10}")
        for r in rows:
            fi = r.get("flashinfer_us")
            print(f"{r['T']:>5} {r['H']:>5} {r['fused_us']:>9.2f} "
                  f"{r['nccl_unfused_us']:>12.2f} "
                  f"{fi if fi is not None else '-':>10}")
        for k, why in doc["skipped"].items():
            print(f"skipped {k}: {why}")
    print(f"\n{doc['gpu']}, {doc['date']}, {doc['versions']}"
          + (f"; {where}" if where else ""))


#: the plotted columns: (row key, legend label, line style)
PLOT_COLUMNS = (
    ("fused_us", "fused ({algo})", "-o"),
    ("unfused_us", "unfused (symnccl all_reduce + torch add, rms_norm)",
     "-s"),
    ("ll_us", "fused ll", "-^"),
    ("ll128_us", "fused ll128", "-<"),
    ("lamport_us", "fused lamport", "->"),
    ("one_shot_us", "fused one_shot", "-v"),
    ("two_shot_us", "fused two_shot", "-D"),
    ("ar_ll_us", "all_reduce ll alone (floor of ll)", ":"),
    ("ar_ll128_us", "all_reduce ll128 alone (floor of ll128)", "-."),
    ("nccl_unfused_us", "NCCL + torch add, rms_norm", "--s"),
    ("flashinfer_us", "FlashInfer fused", "--o"),
)


def plot(doc, path):
    """us per call (log) against T (log2), a line per column that has a
    number; one panel per (team size, H): a run of several team sizes on
    one GPU (1 rank and loopback teams) has a row of panels per size."""
    plt = pyplot()
    teams = sorted({r["nranks"] for r in doc["rows"]})
    hs = sorted({r["H"] for r in doc["rows"]})
    fig, axes = plt.subplots(len(teams), len(hs), squeeze=False,
                             figsize=(6 * len(hs), 4.5 * len(teams)))
    cols = [(k, label.format(algo=doc.get("algo", "auto")), style)
            for k, label, style in PLOT_COLUMNS]
    for i, n in enumerate(teams):
        if doc.get("loopback") is False:
            where = f"{n} GPUs, one process each"
        else:
            where = "1 rank" if n == 1 else f"loopback team of {n}, 1 GPU"
        for ax, H in zip(axes[i], hs):
            rows = [r for r in doc["rows"] if r["nranks"] == n and r["H"] == H]
            if not rows:
                ax.set_visible(False)
                continue
            us_panel(ax, rows, "T", cols, "T (tokens)",
                     f"all_reduce + add + RMSNorm, H {H}, {where}\n"
                     f"{doc['gpu']}, {doc['dtype']}, {doc['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", default="1,2",
                    help="team sizes on this GPU (1: a real 1-rank "
                    "communicator; 2+: loopback teams)")
    ap.add_argument("--nranks", type=int, default=0,
                    help="under torchrun: the number of processes (one "
                    "GPU each; WORLD_SIZE if left out); without it, a "
                    "loopback team of this many ranks instead of --ranks")
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--hidden", default=",".join(map(str, HIDDEN)))
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--algo", default="auto",
                    help="the fused call's algo (auto: what a caller gets; "
                    "one_shot, two_shot)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--reps", type=int, default=15)
    add_results_args(ap, "JSON path (default: "
                     "results/fused_<gpu>x<GPUs>_<dtype>.json beside this "
                     "file); the PNG is written beside it")
    args = ap.parse_args(argv)
    if report(args, print_table, plot) is not None:
        return
    opts = vars(args)
    import torch
    gpu, tv = torch.cuda.get_device_name(0), torch.__version__
    extra = {}
    if "WORLD_SIZE" in os.environ:      # torchrun: one process per GPU
        rank, gpus, rows, skipped = _torchrun_main(opts)
        if rank != 0:
            return
        extra = {"loopback": False, "skipped": skipped}
    else:
        rows, gpus = [], 1
        teams = [args.nranks] if args.nranks > 0 else \
            [int(v) for v in args.ranks.split(",")]
        if teams[0] > 1:
            _load_kernels(torch, opts)
        for n in teams:
            team = _team(torch, n)
            try:
                rows += _measure(torch, team, n, 0, opts)
            finally:
                for c in team:
                    c.close()
    doc = run_info(gpus, gpu, tv, dtype=args.dtype, algo=args.algo,
                   iters=args.iters, reps=args.reps, eps=EPS, rows=rows,
                   **extra)
    where = write_results(doc, "fused_", args.out)
    plot_beside(plot, doc, where)
    print_table(doc, where)


if __name__ == "__main__":
    main()
