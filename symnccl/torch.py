"""PyTorch integration: communicators bootstrapped over torch.distributed,
and symnccl collectives as torch.library custom ops with autograd, so they
work in eager mode, in training (backward), under torch.compile(fullgraph=
True) with AOTAutograd, and inside CUDA graphs.

Gradients are those of torch.distributed.nn.functional: the backward of an
all-reduce (sum, avg) is an all-reduce of the gradient, of a reduce-scatter
an all-gather, of an all-gather a reduce-scatter, of a broadcast a reduce
to the root, of a reduce a broadcast from it; each runs on symnccl.

Example (under torchrun)::

    import torch, torch.distributed as dist
    import symnccl.torch as snt

    dist.init_process_group("nccl")
    comm = snt.communicator()              # device from LOCAL_RANK
    x = torch.randn(4096, device="cuda")
    y = snt.all_reduce(x, comm)            # new tensor
    snt.all_reduce_(x, comm)               # in place

    @torch.compile(fullgraph=True)
    def step(t):
        return snt.all_reduce(t * 2, comm, op="sum")

    # sequence parallel: gather the sequence, scatter the sum back
    h = snt.all_gather(x_shard, comm)            # (n * T, H), differentiable
    z = snt.reduce_scatter(h @ w, comm)          # (T, H)
"""
from __future__ import annotations

import itertools
import os
import threading

import torch

import symnccl

__all__ = ["Communicator", "communicator", "wrap", "all_reduce",
           "all_reduce_", "reduce_scatter", "all_gather", "broadcast",
           "reduce", "comm_id", "get_communicator"]

# Custom ops cannot take Python objects: communicators are passed by id.
# The registry keeps them alive until interpreter exit (where symnccl closes
# whatever is still open).
_COMMS: dict[int, symnccl.Communicator] = {}
_IDS: dict[int, int] = {}          # id(comm) -> registry id
_next_id = itertools.count(1)
_lock = threading.Lock()
_bootstraps: dict[str, itertools.count] = {}


def _register(comm) -> int:
    with _lock:
        cid = next(_next_id)
        _COMMS[cid] = comm
        _IDS[id(comm)] = cid
    return cid


def get_communicator(cid: int) -> symnccl.Communicator:
    """The communicator registered under id `cid` (see communicator())."""
    try:
        return _COMMS[cid]
    except KeyError:
        raise ValueError(f"no symnccl communicator with id {cid}") from None


def comm_id(comm) -> int:
    """The integer id under which the custom ops find `comm` (registered on
    first use).

    Example::

        torch.ops.symnccl.all_reduce(x, symnccl.torch.comm_id(comm), "sum",
                                     "auto")
    """
    if isinstance(comm, Communicator):
        return comm.cid
    cid = _IDS.get(id(comm))
    if cid is None or _COMMS.get(cid) is not comm:
        cid = _register(comm)
    return cid


class Communicator:
    """A symnccl.Communicator for torch code: every attribute and method of
    the wrapped communicator, plus `.cid`, a plain int that torch.compile
    reads as a constant when tracing the custom ops.

    Example::

        comm = symnccl.torch.wrap(symnccl.Communicator(uid, r, n, r))
        buf = comm.empty(1024, "bfloat16")     # delegated
    """

    def __init__(self, comm: symnccl.Communicator):
        self.comm = comm
        self.cid = _register(comm)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.comm.close()

    def __repr__(self):
        return f"<symnccl.torch.Communicator cid={self.cid} {self.comm!r}>"


# Delegate the public surface explicitly (no __getattr__, which torch.compile
# treats with suspicion when tracing attribute reads such as .cid).
for _name in dir(symnccl.Communicator):
    if not _name.startswith("_") and _name != "init_all":
        setattr(Communicator, _name,
                property(lambda self, _n=_name: getattr(self.comm, _n)))
del _name


def wrap(comm: symnccl.Communicator) -> Communicator:
    """Wrap an existing symnccl.Communicator for use with the custom ops
    inside torch.compile."""
    return comm if isinstance(comm, Communicator) else Communicator(comm)


def communicator(group=None, device=None, timeout: float = 600.0,
                 **kwargs) -> Communicator:
    """A symnccl Communicator over the ranks of a torch.distributed group.

    The unique id travels through torch.distributed's key-value store (not
    through an NCCL collective), under a key namespaced by group and call
    count, so every rank must call this in the same order. The device is
    `device`, else LOCAL_RANK, else torch.cuda.current_device(). Returns a
    symnccl.torch.Communicator (the symnccl communicator, usable inside
    torch.compile).

    Example::

        dist.init_process_group("nccl")
        comm = symnccl.torch.communicator()
    """
    import torch.distributed as dist
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialized: call "
                           "torch.distributed.init_process_group() first")
    if group is None:
        group = dist.group.WORLD
    rank = dist.get_rank(group)
    nranks = dist.get_world_size(group)
    if device is None:
        local = os.environ.get("LOCAL_RANK")
        device = int(local) if local is not None else \
            torch.cuda.current_device()
    elif isinstance(device, torch.device):
        device = device.index if device.index is not None else \
            torch.cuda.current_device()
    name = getattr(group, "group_name", None) or "world"
    with _lock:
        n = next(_bootstraps.setdefault(name, itertools.count()))
    uid = _share_unique_id(dist, group, rank, f"symnccl/uid/{name}/{n}",
                           device)
    return Communicator(symnccl.Communicator(bytes(uid), rank, nranks,
                                             device=device, timeout=timeout,
                                             **kwargs))


def _share_unique_id(dist, group, rank, key, device) -> bytes:
    """Rank 0's NCCL unique id on every rank of `group`: through the
    default store (torch's private _get_default_store: no collective, no
    GPU work), else, where that is gone, broadcast_object_list (public; a
    collective of the group's backend)."""
    get_store = getattr(dist.distributed_c10d, "_get_default_store", None)
    if get_store is not None:
        store = get_store()
        if rank == 0:
            store.set(key, symnccl.get_unique_id())
        return store.get(key)   # bounded by the store's timeout
    box = [symnccl.get_unique_id() if rank == 0 else None]
    src = dist.get_global_rank(group, 0) if group is not dist.group.WORLD \
        else 0
    dist.broadcast_object_list(box, src=src, group=group,
                               device=torch.device("cuda", device))
    return box[0]


# ---------------------------------------------------------------- custom ops
#
# One op per collective, out of place, each with a fake kernel (shapes for
# torch.compile) and an autograd formula that calls the ops again, so that
# AOTAutograd traces the backward too. Communicators are passed by id.


def _nranks(cid: int) -> int:
    return get_communicator(cid).nranks


def _like(x: torch.Tensor) -> torch.Tensor:
    """A new contiguous tensor of x's shape, dtype and device."""
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _scatter_shape(x: torch.Tensor, n: int) -> list[int]:
    if x.dim() == 0 or x.shape[0] % n != 0:
        raise ValueError(f"reduce_scatter: x has shape {tuple(x.shape)}, "
                         f"expected dim 0 to be a multiple of nranks ({n})")
    return [x.shape[0] // n, *x.shape[1:]]


def _gather_shape(x: torch.Tensor, n: int) -> list[int]:
    return [n] if x.dim() == 0 else [x.shape[0] * n, *x.shape[1:]]


@torch.library.custom_op("symnccl::all_reduce", mutates_args=())
def _all_reduce_op(x: torch.Tensor, comm_id: int, op: str,
                   algo: str) -> torch.Tensor:
    out = _like(x)
    get_communicator(comm_id).all_reduce(x.contiguous(), out=out, op=op,
                                         algo=algo)
    return out


@_all_reduce_op.register_fake
def _(x, comm_id, op, algo):
    return _like(x)


@torch.library.custom_op("symnccl::all_reduce_", mutates_args=("x",))
def _all_reduce_inplace_op(x: torch.Tensor, comm_id: int, op: str,
                           algo: str) -> None:
    if not x.is_contiguous():
        raise ValueError("all_reduce_ needs a contiguous tensor, got strides "
                         f"{tuple(x.stride())} for shape {tuple(x.shape)}")
    get_communicator(comm_id).all_reduce(x, op=op, algo=algo)


@_all_reduce_inplace_op.register_fake
def _(x, comm_id, op, algo):
    return None


@torch.library.custom_op("symnccl::reduce_scatter", mutates_args=())
def _reduce_scatter_op(x: torch.Tensor, comm_id: int, op: str,
                       algo: str) -> torch.Tensor:
    comm = get_communicator(comm_id)
    out = x.new_empty(_scatter_shape(x, comm.nranks))
    comm.reduce_scatter(x.contiguous(), out=out, op=op, algo=algo)
    return out


@_reduce_scatter_op.register_fake
def _(x, comm_id, op, algo):
    return x.new_empty(_scatter_shape(x, _nranks(comm_id)))


@torch.library.custom_op("symnccl::all_gather", mutates_args=())
def _all_gather_op(x: torch.Tensor, comm_id: int,
                   algo: str) -> torch.Tensor:
    comm = get_communicator(comm_id)
    out = x.new_empty(_gather_shape(x, comm.nranks))
    comm.all_gather(x.contiguous(), out=out, algo=algo)
    return out


@_all_gather_op.register_fake
def _(x, comm_id, algo):
    return x.new_empty(_gather_shape(x, _nranks(comm_id)))


@torch.library.custom_op("symnccl::broadcast", mutates_args=())
def _broadcast_op(x: torch.Tensor, comm_id: int, root: int,
                  algo: str) -> torch.Tensor:
    out = _like(x)
    get_communicator(comm_id).broadcast(x.contiguous(), root=root, out=out,
                                        algo=algo)
    return out


@_broadcast_op.register_fake
def _(x, comm_id, root, algo):
    return _like(x)


@torch.library.custom_op("symnccl::reduce", mutates_args=())
def _reduce_op(x: torch.Tensor, comm_id: int, root: int, op: str,
               algo: str) -> torch.Tensor:
    out = _like(x)
    get_communicator(comm_id).reduce(x.contiguous(), root=root, out=out,
                                     op=op, algo=algo)
    return out


@_reduce_op.register_fake
def _(x, comm_id, root, op, algo):
    return _like(x)


# ------------------------------------------------------------------ autograd
#
# max and min: the gradient goes to the ranks whose input is the result,
# split evenly among ties (as torch.amax splits it); sum and avg: the
# transposed collective (avg divides by nranks, once).

_ops = torch.ops.symnccl


def _arg_extreme_share(x, y, grad_sum, cid):
    """grad_sum where x holds the reduced value y, over the number of ranks
    that hold it."""
    hit = (x == y).to(grad_sum.dtype)
    return grad_sum * hit / _ops.all_reduce(hit, cid, "sum", "auto")


def _no_gradient(collective: str, op: str):
    return NotImplementedError(
        f"symnccl.torch.{collective}: op {op!r} has no gradient here "
        "(sum and avg have, and all_reduce's and reduce_scatter's max and "
        "min)")


def _setup_all_reduce(ctx, inputs, output):
    x, ctx.cid, ctx.op, ctx.algo = inputs
    if ctx.op in ("max", "min"):
        ctx.save_for_backward(x, output)


def _backward_all_reduce(ctx, grad):
    if ctx.op == "prod":
        raise _no_gradient("all_reduce", ctx.op)
    if ctx.op in ("sum", "avg"):
        return _ops.all_reduce(grad, ctx.cid, ctx.op, ctx.algo), \
            None, None, None
    x, y = ctx.saved_tensors
    g = _ops.all_reduce(grad, ctx.cid, "sum", ctx.algo)
    return _arg_extreme_share(x, y, g, ctx.cid), None, None, None


def _setup_reduce_scatter(ctx, inputs, output):
    x, ctx.cid, ctx.op, ctx.algo = inputs
    if ctx.op in ("max", "min"):
        ctx.save_for_backward(x, output)


def _backward_reduce_scatter(ctx, grad):
    if ctx.op == "prod":
        raise _no_gradient("reduce_scatter", ctx.op)
    # the same algorithm: reduce_scatter and all_gather take the same ones
    g = _ops.all_gather(grad, ctx.cid, ctx.algo)
    if ctx.op == "avg":
        g = g / _nranks(ctx.cid)
    elif ctx.op in ("max", "min"):
        x, y = ctx.saved_tensors
        g = _arg_extreme_share(x, _ops.all_gather(y, ctx.cid, ctx.algo), g,
                               ctx.cid)
    return g, None, None, None


def _setup_all_gather(ctx, inputs, output):
    x, ctx.cid, ctx.algo = inputs
    ctx.shape = x.shape   # a 0-d x gathers into (nranks,)


def _backward_all_gather(ctx, grad):
    g = _ops.reduce_scatter(grad, ctx.cid, "sum", ctx.algo)
    return g.reshape(ctx.shape), None, None


# broadcast and reduce are each other's transpose, and take the same
# algorithms: the backward runs on the forward's.
def _setup_broadcast(ctx, inputs, output):
    _, ctx.cid, ctx.root, ctx.algo = inputs


def _backward_broadcast(ctx, grad):
    # the sum of every rank's gradient, on the root; nothing elsewhere
    g = _ops.reduce(grad, ctx.cid, ctx.root, "sum", ctx.algo)
    if get_communicator(ctx.cid).rank != ctx.root:
        g = torch.zeros_like(g)
    return g, None, None, None


def _setup_reduce(ctx, inputs, output):
    _, ctx.cid, ctx.root, ctx.op, ctx.algo = inputs


def _backward_reduce(ctx, grad):
    if ctx.op not in ("sum", "avg"):
        raise _no_gradient("reduce", ctx.op)
    # the root's gradient reaches every rank; other ranks' outputs are not
    # results, so their gradients do not count
    g = _ops.broadcast(grad, ctx.cid, ctx.root, ctx.algo)
    if ctx.op == "avg":
        g = g / _nranks(ctx.cid)
    return g, None, None, None, None


_all_reduce_op.register_autograd(_backward_all_reduce,
                                 setup_context=_setup_all_reduce)
_reduce_scatter_op.register_autograd(_backward_reduce_scatter,
                                     setup_context=_setup_reduce_scatter)
_all_gather_op.register_autograd(_backward_all_gather,
                                 setup_context=_setup_all_gather)
_broadcast_op.register_autograd(_backward_broadcast,
                                setup_context=_setup_broadcast)
_reduce_op.register_autograd(_backward_reduce, setup_context=_setup_reduce)


# ------------------------------------------------------------ public calls

def all_reduce(x: torch.Tensor, comm, op: str = "sum",
               algo: str = "auto") -> torch.Tensor:
    """Out-of-place all-reduce as the custom op symnccl::all_reduce
    (differentiable, traceable by torch.compile, capturable in CUDA
    graphs).

    Example::

        y = symnccl.torch.all_reduce(x, comm, op="max")
    """
    return _ops.all_reduce(x, comm_id(comm), op, algo)


def all_reduce_(x: torch.Tensor, comm, op: str = "sum",
                algo: str = "auto") -> torch.Tensor:
    """In-place all-reduce as the custom op symnccl::all_reduce_; returns x.

    A tensor that autograd records (requires_grad, not a leaf) is written
    through copy_ of the differentiable all_reduce, so its history stays
    right; a leaf that requires grad is reduced as torch.distributed does,
    outside autograd.

    Example::

        symnccl.torch.all_reduce_(grad, comm, op="avg")
    """
    cid = comm_id(comm)
    if x.requires_grad and torch.is_grad_enabled():
        if not x.is_leaf:
            return x.copy_(_ops.all_reduce(x, cid, op, algo))
        with torch.no_grad():
            _ops.all_reduce_(x, cid, op, algo)
        return x
    _ops.all_reduce_(x, cid, op, algo)
    return x


def reduce_scatter(x: torch.Tensor, comm, op: str = "sum",
                   algo: str = "auto") -> torch.Tensor:
    """Reduce-scatter along dim 0, as reduce_scatter_tensor: x of shape
    (nranks * m, ...) gives this rank's block (m, ...) of the reduction.
    Backward: an all-gather of the gradient (divided by nranks for avg).

    Example::

        z = symnccl.torch.reduce_scatter(h @ w_row, comm)   # (T, H)
    """
    return _ops.reduce_scatter(x, comm_id(comm), op, algo)


def all_gather(x: torch.Tensor, comm, algo: str = "auto") -> torch.Tensor:
    """All-gather along dim 0, as all_gather_into_tensor: x of shape
    (m, ...) gives (nranks * m, ...), rank r's block at rows [r*m, r*m+m).
    Backward: a reduce-scatter (sum) of the gradient.

    Example::

        h = symnccl.torch.all_gather(x_shard, comm)         # (n * T, H)
    """
    return _ops.all_gather(x, comm_id(comm), algo)


def broadcast(x: torch.Tensor, comm, root: int = 0,
              algo: str = "auto") -> torch.Tensor:
    """Root's x on every rank, as a new tensor. Backward: the sum of the
    gradients reaches the root's x (a reduce on the same algo); other
    ranks' x get zeros. algo: "one_shot" runs symnccl's kernel, "nccl"
    NCCL, "auto" the measured table (symnccl.COLLECTIVE_AUTO_TABLE).

    Example::

        w = symnccl.torch.broadcast(w, comm, root=0)
    """
    return _ops.broadcast(x, comm_id(comm), root, algo)


def reduce(x: torch.Tensor, comm, root: int = 0, op: str = "sum",
           algo: str = "auto") -> torch.Tensor:
    """The reduction of every rank's x, on root (a new tensor; on other
    ranks its contents are unspecified, as torch.distributed.reduce
    leaves them). Backward (sum, avg): the root's gradient, broadcast on
    the same algo. algo: "one_shot" runs symnccl's kernel (the bits of
    all_reduce), "nccl" NCCL, "auto" the measured table
    (symnccl.COLLECTIVE_AUTO_TABLE).

    Example::

        total = symnccl.torch.reduce(loss, comm, root=0, algo="one_shot")
    """
    return _ops.reduce(x, comm_id(comm), root, op, algo)
