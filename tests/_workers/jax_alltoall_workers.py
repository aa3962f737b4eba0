"""JAX all-to-all workers (tests/test_jax_alltoall.py): each runs in a
fresh process (JAX reads XLA_FLAGS and JAX_PLATFORMS once)."""
import os

import numpy as np

AXIS = "x"
# (per-shard shape, split_axis, concat_axis, tiled) at 2 ranks
A2A_CASES = [((4, 3), 0, 0, True), ((4, 6), 0, 1, True),
             ((3, 4, 2), 1, 0, True), ((2, 6, 4), 2, 1, True),
             ((2, 5), 0, 1, False), ((3, 2, 4), 1, 0, False),
             ((5, 2), 1, 1, False), ((2, 3, 2), 2, 0, False)]
A2A_VMA_OFF = [A2A_CASES[1], A2A_CASES[4]]


def _cpu(ndev):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count"
                               f"={ndev}")
    os.environ["JAX_PLATFORMS"] = "cpu"


def _v_stand_in(jax, jnp, sj, n):
    """Communicator.all_to_all_v's meaning from JAX's collectives (the
    custom call needs a GPU): splits[q] rows of x to rank q, packed rank
    after rank at the receiver, and the rows received from each rank."""
    lax = jax.lax

    def v(x, splits, out_rows, algo):
        s = jnp.maximum(splits.astype(jnp.int32), 0)
        every = lax.all_gather(s, AXIS)            # [source, destination]
        xs = lax.all_gather(x, AXIS)
        me = lax.axis_index(AXIS)
        got = every[:, me]
        starts = jnp.cumsum(every, axis=1) - every
        seg, last, k = sj._segments(got, out_rows)
        row = jnp.clip(starts[last, me] + k, 0, x.shape[0] - 1)
        out = xs[last, row]
        keep = (seg < n).reshape((-1,) + (1,) * (x.ndim - 1))
        return jnp.where(keep, out, jnp.zeros_like(out)), got
    return v


def _ragged_reference(jax, jnp, n):
    """jax.lax.ragged_all_to_all's documented meaning, written with
    all_gather (differentiable by JAX itself)."""
    lax = jax.lax

    def ref(operand, output, in_off, send, out_off, recv):
        ops = lax.all_gather(operand, AXIS)
        io, ss, oo = (lax.all_gather(a.astype(jnp.int32), AXIS)
                      for a in (in_off, send, out_off))
        me = lax.axis_index(AXIS)
        j = jnp.arange(output.shape[0])
        res = output
        for r in range(n):
            start, size, src = oo[r, me], ss[r, me], io[r, me]
            inside = ((j >= start) & (j < start + size)).reshape(
                (-1,) + (1,) * (output.ndim - 1))
            rows = ops[r][jnp.clip(src + j - start, 0, operand.shape[0] - 1)]
            res = jnp.where(inside, rows, res)
        return res
    return ref


def _lax_all_to_all(jax, jnp, a, sa, ca, tiled):
    """jax.lax.all_to_all; untiled with different axes as the tiled one
    around expand_dims/squeeze (what jax.lax does forward), whose
    transpose JAX gets right."""
    if tiled or sa == ca:
        return jax.lax.all_to_all(a, AXIS, sa, ca, tiled=tiled)
    if sa < ca:
        ca += 1
        a = jnp.expand_dims(a, ca)
    else:
        a = jnp.expand_dims(a, ca)
        sa += 1
    return jnp.squeeze(jax.lax.all_to_all(a, AXIS, sa, ca, tiled=True), sa)


def _ragged_args(rng, n, rows_in, rows_out, zero_chunks):
    """Per rank (input_offsets, send_sizes, output_offsets, recv_sizes)
    with padding between slices and, if asked, empty ones; consistent
    (recv_sizes = the senders' send_sizes)."""
    send = rng.integers(0, 4, (n, n))
    if zero_chunks:
        send[rng.random((n, n)) < 0.4] = 0
    args = []
    out_off = np.zeros((n, n), np.int64)
    for dst in range(n):       # where each source's slice lands at dst
        at = rng.integers(0, 2)
        for src in range(n):
            out_off[src, dst] = at
            at += send[src, dst] + rng.integers(0, 2)
        assert at <= rows_out
    for src in range(n):
        in_off = []
        at = rng.integers(0, 2)
        for dst in range(n):
            in_off.append(at)
            at += send[src, dst] + rng.integers(0, 2)
        assert at <= rows_in
        args.append((np.array(in_off), send[src], out_off[src],
                     send[:, src]))
    return args


def rules_on_cpu(seed):
    """The jnp around the custom calls and the custom_vjp rules, on 2 CPU
    devices with the custom calls replaced by JAX's collectives of the
    same meaning. Rows (case, max |dy|, max |dx|) against jax.lax's
    all_to_all and (the documented meaning of) ragged_all_to_all."""
    _cpu(2)
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
    import symnccl.jax as sj
    n = 2
    sj._nranks = lambda: n
    sj._a2a_rows_raw = lambda x, algo: jax.lax.all_to_all(
        x, AXIS, 0, 0, tiled=True)
    sj._a2a_v_raw = _v_stand_in(jax, jnp, sj, n)
    mesh = jax.make_mesh((n,), (AXIS,))
    rng = np.random.default_rng(seed)
    rows = []

    def compare(name, ours, theirs, args, specs, wrt, vma):
        outs = []
        for f in (ours, theirs):
            g = jax.shard_map(f, mesh=mesh, in_specs=specs, out_specs=P(AXIS),
                              check_vma=vma)
            y = jax.jit(g)(*args)
            w = jnp.asarray(rng.standard_normal(y.shape), y.dtype) \
                if not outs else outs[0][2]

            def loss(*a, g=g, w=w):
                return jnp.sum(jnp.sin(g(*a)) * w)
            d = jax.jit(jax.grad(loss, argnums=wrt))(*args)
            outs.append((y, d, w))
        dy = float(jnp.max(jnp.abs(outs[0][0] - outs[1][0])))
        dx = max(float(jnp.max(jnp.abs(a - b))) if a.size else 0.0
                 for a, b in zip(outs[0][1], outs[1][1]))
        rows.append((f"{name} vma={vma}", dy, dx))

    for vma in (True, False):
        # check_vma off changes no rule of ours, only JAX's typing: every
        # case with it on, one tiled and one untiled case with it off
        # (compiles are the test's cost)
        for shape, sa, ca, tiled in (A2A_CASES if vma else A2A_VMA_OFF):
            x = jax.device_put(
                jnp.asarray(rng.standard_normal((n * shape[0], *shape[1:])),
                            jnp.float32), NamedSharding(mesh, P(AXIS)))
            ours = (lambda a, sa=sa, ca=ca, t=tiled:
                    sj.all_to_all(a, sa, ca, tiled=t, algo="push"))
            if not tiled and sa != ca:
                # jax.lax.all_to_all(tiled=False)'s own transpose gets the
                # shape wrong when the axes differ (JAX 0.11.2: it applies
                # the expand/squeeze of the public function again): values
                # against it, gradients against its tiled formulation
                f = jax.jit(jax.shard_map(
                    lambda a, sa=sa, ca=ca: jax.lax.all_to_all(
                        a, AXIS, sa, ca), mesh=mesh, in_specs=P(AXIS),
                    out_specs=P(AXIS), check_vma=vma))
                g = jax.jit(jax.shard_map(ours, mesh=mesh, in_specs=P(AXIS),
                                          out_specs=P(AXIS), check_vma=vma))
                rows.append((f"all_to_all {shape} {sa}->{ca} values vma="
                             f"{vma}", float(jnp.max(jnp.abs(f(x) - g(x)))),
                             0.0))
            compare(f"all_to_all {shape} {sa}->{ca} tiled={tiled}", ours,
                    lambda a, sa=sa, ca=ca, t=tiled:
                        _lax_all_to_all(jax, jnp, a, sa, ca, t),
                    (x,), P(AXIS), (0,), vma)
        for zero in (False, True):
            rin, rout = 16, 18
            per = _ragged_args(rng, n, rin, rout, zero)
            ops = jnp.asarray(rng.standard_normal((n * rin, 3)), jnp.float32)
            outp = jnp.asarray(rng.standard_normal((n * rout, 3)),
                               jnp.float32)
            ints = [jnp.asarray(np.concatenate([p[i] for p in per]),
                                jnp.int32) for i in range(4)]
            sh = NamedSharding(mesh, P(AXIS))
            args = [jax.device_put(a, sh) for a in (ops, outp, *ints)]
            compare(f"ragged_all_to_all zero_chunks={zero}",
                    lambda *a: sj.ragged_all_to_all(*a, algo="push"),
                    _ragged_reference(jax, jnp, n), args, P(AXIS), (0, 1),
                    vma)
    return rows


def result_types_on_cpu():
    """With check_vma, the results vary over the mesh axis, as
    jax.lax.all_to_all's and ragged_all_to_all's do (traced only)."""
    _cpu(2)
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
    import symnccl.jax as sj
    sj._nranks = lambda: 2
    sj._registered = True   # tracing needs no handler (and no CUDA)
    mesh = jax.make_mesh((2,), (AXIS,))
    seen = {}

    def f(a, b):
        # a varies over the axis, b (replicated) does not: every rank's
        # result differs either way, as jax.lax.all_to_all's does
        for name, x in (("", a), (" of an invariant x", b)):
            seen["all_to_all" + name] = sorted(sj._varying(
                sj.all_to_all(x, 0, 1, tiled=True)))
            z = jnp.zeros(2, jnp.int32)   # invariant offsets and sizes
            seen["ragged_all_to_all" + name] = sorted(sj._varying(
                sj.ragged_all_to_all(x, jnp.zeros_like(x), z, z, z, z)))
        return a
    spec = jax.ShapeDtypeStruct((8, 2), jnp.float32,
                                sharding=NamedSharding(mesh, P(AXIS)))
    rep = jax.ShapeDtypeStruct((4, 2), jnp.float32,
                               sharding=NamedSharding(mesh, P()))
    jax.make_jaxpr(jax.shard_map(f, mesh=mesh, in_specs=(P(AXIS), P()),
                                 out_specs=P(AXIS)))(spec, rep)
    return seen


def one_gpu(rank, nranks, uid, seed):
    """One GPU, one rank: symnccl.jax's all_to_all and ragged_all_to_all
    inside jit(shard_map) against jax.lax's, bit for bit, values and
    gradients, several dtypes, empty chunks; the launch counters say which
    kernel ran."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
    from _workers import jax_on_one_gpu
    jax_on_one_gpu(jax)
    import symnccl
    import symnccl.jax as sj
    from symnccl import _check
    comms = sj.communicator()
    c = comms[0]
    mesh = jax.make_mesh((1,), (AXIS,))
    sh = NamedSharding(mesh, P(AXIS))
    rng = np.random.default_rng(seed)
    rows, kernels = [], {}

    def run(f, *args, vma=True):
        g = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P(AXIS),
                                  out_specs=P(AXIS), check_vma=vma))
        return np.asarray(jax.block_until_ready(g(*args)))

    def ran(before):
        after = c._launches()
        return {k: after[k] - before[k] for k in after if after[k] != before[k]}

    # jax.lax's result once per input, then every algo against it
    # the kernels move bytes: an element of 4, 2 and 1 bytes
    for dtype in ("float32", "bfloat16", "int8"):
        npdt = _check.numpy_dtype(dtype)
        algos = ("push", "ll", "nccl", "auto") if dtype == "float32" \
            else ("push",)
        for shape, sa, ca, tiled in (((5, 3), 0, 1, True),
                                     ((0, 3), 0, 0, True),
                                     ((4, 1, 7), 1, 2, False)):
            x = jax.device_put(jnp.asarray(
                rng.integers(-50, 50, shape).astype(npdt)), sh)
            b = run(lambda t, sa=sa, ca=ca, tl=tiled:
                    jax.lax.all_to_all(t, AXIS, sa, ca, tiled=tl), x)
            for algo in algos:
                before = c._launches()
                a = run(lambda t, sa=sa, ca=ca, tl=tiled, al=algo:
                        sj.all_to_all(t, sa, ca, tiled=tl, algo=al), x)
                got = ran(before)
                same = a.shape == b.shape and a.tobytes() == b.tobytes()
                rows.append((f"all_to_all {algo} {dtype} {shape}", same,
                             sorted(got)))
        # ragged at 1 rank: one slice from input_offsets into
        # output_offsets; padding around it, or an empty one
        if dtype == "int8":
            continue
        for in_off, size, out_off in ((2, 5, 3), (0, 0, 1), (0, 9, 0)):
            op = jax.device_put(jnp.asarray(
                rng.integers(-50, 50, (9, 4)).astype(npdt)), sh)
            out = jax.device_put(jnp.asarray(
                rng.integers(-50, 50, (11, 4)).astype(npdt)), sh)
            ints = [jax.device_put(jnp.asarray([v], jnp.int32), sh)
                    for v in (in_off, size, out_off, size)]
            b = run(lambda *t: jax.lax.ragged_all_to_all(
                *t, axis_name=AXIS), op, out, *ints)
            for algo in ("push", "ll", "auto") if dtype == "float32" \
                    else ("push",):
                before = c._launches()
                a = run(lambda *t, al=algo: sj.ragged_all_to_all(*t, algo=al),
                        op, out, *ints)
                got = ran(before)
                rows.append((f"ragged {algo} {dtype} "
                             f"{(in_off, size, out_off)}",
                             a.tobytes() == b.tobytes(), sorted(got)))
                kernels[f"ragged {algo}"] = got
    # gradients against jax.lax's, both collectives, check_vma on and off
    grads = []
    x = jax.device_put(jnp.asarray(rng.standard_normal((6, 4)),
                                   jnp.float32), sh)
    w = jnp.asarray(rng.standard_normal((6, 4)), jnp.float32)
    op = jax.device_put(jnp.asarray(rng.standard_normal((9, 4)),
                                    jnp.float32), sh)
    out = jax.device_put(jnp.asarray(rng.standard_normal((11, 4)),
                                     jnp.float32), sh)
    wr = jnp.asarray(rng.standard_normal((11, 4)), jnp.float32)
    ints = [jax.device_put(jnp.asarray([v], jnp.int32), sh)
            for v in (2, 5, 3, 5)]
    for vma in (True, False):
        for name, f, args, wt, argn in (
                ("all_to_all", lambda t: sj.all_to_all(t, 0, 1, tiled=True,
                                                       algo="push"),
                 (x,), w, (0,)),
                ("lax all_to_all", lambda t: jax.lax.all_to_all(
                    t, AXIS, 0, 1, tiled=True), (x,), w, (0,)),
                ("ragged", lambda *t: sj.ragged_all_to_all(*t, algo="push"),
                 (op, out, *ints), wr, (0, 1)),
                ("lax ragged", lambda *t: jax.lax.ragged_all_to_all(
                    *t, axis_name=AXIS), (op, out, *ints), wr, (0, 1))):
            g = jax.shard_map(f, mesh=mesh, in_specs=P(AXIS),
                              out_specs=P(AXIS), check_vma=vma)
            d = jax.jit(jax.grad(lambda *a, g=g, wt=wt: jnp.sum(
                jnp.sin(g(*a)) * wt), argnums=argn))(*args)
            grads.append((name, vma, [np.asarray(v) for v in d]))
    for i in range(0, len(grads), 2):
        (name, vma, ours), (_, _, theirs) = grads[i], grads[i + 1]
        diff = max(float(np.max(np.abs(a - b))) for a, b in
                   zip(ours, theirs))
        rows.append((f"grad {name} vma={vma}", diff == 0.0, diff))
    algos = {k: symnccl._C.COLLECTIVE_KERNELS["all_to_all"].get(k)
             for k in ("push", "ll")}
    c.close()
    return {"rows": rows, "kernels": kernels, "names": algos}
