"""python -m symnccl: prints the symnccl, NCCL and CUDA versions and each
GPU's topology (LSA size, whether the device API and multicast are usable
and why), then checks every collective, algorithm, dtype and op on all
local GPUs (one process per GPU) against a float64 reference. It exits 0
when every result is right, 1 when one is wrong or no GPU is visible, 2 on
a usage error.

    python -m symnccl                 # all local GPUs
    python -m symnccl --nranks 2      # the first two
    python -m symnccl --quick         # fewer sizes
    python -m symnccl bench --dtype bfloat16   # the all-reduce benchmark
    python -m symnccl bench --help             # the benchmark's options
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


def _positive_int(text):
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of GPUs, "
                                         f"got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(
            f"must be 1 or more GPUs, got {n} (leave --nranks out to use "
            "every local GPU)")
    return n


def _positive_seconds(text):
    try:
        s = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") \
            from None
    if not s > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {text}")
    return s


def _bench_module():
    """benchmarks/bench_allreduce.py: in a wheel symnccl/_bench_allreduce.py,
    in a source tree (editable install) the file itself; None with a
    message when neither is there."""
    try:   # installed from a wheel
        from symnccl import _bench_allreduce as bench
        return bench
    except ImportError:   # a source tree (editable install)
        pass
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    bench_dir = os.path.join(here, "benchmarks")
    if not os.path.exists(os.path.join(bench_dir, "bench_allreduce.py")):
        print(f"python -m symnccl bench: the benchmark is neither in the "
              f"package nor at {bench_dir}/bench_allreduce.py",
              file=sys.stderr)
        return None
    # on sys.path (which spawned ranks inherit) so they can import it
    sys.path.insert(0, bench_dir)
    import bench_allreduce as bench
    return bench


BENCH = "python -m symnccl bench"


def _bench_report(bench, path, out):
    """bench --report: the table of a results JSON, and its plot written to
    --out (a .png path) or into the current directory, never beside the
    JSON (which may be read-only)."""
    import json
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        print(f"{BENCH} --report: cannot read {path}: {e.strerror}",
              file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"{BENCH} --report: {path} is not a results JSON: {e}",
              file=sys.stderr)
        return 2
    if not isinstance(doc, dict) or "rows" not in doc:
        print(f"{BENCH} --report: {path} is not a results JSON of "
              "bench_allreduce (no 'rows')", file=sys.stderr)
        return 2
    bench.print_table(doc)
    png = out or os.path.splitext(os.path.basename(path))[0] + ".png"
    try:
        bench.plot(doc, png)
    except ImportError as e:
        print(f"no plot: {e} (pip install matplotlib)")
    except OSError as e:
        print(f"no plot: cannot write {png}: {e.strerror} (--out PATH.png "
              "says where)")
    else:
        print(f"plot: {os.path.abspath(png)}")
    return 0


def _bench(argv) -> int:
    """Runs the all-reduce benchmark (benchmarks/bench_allreduce.py); its
    own options and --help follow `bench`."""
    pre = argparse.ArgumentParser(prog=BENCH, add_help=False)
    pre.add_argument("--nranks", type=_positive_int, default=None)
    pre.add_argument("--report", default=None)
    pre.add_argument("--out", default=None)
    known, _ = pre.parse_known_args(argv)
    helping = "-h" in argv or "--help" in argv
    bench = _bench_module()
    if bench is None:
        return 2
    if known.report is None and not helping:
        # the GPUs first: one line saying what was found, never torch's
        # traceback of a machine without a driver
        missing = bench.gpus_missing(known.nranks)
        if missing:
            print(f"{BENCH}: {missing}", file=sys.stderr)
            return 1
        try:
            import torch  # noqa: F401  (the benchmark's anchors need it)
        except ImportError:
            print("symnccl bench needs PyTorch (its anchors are "
                  "torch.distributed and torch symm_mem): pip install "
                  "'symnccl[bench]'", file=sys.stderr)
            return 2
    if known.report is not None and not helping:
        return _bench_report(bench, known.report, known.out)
    # the benchmark's parser names itself after argv[0]
    saved = sys.argv[0]
    sys.argv[0] = BENCH
    try:
        return bench.main(argv)
    finally:
        sys.argv[0] = saved


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        return _bench(argv[1:])
    from . import __version__
    p = argparse.ArgumentParser(
        prog="python -m symnccl", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version",
                   version=f"symnccl {__version__}")
    p.add_argument("command", nargs="?", default="check",
                   choices=["check", "bench"],
                   help="check (the default): the report and correctness "
                        "check; bench: the all-reduce benchmark, whose "
                        "options follow it: `python -m symnccl bench "
                        "--help`")
    p.add_argument("--nranks", type=_positive_int, default=None,
                   metavar="N",
                   help="number of GPUs to check, one process each: the "
                        "first N local GPUs (default: every local GPU)")
    from symnccl._selftest import QUICK_SIZES, SIZES
    p.add_argument("--quick", action="store_true",
                   help="all-reduce sizes of " +
                        ", ".join(map(str, QUICK_SIZES)) + " elements "
                        "instead of " + ", ".join(map(str, SIZES)))
    p.add_argument("--timeout", type=_positive_seconds, default=900.0,
                   metavar="SECONDS",
                   help="wall-clock limit of the whole check in seconds "
                        "(default: 900); the ranks are stopped past it")
    args = p.parse_args(argv)
    if args.command == "bench":
        # options before `bench` are the check's: never run the check
        # instead, never guess which options were meant for the benchmark
        p.error("`bench` must come first, its options after it: "
                "python -m symnccl bench [options] (see "
                "`python -m symnccl bench --help`)")

    import symnccl
    from symnccl import _selftest
    from symnccl.bootstrap import local_device_count, spawn

    v = symnccl.versions()
    print("symnccl", v["symnccl"])
    print(f"NCCL    {v['nccl_runtime']} from {v['nccl_library']}")
    print(f"kernels built against NCCL {v['nccl_kernels']}'s headers, "
          f"running on NCCL {v['nccl_runtime']} (builds in this module: "
          f"{v['nccl_kernel_builds']})")
    print(f"CUDA    runtime {v['cuda_runtime']} (built {v['cuda_build']}), "
          f"driver {v['cuda_driver']}, {v['device_count']} device(s)")
    for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
              "NVSHMEM_DISABLE_NVLS"):
        print(f"{k}={os.environ.get(k, '(unset)')}")
    visible = local_device_count()
    if visible == 0:
        print("no CUDA device is visible: nothing to check")
        return 1
    n = args.nranks if args.nranks is not None else visible
    if n > visible:
        print(f"--nranks {n} but only {visible} GPUs are visible",
              file=sys.stderr)
        return 2
    results = spawn(_selftest.worker, n, args=(1234, args.quick),
                    timeout=args.timeout)
    return 0 if _report(results, n) else 1


if __name__ == "__main__":
    sys.exit(main())
