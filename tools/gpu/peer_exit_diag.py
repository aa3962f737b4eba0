"""The 2-GPU peer-exit scenario of tests/test_faults.py on its own, for a
hang's diagnosis (tools/gpu/stacks.sh): `python3 tools/gpu/peer_exit_diag.py
COLLECTIVE...` runs W.peer_failure("exit", algo="nccl") on 2 ranks per
collective (DIAG_SCENARIO and DIAG_ALGO choose others: "sleep", "ll"),
bounded by DIAG_TIMEOUT seconds; each rank dumps every thread's Python
stack every 20 s while it runs (stderr), then the results. Run from the
repository's root."""
import faulthandler
import os
import sys
import time

sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
SCENARIO = os.environ.get("DIAG_SCENARIO", "exit")
ALGO = os.environ.get("DIAG_ALGO", "nccl")


def worker(rank, nranks, uid, collective, rehearsal_uid, survivors_uid):
    faulthandler.dump_traceback_later(20, repeat=True, file=sys.stderr)
    from _workers import faults as W
    t0 = time.monotonic()
    out = W.peer_failure(rank, nranks, uid, SCENARIO, collective, ALGO, 3.0,
                         rehearsal_uid, survivors_uid)
    out["wall"] = time.monotonic() - t0
    return out


if __name__ == "__main__":
    import symnccl
    from symnccl.bootstrap import spawn
    for coll in sys.argv[1:]:
        t0 = time.monotonic()
        try:
            res = spawn(worker, 2, args=(coll, symnccl.get_unique_id(),
                                         symnccl.get_unique_id()),
                        timeout=float(os.environ.get("DIAG_TIMEOUT", "60")),
                        exit_timeout=20)
            print(coll, "took", round(time.monotonic() - t0, 1), res, flush=True)
        except Exception as e:
            print(coll, "FAILED after", round(time.monotonic() - t0, 1), repr(e), flush=True)
