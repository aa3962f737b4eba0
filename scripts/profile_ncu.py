"""Hardware counters of the all-reduce kernels, with Nsight Compute on rank 0.

    python scripts/profile_ncu.py --nranks 2 --cases ll:4K,two_shot:1M,push:256M \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum

One process per rank (device = rank); rank 0 runs under ncu, the others
run normally. A collective kernel cannot be replayed (its peers do not
replay with it), so every ncu run must collect in ONE pass: the script
asks ncu how many passes metrics need on a local kernel, splits the list
into one-pass groups, and runs the ranks once per group. Only the calls between torch.cuda.profiler.start()
and stop() are profiled (--profile-from-start off): for each case, `--warmup`
unprofiled calls, then `--reps` profiled ones, all in place on a window
buffer of bf16. Rank 0's profiled kernel starts long after its peers' (ncu
prepares the counters first), so its duration is the kernel without the
arrival skew of a real step: a lower bound of a graph replay's time.

Prints one row per profiled kernel (case, kernel, metrics) and, for each
case, the mean over the reps with the bytes turned into GB/s.
"""
import argparse
import csv
import io
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "benchmarks"))
from bench_allreduce import parse_sizes  # noqa: E402

NCU = ["ncu", "--clock-control", "none", "--cache-control", "none",
       "--replay-mode", "kernel", "--csv", "--page", "raw"]


def parse_size(s):
    """'4K' -> 4096, with the benchmark's parser (one place for the syntax)."""
    return parse_sizes(s)[0]


def passes(metrics):
    """How many passes ncu needs for `metrics` on a plain local kernel."""
    code = ("import torch; x = torch.ones(1 << 20, device='cuda'); "
            "y = x * 2; torch.cuda.synchronize()")
    p = subprocess.run(NCU[:-3] + ["--metrics", metrics, sys.executable,
                                   "-c", code],
                       capture_output=True, text=True, timeout=300)
    n = None
    for line in (p.stdout + p.stderr).splitlines():
        if "==PROF==" in line and " pass" in line:
            n = int(line.rsplit("-", 1)[1].split()[0])
    if n is None:
        sys.stderr.write(p.stdout[-2000:] + p.stderr[-2000:])
    return n


def worker(a):
    import torch

    import symnccl
    torch.cuda.set_device(a.rank)
    comm = symnccl.Communicator(bytes.fromhex(a.uid), a.rank, a.nranks,
                                device=a.rank, timeout=300.0,
                                multicast=False)
    for case in a.cases.split(","):
        algo, size = case.split(":")
        count = parse_size(size) // 2
        buf = comm.empty(count, "bfloat16")
        t = torch.from_dlpack(buf)
        g = torch.Generator(device="cuda").manual_seed(a.rank + 1)
        t.copy_(torch.rand(count, generator=g, device="cuda") - 0.5)
        for _ in range(a.warmup):
            comm.all_reduce(t, algo=algo)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        for _ in range(a.reps):
            comm.all_reduce(t, algo=algo)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        del t, buf
        comm.barrier()
    comm.close()


def report(log, cases, reps, nranks, metrics, durations=None):
    durations = dict(durations or {})
    rows = list(csv.reader(io.StringIO(
        "".join(l for l in open(log) if l.startswith('"')))))
    if not rows:
        print("no ncu rows in", log)
        return durations
    head, units, data = rows[0], rows[1], rows[2:]
    kcol = head.index("Kernel Name")
    mcols = [i for i, h in enumerate(head) if h in metrics]
    names = [head[i] for i in mcols]
    print(f"\n{len(data)} profiled kernels on rank 0 of {nranks} "
          f"({len(cases)} cases x {reps} reps expected)")
    print("case          kernel" + "".join(f" | {n}" for n in names))
    per_case = {}
    for k, r in enumerate(data):
        case = cases[k // reps] if k // reps < len(cases) else "?"
        vals = []
        for i in mcols:
            try:
                vals.append(float(r[i].replace(",", "")))
            except ValueError:
                vals.append(float("nan"))
        per_case.setdefault(case, []).append(vals)
        print(f"{case:<13} {r[kcol][:40]:<40}" +
              "".join(f" | {v:.4g}" for v in vals))
    # The fastest rep is the kernel's own time: in the slower ones rank 0
    # started before a peer and waited for it. Byte counters are shown as
    # GB/s over that time (from this run, or `durations` of an earlier one).
    if "gpu__time_duration.sum" in names:
        d = names.index("gpu__time_duration.sum")
        scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0,
                 "ms": 1e3, "msecond": 1e3}[units[mcols[d]]]
        durations = {c: min(v[d] for v in vs) * scale
                     for c, vs in per_case.items()}
    if not durations:
        return durations
    print("\nper case: fastest rep (us), busbw from it; byte counters "
          "(mean over the reps) as GB/s over it")
    for case, vs in per_case.items():
        us = durations.get(case)
        if us is None:
            continue
        nbytes = parse_size(case.split(":")[1])
        bus = 2 * (nranks - 1) / nranks * nbytes / (us * 1e-6) / 1e9
        m = [sum(v[i] for v in vs) / len(vs) for i in range(len(names))]
        extra = "".join(
            f" {n.split('.')[0]}={m[i] / 1e6:.1f}MB"
            f"({m[i] / (us * 1e-6) / 1e9:.0f}GB/s)"
            for i, n in enumerate(names)
            if units[mcols[i]] in ("byte", "Kbyte", "Mbyte") and "bytes" in n)
        print(f"{case:<13} {us:9.2f} us  busbw {bus:7.1f} GB/s{extra}")
    return durations


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nranks", type=int, default=2)
    p.add_argument("--cases", default="ll:4K,two_shot:1M,push:16M,push:256M")
    p.add_argument("--metrics", default="gpu__time_duration.sum")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--max-groups", type=int, default=3,
                   help="ncu runs at most (metrics in the order given)")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--log", default=os.path.join(
        os.environ.get("OUT", "/tmp"), "ncu.csv"))
    p.add_argument("--rank", type=int, default=None)   # worker mode
    p.add_argument("--uid", default=None)
    a = p.parse_args()
    if a.rank is not None:
        worker(a)
        return 0
    groups = one_pass_groups(a.metrics.split(","))[:a.max_groups]
    failed, durations = 0, None
    for k, g in enumerate(groups):
        log = a.log.replace(".csv", f"_{k}.csv")
        failed += run_ranks(a, ",".join(g), log)
        durations = report(log, a.cases.split(","), a.reps, a.nranks, g,
                           durations)
    return 1 if failed else 0


def one_pass_groups(metrics):
    """Splits `metrics` into lists that ncu collects in one pass each
    (greedy; gpu__time_duration.sum leads every group). Cached per list
    in $TMPDIR, as each probe costs a process start."""
    import json
    cache = os.path.join(os.environ.get("TMPDIR", "/tmp"),
                         "symnccl_ncu_groups.json")
    known = json.load(open(cache)) if os.path.exists(cache) else {}
    key = ",".join(metrics)
    if key in known:
        return known[key]
    lead = "gpu__time_duration.sum"
    groups, cur, alone = [], [lead], []
    for m in metrics:
        if m == lead:
            continue
        if passes(",".join(cur + [m])) == 1:
            cur.append(m)
        elif len(cur) > 1 and passes(",".join([lead, m])) == 1:
            groups.append(cur)
            cur = [lead, m]
        else:
            alone.append(m)
    groups.append(cur)
    # counters that cannot share a pass with the duration (NVLink's):
    # groups of their own, read against the first group's durations
    cur = []
    for m in alone:
        if passes(",".join(cur + [m])) == 1:
            cur.append(m)
        elif cur and passes(m) == 1:
            groups.append(cur)
            cur = [m]
        else:
            print(f"dropped {m}: not collectable in one pass (or unknown)")
    if cur:
        groups.append(cur)
    for g in groups:
        print("one-pass group:", ",".join(g))
    known[key] = groups
    json.dump(known, open(cache, "w"))
    return groups


def run_ranks(a, metrics, log):
    import symnccl
    uid = symnccl.get_unique_id().hex()
    me = [sys.executable, os.path.abspath(__file__), "--nranks",
          str(a.nranks), "--cases", a.cases, "--reps", str(a.reps),
          "--warmup", str(a.warmup), "--uid", uid]
    procs = []
    for r in range(a.nranks):
        cmd = me + ["--rank", str(r)]
        if r == 0:
            cmd = NCU + ["--profile-from-start", "off", "--metrics",
                         metrics, "--log-file", log] + cmd
        procs.append(subprocess.Popen(cmd))
    rcs = []
    for pr in procs:
        try:
            rcs.append(pr.wait(timeout=600))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            rcs.append("timeout")
    print("exit codes", rcs)
    return 0 if not any(rcs) else 1


if __name__ == "__main__":
    sys.exit(main())
