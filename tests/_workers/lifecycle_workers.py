"""Workers of tests/test_lifecycle.py that need a process of their own
(JAX is configured before its first use)."""
import os
import re
import threading
import time

# What a call that loses the race against close() or abort() may say: the
# communicator's state (lifecycle.c), an abort that ended its wait, or the
# XLA handler's "no communicator registered" (after close() took it out).
CLEAR = re.compile(r"is (being )?(closed|aborted)|interrupted by abort|"
                   r"stopped by an abort|no open symnccl communicator")
ALGOS = ("ll", "one_shot", "push", "nccl")


def hammer(comm, calls, teardown, bound):
    """Runs every call of `calls` in a loop on a thread of its own while
    this thread tears comm down (teardown(comm)) once they are under way.
    Returns (seconds the teardown took, its exception or None, callers
    still running `bound` seconds after it, unclear exceptions, counts of
    calls that returned and that were refused)."""
    go, stop, mu = threading.Event(), threading.Event(), threading.Lock()
    counts = {"ok": 0, "refused": 0}
    unclear = []

    def caller(call):
        go.wait()
        while not stop.is_set():
            try:
                call()
                key = "ok"
            except Exception as e:   # noqa: BLE001 - judged below
                if not CLEAR.search(str(e)):
                    with mu:
                        unclear.append(f"{type(e).__name__}: {e}"[:400])
                key = "refused"
                time.sleep(0)
            with mu:
                counts[key] += 1

    threads = [threading.Thread(target=caller, args=(c,), daemon=True)
               for c in calls]
    for t in threads:
        t.start()
    go.set()
    time.sleep(0.005)   # the calls under way
    error = None
    t0 = time.monotonic()
    try:
        teardown(comm)
    except Exception as e:   # noqa: BLE001 - reported to the test
        error = f"{type(e).__name__}: {e}"
    took = time.monotonic() - t0
    time.sleep(0.002)   # calls arrive after the teardown too
    stop.set()
    until = time.monotonic() + bound
    for t in threads:
        t.join(max(0.0, until - time.monotonic()))
    alive = sum(t.is_alive() for t in threads)
    return took, error, alive, unclear, counts


def xla_hammer(rank, nranks, uid, rounds, kind, bound):
    """`rounds` times: symnccl.jax.communicator() on one GPU, four threads
    running jitted all-reduces (ll, one_shot, push, nccl: the XLA
    handler) on it, and this thread's close() or abort() meanwhile. Every
    call returns or raises a clear error, the teardown returns within
    `bound`, the process lives on."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from _workers import jax_on_one_gpu
    jax_on_one_gpu(jax)
    import symnccl.jax as sj
    mesh = jax.make_mesh((1,), ("x",))
    x = jax.device_put(jnp.ones(4096, jnp.float32),
                       NamedSharding(mesh, P("x")))
    fns = [jax.jit(jax.shard_map(lambda t, a=a: sj.all_reduce(t, algo=a),
                                 mesh=mesh, in_specs=P("x"),
                                 out_specs=P("x")))
           for a in ALGOS]
    out = {"took": [], "errors": [], "alive": 0, "unclear": [],
           "ok": 0, "refused": 0}
    teardown = {"close": lambda c: c.close(), "abort": lambda c: c.abort()}
    for _ in range(rounds):
        comm = sj.communicator()[0]
        for f in fns:   # compiled, and the handlers warm, before the race
            np.asarray(f(x))
        calls = [lambda f=f: np.asarray(f(x)) for f in fns]
        took, error, alive, unclear, counts = hammer(comm, calls,
                                                     teardown[kind], bound)
        out["took"].append(took)
        out["alive"] += alive
        out["unclear"] += unclear[:3]
        out["ok"] += counts["ok"]
        out["refused"] += counts["refused"]
        if error is not None:
            out["errors"].append(error)
        if alive:
            break
    out["usable"] = float(np.asarray(jnp.arange(8.0).sum()))
    return out
