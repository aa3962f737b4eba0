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

import torch

# The parts, each a module of its own: the id registry (communicators by id,
# the Communicator wrapper), the bootstrap over torch.distributed, the
# custom ops, the eager path and the autograd formulas. This module imports
# what its functions use, the public names, and the private ones the tests
# read (_COMMS, _IDS, _register, _lock, _prune, _install_gate).
from ._torch_ids import (  # noqa: F401
    _COMMS, _IDS, Communicator, _lock, _prune, _raw, _register, comm_id,
    get_communicator, wrap)
from ._torch_bootstrap import communicator
from ._torch_eager import (  # noqa: F401
    OPS, _RECORDED, _bump_version, _eager, _eager_call, _grad_enabled,
    _install_gate)
from ._torch_autograd import _TPCopyFn
from ._torch_ops import _ops

__all__ = ["Communicator", "communicator", "wrap", "all_reduce",
           "all_reduce_", "reduce_scatter", "all_gather", "broadcast",
           "reduce", "tp_all_reduce", "tp_copy", "all_reduce_add_rmsnorm",
           "comm_id",
           "get_communicator"]

# The public names defined in the parts read as symnccl.torch's (help(),
# reprs), as they did before the split.
for _f in (Communicator, wrap, comm_id, get_communicator, communicator):
    _f.__module__ = __name__
del _f


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
        return _eager_call(m, OPS.all_reduce, x, comm, op, algo)
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
        return _eager_call(m, OPS.reduce_scatter, x, comm, op, algo)
    return _ops.reduce_scatter(x, comm_id(comm), op, algo)


def all_gather(x: torch.Tensor, comm, algo: str = "auto") -> torch.Tensor:
    """All-gather along dim 0, as all_gather_into_tensor: x of shape
    (m, ...) gives (nranks * m, ...), rank r's block at rows [r*m, r*m+m).
    Backward: a reduce-scatter (sum) of the gradient.

    Example::

        h = symnccl.torch.all_gather(x_shard, comm)         # (n * T, H)
    """
    if (m := _eager(x)):
        return _eager_call(m, OPS.all_gather, x, comm, algo)
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
        return _eager_call(m, OPS.broadcast, x, comm, root, algo)
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
        return _eager_call(m, OPS.reduce, x, comm, root, op, algo)
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
        return _eager_call(m, OPS.tp_all_reduce, x, comm, algo)
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
            return OPS.all_reduce_add_rmsnorm_fp8.impl(
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
            return OPS.all_reduce_add_rmsnorm.fn.apply(
                x, comm_id(comm), residual, weight, eps, algo)
        return _eager_call(m, OPS.all_reduce_add_rmsnorm, x, comm, residual,
                           weight, eps, algo)
    return _ops.all_reduce_add_rmsnorm(x, comm_id(comm), residual, weight,
                                       eps, algo)


# --------------------------------------------------------------- all-to-all
# (symnccl/_torch_ops.py: the ops' rows; symnccl/_torch_autograd.py: backward)

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
        return _eager_call(m, OPS.all_to_all, x, comm, algo)
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
        y, got = OPS.all_to_all_v.fn.apply(x, comm_id(comm), in_splits,
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
