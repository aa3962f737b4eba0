"""JAX integration: symnccl's all-reduce inside jax.jit and shard_map.

The all-reduce is an XLA FFI custom call, "symnccl_all_reduce", whose
handler is C (csrc/xla_ffi.c): it takes XLA's stream and device, and uses
the communicator created for that device by communicator(). Communicators
are made before the computation runs, never inside it.

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

import itertools

import numpy as np

import jax

from . import _C, Communicator, OPS

__all__ = ["communicator", "all_reduce", "TARGET"]

TARGET = "symnccl_all_reduce"
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
        jax.ffi.register_ffi_target(TARGET, _C._xla_handler(),
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


def communicator(*, name: str = "default", timeout: float = 600.0,
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
    for old in list(_comms.values()):
        if not old.closed:
            old.close()
    _comms.clear()
    for c in comms:
        _C._xla_register(c)
        _comms[c.device] = c
    return comms


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


def all_reduce(x, op: str = "sum", algo: str = "auto"):
    """All-reduce of x across the ranks of the communicators made by
    communicator(), as an XLA custom call: use it inside jax.jit, per shard
    inside shard_map. Returns a new array of x's shape and dtype.

    Buffers are asked for in XLA's collective memory space
    (operands_memory_spaces/results_memory_spaces "{0:1}"); the handler runs
    on XLA's buffer in place where that lies in a window it could register,
    and through the communicator's staging window otherwise.
    """
    if op not in _OP_CODES:
        raise ValueError(f"op {op!r} is not supported: expected one of {OPS}")
    if algo not in _ALGO_CODES:
        raise ValueError(f"algo {algo!r} is not available: expected one of "
                         f"{tuple(_ALGO_CODES)}")
    _register_target()
    from jax.experimental.xla_metadata import set_xla_metadata
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct(x.shape, x.dtype))
    # Several processes may register XLA's buffers (collective, in the same
    # call everywhere); one process driving every GPU may run all handlers
    # from one thread, where a collective registration could not complete.
    register = 1 if jax.process_count() > 1 else 0
    with set_xla_metadata(operands_memory_spaces="{0:1}",
                          results_memory_spaces="{0:1}"):
        return call(x, op=np.int32(_OP_CODES[op]),
                    algo=np.int32(_ALGO_CODES[algo]),
                    register=np.int32(register))


def stats(device: int) -> dict:
    """How the handler ran on one device (for tests and debugging)."""
    w, s, r = _C._xla_stats(device)
    return {"window_calls": w, "staged_calls": s, "registrations": r}
