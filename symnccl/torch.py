"""PyTorch integration: communicators bootstrapped over torch.distributed,
and symnccl collectives as torch.library custom ops with autograd, so they
work in eager mode, in training (backward), under torch.compile(fullgraph=
True) with AOTAutograd, and inside CUDA graphs.

Gradients. Each op's backward runs on symnccl (the forward's algo):

=================  ========================  ============================
op                 forward                   gradient of x (backward)
=================  ========================  ============================
all_reduce (sum)   sum over ranks of x       all_reduce (sum) of the
                                             gradient, as
                                             torch.distributed.nn's
tp_all_reduce      sum over ranks of x       the gradient itself
                                             (identity)
tp_copy            x itself (identity)       all_reduce (sum) of the
                                             gradient
reduce_scatter     this rank's block of the  all_gather of the gradient
                   sum                       (/ nranks for avg)
all_gather         every rank's x, stacked   reduce_scatter (sum) of the
                   on dim 0                  gradient
broadcast          root's x                  reduce (sum) to the root;
                                             zeros elsewhere
reduce             the sum, on root          broadcast of the root's
                                             gradient
=================  ========================  ============================

(all_reduce avg divides by nranks, max and min send the gradient to the
ranks whose x is the result; prod has no gradient.)

Which all-reduce to use: the two gradients answer two questions.

- ``all_reduce`` when every rank's output feeds a loss of its own and the
  loss trained is the sum of the ranks' losses (each rank's y is a
  different term): the gradient of x is the sum of every rank's.
- ``tp_all_reduce`` to close a row-parallel layer (Megatron style) whose
  output feeds computation that every rank repeats identically: the loss
  counts once, and each rank's partial sum gets the gradient of y as it
  is. ``all_reduce`` there would give nranks times the gradient.
- ``tp_copy`` to open a column-parallel layer: the input is replicated,
  each rank uses it with its own shard of the weights, so its gradient is
  the sum of the ranks' gradients.

A tensor-parallel MLP is ``tp_all_reduce(gelu(tp_copy(x) @ w1) @ w2)``,
with w1 split by columns and w2 by rows; a sequence-parallel one replaces
the pair by all_gather and reduce_scatter.

Eager calls. Outside torch.compile and tracing (no dispatch, function or
functorch mode active, no torch.jit.trace; a plain CUDA tensor, not a
subclass), each function calls the Communicator's method directly, as
cheap as the method; a tensor that autograd records goes through a
torch.autograd.Function with the same gradients as the op's.
torch.compile, make_fx and export see the custom ops (torch.ops.symnccl.*),
with their fake kernels and autograd formulas.

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

    # tensor parallel: column-parallel w1, row-parallel w2
    y = snt.tp_all_reduce(torch.relu(snt.tp_copy(x, comm) @ w1) @ w2, comm)

    # sequence parallel: gather the sequence, scatter the sum back
    h = snt.all_gather(x_shard, comm)            # (n * T, H), differentiable
    z = snt.reduce_scatter(h @ w, comm)          # (T, H)

JAX needs no such pair: lax.psum's transpose follows shard_map's varying
and invariant types, so its gradient is already the right one.
"""
from __future__ import annotations

import itertools
import os
import threading
from typing import Optional

import torch

import symnccl

__all__ = ["Communicator", "communicator", "wrap", "all_reduce",
           "all_reduce_", "reduce_scatter", "all_gather", "broadcast",
           "reduce", "tp_all_reduce", "tp_copy", "all_reduce_add_rmsnorm",
           "comm_id",
           "get_communicator"]

# Custom ops cannot take Python objects: communicators are passed by id.
# The registry keeps open communicators alive until interpreter exit (where
# symnccl closes whatever is still open); closed and aborted ones leave it
# at the next registration (_prune), so abort-and-rebuild does not keep
# every dead communicator.
_COMMS: dict[int, symnccl.Communicator] = {}
_IDS: dict[int, int] = {}          # id(comm) -> registry id
_next_id = itertools.count(1)
_lock = threading.Lock()
_bootstraps: dict[str, itertools.count] = {}


def _prune() -> None:
    """Drops the closed and aborted communicators (caller holds _lock)."""
    for cid in [cid for cid, c in _COMMS.items()
                if getattr(c, "closed", False)]:
        c = _COMMS.pop(cid)
        if _IDS.get(id(c)) == cid:
            del _IDS[id(c)]


def _register(comm) -> int:
    with _lock:
        _prune()
        cid = next(_next_id)
        _COMMS[cid] = comm
        _IDS[id(comm)] = cid
    return cid


def get_communicator(cid: int) -> symnccl.Communicator:
    """The communicator registered under id `cid` (see communicator())."""
    try:
        return _COMMS[cid]
    except KeyError:
        raise ValueError(f"no symnccl communicator with id {cid} (closed "
                         "and aborted ones leave the registry)") from None


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
        with _lock:
            _prune()

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


def communicator(group=None, device=None,
                 timeout: float = symnccl._C.DEFAULT_TIMEOUT,
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
    timeout = symnccl._C._check_timeout(timeout)   # before any rendezvous
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
# Each op's work is an _impl function of the communicator itself, which
# the eager path (below) calls without the op: both give the same bits.
# The methods' arguments go by position (x, out, ...: their C signatures),
# which spares the keyword dict of every call.


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


def _all_reduce_impl(comm, x, op, algo):
    x = x.contiguous()
    out = torch.empty_like(x)   # _like(x): x is contiguous
    comm.all_reduce(x, out, op, algo)
    return out


def _check_inplace(x):
    if not x.is_contiguous():
        raise ValueError("all_reduce_ needs a contiguous tensor, got strides "
                         f"{tuple(x.stride())} for shape {tuple(x.shape)}")


def _reduce_scatter_impl(comm, x, op, algo):
    if x.dim() and x.size(0) % comm.nranks == 0:
        # the method makes the (m, ...) output in C, as _scatter_shape
        return comm.reduce_scatter(x.contiguous(), None, op, algo)
    out = x.new_empty(_scatter_shape(x, comm.nranks))   # raises
    comm.reduce_scatter(x.contiguous(), out, op, algo)
    return out


def _all_gather_impl(comm, x, algo):
    # the method makes the output in C, of _gather_shape's shape
    return comm.all_gather(x.contiguous(), None, algo)


def _broadcast_impl(comm, x, root, algo):
    x = x.contiguous()
    out = torch.empty_like(x)   # _like(x): x is contiguous
    comm.broadcast(x, root, out, algo)
    return out


def _reduce_impl(comm, x, root, op, algo):
    x = x.contiguous()
    out = torch.empty_like(x)   # _like(x): x is contiguous
    comm.reduce(x, root, out, op, algo)
    return out


def _tp_all_reduce_impl(comm, x, algo):
    return _all_reduce_impl(comm, x, "sum", algo)


@torch.library.custom_op("symnccl::all_reduce", mutates_args=())
def _all_reduce_op(x: torch.Tensor, comm_id: int, op: str,
                   algo: str) -> torch.Tensor:
    return _all_reduce_impl(get_communicator(comm_id), x, op, algo)


@_all_reduce_op.register_fake
def _(x, comm_id, op, algo):
    return _like(x)


@torch.library.custom_op("symnccl::all_reduce_", mutates_args=("x",))
def _all_reduce_inplace_op(x: torch.Tensor, comm_id: int, op: str,
                           algo: str) -> None:
    _check_inplace(x)
    get_communicator(comm_id).all_reduce(x, op=op, algo=algo)


@_all_reduce_inplace_op.register_fake
def _(x, comm_id, op, algo):
    return None


@torch.library.custom_op("symnccl::reduce_scatter", mutates_args=())
def _reduce_scatter_op(x: torch.Tensor, comm_id: int, op: str,
                       algo: str) -> torch.Tensor:
    return _reduce_scatter_impl(get_communicator(comm_id), x, op, algo)


@_reduce_scatter_op.register_fake
def _(x, comm_id, op, algo):
    return x.new_empty(_scatter_shape(x, _nranks(comm_id)))


@torch.library.custom_op("symnccl::all_gather", mutates_args=())
def _all_gather_op(x: torch.Tensor, comm_id: int,
                   algo: str) -> torch.Tensor:
    return _all_gather_impl(get_communicator(comm_id), x, algo)


@_all_gather_op.register_fake
def _(x, comm_id, algo):
    return x.new_empty(_gather_shape(x, _nranks(comm_id)))


@torch.library.custom_op("symnccl::broadcast", mutates_args=())
def _broadcast_op(x: torch.Tensor, comm_id: int, root: int,
                  algo: str) -> torch.Tensor:
    return _broadcast_impl(get_communicator(comm_id), x, root, algo)


@_broadcast_op.register_fake
def _(x, comm_id, root, algo):
    return _like(x)


@torch.library.custom_op("symnccl::reduce", mutates_args=())
def _reduce_op(x: torch.Tensor, comm_id: int, root: int, op: str,
               algo: str) -> torch.Tensor:
    return _reduce_impl(get_communicator(comm_id), x, root, op, algo)


@_reduce_op.register_fake
def _(x, comm_id, root, op, algo):
    return _like(x)


@torch.library.custom_op("symnccl::tp_all_reduce", mutates_args=())
def _tp_all_reduce_op(x: torch.Tensor, comm_id: int,
                      algo: str) -> torch.Tensor:
    return _tp_all_reduce_impl(get_communicator(comm_id), x, algo)


@_tp_all_reduce_op.register_fake
def _(x, comm_id, algo):
    return _like(x)


def _all_reduce_add_rmsnorm_impl(comm, x, residual, weight, eps, algo):
    y, h = _like(x), _like(x)
    comm.all_reduce_rmsnorm(x.contiguous(), residual.contiguous(),
                            weight.contiguous(), eps, out=y, residual_out=h,
                            algo=algo)
    return y, h


@torch.library.custom_op("symnccl::all_reduce_add_rmsnorm", mutates_args=())
def _all_reduce_add_rmsnorm_op(x: torch.Tensor, comm_id: int,
                               residual: torch.Tensor, weight: torch.Tensor,
                               eps: float, algo: str
                               ) -> tuple[torch.Tensor, torch.Tensor]:
    return _all_reduce_add_rmsnorm_impl(get_communicator(comm_id), x,
                                        residual, weight, eps, algo)


@_all_reduce_add_rmsnorm_op.register_fake
def _(x, comm_id, residual, weight, eps, algo):
    return _like(x), _like(x)


def _all_reduce_add_rmsnorm_fp8_impl(comm, x, residual, weight, eps, scale,
                                     algo):
    y = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    h = _like(x)
    if scale is None:
        quant, scale = "fp8_dynamic", x.new_empty((*x.shape[:-1], 1),
                                                  dtype=torch.float32)
    else:
        quant = "fp8_static"
    comm.all_reduce_rmsnorm(x.contiguous(), residual.contiguous(),
                            weight.contiguous(), eps, out=y, residual_out=h,
                            quant=quant, scale=scale, algo=algo)
    return y, h, scale if quant == "fp8_dynamic" else scale.clone()


@torch.library.custom_op("symnccl::all_reduce_add_rmsnorm_fp8",
                         mutates_args=())
def _all_reduce_add_rmsnorm_fp8_op(
        x: torch.Tensor, comm_id: int, residual: torch.Tensor,
        weight: torch.Tensor, eps: float, scale: Optional[torch.Tensor],
        algo: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _all_reduce_add_rmsnorm_fp8_impl(get_communicator(comm_id), x,
                                            residual, weight, eps, scale,
                                            algo)


@_all_reduce_add_rmsnorm_fp8_op.register_fake
def _(x, comm_id, residual, weight, eps, scale, algo):
    y = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    s = (x.new_empty((*x.shape[:-1], 1), dtype=torch.float32)
         if scale is None else torch.empty_like(scale))
    return y, _like(x), s


_ops = torch.ops.symnccl


# ------------------------------------------------------------- eager calls
#
# The custom op's dispatch (autograd, ADInplaceOrView, the Python kernel)
# costs 4-5x a direct method call (issue 29's table). Where nothing can
# observe the difference -- no compile or trace, no mode that would see
# the op, a plain CUDA tensor -- the functions call the _impl directly.

_is_compiling = torch.compiler.is_compiling
_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._is_torch_function_mode_enabled
_functorch = torch._C._are_functorch_transforms_active
_jit_tracing = torch._C._get_tracing_state   # torch.jit.trace records ops
_grad_enabled = torch.is_grad_enabled
# what torch.autograd.graph.increment_version calls, without its frame:
# _bump_version((x,))
_bump_version = torch._C._increment_version
# Tensor subclasses (FakeTensor, FunctionalTensor, DTensor, ...) may
# dispatch the op themselves: only these two types skip it.
_PLAIN = (torch.Tensor, torch.nn.Parameter)
# torch's queries of what must see the ops: each returns a false value
# when no mode, transform or tracer is active
_TRACERS = (_dispatch_modes, _function_modes, _functorch, _jit_tracing)


def _install_gate(attr: str = "is_cuda") -> None:
    """_C._torch_eager's parts: the eager path takes a tensor whose `attr`
    is true (the CPU tests install "is_cpu")."""
    symnccl._C._torch_eager_install(_PLAIN, attr, _TRACERS, _grad_enabled)


_install_gate()
_eager_gate = symnccl._C._torch_eager
# _eager's value when autograd records the call
_RECORDED = 2


def _eager(x) -> int:
    """Whether a call on x may skip the custom op (true: x's type is one
    of _PLAIN, it is on CUDA, and no mode, transform or tracer is active
    that must see the ops), and whether autograd records it: 0, 1, or
    _RECORDED when x requires grad and grad mode is on. One C call,
    _C._torch_eager. is_compiling() comes first: Dynamo reads it as the
    constant True and traces nothing after it, so compiled code always
    holds the op."""
    return 0 if _is_compiling() else _eager_gate(x)


def _raw(comm):
    """The symnccl.Communicator behind comm (a wrapper or itself)."""
    return comm.comm if isinstance(comm, Communicator) else comm


def _autograd_function(name, impl, setup, backward):
    """A torch.autograd.Function running impl with the op's autograd
    formula: the eager path of a call that autograd records. forward takes
    ctx (no setup_context staticmethod: Function.apply then skips binding
    the arguments by inspect.signature, most of its cost)."""
    def forward(ctx, x, cid, *args):
        y = impl(get_communicator(cid), x, *args)
        setup(ctx, (x, cid, *args), y)
        return y
    fn = type(name, (torch.autograd.Function,),
              {"forward": staticmethod(forward),
               "backward": staticmethod(backward)})
    fn.eager_apply = _C_APPLY.__get__(None, fn)
    return fn


# Function.apply is a Python layer (functorch's dead-wrapper unwrapping,
# argument binding) over this C++ apply, and costs a third of an eager
# call that autograd records (docs/PERFORMANCE.md, 'Eager host path').
# _eager() has ruled out functorch transforms; a tensor a finished
# transform left wrapped still takes the Python layer.
_C_APPLY = torch._C._FunctionBase.__dict__["apply"]
_functorch_wrapped = torch._C._functorch.is_functorch_wrapped_tensor


def _eager_call(mode, fn, impl, x, comm, *args):
    """The eager path of a call whose _eager(x) is mode (not 0)."""
    if mode == _RECORDED:
        if _functorch_wrapped(x):
            return fn.apply(x, comm_id(comm), *args)
        return fn.eager_apply(x, comm_id(comm), *args)
    return impl(_raw(comm), x, *args)


# The backward formulas' collectives, by communicator id: eager or the op,
# as the public functions below choose.
def _call_all_reduce(x, cid, op, algo):
    if (m := _eager(x)):
        return _eager_call(m, _AllReduceFn, _all_reduce_impl, x,
                           get_communicator(cid), op, algo)
    return _ops.all_reduce(x, cid, op, algo)


def _call_reduce_scatter(x, cid, op, algo):
    if (m := _eager(x)):
        return _eager_call(m, _ReduceScatterFn, _reduce_scatter_impl, x,
                           get_communicator(cid), op, algo)
    return _ops.reduce_scatter(x, cid, op, algo)


def _call_all_gather(x, cid, algo):
    if (m := _eager(x)):
        return _eager_call(m, _AllGatherFn, _all_gather_impl, x,
                           get_communicator(cid), algo)
    return _ops.all_gather(x, cid, algo)


def _call_broadcast(x, cid, root, algo):
    if (m := _eager(x)):
        return _eager_call(m, _BroadcastFn, _broadcast_impl, x,
                           get_communicator(cid), root, algo)
    return _ops.broadcast(x, cid, root, algo)


def _call_reduce(x, cid, root, op, algo):
    if (m := _eager(x)):
        return _eager_call(m, _ReduceFn, _reduce_impl, x,
                           get_communicator(cid), root, op, algo)
    return _ops.reduce(x, cid, root, op, algo)


# ------------------------------------------------------------------ autograd
#
# max and min: the gradient goes to the ranks whose input is the result,
# split evenly among ties (as torch.amax splits it); sum and avg: the
# transposed collective (avg divides by nranks, once). The formulas serve
# the ops (register_autograd) and the eager Functions alike.


def _arg_extreme_share(x, y, grad_sum, cid):
    """grad_sum where x holds the reduced value y, over the number of ranks
    that hold it."""
    hit = (x == y).to(grad_sum.dtype)
    return grad_sum * hit / _call_all_reduce(hit, cid, "sum", "auto")


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
        return _call_all_reduce(grad, ctx.cid, ctx.op, ctx.algo), \
            None, None, None
    x, y = ctx.saved_tensors
    g = _call_all_reduce(grad, ctx.cid, "sum", ctx.algo)
    return _arg_extreme_share(x, y, g, ctx.cid), None, None, None


def _setup_reduce_scatter(ctx, inputs, output):
    x, ctx.cid, ctx.op, ctx.algo = inputs
    if ctx.op in ("max", "min"):
        ctx.save_for_backward(x, output)


def _backward_reduce_scatter(ctx, grad):
    if ctx.op == "prod":
        raise _no_gradient("reduce_scatter", ctx.op)
    # the same algorithm: reduce_scatter and all_gather take the same ones
    g = _call_all_gather(grad, ctx.cid, ctx.algo)
    if ctx.op == "avg":
        g = g / _nranks(ctx.cid)
    elif ctx.op in ("max", "min"):
        x, y = ctx.saved_tensors
        g = _arg_extreme_share(x, _call_all_gather(y, ctx.cid, ctx.algo), g,
                               ctx.cid)
    return g, None, None, None


def _setup_all_gather(ctx, inputs, output):
    x, ctx.cid, ctx.algo = inputs
    ctx.shape = x.shape   # a 0-d x gathers into (nranks,)


def _backward_all_gather(ctx, grad):
    g = _call_reduce_scatter(grad, ctx.cid, "sum", ctx.algo)
    return g.reshape(ctx.shape), None, None


# broadcast and reduce are each other's transpose, and take the same
# algorithms: the backward runs on the forward's.
def _setup_broadcast(ctx, inputs, output):
    _, ctx.cid, ctx.root, ctx.algo = inputs


def _backward_broadcast(ctx, grad):
    # the sum of every rank's gradient, on the root; nothing elsewhere
    g = _call_reduce(grad, ctx.cid, ctx.root, "sum", ctx.algo)
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
    g = _call_broadcast(grad, ctx.cid, ctx.root, ctx.algo)
    if ctx.op == "avg":
        g = g / _nranks(ctx.cid)
    return g, None, None, None, None


def _setup_tp_all_reduce(ctx, inputs, output):
    pass


def _backward_tp_all_reduce(ctx, grad):
    # the sum's output feeds replicated computation: each rank's partial
    # sum gets the gradient of the sum as it is
    return grad, None, None


_all_reduce_op.register_autograd(_backward_all_reduce,
                                 setup_context=_setup_all_reduce)
_reduce_scatter_op.register_autograd(_backward_reduce_scatter,
                                     setup_context=_setup_reduce_scatter)
_all_gather_op.register_autograd(_backward_all_gather,
                                 setup_context=_setup_all_gather)
_broadcast_op.register_autograd(_backward_broadcast,
                                setup_context=_setup_broadcast)
_reduce_op.register_autograd(_backward_reduce, setup_context=_setup_reduce)
_tp_all_reduce_op.register_autograd(_backward_tp_all_reduce,
                                    setup_context=_setup_tp_all_reduce)

def _setup_all_reduce_add_rmsnorm(ctx, inputs, output):
    _, ctx.cid, _, weight, ctx.eps, ctx.algo = inputs
    ctx.save_for_backward(output[1], weight)


def _backward_all_reduce_add_rmsnorm(ctx, gy, gh):
    """The unfused composition's: y = rms_norm(h) * weight with h =
    all_reduce(x) + residual, so h's gradient (gh plus the norm's) is
    residual's, and its all_reduce (sum) is x's."""
    h, weight = ctx.saved_tensors
    hf, wf = h.float(), weight.float()
    rstd = torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + ctx.eps)
    normed = hf * rstd
    gw = None
    g = torch.zeros_like(hf) if gh is None else gh.float()
    if gy is not None:
        gyf = gy.float()
        gn = gyf * wf
        g = g + rstd * (gn - normed * (gn * normed).mean(-1, keepdim=True))
        if getattr(ctx, "needs_input_grad", (True,) * 4)[3]:
            gw = (gyf * normed).reshape(-1, wf.shape[-1]).sum(0).to(
                weight.dtype)
    g = g.to(h.dtype)
    return _call_all_reduce(g, ctx.cid, "sum", "auto"), None, g, gw, None, \
        None


_all_reduce_add_rmsnorm_op.register_autograd(
    _backward_all_reduce_add_rmsnorm,
    setup_context=_setup_all_reduce_add_rmsnorm)

_AllReduceFn = _autograd_function("_AllReduceFn", _all_reduce_impl,
                                  _setup_all_reduce, _backward_all_reduce)
_ReduceScatterFn = _autograd_function(
    "_ReduceScatterFn", _reduce_scatter_impl, _setup_reduce_scatter,
    _backward_reduce_scatter)
_AllGatherFn = _autograd_function("_AllGatherFn", _all_gather_impl,
                                  _setup_all_gather, _backward_all_gather)
_BroadcastFn = _autograd_function("_BroadcastFn", _broadcast_impl,
                                  _setup_broadcast, _backward_broadcast)
_ReduceFn = _autograd_function("_ReduceFn", _reduce_impl, _setup_reduce,
                               _backward_reduce)
_AllReduceAddRMSNormFn = _autograd_function(
    "_AllReduceAddRMSNormFn", _all_reduce_add_rmsnorm_impl,
    _setup_all_reduce_add_rmsnorm, _backward_all_reduce_add_rmsnorm)
_TPAllReduceFn = _autograd_function(
    "_TPAllReduceFn", _tp_all_reduce_impl, _setup_tp_all_reduce,
    _backward_tp_all_reduce)


class _TPCopyFn(torch.autograd.Function):
    """tp_copy: the identity forward, an all_reduce (sum) of the gradient
    backward. No custom op: an op may not return its input, so one would
    copy x; Dynamo traces this Function, and the backward's all_reduce is
    the symnccl::all_reduce op in the compiled graph."""

    @staticmethod
    def forward(ctx, x, cid, algo):
        ctx.cid, ctx.algo = cid, algo
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _call_all_reduce(grad, ctx.cid, "sum", ctx.algo), None, None


# ------------------------------------------------------------ public calls

def all_reduce(x: torch.Tensor, comm, op: str = "sum",
               algo: str = "auto") -> torch.Tensor:
    """Out-of-place all-reduce: the custom op symnccl::all_reduce
    (differentiable, traceable by torch.compile, capturable in CUDA
    graphs), or in eager mode the same work without the op's dispatch.
    Backward: an all_reduce of the gradient (torch.distributed.nn's; see
    tp_all_reduce for a tensor-parallel layer).

    Example::

        y = symnccl.torch.all_reduce(x, comm, op="max")
    """
    if (m := _eager(x)):
        return _eager_call(m, _AllReduceFn, _all_reduce_impl, x, comm, op,
                           algo)
    return _ops.all_reduce(x, comm_id(comm), op, algo)


def all_reduce_(x: torch.Tensor, comm, op: str = "sum",
                algo: str = "auto") -> torch.Tensor:
    """In-place all-reduce as the custom op symnccl::all_reduce_ (in eager
    mode the method itself, with the op's version-counter bump); returns x.

    A tensor that autograd records (requires_grad, not a leaf) is written
    through copy_ of the differentiable all_reduce, so its history stays
    right; a leaf that requires grad is reduced as torch.distributed does,
    outside autograd.

    Example::

        symnccl.torch.all_reduce_(grad, comm, op="avg")
    """
    m = _eager(x)
    recorded = m == _RECORDED if m else (x.requires_grad and
                                         torch.is_grad_enabled())
    if m and (not recorded or x.is_leaf) and x.is_contiguous():
        _raw(comm).all_reduce(x, None, op, algo)
        _bump_version((x,))   # as the op's ADInplaceOrView kernel does
        return x
    cid = comm_id(comm)
    if recorded:
        if not x.is_leaf:
            return x.copy_(all_reduce(x, comm, op, algo))
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
    if (m := _eager(x)):
        return _eager_call(m, _ReduceScatterFn, _reduce_scatter_impl, x, comm,
                           op, algo)
    return _ops.reduce_scatter(x, comm_id(comm), op, algo)


def all_gather(x: torch.Tensor, comm, algo: str = "auto") -> torch.Tensor:
    """All-gather along dim 0, as all_gather_into_tensor: x of shape
    (m, ...) gives (nranks * m, ...), rank r's block at rows [r*m, r*m+m).
    Backward: a reduce-scatter (sum) of the gradient.

    Example::

        h = symnccl.torch.all_gather(x_shard, comm)         # (n * T, H)
    """
    if (m := _eager(x)):
        return _eager_call(m, _AllGatherFn, _all_gather_impl, x, comm, algo)
    return _ops.all_gather(x, comm_id(comm), algo)


def broadcast(x: torch.Tensor, comm, root: int = 0,
              algo: str = "auto") -> torch.Tensor:
    """Root's x on every rank, as a new tensor. Backward: the sum of the
    gradients reaches the root's x (a reduce on the same algo); other
    ranks' x get zeros. algo: "one_shot" runs symnccl's kernel, "nccl"
    NCCL, "auto" the measured table (symnccl.AUTO_TABLE).

    Example::

        w = symnccl.torch.broadcast(w, comm, root=0)
    """
    if (m := _eager(x)):
        return _eager_call(m, _BroadcastFn, _broadcast_impl, x, comm, root,
                           algo)
    return _ops.broadcast(x, comm_id(comm), root, algo)


def reduce(x: torch.Tensor, comm, root: int = 0, op: str = "sum",
           algo: str = "auto") -> torch.Tensor:
    """The reduction of every rank's x, on root (a new tensor; on other
    ranks its contents are unspecified, as torch.distributed.reduce
    leaves them). Backward (sum, avg): the root's gradient, broadcast on
    the same algo. algo: "one_shot" runs symnccl's kernel (the bits of
    all_reduce), "nccl" NCCL, "auto" the measured table
    (symnccl.AUTO_TABLE).

    Example::

        total = symnccl.torch.reduce(loss, comm, root=0, algo="one_shot")
    """
    if (m := _eager(x)):
        return _eager_call(m, _ReduceFn, _reduce_impl, x, comm, root, op, algo)
    return _ops.reduce(x, comm_id(comm), root, op, algo)


def tp_all_reduce(x: torch.Tensor, comm, algo: str = "auto") -> torch.Tensor:
    """The sum over ranks of x (a new tensor) whose backward is the
    identity: it closes a row-parallel layer whose output feeds
    computation every rank repeats (the custom op symnccl::tp_all_reduce;
    the module docstring's table says when to use it and when all_reduce).

    Example (Megatron-style MLP, w1 split by columns, w2 by rows)::

        h = torch.nn.functional.gelu(symnccl.torch.tp_copy(x, comm) @ w1)
        y = symnccl.torch.tp_all_reduce(h @ w2, comm) + b2
    """
    if (m := _eager(x)):
        return _eager_call(m, _TPAllReduceFn, _tp_all_reduce_impl, x, comm,
                           algo)
    return _ops.tp_all_reduce(x, comm_id(comm), algo)


def tp_copy(x: torch.Tensor, comm, algo: str = "auto") -> torch.Tensor:
    """x itself forward; backward, the sum over ranks of the gradient (an
    all_reduce on algo): it opens a column-parallel layer whose input
    every rank holds whole. Without autograd it returns x and runs
    nothing.

    Example::

        h = symnccl.torch.tp_copy(x, comm) @ w1_columns   # (T, F / n)
    """
    if x.requires_grad and torch.is_grad_enabled():
        return _TPCopyFn.apply(x, comm_id(comm), algo)
    return x


def all_reduce_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor,
                           weight: torch.Tensor, eps: float, comm,
                           algo: str = "auto", quant: str | None = None,
                           scale: torch.Tensor | None = None):
    """The tensor-parallel all-reduce fused with the residual add and
    RMSNorm after it (Communicator.all_reduce_rmsnorm, the custom op
    symnccl::all_reduce_add_rmsnorm): returns (y, h) with

        h = all_reduce(x) + residual
        y = h * rsqrt(mean(h * h, -1) + eps) * weight

    in vLLM's fused_add_rms_norm numerics (h rounded to x's dtype before
    the norm, the norm in fp32). New tensors (the op mutates nothing; vLLM
    writes h into residual). Traceable by torch.compile(fullgraph=True),
    capturable in CUDA graphs; differentiable through the unfused
    composition (x's gradient is the all_reduce of h's).

    quant="fp8": returns (y, h, scale) with y float8_e4m3fn, y / scale
    saturated to +-448: scale the given float32 one-element tensor
    (static), else one per row computed in the kernel, shape (..., 1)
    (dynamic, vLLM's per-token scale). Not differentiable.

    Example::

        y, residual = symnccl.torch.all_reduce_add_rmsnorm(
            o_proj_partial, residual, norm.weight, 1e-6, comm)
        q, residual, s = symnccl.torch.all_reduce_add_rmsnorm(
            o_proj_partial, residual, norm.weight, 1e-6, comm, quant="fp8")
    """
    if quant is not None:
        if quant != "fp8":
            raise ValueError(f"quant={quant!r}, expected None or 'fp8'")
        if _eager(x):
            return _all_reduce_add_rmsnorm_fp8_impl(
                _raw(comm), x, residual, weight, eps, scale, algo)
        return _ops.all_reduce_add_rmsnorm_fp8(x, comm_id(comm), residual,
                                               weight, eps, scale, algo)
    if scale is not None:
        raise ValueError("scale= is given without quant='fp8'")
    if (m := _eager(x)):
        if m != _RECORDED and _grad_enabled() and (
                residual.requires_grad or weight.requires_grad):
            # autograd records the call for the residual's or the
            # weight's gradient (_eager_call looks at x alone)
            return _AllReduceAddRMSNormFn.apply(x, comm_id(comm), residual,
                                                weight, eps, algo)
        return _eager_call(m, _AllReduceAddRMSNormFn,
                           _all_reduce_add_rmsnorm_impl, x, comm, residual,
                           weight, eps, algo)
    return _ops.all_reduce_add_rmsnorm(x, comm_id(comm), residual, weight,
                                       eps, algo)
# --------------------------------------------------------------- all-to-all
#
# Expert parallelism (issue 32). all_to_all: equal blocks, its own
# transpose. all_to_all_v: uneven splits, which may stay on the device; the
# op returns the rows received and their counts (out_splits), and its
# backward sends every rank's gradient rows back where they came from: the
# all_to_all_v of the gradient with out_splits as its splits (the splits
# transposed), into x's rows (those x did not send get zeros).


def _all_to_all_impl(comm, x, algo):
    out = _like(x)
    comm.all_to_all(x.contiguous(), out, algo)
    return out


def _all_to_all_v_impl(comm, x, in_splits, out_rows, algo):
    out = x.new_zeros((out_rows, *x.shape[1:]))
    got = torch.empty(comm.nranks, dtype=torch.int64, device=x.device)
    comm.all_to_all_v(x.contiguous(), out, in_splits, got, algo)
    return out, got


@torch.library.custom_op("symnccl::all_to_all", mutates_args=())
def _all_to_all_op(x: torch.Tensor, comm_id: int, algo: str) -> torch.Tensor:
    return _all_to_all_impl(get_communicator(comm_id), x, algo)


@_all_to_all_op.register_fake
def _(x, comm_id, algo):
    return _like(x)


@torch.library.custom_op("symnccl::all_to_all_v", mutates_args=())
def _all_to_all_v_op(x: torch.Tensor, comm_id: int, in_splits: torch.Tensor,
                     out_rows: int, algo: str
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    return _all_to_all_v_impl(get_communicator(comm_id), x, in_splits,
                              out_rows, algo)


@_all_to_all_v_op.register_fake
def _(x, comm_id, in_splits, out_rows, algo):
    return (x.new_empty((out_rows, *x.shape[1:])),
            x.new_empty((_nranks(comm_id),), dtype=torch.int64))


def _call_all_to_all(x, cid, algo):
    if (m := _eager(x)):
        return _eager_call(m, _AllToAllFn, _all_to_all_impl, x,
                           get_communicator(cid), algo)
    return _ops.all_to_all(x, cid, algo)


def _setup_all_to_all(ctx, inputs, output):
    _, ctx.cid, ctx.algo = inputs


def _backward_all_to_all(ctx, grad):
    return _call_all_to_all(grad, ctx.cid, ctx.algo), None, None


def _setup_all_to_all_v(ctx, inputs, output):
    x, ctx.cid, _, _, ctx.algo = inputs
    ctx.x_rows = x.shape[0]
    ctx.save_for_backward(output[1])


def _backward_all_to_all_v(ctx, grad, _grad_splits):
    (got,) = ctx.saved_tensors
    if (m := _eager(grad)):
        gx, _ = _eager_call(m, _AllToAllVFn, _all_to_all_v_impl, grad,
                            get_communicator(ctx.cid), got, ctx.x_rows,
                            ctx.algo)
    else:
        gx, _ = _ops.all_to_all_v(grad, ctx.cid, got, ctx.x_rows, ctx.algo)
    return gx, None, None, None, None


_all_to_all_op.register_autograd(_backward_all_to_all,
                                 setup_context=_setup_all_to_all)
_all_to_all_v_op.register_autograd(_backward_all_to_all_v,
                                   setup_context=_setup_all_to_all_v)
_AllToAllFn = _autograd_function("_AllToAllFn", _all_to_all_impl,
                                 _setup_all_to_all, _backward_all_to_all)
_AllToAllVFn = _autograd_function("_AllToAllVFn", _all_to_all_v_impl,
                                  _setup_all_to_all_v, _backward_all_to_all_v)


def all_to_all(x: torch.Tensor, comm, algo: str = "auto") -> torch.Tensor:
    """All-to-all of equal blocks along dim 0, as
    torch.distributed.all_to_all_single without splits: x of shape
    (nranks * m, ...); block j goes to rank j, and block i of the result
    comes from rank i. Backward: the all_to_all of the gradient.
    algo: "push" runs symnccl's kernel, "nccl" (and "auto") NCCL's
    send/recv.

    Example::

        y = symnccl.torch.all_to_all(tokens, comm, algo="push")
    """
    if (m := _eager(x)):
        return _eager_call(m, _AllToAllFn, _all_to_all_impl, x, comm, algo)
    return _ops.all_to_all(x, comm_id(comm), algo)


def all_to_all_v(x: torch.Tensor, out: torch.Tensor, in_splits, comm,
                 algo: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Uneven all-to-all along dim 0 (a mixture-of-experts dispatch or
    combine): this rank sends in_splits[q] rows of x to rank q (in order),
    and receives the rows of ranks 0, 1, ... one after another. out is
    sized by the caller for the most rows this rank can receive (as
    all_to_all_vdev's); rows past those received are unspecified.
    in_splits: a device int64 tensor of nranks (with algo="push" nothing
    synchronises with the host, and CUDA graphs replay with new splits) or
    a list of ints. Returns (result, out_splits): the result is out, filled
    (a new tensor equal to it where autograd or torch.compile records the
    op), and out_splits the rows received from each rank (int64, device).
    Backward: the rows' gradients go back where they came from (the
    all_to_all_v with the splits transposed); rows of x not sent get zero.

    Example::

        counts = torch.bincount(expert_rank, minlength=n)       # device
        recv, got = symnccl.torch.all_to_all_v(x[order], buf, counts, comm,
                                               algo="push")
    """
    m = _eager(x)
    if m and m != _RECORDED:
        got = torch.empty(_raw(comm).nranks, dtype=torch.int64,
                          device=x.device)
        _raw(comm).all_to_all_v(x.contiguous(), out, in_splits, got, algo)
        return out, got
    if m:
        y, got = _AllToAllVFn.apply(x, comm_id(comm), in_splits,
                                    out.shape[0], algo)
    else:
        if not isinstance(in_splits, torch.Tensor):
            in_splits = torch.tensor(list(in_splits), dtype=torch.int64,
                                     device=x.device)
        y, got = _ops.all_to_all_v(x, comm_id(comm), in_splits,
                                   out.shape[0], algo)
    with torch.no_grad():
        out.copy_(y)
    return y, got


# ------------------------------------------------ torch.distributed backend
# dist.init_process_group("symnccl"): symnccl/torch_backend.py.
if torch.distributed.is_available():
    from . import torch_backend as _torch_backend
    _torch_backend.register()
