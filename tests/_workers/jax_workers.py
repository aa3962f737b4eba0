"""JAX workers: each runs in a fresh process (JAX must be configured before
its first import). Results are compared with jax.lax.psum/pmax on the same
sharded input and with the float64 reference."""
import os

import numpy as np

CASES = [  # (algo, dtype, op, elements per shard)
    (algo, dtype, op, m)
    for algo in ("auto", "nccl", "one_shot", "two_shot", "ll", "ll128", "push")
    for dtype, op, m in (("float32", "sum", 1031), ("bfloat16", "sum", 1031),
                         ("int32", "sum", 1031), ("float32", "max", 1031),
                         ("bfloat16", "max", 65537), ("float32", "sum", 1),
                         ("float32", "sum", 300007))
]


def _setup(user_buffers=False):
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if user_buffers:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   " --xla_gpu_enable_nccl_user_buffers=true")


def _check_cases(jax, mesh, nshards, local_of, seed, comms):
    """Runs every case through symnccl and through psum/pmax; returns rows
    (case, #differences from psum, #wrong vs float64, "" or which kernels
    ran instead of the algorithm's: the launch counters of this process's
    communicators)."""
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
    import symnccl
    import symnccl.jax as sj
    from symnccl import _check
    rows = []
    for algo, dtype, op, m in CASES:
        npdt = _check.numpy_dtype(dtype)
        # small integers: exact in every dtype and order, so symnccl and
        # psum must agree bit for bit
        ints = [np.random.default_rng([seed, r, m]).integers(-8, 9, m)
                .astype(npdt) for r in range(nshards)]
        # random floats for the float64 comparison
        floats = [_check.make_input(dtype, m, r, seed + 1, op)
                  for r in range(nshards)]
        sh = NamedSharding(mesh, P("x"))

        def ours(a, op=op, algo=algo):
            return sj.all_reduce(a, op=op, algo=algo)

        def theirs(a, op=op):
            return (jax.lax.psum if op == "sum" else jax.lax.pmax)(a, "x")

        f = jax.jit(jax.shard_map(ours, mesh=mesh, in_specs=P("x"),
                                  out_specs=P("x")))
        g = jax.jit(jax.shard_map(theirs, mesh=mesh, in_specs=P("x"),
                                  out_specs=P("x")))
        x = local_of(ints, sh, jnp.dtype(npdt))
        before = [c._launches() for c in comms]
        a, b = f(x), g(x)
        diff = sum(int(np.count_nonzero(
            np.asarray(s1.data) != np.asarray(s2.data)))
            for s1, s2 in zip(a.addressable_shards, b.addressable_shards))
        y = f(local_of(floats, sh, jnp.dtype(npdt)))
        wrong = sum(_check.count_wrong(np.asarray(s.data), op, floats, dtype)
                    for s in y.addressable_shards)
        kernels = ""
        for c, b0 in zip(comms, before):
            want = algo
            if algo == "auto":   # the handler asks the registry alike
                want = c._auto_algo(m * np.dtype(npdt).itemsize, dtype, op,
                                    jax.process_count() > 1)
            want = set(symnccl._C.ALGO_KERNELS[want]) or {"nccl"}
            after = c._launches()
            ran = {k for k in after if after[k] != b0[k]}
            if not ran or not ran <= want:
                kernels = f"ran {sorted(ran)}, expected {sorted(want)}"
        rows.append(((algo, dtype, op, m), diff, wrong, kernels))
    return rows


def single_process(rank, nranks, uid, seed):
    """One process driving every local GPU: shard_map over all of them."""
    _setup()
    import jax
    import symnccl.jax as sj
    comms = sj.communicator()
    n = len(comms)
    mesh = jax.make_mesh((n,), ("x",))

    def local_of(parts, sh, dt):
        return jax.device_put(np.concatenate(parts).astype(dt), sh)

    rows = _check_cases(jax, mesh, n, local_of, seed, comms)
    stats = [sj.stats(c.device) for c in comms]
    for c in comms:
        c.close()
    return {"n": n, "rows": rows, "stats": stats}


def multi_process(rank, nranks, uid, port, user_buffers, seed):
    """One process per GPU under jax.distributed."""
    _setup(user_buffers)
    import jax
    jax.distributed.initialize(f"127.0.0.1:{port}", nranks, rank,
                               local_device_ids=[rank],
                               initialization_timeout=120)
    import symnccl.jax as sj
    comms = sj.communicator(name="test")
    assert comms[0].rank == rank and comms[0].nranks == nranks
    mesh = jax.make_mesh((nranks,), ("x",))

    def local_of(parts, sh, dt):
        return jax.make_array_from_process_local_data(
            sh, parts[jax.process_index()].astype(dt))

    rows = _check_cases(jax, mesh, nranks, local_of, seed, comms)
    stats = sj.stats(comms[0].device)
    comms[0].close()
    jax.distributed.shutdown()
    return {"rows": rows, "stats": stats}
