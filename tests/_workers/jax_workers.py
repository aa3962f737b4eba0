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


def _grad_cases(jax, jnp, sj, axis):
    """(name, ours, theirs) per shard: theirs is JAX's own collective (or,
    for max, which jax.lax.pmax cannot differentiate, the gather-then-max
    reference)."""
    lax = jax.lax
    return [
        ("all_reduce sum ll", lambda a: sj.all_reduce(a, algo="ll"),
         lambda a: lax.psum(a, axis)),
        ("all_reduce sum", lambda a: sj.all_reduce(a),
         lambda a: lax.psum(a, axis)),
        ("all_reduce avg", lambda a: sj.all_reduce(a, op="avg"),
         lambda a: lax.pmean(a, axis)),
        ("all_reduce max", lambda a: sj.all_reduce(a, op="max"),
         lambda a: jnp.max(lax.all_gather(a, axis), axis=0)),
        ("reduce_scatter sum", lambda a: sj.reduce_scatter(a),
         lambda a: lax.psum_scatter(a, axis, tiled=True)),
        ("reduce_scatter avg", lambda a: sj.reduce_scatter(a, op="avg"),
         lambda a: lax.psum_scatter(a, axis, tiled=True)
         / lax.axis_size(axis)),
        ("all_gather", lambda a: sj.all_gather(a),
         lambda a: lax.all_gather(a, axis, tiled=True)),
    ] + [
        case for algo in ("ll", "push") for case in (
            (f"reduce_scatter sum {algo}",
             lambda a, algo=algo: sj.reduce_scatter(a, algo=algo),
             lambda a: lax.psum_scatter(a, axis, tiled=True)),
            (f"all_gather {algo}",
             lambda a, algo=algo: sj.all_gather(a, algo=algo),
             lambda a: lax.all_gather(a, axis, tiled=True)))]


def _compare_grads(jax, jnp, sj, mesh, n, axis, dtype, check_vma, seed,
                   only=""):
    """Rows (case, max |dy|, max |dx|) of jit(grad) through shard_map, ours
    against theirs, on random inputs and a random loss weighting (the cases
    whose name starts with `only`)."""
    from jax.sharding import NamedSharding, PartitionSpec as P
    rows = []
    rng = np.random.default_rng(seed)
    x = jax.device_put(
        jnp.asarray(rng.standard_normal((n * 8 * n, 5)) + 0.1, dtype),
        NamedSharding(mesh, P(axis)))
    for name, ours, theirs in _grad_cases(jax, jnp, sj, axis):
        if not name.startswith(only):
            continue
        outs = []
        for f in (ours, theirs):
            g = jax.shard_map(f, mesh=mesh, in_specs=P(axis),
                              out_specs=P(axis), check_vma=check_vma)
            w = jnp.asarray(rng.standard_normal(
                jax.eval_shape(g, x).shape), dtype) if not outs else outs[0][2]
            loss = (lambda x, w=w, g=g:
                    jnp.sum(jnp.sin(g(x).astype(jnp.float32)) *
                            w.astype(jnp.float32)))
            y = jax.jit(g)(x)
            dx = jax.jit(jax.grad(loss))(x)
            outs.append((y, dx, w))
        dy = float(jnp.max(jnp.abs(outs[0][0].astype(jnp.float32) -
                                   outs[1][0].astype(jnp.float32))))
        dd = float(jnp.max(jnp.abs(outs[0][1].astype(jnp.float32) -
                                   outs[1][1].astype(jnp.float32))))
        rows.append((f"{name} {jnp.dtype(dtype).name} vma={check_vma}",
                     dy, dd))
    return rows


def gradients(rank, nranks, uid, seed):
    """One process driving every local GPU: jax.grad through symnccl's
    custom calls against JAX's collectives, with check_vma on and off; the
    launch counters show that the ll all-reduce ran in both passes."""
    _setup()
    import jax
    import jax.numpy as jnp
    import symnccl.jax as sj
    comms = sj.communicator()
    n = len(comms)
    mesh = jax.make_mesh((n,), ("x",))
    rows = []
    for dtype in (jnp.float32, jnp.bfloat16):
        for vma in (True, False):
            rows += _compare_grads(jax, jnp, sj, mesh, n, "x", dtype, vma,
                                   seed)
    # the ll all-reduce, forward and backward: two ll launches per device
    # (with check_vma the result is typed invariant, as psum's, and JAX
    # sums the cotangent itself; without it the backward is symnccl's)
    before = [c._launches()["ll"] for c in comms]
    g = jax.shard_map(lambda a: sj.all_reduce(a, algo="ll"), mesh=mesh,
                      in_specs=jax.sharding.PartitionSpec("x"),
                      out_specs=jax.sharding.PartitionSpec("x"),
                      check_vma=False)
    x = jax.device_put(jnp.ones((n * 64,), jnp.float32),
                       jax.sharding.NamedSharding(
                           mesh, jax.sharding.PartitionSpec("x")))
    jax.block_until_ready(jax.jit(jax.grad(
        lambda x: jnp.sum(g(x) ** 2)))(x))
    ll = [c._launches()["ll"] - b for c, b in zip(comms, before)]
    # reduce_scatter and all_gather on symnccl's kernels, forward and
    # backward (each is the other's transpose, on the same algo): two
    # launches of each kernel per device
    kernels = {}
    for algo in ("ll", "push"):
        names = [sj._C.COLLECTIVE_KERNELS[coll][algo]
                 for coll in ("reduce_scatter", "all_gather")]
        before = [c._launches() for c in comms]
        g = jax.shard_map(
            lambda a, algo=algo: sj.all_gather(
                sj.reduce_scatter(a, algo=algo), algo=algo),
            mesh=mesh, in_specs=jax.sharding.PartitionSpec("x"),
            out_specs=jax.sharding.PartitionSpec("x"))
        jax.block_until_ready(jax.jit(jax.grad(
            lambda x, g=g: jnp.sum(g(x) ** 2)))(x))
        for name in names:
            kernels[name] = [c._launches()[name] - b[name]
                             for c, b in zip(comms, before)]
    for c in comms:
        c.close()
    return {"n": n, "rows": rows, "ll": ll, "kernels": kernels}


def rules_on_cpu(seed):
    """The differentiation rules alone, on 2 CPU devices: symnccl.jax's
    custom calls replaced by JAX's collectives with the same meaning (the
    FFI handlers need GPUs), gradients against JAX's own; once with the
    all-reduce's result typed invariant (as psum's), once varying
    (SYMNCCL_TEST_VARYING, read while tracing). Rows: (case, dy, dx), the
    case prefixed by the typing. Runs in a fresh process (XLA_FLAGS must
    be set before JAX starts)."""
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               " --xla_force_host_platform_device_count=2")
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    import jax.numpy as jnp
    import symnccl.jax as sj
    raw = (sj._nranks, sj._all_reduce_raw, sj._reduce_scatter_raw,
           sj._all_gather_raw)
    rows = []
    for varying in ("", "1"):
        os.environ["SYMNCCL_TEST_VARYING"] = varying
        (sj._nranks, sj._all_reduce_raw, sj._reduce_scatter_raw,
         sj._all_gather_raw) = raw
        rows += [(f"{'varying' if varying else 'invariant'} result: {c}",
                  dy, dx) for c, dy, dx in _rules(jax, jnp, sj, seed,
                                                  bool(varying))]
    return rows


def _rules(jax, jnp, sj, seed, all_reduce_only):
    """all_reduce_only: the all-reduce's cases alone (the typing of its
    result changes no other collective's rule)."""
    axis = "x"

    def all_reduce(x, op, algo):
        lax = jax.lax
        if op == "max":   # pmax has no gradient rule, never needed here
            return jnp.max(lax.all_gather(x, axis), axis=0)
        r = {"sum": lax.psum, "avg": lax.pmean}[op](x, axis)
        if axis in sj._varying(x) and axis not in sj._varying(r) and \
                os.environ.get("SYMNCCL_TEST_VARYING"):
            r = sj._typed_as(r, x)   # a custom call typed varying
        return r
    sj._nranks = lambda: 2
    sj._all_reduce_raw = all_reduce
    sj._reduce_scatter_raw = lambda x, op, algo: (
        jax.lax.psum_scatter(x, axis, tiled=True) / (2 if op == "avg" else 1))
    sj._all_gather_raw = lambda x, algo: jax.lax.all_gather(
        x, axis, tiled=x.ndim > 0)
    mesh = jax.make_mesh((2,), (axis,))
    rows = []
    for vma in (True, False):
        rows += _compare_grads(jax, jnp, sj, mesh, 2, axis, jnp.float32, vma,
                               seed, "all_reduce" if all_reduce_only else "")
    if all_reduce_only:
        return rows
    # a scalar per shard: the all-gather's backward gives a scalar back
    xs = jax.device_put(jnp.arange(8.0), jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec(axis)))
    grads = []
    for gather in (sj.all_gather, lambda s: jax.lax.all_gather(s, axis)):
        f = jax.shard_map(lambda a, gather=gather: gather(jnp.sum(a ** 2)),
                          mesh=mesh, in_specs=jax.sharding.PartitionSpec(axis),
                          out_specs=jax.sharding.PartitionSpec(axis))
        grads.append(jax.jit(jax.grad(
            lambda a, f=f: jnp.sum(f(a) * jnp.arange(4.0))))(xs))
    rows.append(("all_gather of a scalar", 0.0,
                 float(jnp.max(jnp.abs(grads[0] - grads[1])))))
    # prod has no gradient: it says so, never a wrong one
    sj._all_reduce_raw = lambda x, op, algo: x
    sj._reduce_scatter_raw = lambda x, op, algo: x[: x.shape[0] // 2]
    from jax.sharding import PartitionSpec as P
    x = jax.device_put(jnp.ones((4,)),
                       jax.sharding.NamedSharding(mesh, P(axis)))
    for name in ("all_reduce", "reduce_scatter"):
        f = jax.shard_map(lambda a, name=name: getattr(sj, name)(a, op="prod"),
                          mesh=mesh, in_specs=P(axis), out_specs=P(axis))
        try:
            jax.jit(jax.grad(lambda a: f(a).sum()))(x)
            rows.append((f"{name} prod raises", 1.0, 1.0))
        except NotImplementedError as e:
            ok = f"{name}: op 'prod'" in str(e)
            rows.append((f"{name} prod raises", 0.0 if ok else 1.0, 0.0))
    return rows


def result_types_on_cpu():
    """How JAX types each custom call's result inside shard_map with
    check_vma (traced only: no handler runs), on 2 CPU devices."""
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               " --xla_force_host_platform_device_count=2")
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
    import symnccl.jax as sj
    sj._nranks = lambda: 2
    sj._registered = True   # tracing needs no handler (and no CUDA)
    mesh = jax.make_mesh((2,), ("x",))
    seen = {}

    def f(a, b):
        # a varies over the axis, b (replicated) does not
        for name in ("all_reduce", "reduce_scatter", "all_gather"):
            seen[name] = sorted(sj._varying(getattr(sj, name)(a)))
            seen[name + " of an invariant x"] = sorted(
                sj._varying(getattr(sj, name)(b)))
        return a
    spec = jax.ShapeDtypeStruct((8, 2), jnp.float32,
                                sharding=NamedSharding(mesh, P("x")))
    rep = jax.ShapeDtypeStruct((4, 2), jnp.float32,
                               sharding=NamedSharding(mesh, P()))
    jax.make_jaxpr(jax.shard_map(f, mesh=mesh, in_specs=(P("x"), P()),
                                 out_specs=P("x")))(spec, rep)
    return seen
