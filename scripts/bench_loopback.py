"""Push reduce-scatter / all-gather on a loopback team (every rank on this
one GPU, Communicator._loopback), by pipeline step (SYMNCCL_PUSH_CHUNK_KIB),
CUDA-graph replay, median of --reps; every cell checked first.

A proxy for when no multi-GPU machine is at hand: the ranks' "remote"
stores land in this GPU's own memory and the ranks share its SMs and
bandwidth, so the times say how the kernel's phases overlap, not what
NVLink gives; compare columns of one run only, never with 2-GPU numbers.

    python scripts/bench_loopback.py --nranks 2 --sizes 4M,16M,64M \\
        --chunks 0,256,1024
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "benchmarks"))
from bench_allreduce import parse_sizes, team_replay_us  # noqa: E402


def team_for(nranks, chunk_kib, ctas):
    import symnccl
    os.environ["SYMNCCL_PUSH_CHUNK_KIB"] = str(chunk_kib)
    os.environ["SYMNCCL_PUSH_CTAS"] = str(ctas)
    return symnccl.Communicator._loopback(nranks, 0, timeout=60.0)


def cell(torch, team, streams, coll, nbytes, dt, reps, iters):
    """Median us per call of `coll` moving nbytes (the reduce-scatter's
    input, the all-gather's output) per rank; -1.0 when a result is wrong.
    Inputs are random small integers, so every sum is exact in any order."""
    n = len(team)
    es = torch.empty(0, dtype=dt).element_size()
    m = nbytes // es // n                     # one rank's block
    per_rank = n * m if coll == "reduce_scatter" else m
    gen = torch.Generator(device="cuda").manual_seed(nbytes)
    xs = [torch.randint(-8, 9, (per_rank,), generator=gen, device="cuda")
          .to(dt) for _ in team]
    outs = [torch.full((m if coll == "reduce_scatter" else n * m,),
                       float("nan"), device="cuda", dtype=dt) for _ in team]

    def calls(k):
        for c, s, x, o in zip(team, streams, xs, outs):
            for _ in range(k):
                getattr(c, coll)(x, out=o, algo="push", stream=s)

    torch.cuda.synchronize()
    calls(1)
    torch.cuda.synchronize()
    if coll == "reduce_scatter":
        tot = sum(x.double() for x in xs)
        want = [tot[q * m:(q + 1) * m] for q in range(n)]
    else:
        want = [torch.cat([x.double() for x in xs])] * n
    if any(not torch.equal(o.double(), w) for o, w in zip(outs, want)):
        return -1.0
    graphs = []
    for s in streams:
        graphs.append(torch.cuda.CUDAGraph())
    for c, s, x, o, g in zip(team, streams, xs, outs, graphs):
        with torch.cuda.graph(g, stream=s):
            for _ in range(iters):
                getattr(c, coll)(x, out=o, algo="push", stream=s)
    return team_replay_us(torch, graphs, streams, iters, reps)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nranks", type=int, default=2)
    p.add_argument("--sizes", default="1M,4M,16M,64M")
    p.add_argument("--chunks", default="0,256,512,1024,2048",
                   help="SYMNCCL_PUSH_CHUNK_KIB values (0: a whole slot)")
    p.add_argument("--collectives", default="reduce_scatter,all_gather")
    p.add_argument("--ctas", type=int, default=0,
                   help="push grid per rank (0: 128 / nranks)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--iters", type=int, default=10)
    a = p.parse_args()
    import torch
    torch.cuda._sleep(1)    # loaded before any rank waits (loopback.c)
    dt = getattr(torch, a.dtype)
    sizes = parse_sizes(a.sizes)
    chunks = [int(c) for c in a.chunks.split(",")]
    ctas = a.ctas or 128 // a.nranks
    res = {}
    for ck in chunks:
        team = team_for(a.nranks, ck, ctas)
        streams = [torch.cuda.Stream() for _ in team]
        try:
            for coll in a.collectives.split(","):
                for nb in sizes:
                    res[coll, nb, ck] = cell(torch, team, streams, coll, nb,
                                             dt, a.reps, a.iters)
        finally:
            for c in team:
                c.close()
    print(f"{torch.cuda.get_device_name()}, loopback team of {a.nranks}, "
          f"{ctas} CTAs per rank, {a.dtype}, push, graph replay, median of "
          f"{a.reps}; us per call (-1: wrong result); column: "
          "SYMNCCL_PUSH_CHUNK_KIB (0: a whole slot)")
    for coll in a.collectives.split(","):
        print(f"{coll:>16} " + " ".join(f"{c:>8}" for c in chunks))
        for nb in sizes:
            print(f"{nb:>16} " + " ".join(f"{res[coll, nb, c]:8.1f}"
                                          for c in chunks))


if __name__ == "__main__":
    main()
