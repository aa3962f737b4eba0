"""The "symnccl" torch.distributed backend against the NCCL backend, same
run, same ranks (issue 41): two groups over all ranks, one per backend,
and a symnccl.torch communicator for the custom-op rows.

1. Host cost of one eager call at --size (4 KiB): dist.<call>(group=...)
   through the symnccl backend and through the NCCL backend, and the
   symnccl.torch function doing the same work. As bench_eager.py: --calls
   calls in a loop made while a sleep kernel holds the GPU, median over
   --loops loops (the rows take turns), ratio = median of the per-round
   ratios; the ranks start each loop together (a barrier).
2. Step time, eager, median of --steps steps (device events; the step's
   host time shows where it exceeds the GPU's) and the host time of
   making the step's calls: DDP and FSDP2 (fully_shard per Linear)
   training an MLP (--hidden, --layers, --batch per rank), and DTensor
   TP + SP (parallelize_module) training the same blocks. "sizes": the
   device time per call of the steps' collectives at their sizes (DDP's
   32 MiB bucket all-reduce, FSDP2's 16 MiB all-gather and
   reduce-scatter), each backend.
3. A tensor-parallel decode layer stack (T tokens, --layers MLP layers,
   one dist.all_reduce per layer) captured in a CUDA graph: its time with
   each backend's group, and with the all-reduce replaced by a copy
   ("none"); communication = time - none.

Targets (issue 41), checked from the JSON by targets():
  - eager host cost through the backend <= the NCCL backend's, every call;
  - decode communication in CUDA graphs <= 0.6x the NCCL backend's;
  - DDP and FSDP2 steps <= 1.02x the NCCL backend's.

    python benchmarks/bench_backend.py --nranks 2
    python benchmarks/bench_backend.py --nranks 2 --only eager
    python benchmarks/bench_backend.py --report \
        benchmarks/results/backend_h100x2_float32.json

A run writes its JSON and a PNG beside it (plot: a panel of bars per part
the JSON holds); --report prints a JSON's table and writes its PNG beside
it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_allreduce import (  # noqa: E402
    add_results_args, bar_panel, bar_slots, median_us, parse_sizes,
    plot_beside, pyplot, refuse_torchrun, report, run_info, write_results)

TARGET_EAGER = 1.0      # backend / NCCL backend, host us per call
TARGET_DECODE = 0.6     # decode communication, backend / NCCL backend
TARGET_STEP = 1.02      # DDP, FSDP2 step, backend / NCCL backend
PARTS = ("eager", "steps", "sizes", "decode")
BACKENDS = ("symnccl", "nccl")


def _loop(fn, calls, torch, cycles):
    """Host microseconds per call of `calls` calls made while the GPU is
    held by a sleep kernel (bench_eager.py's measure)."""
    torch.cuda.synchronize()
    torch.cuda._sleep(cycles)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    us = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return us


def _eager_rows(torch, dist, snt, comm, groups, opts, rank, n):
    """[(call, kind, fn)]: every routed call at opts['size'] bytes."""
    dtype = getattr(torch, opts["dtype"])
    esize = torch.empty(0, dtype=dtype).element_size()
    count = max(n, opts["size"] // esize // n * n)
    x = torch.randn(count, device="cuda", dtype=dtype)
    out_g = torch.empty(count * n, device="cuda", dtype=dtype)
    out_s = torch.empty(count // n, device="cuda", dtype=dtype)
    out_a = torch.empty_like(x)
    rows = []
    for kind in BACKENDS:
        g = groups[kind]
        rows += [
            ("all_reduce", kind, lambda g=g: dist.all_reduce(x, group=g)),
            ("all_gather_into_tensor", kind,
             lambda g=g: dist.all_gather_into_tensor(out_g, x, group=g)),
            ("reduce_scatter_tensor", kind,
             lambda g=g: dist.reduce_scatter_tensor(out_s, x, group=g)),
            ("broadcast", kind, lambda g=g: dist.broadcast(x, 0, group=g)),
            ("reduce", kind, lambda g=g: dist.reduce(x, 0, group=g)),
            ("all_to_all_single", kind,
             lambda g=g: dist.all_to_all_single(out_a, x, group=g)),
            ("all_reduce async_op", kind,
             lambda g=g: dist.all_reduce(x, group=g, async_op=True).wait()),
            # DDP's reducer: the Work's future, waited (stream-ordered)
            ("all_reduce async_op future", kind,
             lambda g=g: dist.all_reduce(x, group=g, async_op=True)
             .get_future().wait()),
            ("all_gather_into_tensor async_op", kind,
             lambda g=g: dist.all_gather_into_tensor(
                 out_g, x, group=g, async_op=True).wait()),
            ("reduce_scatter_tensor async_op", kind,
             lambda g=g: dist.reduce_scatter_tensor(
                 out_s, x, group=g, async_op=True).wait()),
        ]
    rows += [
        ("all_reduce", "symnccl.torch", lambda: snt.all_reduce_(x, comm)),
        ("all_gather_into_tensor", "symnccl.torch",
         lambda: snt.all_gather(x, comm)),
        ("reduce_scatter_tensor", "symnccl.torch",
         lambda: snt.reduce_scatter(x, comm)),
        ("broadcast", "symnccl.torch", lambda: snt.broadcast(x, comm, 0)),
        ("reduce", "symnccl.torch", lambda: snt.reduce(x, comm, 0)),
        ("all_to_all_single", "symnccl.torch",
         lambda: snt.all_to_all(x, comm)),
    ]
    return rows


def _eager(torch, dist, snt, comm, groups, opts, rank, n):
    rows = _eager_rows(torch, dist, snt, comm, groups, opts, rank, n)
    for _, _, fn in rows:       # warm: NCCL and symnccl connect lazily
        fn()
    torch.cuda.synchronize()
    cycles = int(opts["hold_ms"] * 1e-3 * 1.5e9)
    loops = {(c, k): [] for c, k, _ in rows}
    for _ in range(opts["loops"]):
        for c, k, fn in rows:
            dist.barrier(group=groups["nccl"])
            loops[(c, k)].append(_loop(fn, opts["calls"], torch, cycles))
    return [{"call": c, "kind": k, "us": statistics.median(v),
             "loops_us": [round(u, 3) for u in v]}
            for (c, k), v in loops.items()]


def _mlp(torch, H, L, seed=0):
    torch.manual_seed(seed)
    layers = []
    for _ in range(L):
        layers += [torch.nn.Linear(H, 4 * H), torch.nn.GELU(),
                   torch.nn.Linear(4 * H, H)]
    return torch.nn.Sequential(*layers).cuda()


def _sgd_step(fwd, opt, x):
    """One training step of the steps' models: the mean square of fwd(x)
    as the loss, backward, SGD."""
    def step():
        loss = fwd(x).float().square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def _step_time(torch, step, steps):
    """Median microseconds per step (device events around each; host
    waits for each step, so host cost a step cannot hide shows), and the
    median host time of making the step's calls (step() returning, before
    the wait): where the two are close, the step is host-bound."""
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    times, host = [], []
    for _ in range(steps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        t0 = time.perf_counter()
        step()
        host.append((time.perf_counter() - t0) * 1e6)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times), statistics.median(host)


def _steps(torch, dist, groups, opts, rank, n):
    from torch.distributed.device_mesh import DeviceMesh
    H, L, B = opts["hidden"], opts["layers"], opts["batch"]
    rows = []
    x = torch.randn(B, H, device="cuda")
    for which in opts["step_kinds"].split(","):
        row = {"step": which}
        for kind in BACKENDS:
            g = groups[kind]
            dist.barrier(group=groups["nccl"])
            if which == "ddp":
                from torch.nn.parallel import DistributedDataParallel as DDP
                model = DDP(_mlp(torch, H, L), process_group=g)
                fwd = model
            elif which == "fsdp2":
                try:
                    from torch.distributed.fsdp import fully_shard
                except ImportError:
                    from torch.distributed._composable.fsdp import \
                        fully_shard
                model = _mlp(torch, H, L)
                mesh = DeviceMesh.from_group(g, "cuda")
                for m in model:
                    if isinstance(m, torch.nn.Linear):
                        fully_shard(m, mesh=mesh)
                fully_shard(model, mesh=mesh)
                fwd = model
            else:
                from torch.distributed.tensor import DTensor, Replicate, \
                    Shard
                from torch.distributed.tensor.parallel import (
                    ColwiseParallel, RowwiseParallel, parallelize_module)
                model = _mlp(torch, H, L)
                mesh = DeviceMesh.from_group(g, "cuda")
                plan = {}
                for i in range(L):
                    plan[str(3 * i)] = ColwiseParallel(
                        input_layouts=Shard(0) if i == 0 else Replicate())
                    plan[str(3 * i + 2)] = RowwiseParallel(
                        output_layouts=Shard(0) if i == L - 1 else
                        Replicate())
                parallelize_module(model, mesh, plan)

                def fwd(x, model=model, mesh=mesh):
                    # RowwiseParallel's output is local (use_local_output)
                    y = model(DTensor.from_local(x, mesh, [Shard(0)]))
                    return y.to_local() if isinstance(y, DTensor) else y
            opt = torch.optim.SGD(model.parameters(), lr=1e-3)
            row[kind], row[f"{kind}_host"] = _step_time(
                torch, _sgd_step(fwd, opt, x), opts["steps"])
            del model, opt
        rows.append(row)
    return rows


def _sizes(torch, dist, groups, opts, rank, n):
    """Device microseconds per call at the training steps' sizes, eager,
    calls back to back (median of --reps reps of --iters calls): DDP's
    bucket all-reduce (async, as its reducer makes it; 32 MiB: two
    16 MiB weights a bucket at --hidden 1024), FSDP2's all-gather (16 MiB
    output) and reduce-scatter (16 MiB input), synchronous on a side
    stream as FSDP2 makes them. Tells a kernel slower than NCCL's at
    these sizes from host cost in the steps."""
    H = opts["hidden"]
    big = 4 * H * H * 2          # fp32 elements of two 4H x H weights
    x = torch.randn(big, device="cuda")
    shard = torch.randn(big // 2 // n, device="cuda")
    out_g = torch.empty(big // 2, device="cuda")
    ins = torch.randn(big // 2, device="cuda")
    out_s = torch.empty(big // 2 // n, device="cuda")
    side = torch.cuda.Stream()
    cycles = int(10e-3 * 1.5e9)
    rows = []
    for call, nbytes in (("all_reduce async_op", x.nbytes),
                         ("all_gather_into_tensor", out_g.nbytes),
                         ("reduce_scatter_tensor", ins.nbytes)):
        row = {"call": call, "bytes": nbytes}
        for kind in BACKENDS:
            g = groups[kind]
            if call == "all_reduce async_op":
                def one(g=g):
                    dist.all_reduce(x, group=g, async_op=True).wait()
            elif call == "all_gather_into_tensor":
                def one(g=g):
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        dist.all_gather_into_tensor(out_g, shard, group=g)
                    torch.cuda.current_stream().wait_stream(side)
            else:
                def one(g=g):
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        dist.reduce_scatter_tensor(out_s, ins, group=g)
                    torch.cuda.current_stream().wait_stream(side)

            for _ in range(3):
                one()
            times = []
            for _ in range(opts["reps"]):
                # the ranks aligned, the GPU held while the host queues the
                # calls: device time, not the host's
                dist.barrier(group=groups["nccl"])
                torch.cuda.synchronize()
                torch.cuda._sleep(cycles)
                a = torch.cuda.Event(enable_timing=True)
                b = torch.cuda.Event(enable_timing=True)
                a.record()
                for _ in range(opts["iters"]):
                    one()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) * 1e3 / opts["iters"])
            row[kind] = statistics.median(times)
        rows.append(row)
    return rows


def _graph_time(torch, fn, iters, reps):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            fn()
    return median_us(graph.replay, iters, reps, torch)


def _decode(torch, dist, groups, opts, rank, n):
    dtype = getattr(torch, opts["decode_dtype"])
    H, L = opts["decode_hidden"], opts["layers"]
    F = 4 * H // n
    gen = torch.Generator(device="cuda").manual_seed(0)
    w1 = [torch.randn(H, F, generator=gen, device="cuda", dtype=dtype)
          / H ** .5 for _ in range(L)]
    w2 = [torch.randn(F, H, generator=gen, device="cuda", dtype=dtype)
          / F ** .5 for _ in range(L)]
    rows = []
    for T in opts["tokens"]:
        x = torch.randn(T, H, generator=gen, device="cuda", dtype=dtype)
        row = {"tokens": T}
        outs = {}
        for kind in (*BACKENDS, "none"):
            g = groups.get(kind)

            def step(g=g, kind=kind):
                h = x
                for a, b in zip(w1, w2):
                    h = torch.nn.functional.gelu(h @ a) @ b
                    if g is not None:
                        dist.all_reduce(h, group=g)
                    else:
                        h = h.clone()
                outs[kind] = h
            dist.barrier(group=groups["nccl"])
            row[kind] = _graph_time(torch, step, opts["iters"], opts["reps"])
        row["same_output"] = bool(torch.equal(outs["symnccl"],
                                              outs["nccl"]))
        rows.append(row)
    return rows


def worker(rank, nranks, uid, opts):
    import torch
    import torch.distributed as dist

    import symnccl.torch as snt
    from symnccl import torch_backend as tb
    from symnccl.bootstrap import init_torch
    init_torch(rank, nranks, opts["port"])
    groups = {b: dist.new_group(list(range(nranks)), backend=b)
              for b in BACKENDS}
    comm = snt.communicator()
    torch.backends.cuda.matmul.allow_tf32 = False
    out = {}
    if "eager" in opts["parts"]:
        out["eager"] = _eager(torch, dist, snt, comm, groups, opts, rank,
                              nranks)
    if "steps" in opts["parts"]:
        out["steps"] = _steps(torch, dist, groups, opts, rank, nranks)
    if "sizes" in opts["parts"]:
        out["sizes"] = _sizes(torch, dist, groups, opts, rank, nranks)
    if "decode" in opts["parts"]:
        out["decode"] = _decode(torch, dist, groups, opts, rank, nranks)
    sym = tb.communicator_of(groups["symnccl"])
    launches = sym._launches() if sym is not None else {}
    out["symnccl_launches"] = {k: v for k, v in launches.items() if v}
    comm.close()
    dist.destroy_process_group()
    return out


def targets(doc):
    """[(target, measured, limit, met)] from a results doc."""
    out = []
    eager = {(r["call"], r["kind"]): r for r in doc.get("eager", [])}
    for (call, kind), r in sorted(eager.items()):
        if kind != "symnccl" or (call, "nccl") not in eager:
            continue
        a, b = r["loops_us"], eager[(call, "nccl")]["loops_us"]
        ratio = statistics.median(x / y for x, y in zip(a, b))
        out.append((f"eager {call}: backend / nccl backend", ratio,
                    TARGET_EAGER))
    for r in doc.get("decode", []):
        cs, cn = r["symnccl"] - r["none"], r["nccl"] - r["none"]
        if cn > 0:
            out.append((f"decode T={r['tokens']} communication: backend / "
                        "nccl backend", cs / cn, TARGET_DECODE))
    for r in doc.get("steps", []):
        if r["step"] in ("ddp", "fsdp2"):
            out.append((f"{r['step']} step: backend / nccl backend",
                        r["symnccl"] / r["nccl"], TARGET_STEP))
    return [(name, round(v, 3), lim, v <= lim) for name, v, lim in out]


def print_table(doc):
    print(f"# {doc['gpu']} x{doc['nranks']}, {doc['date']}; torch "
          f"{doc['versions']['torch']}, NCCL "
          f"{doc['versions']['nccl_runtime']}")
    if doc.get("eager"):
        print(f"\n# eager host us per call, {doc['bytes']} B {doc['dtype']}"
              f", {doc['calls']} calls x {doc['loops']} loops, GPU held")
        kinds = ("symnccl", "nccl", "symnccl.torch")
        us = {(r["call"], r["kind"]): r["us"] for r in doc["eager"]}
        print(f"{'call':<24}" + "".join(f"{k:>15}" for k in kinds))
        for call in dict.fromkeys(r["call"] for r in doc["eager"]):
            print(f"{call:<24}" + "".join(
                f"{us[(call, k)]:>15.2f}" if (call, k) in us else
                f"{'-':>15}" for k in kinds))
    if doc.get("steps"):
        print(f"\n# eager training step, us (median of {doc['steps_n']}), "
              f"H={doc['hidden']}, {doc['layers']} layers, batch "
              f"{doc['batch']} per rank, float32")
        for r in doc["steps"]:
            host = "" if "symnccl_host" not in r else (
                f"  host: symnccl {r['symnccl_host']:>10.1f}  nccl "
                f"{r['nccl_host']:>10.1f}")
            print(f"{r['step']:<8} symnccl {r['symnccl']:>10.1f}  nccl "
                  f"{r['nccl']:>10.1f}  ratio {r['symnccl'] / r['nccl']:.3f}"
                  + host)
    if doc.get("sizes"):
        print(f"\n# device us per call at the steps' sizes, eager, back to "
              f"back, float32")
        for r in doc["sizes"]:
            print(f"{r['call']:<24} {r['bytes'] >> 20:>4} MiB  symnccl "
                  f"{r['symnccl']:>9.1f}  nccl {r['nccl']:>9.1f}  ratio "
                  f"{r['symnccl'] / r['nccl']:.3f}")
    if doc.get("decode"):
        print(f"\n# TP decode, CUDA graph, us per step, H="
              f"{doc['decode_hidden']}, {doc['layers']} layers, "
              f"{doc['decode_dtype']}")
        for r in doc["decode"]:
            cs, cn = r["symnccl"] - r["none"], r["nccl"] - r["none"]
            print(f"T={r['tokens']:<5} symnccl {r['symnccl']:>9.1f}  nccl "
                  f"{r['nccl']:>9.1f}  none {r['none']:>9.1f}  comm ratio "
                  f"{cs / cn if cn > 0 else float('nan'):.3f}  same "
                  f"{r['same_output']}")
    print(f"\n{'target':<58} {'value':>7} {'limit':>6}  met")
    for name, v, lim, ok in doc["targets"]:
        print(f"{name:<58} {v:>7.3f} {lim:>6.2f}  {'yes' if ok else 'NO'}")


#: the bars' labels of the backends and the symnccl.torch rows
LABELS = {"symnccl": "symnccl backend", "nccl": "nccl backend",
          "symnccl.torch": "symnccl.torch", "none": "none (a copy)"}


def _ratio_of(doc, name, of="nccl backend"):
    """The targets() value named `name` in the doc, as a note, or ''."""
    v = next((t[1] for t in doc.get("targets", []) if t[0] == name), None)
    return "" if v is None else f"  ({v:.2f}x {of})"


def plot(doc, path):
    """A panel of horizontal bars per part the doc holds, top to bottom:
    eager host us per call (a group per call: the symnccl backend, the
    NCCL backend, symnccl.torch; its target ratio in the heading), the
    training steps' us (host time of making the calls beside, where
    recorded), the device us per call at the steps' sizes, the decode
    stack's us per CUDA-graph step (symnccl, nccl, none; the
    communication ratio in the heading)."""
    plt = pyplot()
    panels = []     # (groups, title, xlabel)
    if doc.get("eager"):
        groups = []
        for call in dict.fromkeys(r["call"] for r in doc["eager"]):
            rows = {r["kind"]: r["us"] for r in doc["eager"]
                    if r["call"] == call}
            head = call + _ratio_of(doc, f"eager {call}: backend / nccl "
                                         "backend")
            groups.append((head, [(LABELS[k], rows[k], k, "")
                                  for k in ("symnccl", "nccl",
                                            "symnccl.torch") if k in rows]))
        panels.append((groups, f"eager host µs per call, {doc['bytes']} B "
                       f"{doc['dtype']}, median of {doc['loops']} loops x "
                       f"{doc['calls']} calls, GPU held\n(heading: the "
                       "target's ratio, median of the per-round ratios)",
                       "host µs per call"))
    if doc.get("steps"):
        groups = []
        for r in doc["steps"]:
            bars = []
            for k in BACKENDS:
                host = r.get(f"{k}_host")
                note = "" if host is None else f"  (host {host:.0f})"
                bars.append((LABELS[k], r.get(k), k, note))
            groups.append((f"{r['step']}  ({r['symnccl'] / r['nccl']:.3f}x "
                           "nccl backend)", bars))
        panels.append((groups, f"training step, µs (median of "
                       f"{doc['steps_n']}), H={doc['hidden']}, "
                       f"{doc['layers']} layers, batch {doc['batch']} per "
                       "rank, float32\n(host: the host's time making the "
                       "step's calls, median)", "µs per step"))
    if doc.get("sizes"):
        groups = [(f"{r['call']} {r['bytes'] >> 20} MiB  "
                   f"({r['symnccl'] / r['nccl']:.3f}x nccl backend)",
                   [(LABELS[k], r.get(k), k, "") for k in BACKENDS])
                  for r in doc["sizes"]]
        panels.append((groups, "device µs per call at the steps' sizes, "
                       "eager, back to back, float32", "µs per call"))
    if doc.get("decode"):
        groups = []
        for r in doc["decode"]:
            head = f"T={r['tokens']}" + _ratio_of(
                doc, f"decode T={r['tokens']} communication: backend / "
                     "nccl backend", "the nccl backend's communication")
            if not r.get("same_output", True):
                head += "  outputs differ"
            groups.append((head, [(LABELS[k], r.get(k), k, "")
                                  for k in (*BACKENDS, "none")]))
        panels.append((groups, f"TP decode, CUDA graph, µs per step, "
                       f"H={doc['decode_hidden']}, {doc['layers']} layers, "
                       f"{doc['decode_dtype']}\n(communication: time - "
                       "none)",
                       "µs per step"))
    if not panels:
        raise ValueError("the results doc holds none of " + ", ".join(PARTS))
    slots = [bar_slots(g) + 3 for g, _, _ in panels]
    fig, axes = plt.subplots(len(panels), 1, squeeze=False,
                             figsize=(9, 1.0 + 0.17 * sum(slots)),
                             gridspec_kw={"height_ratios": slots})
    colors = {}
    for ax, (groups, title, xlabel) in zip(axes[:, 0], panels):
        bar_panel(ax, groups, title, xlabel, colors=colors)
    met = sum(1 for t in doc.get("targets", []) if t[3])
    fig.suptitle(f"{doc['gpu']} x{doc['nranks']}: the symnccl "
                 f"torch.distributed backend against NCCL's\n{doc['date']}; "
                 f"torch {doc['versions']['torch']}, NCCL "
                 f"{doc['versions']['nccl_runtime']}; issue 41 targets met "
                 f"{met}/{len(doc.get('targets', []))}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nranks", type=int, default=2)
    p.add_argument("--only", default=",".join(PARTS),
                   help=f"comma-separated parts of {PARTS}")
    p.add_argument("--size", default="4K", help="eager bytes per tensor")
    p.add_argument("--dtype", default="float32", help="eager dtype")
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--loops", type=int, default=15)
    p.add_argument("--hold-ms", type=float, default=30.0)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--step-kinds", default="ddp,fsdp2,tp",
                   help="the training steps timed (of ddp, fsdp2, tp)")
    p.add_argument("--decode-hidden", type=int, default=4096)
    p.add_argument("--decode-dtype", default="bfloat16")
    p.add_argument("--tokens", default="1,16,128")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--reps", type=int, default=11)
    add_results_args(p, "JSON path (default: benchmarks/results/"
                        "backend_<gpu>x<n>_<dtype>.json)")
    args = p.parse_args(argv)
    if report(args, print_table, plot) is not None:
        return
    refuse_torchrun("bench_backend.py")
    kinds = [s for s in args.step_kinds.split(",") if s]
    if not set(kinds) <= {"ddp", "fsdp2", "tp"}:
        p.error(f"--step-kinds: {args.step_kinds!r}; expected a list of "
                "ddp, fsdp2, tp")
    import torch

    from symnccl.bootstrap import free_port, local_device_count, spawn
    n = args.nranks
    if local_device_count() < n:
        sys.exit(f"needs {n} GPUs, {local_device_count()} visible")
    parts = [s for s in args.only.split(",") if s]
    opts = {"port": free_port(), "parts": parts,
            "step_kinds": ",".join(kinds),
            "size": parse_sizes(args.size)[0], "dtype": args.dtype,
            "calls": args.calls, "loops": args.loops,
            "hold_ms": args.hold_ms, "hidden": args.hidden,
            "layers": args.layers, "batch": args.batch,
            "steps": args.steps, "decode_hidden": args.decode_hidden,
            "decode_dtype": args.decode_dtype,
            "tokens": [int(t) for t in args.tokens.split(",")],
            "iters": args.iters, "reps": args.reps}
    res = spawn(worker, n, args=(opts,), timeout=1800)
    r0 = res[0]
    doc = run_info(n, torch.cuda.get_device_name(0), torch.__version__,
                   dtype=args.dtype, bytes=opts["size"], calls=args.calls,
                   loops=args.loops, hidden=args.hidden, layers=args.layers,
                   batch=args.batch, steps_n=args.steps,
                   decode_hidden=args.decode_hidden,
                   decode_dtype=args.decode_dtype, parts=parts, **r0)
    # the eager rows: the slower rank's (each rank waits for the other)
    if "eager" in r0:
        for row, *others in zip(r0["eager"], *(r["eager"] for r in res[1:])):
            worst = max([row, *others], key=lambda r: r["us"])
            row.update(us=worst["us"], loops_us=worst["loops_us"])
    doc["targets"] = targets(doc)
    print_table(doc)
    path = write_results(doc, "backend_", args.out)
    print("wrote", path)
    plot_beside(plot, doc, path)


if __name__ == "__main__":
    main()
