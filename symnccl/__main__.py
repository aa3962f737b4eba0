"""`python -m symnccl`: versions, topology and a correctness check of every
available algorithm on all local GPUs (one process per GPU).

    python -m symnccl                 # all local GPUs
    python -m symnccl --nranks 2      # the first two
    python -m symnccl --quick         # fewer sizes
    python -m symnccl bench --dtype bfloat16   # the all-reduce benchmark
"""
from __future__ import annotations

import argparse
import os
import sys


def _report(results, nranks):
    info = [r["info"] for r in results]
    print(f"\nranks: {nranks} (one process per GPU)")
    print(f"{'rank':>4} {'device':>7} {'lsa_size':>8} {'symmetric':>9} "
          f"{'multicast':>9}  reason (multicast)")
    for i in info:
        print(f"{i['rank']:>4} {'cuda:%d' % i['device']:>7} "
              f"{i['lsa_size']:>8} {str(i['symmetric']):>9} "
              f"{str(i['multicast']):>9}  {i['multicast_reason']}")
    if not info[0]["symmetric"]:
        print(f"device API: {info[0]['symmetric_reason']}")
    # One line per (collective, algo, dtype): wrong summed over ranks.
    agg = {}
    for r in results:
        for coll, algo, dtype, op, count, wrong in r["rows"]:
            key = (coll, algo, dtype)
            a = agg.setdefault(key, [0, 0])
            a[0] += 1
            a[1] += wrong
    print(f"\n{'collective':<22} {'algo':<8} {'dtype':<14} {'checks':>6} "
          f"{'#wrong':>7}")
    total_wrong = 0
    for (coll, algo, dtype), (n, wrong) in sorted(agg.items()):
        total_wrong += wrong
        print(f"{coll:<22} {algo:<8} {dtype:<14} {n:>6} {wrong:>7}")
    for dtype, why in results[0]["skipped"]:
        print(f"skipped {dtype}: {why}")
    checks = sum(n for n, _ in agg.values())
    # the failing cells again, last, where a log's tail shows them: each
    # (rank, op, count) that had wrong elements
    bad = [(coll, algo, dtype, op, count, rank, wrong)
           for rank, r in enumerate(results)
           for coll, algo, dtype, op, count, wrong in r["rows"] if wrong]
    for coll, algo, dtype, op, count, rank, wrong in bad[:20]:
        print(f"wrong: {coll} algo {algo} {dtype} op {op} count {count} "
              f"rank {rank}: {wrong}")
    if len(bad) > 20:
        print(f"wrong: ... and {len(bad) - 20} more cells")
    print(f"\n{checks} checks over {nranks} ranks, {total_wrong} wrong "
          f"elements: {'PASS' if total_wrong == 0 else 'FAIL'}")
    return total_wrong == 0


def _bench(argv) -> int:
    """Runs the all-reduce benchmark (benchmarks/bench_allreduce.py; a wheel
    carries it as symnccl/_bench_allreduce.py); its own options and --help
    follow `bench`."""
    if "--report" not in argv and "-h" not in argv and "--help" not in argv:
        try:
            import torch  # noqa: F401  (the benchmark's anchors need it)
        except ImportError:
            print("symnccl bench needs PyTorch (its anchors are "
                  "torch.distributed and torch symm_mem): pip install "
                  "'symnccl[bench]'", file=sys.stderr)
            return 2
    try:   # installed from a wheel
        from symnccl import _bench_allreduce as bench
    except ImportError:   # a source tree (editable install)
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        bench_dir = os.path.join(here, "benchmarks")
        if not os.path.exists(os.path.join(bench_dir, "bench_allreduce.py")):
            print(f"the benchmark is neither in the package nor at "
                  f"{bench_dir}/bench_allreduce.py", file=sys.stderr)
            return 2
        # on sys.path (which spawned ranks inherit) so they can import it
        sys.path.insert(0, bench_dir)
        import bench_allreduce as bench
    return bench.main(argv)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        return _bench(argv[1:])
    from . import __version__
    p = argparse.ArgumentParser(prog="python -m symnccl",
                                description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version",
                   version=f"symnccl {__version__}")
    p.add_argument("command", nargs="?", default="check",
                   choices=["check", "bench"],
                   help="check (default): report and correctness check; "
                        "bench: benchmarks/bench_allreduce.py (`bench "
                        "--help` lists its options)")
    p.add_argument("--nranks", type=int, default=None,
                   help="GPUs to use (default: all local GPUs)")
    p.add_argument("--quick", action="store_true", help="fewer sizes")
    p.add_argument("--timeout", type=float, default=900.0)
    args = p.parse_args(argv)

    import symnccl
    from symnccl import _selftest
    from symnccl.bootstrap import local_device_count, spawn

    v = symnccl.versions()
    print("symnccl", v["symnccl"])
    print(f"NCCL    {v['nccl_runtime']} (built against {v['nccl_build']}) "
          f"from {v['nccl_library']}")
    print(f"CUDA    runtime {v['cuda_runtime']} (built {v['cuda_build']}), "
          f"driver {v['cuda_driver']}, {v['device_count']} device(s)")
    for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
              "NVSHMEM_DISABLE_NVLS"):
        print(f"{k}={os.environ.get(k, '(unset)')}")
    n = args.nranks or local_device_count()
    if local_device_count() == 0:
        print("no CUDA device is visible: nothing to check")
        return 1
    if n > local_device_count():
        print(f"--nranks {n} but only {local_device_count()} GPUs are "
              "visible")
        return 2
    results = spawn(_selftest.worker, n, args=(1234, args.quick),
                    timeout=args.timeout)
    return 0 if _report(results, n) else 1


if __name__ == "__main__":
    sys.exit(main())
