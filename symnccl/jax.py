"""JAX integration: symnccl's all-reduce, reduce-scatter, all-gather,
all-to-all (equal and ragged) and fused all-reduce + residual add + RMSNorm
inside jax.jit, shard_map and jax.grad.

Each is an XLA FFI custom call ("symnccl_all_reduce",
"symnccl_reduce_scatter", "symnccl_all_gather", "symnccl_all_to_all",
"symnccl_all_to_all_v", "symnccl_all_reduce_rmsnorm") whose handler is C
(csrc/xla/xla_ffi.c): it takes XLA's stream and device, and uses the
communicator created for that device by communicator(). Communicators are
made before the computation runs, never inside it. Each is differentiable
(jax.custom_vjp), with the gradients of jax.lax.psum, psum_scatter(tiled=
True), all_gather(tiled=True), all_to_all and ragged_all_to_all at the same
place inside shard_map: the transpose of an all-reduce is an all-reduce,
of a reduce-scatter an all-gather, of an all-gather a reduce-scatter, of
an all-to-all the all-to-all with the axes (or the offsets' roles)
swapped; all_reduce_rmsnorm's is the unfused composition's.

Example (one process, every local GPU)::

    import jax, jax.numpy as jnp
    from jax.sharding import PartitionSpec as P
    import symnccl.jax as sj

    sj.communicator()                            # one per local device
    mesh = jax.make_mesh((jax.device_count(),), ("x",))
    f = jax.jit(jax.shard_map(lambda a: sj.all_reduce(a), mesh=mesh,
                              in_specs=P("x"), out_specs=P("x")))
    y = f(jnp.ones(8 * jax.device_count(), jnp.bfloat16))

Several processes (jax.distributed.initialize() first, one GPU each): the
same calls; communicator() bootstraps over jax.distributed's key-value
store.

Outside jit, Communicator.all_reduce(jax_array) takes and returns jax
arrays through DLPack (JAX exports legacy DLPack capsules only).
"""
from __future__ import annotations

import functools
import itertools

import numpy as np

import jax

from . import _C, Communicator, OPS

__all__ = ["communicator", "all_reduce", "reduce_scatter", "all_gather",
           "TARGET", "TARGETS"]

#: collective -> the FFI target of its handler (csrc/xla/xla_ffi.c's table)
TARGETS = {k: f"symnccl_{k}" for k in _C.XLA_HANDLERS}
TARGET = TARGETS["all_reduce"]
#: op name -> the ncclRedOp_t the handler takes (the C registry's).
_OP_CODES = dict(_C.OP_CODES)
#: algorithm name -> the code the handler takes (the C registry's).
_ALGO_CODES = dict(_C.ALGO_CODES)
_registered = False
_comms: dict[int, Communicator] = {}   # CUDA ordinal -> communicator
_generation = itertools.count()


def _register_target() -> None:
    global _registered
    if not _registered:
        for name, target in TARGETS.items():
            jax.ffi.register_ffi_target(target, _C._xla_handler(name),
                                        platform="CUDA")
        _registered = True


def _gpu_devices():
    devs = [d for d in jax.local_devices() if d.platform == "gpu"]
    if not devs:
        raise RuntimeError("symnccl.jax needs JAX's CUDA backend: "
                           f"jax.local_devices() is {jax.local_devices()}")
    return devs


def _kv_client():
    from jax._src import distributed
    client = distributed.global_state.client
    if client is None:
        raise RuntimeError("several JAX processes but no jax.distributed "
                           "client: call jax.distributed.initialize() first")
    return client


def communicator(*, name: str = "default",
                 timeout: float = _C.DEFAULT_TIMEOUT,
                 multicast=None) -> list[Communicator]:
    """Creates the communicators the XLA handler uses, one per local GPU,
    and returns them (in jax.local_devices() order).

    - One process (jax.process_count() == 1): a communicator for every
      local GPU, created together by Communicator.init_all.
    - Several processes, one GPU each: rank jax.process_index(); process 0
      makes the NCCL unique id and shares it through jax.distributed's
      key-value store under "symnccl/<name>/<n>/uid" (n counts calls, so
      repeated calls never reuse a key); the others wait at most `timeout`
      seconds for it.

    Calling it again replaces the communicators (the old ones are closed).
    """
    timeout = _C._check_timeout(timeout)   # before any rendezvous
    _register_target()
    devs = _gpu_devices()
    nproc = jax.process_count()
    ordinals = [d.local_hardware_id for d in devs]
    if nproc == 1:
        comms = Communicator.init_all(ordinals, timeout=timeout,
                                      multicast=multicast)
        _warm_up(comms)
    else:
        if len(devs) != 1:
            raise NotImplementedError(
                f"{nproc} JAX processes with {len(devs)} GPUs each: "
                "symnccl.jax supports one process per GPU, or one process "
                "driving every GPU")
        client = _kv_client()
        key = f"symnccl/{name}/{next(_generation)}/uid"
        if jax.process_index() == 0:
            uid = _C.get_unique_id()
            client.key_value_set(key, uid.hex())
        else:
            uid = bytes.fromhex(client.blocking_key_value_get(
                key, int(timeout * 1000)))
        comms = [Communicator(uid, jax.process_index(), nproc,
                              device=ordinals[0], timeout=timeout,
                              multicast=multicast)]
    _retire(list(_comms.values()))
    _comms.clear()
    for c in comms:
        _C._xla_register(c)
        _comms[c.device] = c
    return comms


def _retire(old) -> None:
    """Closes the communicators a new communicator() call replaces.

    JAX dispatches asynchronously: a computation called before may still
    run symnccl's handlers on them. The computations whose arrays are alive
    are waited for first. Any handler later still is safe all the same:
    close() takes a communicator out of the handlers' registry before it
    waits (bounded) for the handlers inside it to leave, each handler holds
    its communicator for the duration of its call, and one that starts
    after the close fails with an XLA error naming it (docs/FAILURES.md,
    "Lifecycle")."""
    if not any(not c.closed for c in old):
        return
    for a in jax.live_arrays():
        try:
            a.block_until_ready()
        except Exception:   # a failed computation's: its error is its own
            pass
    for c in old:
        if not c.closed:
            c.close()


def _warm_up(comms) -> None:
    """One NCCL all-reduce on every communicator, grouped: NCCL connects
    peers at first use, collectively, which must not first happen inside
    XLA's execution (one thread may run every device's handler)."""
    from . import group
    with group():
        bufs = [c.zeros(1, "float32") for c in comms]
    with group():
        for c, b in zip(comms, bufs):
            c.all_reduce(b, algo="nccl")
    for b in bufs:   # waits for the all-reduce before the buffers go
        b.to_bytes()


def _check_op(op: str) -> None:
    if op not in _OP_CODES:
        raise ValueError(f"op {op!r} is not supported: expected one of {OPS}")


def _nranks() -> int:
    if not _comms:
        raise RuntimeError("no symnccl communicator: call "
                           "symnccl.jax.communicator() first")
    return next(iter(_comms.values())).nranks


def _result_type(x, shape, varying: bool):
    """The result's type. Inside shard_map with check_vma, JAX types a
    custom call's result from this alone: an all-reduce's result is the
    same on every rank (invariant, as psum's), a reduce-scatter's or an
    all-gather's varies wherever x does (x's type, reshaped)."""
    shape = tuple(shape)
    if varying and hasattr(jax, "typeof") and len(shape) == x.ndim:
        t = jax.typeof(x)
        if _varying(x) and hasattr(t, "update"):
            return t.update(shape=shape)
    return jax.ShapeDtypeStruct(shape, x.dtype)


def _ffi(collective: str, x, shape, **attrs):
    """The custom call of `collective` on x, with a result of `shape`.

    Buffers are asked for in XLA's collective memory space
    (operands_memory_spaces/results_memory_spaces "{0:1}"): the all-reduce
    runs on XLA's buffer in place where that lies in a window it could
    register, and through the communicator's staging window otherwise."""
    _register_target()
    from jax.experimental.xla_metadata import set_xla_metadata
    call = jax.ffi.ffi_call(TARGETS[collective], _result_type(
        x, shape, varying=collective != "all_reduce"))
    with set_xla_metadata(operands_memory_spaces="{0:1}",
                          results_memory_spaces="{0:1}"):
        return call(x, **{k: np.int32(v) for k, v in attrs.items()})


def _all_reduce_raw(x, op, algo):
    # Several processes may register XLA's buffers (collective, in the same
    # call everywhere); one process driving every GPU may run all handlers
    # from one thread, where a collective registration could not complete.
    register = 1 if jax.process_count() > 1 else 0
    return _ffi("all_reduce", x, x.shape, op=_OP_CODES[op],
                algo=_ALGO_CODES[algo], register=register)


def _reduce_scatter_raw(x, op, algo):
    n = _nranks()
    if x.ndim == 0 or x.shape[0] % n != 0:
        raise ValueError(f"reduce_scatter: x has shape {x.shape}, expected "
                         f"dim 0 to be a multiple of nranks ({n})")
    return _ffi("reduce_scatter", x, (x.shape[0] // n, *x.shape[1:]),
                op=_OP_CODES[op], algo=_ALGO_CODES[algo])


def _all_gather_raw(x, algo):
    n = _nranks()
    shape = (n,) if x.ndim == 0 else (x.shape[0] * n, *x.shape[1:])
    return _ffi("all_gather", x, shape, algo=_ALGO_CODES[algo])


def _like(x):
    """A residual that carries x's type and shape for the backward
    (_typed_as, the all-gather's shape) at no cost: x[None][:0], of shape
    (0, *x.shape)."""
    return x[None][:0]


def _varying(x) -> frozenset:
    """The manual axes x varies over inside shard_map (empty elsewhere, and
    on JAX versions without that typing)."""
    t = jax.typeof(x) if hasattr(jax, "typeof") else None
    m = getattr(t, "manual_axis_type", None)
    if m is not None:
        return frozenset(m.varying)
    return frozenset(getattr(t, "vma", ()))


def _vma_union(*xs):
    """xs, each made to vary over every manual axis any of them varies
    over (a custom call's operands and its result then agree, as
    shard_map's check_vma wants)."""
    axes = frozenset().union(*(_varying(x) for x in xs))
    return [_pvary(x, axes) for x in xs]


def _manual_axes() -> frozenset:
    """The manual axes of the shard_map being traced (empty outside one)."""
    get = getattr(jax.sharding, "get_abstract_mesh", None)
    mesh = get() if get is not None else None
    return frozenset(getattr(mesh, "manual_axes", None) or ())


def _vary_everywhere(*xs):
    """xs, each made to vary over every manual axis: the operands of a
    collective whose result JAX types varying even for an invariant operand
    (jax.lax.all_to_all's, psum_scatter's, all_gather's: every rank's
    result may differ)."""
    axes = _manual_axes().union(*(_varying(x) for x in xs))
    return [_pvary(x, axes) for x in xs]


def _pvary(x, axes):
    missing = tuple(sorted(axes - _varying(x)))
    if not missing:
        return x
    if hasattr(jax.lax, "pvary"):
        return jax.lax.pvary(x, missing)
    return jax.lax.pcast(x, missing, to="varying")


def _typed_as(g, like):
    """g with the varying manual axes of `like` (shard_map's check_vma: a
    cotangent must vary over the axes its primal varies over, and a custom
    call's result may carry fewer)."""
    missing = tuple(sorted(_varying(like) - _varying(g)))
    if not missing:
        return g
    if hasattr(jax.lax, "pvary"):
        return jax.lax.pvary(g, missing)
    return jax.lax.pcast(g, missing, to="varying")


def _share(x, y, g):
    """max/min: g where x holds the reduced value y, split evenly among the
    ranks that hold it (as jnp.max splits among ties)."""
    hit = (x == y).astype(g.dtype)
    return g * hit / _all_reduce_raw(hit, "sum", "auto")


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _all_reduce(x, op, algo):
    return _all_reduce_raw(x, op, algo)


def _all_reduce_fwd(x, op, algo):
    y = _all_reduce_raw(x, op, algo)
    return y, ((x, y) if op in ("max", "min") else _like(x))


def _no_gradient(collective: str, op: str):
    return NotImplementedError(
        f"symnccl.jax.{collective}: op {op!r} has no gradient here (sum, "
        "avg, max and min have)")


def _all_reduce_bwd(op, algo, res, g):
    if op == "prod":
        raise _no_gradient("all_reduce", op)
    x = res[0] if op in ("max", "min") else res
    # Inside shard_map with check_vma, a result typed invariant (the same on
    # every rank) gets a cotangent that JAX has already summed over the
    # ranks: then, as for psum, no communication is left to do.
    summed = bool(_varying(x) - _varying(g))
    if op in ("sum", "avg"):
        if summed:
            g = g / _nranks() if op == "avg" else g
        else:
            g = _all_reduce_raw(g, op, algo)
        return (_typed_as(g, x),)
    g = g if summed else _all_reduce_raw(g, "sum", algo)
    return (_typed_as(_share(x, res[1], g), x),)


_all_reduce.defvjp(_all_reduce_fwd, _all_reduce_bwd)


# reduce_scatter and all_gather are each other's transpose; the backward
# runs on the forward's algo (both take the same ones).
@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _reduce_scatter(x, op, algo):
    return _reduce_scatter_raw(x, op, algo)


def _reduce_scatter_fwd(x, op, algo):
    y = _reduce_scatter_raw(x, op, algo)
    return y, ((x, y) if op in ("max", "min") else _like(x))


def _reduce_scatter_bwd(op, algo, res, g):
    if op == "prod":
        raise _no_gradient("reduce_scatter", op)
    full = _all_gather_raw(g, algo)
    if op in ("max", "min"):
        x, y = res
        return (_typed_as(_share(x, _all_gather_raw(y, algo), full), x),)
    if op == "avg":
        full = full / _nranks()
    return (_typed_as(full, res),)


_reduce_scatter.defvjp(_reduce_scatter_fwd, _reduce_scatter_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _all_gather(x, algo):
    return _all_gather_raw(x, algo)


def _all_gather_fwd(x, algo):
    return _all_gather_raw(x, algo), _like(x)


def _all_gather_bwd(algo, res, g):
    return (_typed_as(_reduce_scatter_raw(g, "sum", algo), res).reshape(
        res.shape[1:]),)


_all_gather.defvjp(_all_gather_fwd, _all_gather_bwd)


def all_reduce(x, op: str = "sum", algo: str = "auto"):
    """All-reduce of x across the ranks of the communicators made by
    communicator(), as an XLA custom call: use it inside jax.jit, per shard
    inside shard_map. Returns a new array of x's shape and dtype.
    Differentiable: its gradient is that of jax.lax.psum (sum), of psum/n
    (avg), and for max/min the gradient reaches the ranks that hold the
    result.

    Example::

        y = sj.all_reduce(a)            # psum(a, "x") inside shard_map
    """
    _check_op(op)
    _check_algo(algo)
    return _all_reduce(x, op, algo)


def _check_algo(algo):
    if algo not in _ALGO_CODES:
        raise ValueError(f"algo {algo!r} is not available: expected one of "
                         f"{tuple(_ALGO_CODES)}")


def reduce_scatter(x, op: str = "sum", algo: str = "auto"):
    """Reduce-scatter along axis 0: x of shape (nranks * m, ...) gives this
    rank's block (m, ...) of the reduction, as jax.lax.psum_scatter(x, axis,
    scatter_dimension=0, tiled=True). Differentiable (its transpose is an
    all-gather, on the same algo). algo: "ll", "ll128" or "push" run
    symnccl's kernels (the same bits as block r of all_reduce), "nccl"
    NCCL, "auto" the measured table (symnccl.AUTO_TABLE, by the
    input's bytes); an algo that cannot run the call fails the computation
    naming why.

    Example::

        z = sj.reduce_scatter(h @ w_row, algo="ll")   # (T, H) per shard
    """
    _check_op(op)
    _check_algo(algo)
    # every rank's block differs, whatever x: varying, as psum_scatter's
    x, = _vary_everywhere(x)
    return _reduce_scatter(x, op, algo)


def all_gather(x, algo: str = "auto"):
    """All-gather along axis 0: x of shape (m, ...) gives (nranks * m, ...),
    as jax.lax.all_gather(x, axis, tiled=True). Differentiable (its
    transpose is a reduce-scatter, on the same algo). algo: "ll", "ll128"
    or "push" run symnccl's kernels (any dtype), "nccl" NCCL, "auto" the
    measured table (symnccl.AUTO_TABLE, by the output's bytes).

    Example::

        h = sj.all_gather(x_shard, algo="ll")     # (n * T, H)
    """
    _check_algo(algo)
    x, = _vary_everywhere(x)   # typed varying, as jax.lax.all_gather's
    return _all_gather(x, algo)


def stats(device: int) -> dict:
    """How the handler ran on one device (for tests and debugging)."""
    w, s, r = _C._xla_stats(device)
    return {"window_calls": w, "staged_calls": s, "registrations": r}


# ---------------------------------------------------------------- all-to-all
#
# jax.lax.all_to_all and ragged_all_to_all (issue 32) on two custom calls
# (csrc/xla/xla_ffi.c, "all-to-all"): "symnccl_all_to_all" moves nranks equal
# blocks of rows (axis 0), "symnccl_all_to_all_v" the rows of device splits,
# packed rank after rank (Communicator.all_to_all_v). Other axes are
# transposes and reshapes in jnp around the equal one; ragged's explicit
# offsets are a gather before the packed exchange and a scatter after it,
# on the device (docs/FRAMEWORKS.md, "JAX: all-to-all").

__all__ += ["all_to_all", "ragged_all_to_all"]


def _typed(x, shape, dtype):
    """A result of `shape` and `dtype` that varies as x does."""
    shape = tuple(shape)
    if hasattr(jax, "typeof") and _varying(x):
        t = jax.typeof(x)
        if hasattr(t, "update"):
            return t.update(shape=shape, dtype=np.dtype(dtype))
    return jax.ShapeDtypeStruct(shape, dtype)


def _a2a_rows_raw(x, algo):
    """Block j of x's rows (axis 0, nranks equal blocks) to rank j; block
    i of the result from rank i."""
    _register_target()
    call = jax.ffi.ffi_call(TARGETS["all_to_all"],
                            _typed(x, x.shape, x.dtype))
    return call(x, algo=np.int32(_ALGO_CODES[algo]))


def _as_pairs(v):
    """n int64 counts as 2n uint32 (little-endian halves): the handler
    reads 8 x nranks bytes, and JAX without x64 has no int64."""
    import jax.numpy as jnp
    v = v.astype(jnp.int32)
    lo = jax.lax.bitcast_convert_type(v, jnp.uint32)
    hi = jnp.where(v < 0, jnp.uint32(0xFFFFFFFF), jnp.uint32(0))
    return jnp.stack([lo, hi], axis=1).reshape(-1)


def _a2a_v_raw(x, splits, out_rows, algo):
    """Packed uneven all-to-all: splits[q] rows of x (in order) to rank q;
    returns (out of out_rows rows: the rows of ranks 0, 1, ... one after
    another, the rest unspecified; the rows received from each rank,
    int32)."""
    import jax.numpy as jnp
    _register_target()
    n = _nranks()
    pairs = _as_pairs(splits)
    x, pairs = _vma_union(x, pairs)
    call = jax.ffi.ffi_call(TARGETS["all_to_all_v"], (
        _typed(x, (out_rows, *x.shape[1:]), x.dtype),
        _typed(x, (2 * n,), jnp.uint32)))
    out, got = call(x, pairs, algo=np.int32(_ALGO_CODES[algo]))
    got = jax.lax.bitcast_convert_type(got.reshape(n, 2)[:, 0], jnp.int32)
    return out, got


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _a2a_rows(x, algo):
    return _a2a_rows_raw(x, algo)


def _a2a_rows_fwd(x, algo):
    return _a2a_rows_raw(x, algo), _like(x)


def _a2a_rows_bwd(algo, res, g):
    # equal blocks: the exchange is its own transpose (block i of the
    # cotangent goes back to rank i)
    return (_typed_as(_a2a_rows_raw(g, algo), res),)


_a2a_rows.defvjp(_a2a_rows_fwd, _a2a_rows_bwd)


def all_to_all(x, split_axis: int, concat_axis: int, *, tiled: bool = False,
               algo: str = "auto"):
    """jax.lax.all_to_all(x, axis, split_axis, concat_axis, tiled=tiled)
    over the ranks of the communicators made by communicator(), as an XLA
    custom call (inside jax.jit / shard_map): x is split along split_axis
    into nranks chunks, chunk j goes to rank j, and the chunks received are
    concatenated along concat_axis in rank order (tiled=True), or stacked
    on a new axis at concat_axis (tiled=False, x.shape[split_axis] ==
    nranks). Differentiable: its transpose is the all-to-all with the axes
    swapped. algo: "push" or "ll" run symnccl's kernels, "nccl" NCCL's
    send/recv, "auto" the measured table (symnccl.AUTO_TABLE).

    Example::

        # (E, T, H) per shard, experts split over ranks -> (E/n, n*T, H)
        y = sj.all_to_all(x, 0, 1, tiled=True, algo="push")
    """
    import jax.numpy as jnp
    _check_algo(algo)
    n = _nranks()
    nd = x.ndim
    if nd == 0:
        raise ValueError("all_to_all: x is a scalar, expected an axis to "
                         "split")
    for name, a in (("split_axis", split_axis), ("concat_axis", concat_axis)):
        if not -nd <= a < nd:
            raise ValueError(f"all_to_all: {name} {a} is out of range for x "
                             f"of shape {x.shape}")
    split_axis %= nd
    concat_axis %= nd
    if not tiled:
        if x.shape[split_axis] != n:
            raise ValueError(
                f"all_to_all: x.shape[{split_axis}] is "
                f"{x.shape[split_axis]}, expected nranks ({n}) with "
                "tiled=False")
        # as jax.lax.all_to_all: a new axis of 1 where the ranks' chunks
        # are to be stacked (concat_axis counts without split_axis), the
        # tiled exchange, then split_axis (now of 1) dropped
        if split_axis < concat_axis:
            concat_axis += 1
            x = jnp.expand_dims(x, concat_axis)
        elif split_axis > concat_axis:
            x = jnp.expand_dims(x, concat_axis)
            split_axis += 1
        y = _tiled_all_to_all(x, split_axis, concat_axis, n, algo)
        return y if split_axis == concat_axis else jnp.squeeze(y, split_axis)
    if x.shape[split_axis] % n:
        raise ValueError(f"all_to_all: x.shape[{split_axis}] is "
                         f"{x.shape[split_axis]}, expected a multiple of "
                         f"nranks ({n})")
    return _tiled_all_to_all(x, split_axis, concat_axis, n, algo)


def _tiled_all_to_all(x, split_axis, concat_axis, n, algo):
    import jax.numpy as jnp
    # chunk j of split_axis becomes block j of the rows the kernel moves
    rows, = _vary_everywhere(jnp.moveaxis(x, split_axis, 0))
    y = _a2a_rows(rows, algo)
    m = rows.shape[0] // n
    chunks = jnp.moveaxis(y.reshape((n, m) + rows.shape[1:]), 1,
                          split_axis + 1)   # (n, *x.shape / n on split)
    shape = list(x.shape)
    shape[split_axis] //= n
    shape[concat_axis] *= n
    # rank i's chunk before rank i + 1's along concat_axis
    return jnp.moveaxis(chunks, 0, concat_axis).reshape(shape)


def _segments(sizes, length):
    """For positions 0..length-1 of a buffer holding len(sizes) segments
    packed one after another: the segment of each (len(sizes) past the
    end) and its position inside it."""
    import jax.numpy as jnp
    ends = jnp.cumsum(sizes)
    j = jnp.arange(length, dtype=ends.dtype)
    seg = jnp.searchsorted(ends, j, side="right")
    last = jnp.minimum(seg, sizes.shape[0] - 1)
    return seg, last, j - (ends - sizes)[last]


def _ragged_core(operand, output, input_offsets, send_sizes, land, algo):
    """operand's slices [input_offsets[q], + send_sizes[q]) to rank q,
    where each lands in its output at land[r] (this rank's output, the
    chunk of rank r). Returns (result, rows received from each rank)."""
    import jax.numpy as jnp
    n = _nranks()
    send = jnp.maximum(send_sizes.astype(jnp.int32), 0)
    # gather: the slices packed rank after rank (the packed exchange's x)
    seg, last, k = _segments(send, operand.shape[0])
    packed = jnp.take(operand, input_offsets.astype(jnp.int32)[last] + k,
                      axis=0, mode="clip")
    recv, got = _a2a_v_raw(packed, send, output.shape[0], algo)
    # scatter: rank r's rows to land[r] onwards; the rest dropped
    seg, last, k = _segments(got, output.shape[0])
    to = jnp.where(seg < n, land.astype(jnp.int32)[last] + k,
                   output.shape[0])
    recv, output = _vma_union(recv, output)
    return output.at[to].set(recv, mode="drop"), got


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _ragged(operand, output, input_offsets, send_sizes, output_offsets,
            recv_sizes, algo):
    return _ragged_fwd(operand, output, input_offsets, send_sizes,
                       output_offsets, recv_sizes, algo)[0]


def _ragged_fwd(operand, output, input_offsets, send_sizes, output_offsets,
                recv_sizes, algo):
    import jax.numpy as jnp
    # where this rank's chunk from rank r lands: r's output_offsets[me]
    land = _a2a_rows_raw(output_offsets.astype(jnp.int32).reshape(-1, 1),
                         algo).reshape(-1)
    y, got = _ragged_core(operand, output, input_offsets, send_sizes, land,
                          algo)
    return y, (_like(operand), input_offsets, land, got)


def _ragged_bwd(algo, res, g):
    # as jax's transpose: every received slice's cotangent goes back to
    # where it came from (the offsets' roles swapped: sent from land[r],
    # landing at this rank's input_offsets[r]); the output's cotangent is
    # g where nothing was received
    import jax.numpy as jnp
    like, input_offsets, land, got = res
    zeros = jnp.zeros(like.shape[1:], g.dtype)
    d_operand, _ = _ragged_core(g, zeros, land, got, input_offsets, algo)
    j = jnp.arange(g.shape[0], dtype=jnp.int32)[:, None]
    hit = jnp.any((j >= land[None, :]) & (j < (land + got)[None, :]),
                  axis=1)
    d_output = jnp.where(hit.reshape((-1,) + (1,) * (g.ndim - 1)), 0, g)
    return (_typed_as(d_operand, like), d_output, None, None, None, None)


_ragged.defvjp(_ragged_fwd, _ragged_bwd)


def ragged_all_to_all(operand, output, input_offsets, send_sizes,
                      output_offsets, recv_sizes, *, algo: str = "auto"):
    """jax.lax.ragged_all_to_all over the ranks of the communicators made
    by communicator(), as XLA custom calls: this rank sends
    operand[input_offsets[q]:][:send_sizes[q]] to rank q, where it lands at
    output_offsets[q] of rank q's output (an offset in the receiver's
    output, as in JAX); the result is `output` with the slices received
    written in. The offset and size arrays have one entry per rank (JAX
    allows a multiple; not here), any integer dtype, and stay on the
    device: nothing synchronises with the host. Differentiable in operand
    and output (the transpose sends the cotangents back, the offsets'
    roles swapped, as JAX's rule does).

    Implementation: the slices are gathered into a packed buffer of
    operand's rows, exchanged by symnccl's kernel (algo "push", "ll";
    "auto" is push; "nccl" cannot keep the sizes on the device), and
    scattered into the result. Rows received come from the senders' sizes
    (recv_sizes must agree, as JAX requires); the slices a rank sends must
    fit operand's rows together, and those it receives output's rows
    (further rows are dropped).

    Example::

        y = sj.ragged_all_to_all(tokens, jnp.zeros_like(buf), in_off,
                                 send, out_off, recv, algo="push")
    """
    _check_algo(algo)
    n = _nranks()
    if operand.ndim == 0 or output.ndim != operand.ndim or \
            output.shape[1:] != operand.shape[1:]:
        raise ValueError(f"ragged_all_to_all: operand has shape "
                         f"{operand.shape} and output {output.shape}, "
                         "expected rows (a first dimension) of the same "
                         "shape")
    if output.dtype != operand.dtype:
        raise TypeError(f"ragged_all_to_all: output has dtype "
                        f"{output.dtype}, expected {operand.dtype} "
                        "(operand's)")
    for name, a in (("input_offsets", input_offsets),
                    ("send_sizes", send_sizes),
                    ("output_offsets", output_offsets),
                    ("recv_sizes", recv_sizes)):
        if not np.issubdtype(a.dtype, np.integer):
            raise TypeError(f"ragged_all_to_all: {name} has dtype "
                            f"{a.dtype}, expected an integer dtype")
        if a.shape != (n,):
            raise ValueError(f"ragged_all_to_all: {name} has shape "
                             f"{a.shape}, expected ({n},): one entry per "
                             "rank")
    if algo == "nccl":
        raise ValueError("ragged_all_to_all: algo 'nccl' would read the "
                         "sizes on the host; expected 'push', 'll' or "
                         "'auto'")
    # "auto" is push for both of its exchanges (the offsets' and the
    # rows'), as for the handler (xla_ffi.c, "all-to-all")
    algo = "push" if algo == "auto" else algo
    # every operand varying alike (inside shard_map): the result then
    # varies as jax.lax.ragged_all_to_all's does
    return _ragged(*_vary_everywhere(operand, output, input_offsets,
                                      send_sizes, output_offsets,
                                      recv_sizes), algo)
# ------------------------------------------------------------ end all-to-all


# ------------------------------------------------------ all_reduce_rmsnorm
#
# The all-reduce fused with the residual add and RMSNorm after it (issue
# 31): one custom call, "symnccl_all_reduce_rmsnorm" (csrc/xla/xla_ffi.c), on
# fused.c's launch (the fused kernels, or NCCL's all-reduce and symnccl's
# add+norm), differentiable as the unfused composition is.

__all__ += ["all_reduce_rmsnorm"]
#: the dtypes of the fused kernels (x, residual and weight alike): the
#: registry's (kernels/table.h's FLOAT units)
_RMSNORM_DTYPES = _C.RMSNORM_DTYPES


def _all_reduce_rmsnorm_raw(x, residual, weight, eps, quant, scale, algo):
    """The custom call: (y, h), or with quant="fp8" (q, h) with a static
    `scale` operand, or (q, h, row scales) when scale is None."""
    _register_target()
    import jax.numpy as jnp
    f8 = jnp.float8_e4m3fn
    results = [_typed(residual, x.shape, f8 if quant else x.dtype),
               _typed(residual, x.shape, x.dtype)]
    operands = [x, residual, weight]
    if quant and scale is not None:
        operands.append(scale)
    elif quant:
        results.append(_typed(residual, (*x.shape[:-1], 1),
                                   jnp.float32))
    # a custom call's operands must vary alike (the results are typed
    # above: h varies where residual does)
    operands = _vma_union(*operands)
    call = jax.ffi.ffi_call(TARGETS["all_reduce_rmsnorm"], results)
    return tuple(call(*operands, eps=np.float32(eps),
                      algo=np.int32(_ALGO_CODES[algo])))


def _sum_to(g, like):
    """g, summed over the manual axes it varies over and `like` does not
    (a weight used alike on every rank gets the sum of their gradients),
    then typed as like (_typed_as)."""
    extra = tuple(sorted(_varying(g) - _varying(like)))
    if extra:
        g = jax.lax.psum(g, extra)
    return _typed_as(g, like)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _all_reduce_rmsnorm(x, residual, weight, eps, algo):
    return _all_reduce_rmsnorm_raw(x, residual, weight, eps, None, None,
                                   algo)


def _all_reduce_rmsnorm_fwd(x, residual, weight, eps, algo):
    y, h = _all_reduce_rmsnorm_raw(x, residual, weight, eps, None, None,
                                   algo)
    return (y, h), (h, weight, _like(x), _like(residual))


def _all_reduce_rmsnorm_bwd(eps, algo, res, cts):
    """The unfused composition's (symnccl.torch's formula): h's gradient,
    gh plus the norm's in fp32, rounded to h's dtype, is residual's, and
    its all-reduce x's, with the all-reduce's rules (_all_reduce_bwd: no
    communication where JAX has summed the cotangent already)."""
    import jax.numpy as jnp
    h, weight, xl, rl = res
    gy, gh = cts
    f32 = jnp.float32
    hf, wf = h.astype(f32), weight.astype(f32)
    rstd = jax.lax.rsqrt(jnp.mean(hf * hf, -1, keepdims=True) + eps)
    normed = hf * rstd
    gyf = gy.astype(f32)
    gn = gyf * wf
    g = gh.astype(f32) + rstd * (
        gn - normed * jnp.mean(gn * normed, -1, keepdims=True))
    gw = jnp.sum((gyf * normed).reshape(-1, weight.shape[-1]), 0)
    g = g.astype(h.dtype)
    (gx,) = _all_reduce_bwd("sum", "auto", xl, g)
    return gx, _sum_to(g, rl), _sum_to(gw.astype(weight.dtype), weight)


_all_reduce_rmsnorm.defvjp(_all_reduce_rmsnorm_fwd, _all_reduce_rmsnorm_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _all_reduce_rmsnorm_fp8(x, residual, weight, scale, eps, algo):
    return _all_reduce_rmsnorm_raw(x, residual, weight, eps, "fp8", scale,
                                   algo)


def _all_reduce_rmsnorm_fp8_fwd(x, residual, weight, scale, eps, algo):
    return _all_reduce_rmsnorm_raw(x, residual, weight, eps, "fp8", scale,
                                   algo), None


def _all_reduce_rmsnorm_fp8_bwd(eps, algo, res, cts):
    raise NotImplementedError(
        "symnccl.jax.all_reduce_rmsnorm: quant='fp8' has no gradient (as "
        "symnccl.torch.all_reduce_add_rmsnorm's): differentiate the call "
        "without quant=")


_all_reduce_rmsnorm_fp8.defvjp(_all_reduce_rmsnorm_fp8_fwd,
                               _all_reduce_rmsnorm_fp8_bwd)


def _check_rmsnorm(x, residual, weight, eps, quant, scale):
    name = "symnccl.jax.all_reduce_rmsnorm"
    dts = [np.dtype(a.dtype).name for a in (x, residual, weight)]
    if dts[0] not in _RMSNORM_DTYPES or len(set(dts)) != 1:
        raise TypeError(f"{name}: x, residual and weight have dtypes "
                        f"{', '.join(dts)}, expected one of "
                        f"{', '.join(_RMSNORM_DTYPES)} for all three")
    H = x.shape[-1] if x.ndim else 0
    if H == 0 or H % 8 != 0:
        raise ValueError(f"{name}: x has shape {tuple(x.shape)}, expected "
                         "(..., H) with H a positive multiple of 8")
    if tuple(residual.shape) != tuple(x.shape) or \
            tuple(weight.shape) != (H,):
        raise ValueError(f"{name}: residual has shape "
                         f"{tuple(residual.shape)} and weight "
                         f"{tuple(weight.shape)}, expected {tuple(x.shape)} "
                         f"(x's) and ({H},)")
    if not eps >= 0:
        raise ValueError(f"{name}: eps is {eps!r}, expected a number >= 0")
    if quant not in (None, "fp8"):
        raise ValueError(f"{name}: quant={quant!r}, expected None or 'fp8'")
    if scale is not None:
        if quant is None:
            raise ValueError(f"{name}: scale= is given without "
                             "quant='fp8'")
        if np.dtype(scale.dtype) != np.float32 or np.size(scale) != 1:
            raise ValueError(f"{name}: scale has dtype "
                             f"{np.dtype(scale.dtype).name} and shape "
                             f"{tuple(np.shape(scale))}, expected float32 "
                             "and one element")


def all_reduce_rmsnorm(x, residual, weight, eps: float = 1e-6, *,
                       quant: str | None = None, scale=None,
                       algo: str = "auto"):
    """The tensor-parallel all-reduce fused with the residual add and
    RMSNorm after it, as one XLA custom call (Communicator.
    all_reduce_rmsnorm's kernels): inside jax.jit, per shard inside
    shard_map. Returns (y, h) with

        h = all_reduce(x) + residual
        y = h * rsqrt(mean(h * h, -1) + eps) * weight

    x, residual: (..., H), H a multiple of 8; weight: (H,); all float32,
    float16 or bfloat16. h is rounded to x's dtype before the norm, which
    runs in fp32. Inside shard_map h and y vary where residual (or weight)
    does: the all-reduce's part is invariant, as psum's.
    Differentiable as the unfused composition (x's gradient is the
    all-reduce of h's, by all_reduce's rules).

    quant="fp8": returns (q, h, scale) with q float8_e4m3fn, q = y / scale
    saturated to +-448; scale the float32 one-element array given (static),
    else one per row computed in the kernel, shape (..., 1) (dynamic).
    Not differentiable (jax.grad raises), as symnccl.torch's op.

    algo: "ll", "ll128", "lamport", "one_shot" or "two_shot" run the fused
    kernels ("two_shot" has no FP8 output), "nccl" NCCL's all-reduce then
    symnccl's add+norm, "auto" the measured table (symnccl.AUTO_TABLE); an
    algo that cannot run the call fails the computation naming why.

    Example::

        def layer(o_partial, residual, w):    # per shard, in shard_map
            y, residual = sj.all_reduce_rmsnorm(o_partial, residual, w)
            q, _, s = sj.all_reduce_rmsnorm(o_partial, residual, w,
                                            quant="fp8")
            return y, residual
    """
    _check_rmsnorm(x, residual, weight, eps, quant, scale)
    _check_algo(algo)
    # a weight that varies where residual does not makes h vary there too
    residual = _typed_as(residual, weight)
    if quant is None:
        return _all_reduce_rmsnorm(x, residual, weight, float(eps), algo)
    if scale is None:
        return _all_reduce_rmsnorm_fp8(x, residual, weight, None,
                                       float(eps), algo)
    import jax.numpy as jnp
    q, h = _all_reduce_rmsnorm_fp8(x, residual, weight,
                                   jnp.reshape(scale, (1,)), float(eps),
                                   algo)
    return q, h, scale
