"""Hunt for the rare push failure (README: Known problems): many push-only
all-reduces on plain tensors and windows with random sizes, each checked on
the GPU; the first few failures per rank are described in detail.

    python scripts/push_race.py --nranks 2 --iters 20000 --region-mib 1

Inputs are small integers (exact in float32 and bf16 in any order), so the
expected result is exact. For a failure it prints the call number, size,
dtype, placement, chunk geometry, the wrong elements' count, their first
and last index and, per wrong element, which chunk / slice / CTA run it
falls in, with got / want. Exit status 1 if anything was wrong.
"""
import argparse
import os
import sys

import numpy as np


def worker(rank, nranks, uid, opts):
    import torch

    import symnccl
    torch.cuda.set_device(rank)
    os.environ["SYMNCCL_PUSH_REGION_MIB"] = str(opts["region_mib"])
    comm = symnccl.Communicator(uid, rank, nranks, device=rank, timeout=120)
    region = opts["region_mib"] << 20
    slot = region // (4 * nranks) // 4096 * 4096
    ctas = int(os.environ.get("SYMNCCL_PUSH_CTAS", "64"))
    rng = np.random.default_rng(opts["seed"])
    gen = torch.Generator(device="cuda")
    maxn = 1 << 20
    wins = {dt: torch.from_dlpack(comm.empty(maxn + 16, dt))
            for dt in ("float32", "bfloat16")}
    found = []
    # Calls run back to back, as in a training step: results are checked on
    # the GPU, and the host looks every `window` calls (a sync per call
    # would space the kernels out and could hide a race).
    window, pending = 256, []
    for it in range(opts["iters"]):
        count = int(rng.integers(1, 1 << int(rng.integers(1, 21))))
        dt = ("float32", "bfloat16")[int(rng.integers(0, 2))]
        place = int(rng.integers(0, 4))
        tdt = getattr(torch, dt)
        vals = []
        for r in range(nranks):
            gen.manual_seed(opts["seed"] * 100003 + it * 64 + r)
            vals.append(torch.randint(-8, 9, (count,), generator=gen,
                                      device="cuda").to(tdt))
        want = sum(v.float() for v in vals)
        if place == 0:       # window, in place, aligned
            x = wins[dt][:count]
            x.copy_(vals[rank])
            comm.all_reduce(x, algo="push")
            got = x.clone()  # the window is reused by the next calls
        elif place == 1:     # window in, tensor out
            x = wins[dt][:count]
            x.copy_(vals[rank])
            got = torch.full_like(x, float("nan"))
            comm.all_reduce(x, out=got, algo="push")
        elif place == 2:     # tensor in place
            got = vals[rank].clone()
            comm.all_reduce(got, algo="push")
        else:                # tensor, new output
            got = torch.full_like(vals[rank], float("nan"))
            comm.all_reduce(vals[rank], out=got, algo="push")
        pending.append((it, count, dt, place, got, want,
                        (got.float() != want).sum()))
        if len(pending) < window and it + 1 < opts["iters"]:
            continue
        for (pit, pcount, pdt, pplace, pgot, pwant, nbad) in pending:
            if int(nbad) == 0:
                continue
            if len(found) >= opts["max_report"]:
                found.append(dict(it=pit, wrong=int(nbad)))
                continue
            es = pgot.element_size()
            chunk = slot // es * nranks
            idx = (pgot.float() != pwant).nonzero().flatten().tolist()
            desc = []
            for i in idx[:8]:
                c, off = divmod(i, chunk)
                cj = min(pcount - c * chunk, chunk)
                per = (cj + nranks - 1) // nranks
                e = 16 // es
                sl = (per + e - 1) // e * e
                q, within = divmod(off, sl)
                nv = sl // e
                pv = (nv + ctas - 1) // ctas
                desc.append(dict(i=i, chunk=c, slice=q, cta=within // e // pv,
                                 got=float(pgot[i]), want=float(pwant[i])))
            found.append(dict(it=pit, count=pcount, dtype=pdt,
                              place=("window_inplace", "window_to_tensor",
                                     "tensor_inplace", "tensor_out")[pplace],
                              chunks=(pcount + chunk - 1) // chunk,
                              wrong=len(idx), first=idx[0], last=idx[-1],
                              elems=desc))
        pending = []
    torch.cuda.synchronize()
    comm.close()
    return found


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nranks", type=int, default=2)
    p.add_argument("--iters", type=int, default=20000)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--region-mib", type=int, default=1,
                   help="SYMNCCL_PUSH_REGION_MIB (1: many chunks per call)")
    p.add_argument("--max-report", type=int, default=5)
    a = p.parse_args()
    from symnccl.bootstrap import spawn
    res = spawn(worker, a.nranks, args=(dict(
        iters=a.iters, seed=a.seed, region_mib=a.region_mib,
        max_report=a.max_report),), timeout=1800)
    bad = 0
    for rank, found in enumerate(res):
        print(f"rank {rank}: {len(found)} failing calls of {a.iters}")
        for f in found:
            print("  ", f)
        bad += len(found)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
