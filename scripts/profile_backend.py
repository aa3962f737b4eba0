"""Where a DDP step's host time goes through the "symnccl" torch backend
(issue 41: the step at 1.136x the NCCL backend's, its host time ~300 us a
step above; docs/PERFORMANCE.md, 'The torch backend's async path').

    python scripts/profile_backend.py --nranks 2

One process per rank. bench_backend.py's DDP step (its MLP and its step
timer) runs on a group of each backend; on the symnccl group, the
backend's Python methods are wrapped with timers, so rank 0 prints, per
step, each method's calls and inclusive host microseconds (nested ones
count in their callers too: allreduce includes _run, _run includes the
launch), beside both backends' step and host times. The calls DDP's
reducer makes from autograd's thread count as well (the timers are
per call, not per thread).
"""
import argparse
import os
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "benchmarks"))

# the backend's methods a DDP step reaches (symnccl/torch_backend.py)
WRAPPED = {"_Routes": ("allreduce", "allreduce_coalesced", "_target",
                       "_run", "_future", "_nccl", "_pooled"),
           "_Work": ("wait", "get_future"),
           "_AsyncWork": ("__del__",)}


def _wrap(cls, name, totals):
    fn = cls.__dict__.get(name)
    if fn is None:
        return
    key = f"{cls.__name__}.{name}"

    def timed(*args, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kw)
        finally:
            row = totals[key]
            row[0] += 1
            row[1] += time.perf_counter() - t0
    setattr(cls, name, timed)


def worker(rank, nranks, uid, opts):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import bench_backend as B
    import symnccl.torch  # noqa: F401  (registers the backend)
    from symnccl import torch_backend as tb
    from symnccl.bootstrap import init_torch
    init_torch(rank, nranks, opts["port"])
    groups = {b: dist.new_group(list(range(nranks)), backend=b)
              for b in ("nccl", "symnccl")}
    torch.backends.cuda.matmul.allow_tf32 = False
    x = torch.randn(opts["batch"], opts["hidden"], device="cuda")
    out = {}
    totals = defaultdict(lambda: [0, 0.0])
    for kind in ("nccl", "symnccl"):
        dist.barrier(group=groups["nccl"])
        model = DDP(B._mlp(torch, opts["hidden"], opts["layers"]),
                    process_group=groups[kind])
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        step = B._sgd_step(model, opt, x)
        out[kind] = B._step_time(torch, step, opts["steps"])
        if kind == "symnccl":
            # timed steps of their own: the wrappers cost host time
            for cname, names in WRAPPED.items():
                for name in names:
                    _wrap(getattr(tb, cname), name, totals)
            B._step_time(torch, step, opts["steps"])
        del model, opt
    steps = opts["steps"] + 5    # _step_time's warm-up steps count too
    out["methods"] = {k: (c / steps, s * 1e6 / steps)
                      for k, (c, s) in totals.items()}
    dist.destroy_process_group()
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nranks", type=int, default=2)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=50)
    args = p.parse_args(argv)
    from symnccl.bootstrap import free_port, spawn
    opts = {"port": free_port(), "hidden": args.hidden,
            "layers": args.layers, "batch": args.batch, "steps": args.steps}
    r = spawn(worker, args.nranks, args=(opts,), timeout=900)[0]
    for kind in ("nccl", "symnccl"):
        step_us, host_us = r[kind]
        print(f"DDP step, {kind:8s} backend: {step_us:9.1f} us, host "
              f"{host_us:9.1f} us")
    print(f"{'symnccl backend method':32s} {'calls/step':>10s} "
          f"{'us/step':>9s} {'us/call':>8s}")
    for k, (calls, us) in sorted(r["methods"].items(), key=lambda kv:
                                 -kv[1][1]):
        print(f"{k:32s} {calls:10.1f} {us:9.1f} "
              f"{us / calls if calls else 0.0:8.1f}")


if __name__ == "__main__":
    main()
