"""All-reduce benchmark: symnccl's algorithms and the anchors, same run,
same process layout (one process per GPU). The methods (each skipped with a
printed reason where unavailable) are listed by --help, from METHODS.

Timing: CUDA-graph replay (or eager with --eager) of `iters` calls cycling
over 4 input buffers, device events, median of --reps repeats. Every size is
checked against a float64 reference first (#wrong, as nccl-tests prints).
busbw = bytes / t * 2 (n - 1) / n (nvlink:*: bytes / t).

    python -m symnccl bench --nranks 2 --dtype bfloat16   # writes a JSON
    python -m symnccl bench --report RESULTS.json   # a JSON it wrote
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys

# 1 KiB, then 4 KiB .. 256 MiB in x4 steps, then 512 MiB
SIZES = [1 << 10] + [4096 << (2 * i) for i in range(9)] + [512 << 20]
NBUF = 4


def _time(fn, iters, reps, eager, torch):
    """Median microseconds per call of fn(i) for i in range(iters)."""
    for i in range(3):
        fn(i)   # eager warm-up: NCCL connects lazily
    torch.cuda.synchronize()
    if not eager:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(iters):
                fn(i)
        g.replay()
        torch.cuda.synchronize()

    def run():
        if eager:
            for i in range(iters):
                fn(i)
        else:
            g.replay()
    return median_us(run, iters, reps, torch)


def median_us(run, iters, reps, torch):
    """Median over `reps` of run()'s device time / iters, in microseconds;
    every rep starts with the ranks aligned (a barrier), so no rank's time
    holds another's lateness."""
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        torch.distributed.barrier()
        torch.cuda.synchronize()
        a.record()
        run()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0 / iters)
    times.sort()
    return times[len(times) // 2]


def team_replay_us(torch, graphs, streams, iters, reps):
    """A loopback team's time per call: every rank's graph (`iters` calls)
    replayed on its own stream between one pair of events on the current
    stream; the median over `reps` (after one untimed), in microseconds."""
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


def _init_torch(rank, nranks, port):
    """symnccl.bootstrap.init_torch, spelled out where the symnccl being
    measured predates it (scripts/ab_builds.sh runs this script against
    older builds' packages)."""
    try:
        from symnccl.bootstrap import init_torch
    except ImportError:
        import torch
        import torch.distributed as dist
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(port)
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", rank=rank, world_size=nranks,
                                device_id=torch.device("cuda", rank))
        return
    init_torch(rank, nranks, port)


def worker(rank, nranks, uid, opts):
    import torch
    import torch.distributed as dist

    import symnccl
    _init_torch(rank, nranks, opts["port"])
    group_name = dist.group.WORLD.group_name
    comm = symnccl.Communicator(uid, rank, nranks, device=rank)
    dtype = getattr(torch, opts["dtype"])
    esize = torch.empty(0, dtype=dtype).element_size()
    symm = None
    try:
        import torch.distributed._symmetric_memory as symm_mem
        symm = symm_mem
    except Exception as e:  # pragma: no cover - depends on the torch build
        symm_reason = f"import failed: {e}"
    results, skipped = [], {}
    for nbytes in opts["sizes"]:
        count = nbytes // esize
        iters = opts["iters"] if nbytes <= (4 << 20) else max(
            3, opts["iters"] // 10)
        # inputs: random per rank, reference in float64 on the GPU
        gen = torch.Generator(device="cuda")
        ins = []
        for r in range(nranks):
            gen.manual_seed(1000 * r + 7)
            ins.append(torch.rand(count, generator=gen, device="cuda",
                                  dtype=torch.float32).mul_(2).sub_(1)
                       .to(dtype))
        ref = sum(t.double() for t in ins)
        absum = sum(t.double().abs() for t in ins)
        eps = {torch.bfloat16: 2**-7, torch.float16: 2**-10,
               torch.float32: 2**-23}[dtype]
        mine = ins[rank]
        del ins

        def wrong(out):
            d = (out.double() - ref).abs()
            return int(((d > (nranks + 1) * eps * absum + 1e-30)
                        | ~torch.isfinite(out.double())).sum())

        wins = [comm.empty(count, opts["dtype"]) for _ in range(NBUF)]
        wts = [torch.from_dlpack(w) for w in wins]
        plain = [torch.empty(count, dtype=dtype, device="cuda")
                 for _ in range(NBUF)]
        methods = {}
        for name in SYMNCCL_METHODS:
            methods[name] = (
                wts, lambda i, a=name.split(":")[1]:
                comm.all_reduce(wts[i % NBUF], algo=a))
        methods["symnccl:auto(tensor)"] = (
            plain, lambda i: comm.all_reduce(plain[i % NBUF]))
        for algo in ("two_shot", "push"):   # the tensor paths, for auto
            methods[f"symnccl:{algo}(tensor)"] = (
                plain, lambda i, a=algo: comm.all_reduce(plain[i % NBUF],
                                                         algo=a))
        methods["nccl:window"] = (
            wts, lambda i: comm.all_reduce(wts[i % NBUF], algo="nccl"))
        methods["nccl:plain"] = (
            plain, lambda i: comm.all_reduce(plain[i % NBUF], algo="nccl"))
        methods["torch.dist"] = (
            plain, lambda i: dist.all_reduce(plain[i % NBUF]))
        stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa
        try:
            peer = (rank + 1) % nranks
            srcs = [comm._lsa_pointer(w, peer) for w in wins]
            for eng in ("memcpy", "kernel"):
                methods["nvlink:" + eng] = (
                    plain, lambda i, e=eng: comm._copy(
                        plain[i % NBUF].data_ptr(), srcs[i % NBUF], nbytes,
                        stream(), e, 128))
        except Exception as e:
            skipped["nvlink"] = f"{type(e).__name__}: {e}"[:200]
        if symm is not None:
            try:
                sbufs = [symm.empty(count, dtype=dtype, device="cuda")
                         for _ in range(NBUF)]
                for b in sbufs:
                    symm.rendezvous(b, group_name)
                ops = torch.ops.symm_mem
                methods["symm_mem:one_shot"] = (
                    sbufs, lambda i: ops.one_shot_all_reduce(
                        sbufs[i % NBUF], "sum", group_name))
                methods["symm_mem:two_shot"] = (
                    sbufs, lambda i: ops.two_shot_all_reduce_(
                        sbufs[i % NBUF], "sum", group_name))
            except Exception as e:
                skipped["symm_mem"] = f"{type(e).__name__}: {e}"[:200]
        else:
            skipped["symm_mem"] = symm_reason
        if opts.get("methods"):
            methods = {k: v for k, v in methods.items()
                       if any(k.startswith(m) for m in opts["methods"])}
        row = {"bytes": nbytes, "count": count, "iters": iters}
        for name, (bufs, fn) in methods.items():
            try:
                # correctness: one call on fresh input, poisoned output
                bufs[0].copy_(mine)
                out = fn(0)
                if name == "symm_mem:one_shot":
                    got = out
                else:
                    got = bufs[0]
                torch.cuda.synchronize()
                if name.startswith("nvlink:"):
                    # a copy of the neighbour's window, which holds the
                    # same bytes as ours (the last in-place all-reduce)
                    nwrong = int((got.view(torch.uint8)
                                  != wts[0].view(torch.uint8)).sum())
                else:
                    nwrong = wrong(got)
                us = _time(fn, iters, opts["reps"], opts["eager"], torch)
                row[name] = {"us": us, "wrong": nwrong}
            except Exception as e:
                skipped[name] = f"{type(e).__name__}: {e}"[:200]
        results.append(row)
        del wins, wts, plain, methods, ref, absum
        torch.cuda.empty_cache()
    comm.close()
    dist.destroy_process_group()
    return {"rows": results, "skipped": skipped}


SYMNCCL_METHODS = ("symnccl:ll", "symnccl:ll128", "symnccl:lamport",
                   "symnccl:one_shot", "symnccl:two_shot", "symnccl:push",
                   "symnccl:auto")
TENSOR_METHODS = ("symnccl:auto(tensor)", "symnccl:two_shot(tensor)",
                  "symnccl:push(tensor)")
ANCHORS = ("nccl:window", "nccl:plain", "torch.dist", "symm_mem:one_shot",
           "symm_mem:two_shot")
CEILING = ("nvlink:memcpy", "nvlink:kernel")
#: what each group of methods measures (--help lists the names from the
#: tuples above)
METHODS = (
    (SYMNCCL_METHODS, "in place on SymmetricBuffers"),
    (TENSOR_METHODS, "torch tensor input (through symnccl's staging)"),
    (("nccl:window",), "ncclAllReduce on SymmetricBuffers (NCCL's "
                       "symmetric kernels, as SYMNCCL_NCCL_WINDOWS allows)"),
    (("nccl:plain",), "ncclAllReduce on torch tensors, through symnccl"),
    (("torch.dist",), "torch.distributed.all_reduce (what torch users pay)"),
    (("symm_mem:one_shot", "symm_mem:two_shot"),
     "torch symmetric memory kernels"),
    (CEILING, "the ceiling: every rank pulls the whole message from its "
              "neighbour's window (cudaMemcpyAsync through the LSA pointer; "
              "a plain 16-byte-load copy kernel); GB/s is bytes / time"),
)


def _description():
    """The module's docstring with the method list built from METHODS."""
    lines = ["Methods (--methods takes prefixes of these names):"]
    for names, what in METHODS:
        lines.append("  " + ", ".join(names))
        lines.append("      " + what)
    head, _, tail = __doc__.partition("Timing:")
    return head + "\n".join(lines) + "\n\nTiming:" + tail


def _bw(doc, method, nbytes, us):
    """GB/s: busbw for all-reduces, plain bytes / time for the ceiling."""
    n = doc["nranks"]
    f = 1.0 if method.startswith("nvlink:") else 2.0 * (n - 1) / n
    return nbytes / us / 1e3 * f


#: environment variables that shape a run, recorded in every results file
RUN_ENV = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
           "NVSHMEM_DISABLE_NVLS")


def run_info(nranks: int, gpu: str, torch_version: str, **fields) -> dict:
    """The header of a results file (every benchmark's): GPU, ranks, date,
    host, the command that ran, versions, the environment that shapes the
    run, then `fields`."""
    import shlex
    import symnccl
    versions = symnccl.versions()
    versions["torch"] = torch_version
    argv = [os.path.relpath(sys.argv[0])] + sys.argv[1:]
    return {"gpu": gpu, "nranks": nranks,
            "date": datetime.date.today().isoformat(),
            "host": platform.node(),
            "command": "python " + shlex.join(argv),
            "versions": versions,
            "env": {k: v for k, v in os.environ.items()
                    if k in RUN_ENV or k.startswith("SYMNCCL_")},
            **fields}


def gpu_model(name: str) -> str:
    """"NVIDIA H100 80GB HBM3" -> "h100", "NVIDIA H200" -> "h200": the
    first word that is a letter and digits, else the last word."""
    import re
    words = name.split()
    return next((w for w in words if re.fullmatch(r"[A-Za-z]+\d+", w)),
                words[-1]).lower()


def results_name(doc: dict, prefix: str) -> str:
    """<prefix><gpu>x<n>_<dtype>[_eager].json, e.g. step_h200x2_bfloat16.json
    (gpu: the model in the device name, "NVIDIA H100 80GB HBM3" -> h100)"""
    return (f"{prefix}{gpu_model(doc['gpu'])}x{doc['nranks']}"
            f"_{doc['dtype']}{'_eager' if doc.get('eager') else ''}.json")


def write_results(doc: dict, prefix: str, path=None) -> str:
    """doc as JSON at `path`, else at results/results_name(doc, prefix)
    beside this script; returns where."""
    if path is None:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                            "results", results_name(doc, prefix))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    return path


def refuse_torchrun(name):
    """The benchmarks that start one process per GPU themselves
    (symnccl.bootstrap.spawn) exit here under torchrun, which would give
    every one of its processes a team of its own on the same GPUs: the
    teams' calls would share the GPUs and the timings mean nothing (one
    such run outran a 100 s limit printing nothing)."""
    world = os.environ.get("WORLD_SIZE")
    if world is not None and world != "1":
        sys.exit(f"{name} starts its own process per GPU (--nranks): run "
                 f"it with python, not under torchrun (WORLD_SIZE={world})")


def add_results_args(p, out_help="JSON path"):
    """--out and --report, as every benchmark here takes them."""
    p.add_argument("--out", default=None, metavar="PATH", help=out_help)
    p.add_argument("--report", default=None,
                   help="print the table of a results JSON, no GPU")


def report(args, print_table, plot=None):
    """With --report: its results JSON, after print_table showed it (and,
    given plot, its PNG written beside it: plot_beside); else None (the
    benchmark runs)."""
    if not args.report:
        return None
    with open(args.report) as f:
        doc = json.load(f)
    print_table(doc)
    if plot is not None:
        plot_beside(plot, doc, args.report)
    return doc


def plot_beside(plot, doc, json_path):
    """plot(doc, PNG) with the PNG beside its JSON (json_path's name, .png):
    a run's PNG beside the JSON it wrote, --report's beside the JSON it
    read. Without matplotlib a line says so and nothing is written.
    Returns the PNG's path, or None."""
    png = os.path.splitext(json_path)[0] + ".png"
    try:
        plot(doc, png)
    except ImportError as e:
        print(f"no plot: {e}", file=sys.stderr)
        return None
    return png


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display): ImportError
    without matplotlib."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def us_panel(ax, rows, x, columns, xlabel, title, xfmt=str,
             negative="wrong", ylabel="µs per call (median)"):
    """One panel: microseconds per call (log y) against each row's `x`
    (log2 x, a tick at each x, labelled xfmt(x)); a line per (key, label,
    style) of `columns` with a number in some row. Missing and None cells
    are left out, and so are negative ones (-1.0: a wrong result), the
    label counting those as `negative` (a column with only those: in the
    legend, without a line)."""
    import math
    from matplotlib.ticker import FuncFormatter, NullLocator

    def y_label(v, _pos):     # 1, 2, 5 of each decade, as plain numbers
        lead = round(v / 10 ** math.floor(math.log10(v)), 6)
        return f"{v:g}" if lead in (1, 2, 5) else ""

    xs_all = sorted({r[x] for r in rows})
    for key, label, style in columns:
        pts = [(r[x], r[key]) for r in rows
               if isinstance(r.get(key), (int, float)) and r[key] > 0]
        bad = sum(1 for r in rows if isinstance(r.get(key), (int, float))
                  and r[key] < 0)
        if bad:
            label += f" ({bad} {negative}, left out)"
        if not pts:
            if bad:
                ax.plot([], [], style, label=label, ms=3)
            continue
        xs, ys = zip(*sorted(pts))
        ax.plot(xs, ys, style, label=label, ms=3)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(xs_all)
    ax.set_xticklabels([xfmt(v) for v in xs_all], fontsize=7)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(y_label))
    ax.yaxis.set_minor_formatter(FuncFormatter(y_label))
    ax.tick_params(axis="y", which="both", labelsize=7)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def bar_slots(groups):
    """The rows bar_panel(groups) takes: a heading per group and a row
    per bar (to size a figure, or a panel's share of it)."""
    return sum(1 + len(bars) for _, bars in groups)


def bar_panel(ax, groups, title, xlabel="µs per call (median)",
              colors=None, ref=None):
    """One panel of horizontal bars, top to bottom: per (name, bars) of
    `groups` a heading (its name, in bold on the y axis), then a bar per
    (label, value, key, note) of `bars`, labelled `label` on the y axis
    and its value (then `note`) at its end, coloured by `key`: one
    `colors` dict (key -> colour, filled in as keys come) across panels
    gives a key one colour everywhere. A None or negative value draws no
    bar, only its note ("no value" without one). ref=(value, label): a
    dotted vertical line at value, in the legend. Returns colors."""
    import matplotlib
    colors = {} if colors is None else colors
    tab20 = matplotlib.colormaps["tab20"].colors
    palette = tab20[0::2] + tab20[1::2]
    ys, labels, heads = [], [], []
    y, top = 0.0, 0.0
    for name, bars in groups:
        ys.append(y)
        labels.append(name)
        heads.append(True)
        y += 1
        for label, value, key, note in bars:
            ys.append(y)
            labels.append(label)
            heads.append(False)
            if key not in colors:
                colors[key] = palette[len(colors) % len(palette)]
            if isinstance(value, (int, float)) and value >= 0:
                ax.barh(y, value, height=0.8, color=colors[key])
                top = max(top, value)
                text = f" {value:.2f}" if value < 100 else f" {value:.0f}"
                text += note or ""
                ax.text(value, y, text, va="center", fontsize=6)
            else:
                ax.text(0, y, f" {note or 'no value'}", va="center",
                        fontsize=6, color="firebrick")
            y += 1
        y += 0.4
    if ref is not None:
        ax.axvline(ref[0], ls=":", color="0.3", lw=1, label=ref[1])
        ax.legend(fontsize=7, loc="lower right")
    ax.set_yticks(ys)
    ax.set_yticklabels(labels, fontsize=7)
    for tick, head in zip(ax.get_yticklabels(), heads):
        if head:
            tick.set_fontweight("bold")
    ax.tick_params(axis="y", length=0)
    ax.set_ylim(y - 0.4, -0.8)            # top to bottom
    ax.set_xlim(0, (top or 1) * 1.3)      # room for the values' text
    ax.tick_params(axis="x", labelsize=7)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.grid(True, axis="x", alpha=0.3)
    return colors


def parse_sizes(text):
    """'4K,1M,256M' (or plain byte counts) -> [4096, 1048576, 268435456]."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    out = []
    for tok in text.split(","):
        tok = tok.strip().upper().removesuffix("IB").removesuffix("B")
        if tok and tok[-1] in units:
            out.append(int(float(tok[:-1]) * units[tok[-1]]))
        elif tok:
            out.append(int(tok))
    return out


def _fmt_size(b):
    for unit, s in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= s:
            return f"{b // s}{unit}"
    return f"{b}B"


def print_table(doc):
    n = doc["nranks"]
    rows = doc["rows"]
    names = [m for m in SYMNCCL_METHODS + TENSOR_METHODS + ANCHORS
             + CEILING if any(m in r for r in rows)]
    print(f"\n{doc['gpu']} x{n}, {doc['dtype']}, "
          f"{'eager' if doc['eager'] else 'CUDA-graph replay'}, median us "
          f"(busbw GB/s); NCCL {doc['versions']['nccl_runtime']}, "
          f"torch {doc['versions'].get('torch')}, {doc['date']}")
    head = f"{'size':>8} " + " ".join(f"{m:>22}" for m in names) + \
        f" {'#wrong':>6} {'speedup':>8}"
    print(head)
    for r in rows:
        cells, wrong = [], 0
        for m in names:
            if m in r:
                us = r[m]["us"]
                wrong += r[m]["wrong"]
                cells.append(f"{us:9.2f} ({_bw(doc, m, r['bytes'], us):7.1f})")
            else:
                cells.append(f"{'-':>22}")
        best_s = min((r[m]["us"] for m in SYMNCCL_METHODS if m in r),
                     default=None)
        best_a = min((r[m]["us"] for m in ANCHORS if m in r), default=None)
        sp = f"{best_a / best_s:7.2f}x" if best_s and best_a else "-"
        print(f"{_fmt_size(r['bytes']):>8} " + " ".join(f"{c:>22}"
                                                        for c in cells)
              + f" {wrong:>6} {sp:>8}")
    for k, v in doc.get("skipped", {}).items():
        print(f"skipped {k}: {v}")


def plot(doc, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    n = doc["nranks"]
    rows = doc["rows"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 5))
    for m in SYMNCCL_METHODS + TENSOR_METHODS + ANCHORS + CEILING:
        pts = [(r["bytes"], r[m]["us"]) for r in rows if m in r]
        if not pts:
            continue
        xs, ys = zip(*pts)
        style = "-o" if m.startswith("symnccl") else (
            ":" if m.startswith("nvlink") else "--s")
        a1.loglog(xs, ys, style, label=m, ms=3)
        a2.semilogx(xs, [_bw(doc, m, x, y) for x, y in pts], style, label=m,
                    ms=3)
    a1.set_xlabel("message bytes")
    a1.set_ylabel("us (median)")
    a2.set_xlabel("message bytes")
    a2.set_ylabel("busbw GB/s")
    a1.legend(fontsize=7)
    a1.set_title(f"{doc['gpu']} x{n} {doc['dtype']} all-reduce latency")
    a2.set_title("bus bandwidth")
    for a in (a1, a2):
        a.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def gpus_missing(nranks):
    """None when the GPUs the run needs are visible (nranks, or every
    local GPU; at least 2), else the one-line reason, with what was
    found."""
    from symnccl.bootstrap import local_device_count
    visible = local_device_count()
    n = nranks or visible
    if n >= 2 and visible >= n:
        return None
    found = (f"{visible} GPU{'s are' if visible != 1 else ' is'} visible"
             if visible else "no CUDA GPU is visible (no NVIDIA driver, or "
                             "CUDA_VISIBLE_DEVICES hides them)")
    asked = "" if nranks is None else f" (--nranks {nranks})"
    return (f"the all-reduce benchmark needs at least {max(n, 2)} GPUs"
            f"{asked}, one process each: {found}")


def main(argv=None):
    p = argparse.ArgumentParser(
        description=_description(),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nranks", type=int, default=None, metavar="N",
                   help="number of GPUs, one process each (at least 2; "
                        "default: every local GPU)")
    p.add_argument("--dtype", default="bfloat16",
                   choices=["bfloat16", "float32", "float16"])
    p.add_argument("--iters", type=int, default=50, metavar="CALLS",
                   help="calls per timed CUDA graph (or eager loop), "
                        "whose device time divided by CALLS is the time "
                        "per call (default: 50; a tenth, at least 3, "
                        "above 4 MiB)")
    p.add_argument("--reps", type=int, default=7, metavar="N",
                   help="timed repeats of each loop; the median is "
                        "reported (default: 7)")
    p.add_argument("--eager", action="store_true",
                   help="no CUDA graph: include launch overhead")
    p.add_argument("--max-bytes", type=int, default=512 << 20,
                   metavar="BYTES",
                   help="largest message size in bytes (default: "
                        "536870912, 512 MiB)")
    p.add_argument("--sizes", default=None,
                   help="comma-separated sizes instead of the default sweep, "
                        "e.g. 4K,1M,256M")
    p.add_argument("--methods", default=None,
                   help="comma-separated method prefixes to run, e.g. "
                        "symnccl:push,nccl:plain (default: all)")
    add_results_args(p, "results JSON path (the PNG is written beside "
                        "it; with --report: the PNG's path, default "
                        "./<report name>.png)")
    args = p.parse_args(argv)
    doc = report(args, print_table)
    if doc is not None:
        try:
            plot(doc, args.out or os.path.splitext(
                os.path.basename(args.report))[0] + ".png")
        except ImportError as e:
            print(f"no plot: {e}", file=sys.stderr)
        return 0
    refuse_torchrun("bench_allreduce.py")

    missing = gpus_missing(args.nranks)
    if missing:
        print(missing, file=sys.stderr)
        return 1

    import torch

    from symnccl.bootstrap import free_port, local_device_count, spawn
    n = args.nranks or local_device_count()

    sizes = [s for s in (parse_sizes(args.sizes) if args.sizes else SIZES)
             if s <= args.max_bytes]
    free = min(torch.cuda.mem_get_info(i)[0] for i in range(n))
    # per size: 4 windows + 4 tensors + 4 symm_mem buffers + fp64 reference
    while sizes and 24 * sizes[-1] > free:
        print(f"skipping {sizes[-1] >> 20} MiB: {free >> 30} GiB free")
        sizes.pop()
    opts = dict(dtype=args.dtype, iters=args.iters, reps=args.reps,
                eager=args.eager, sizes=sizes, port=free_port(),
                methods=args.methods.split(",") if args.methods else None)
    res = spawn(worker, n, args=(opts,), timeout=3000)
    doc = run_info(n, torch.cuda.get_device_name(0), torch.__version__,
                   dtype=args.dtype, eager=args.eager, iters=args.iters,
                   reps=args.reps, rows=res[0]["rows"],
                   skipped=res[0]["skipped"])
    out = write_results(doc, "", args.out)
    try:
        plot(doc, os.path.splitext(out)[0] + ".png")
    except ImportError as e:
        print(f"no plot: {e}", file=sys.stderr)
    print_table(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
