"""symnccl.torch's custom ops, declared in one table (TABLE): one row per
op names its schema, its work (an _impl function), its fake kernel and its
autograd formulas, and from the row come the torch.library op
(torch.ops.symnccl.<name>), its fake kernel, its autograd registration and
the eager path's TorchOp (OPS.<name>: the work and the eager autograd
Function, _torch_eager.py). The formulas are _torch_autograd.py's."""
from __future__ import annotations

import re

import torch

from ._torch_autograd import (
    _backward_all_gather, _backward_all_reduce,
    _backward_all_reduce_add_rmsnorm, _backward_all_to_all,
    _backward_all_to_all_v, _backward_broadcast, _backward_reduce,
    _backward_reduce_scatter, _backward_tp_all_reduce, _setup_all_gather,
    _setup_all_reduce, _setup_all_reduce_add_rmsnorm, _setup_all_to_all,
    _setup_all_to_all_v, _setup_broadcast, _setup_reduce,
    _setup_tp_all_reduce)
from ._torch_eager import OPS, TorchOp, _autograd_function
from ._torch_ids import _nranks, get_communicator


# -------------------------------------------------------------- their work
#
# Each op's work is an _impl function of the communicator itself, which
# the op runs and the eager path calls without the op: both give the same
# bits. The methods' arguments go by position (x, out, ...: their C
# signatures), which spares the keyword dict of every call.


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


def _all_reduce_inplace_impl(comm, x, op, algo):
    _check_inplace(x)
    comm.all_reduce(x, op=op, algo=algo)


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


def _all_reduce_add_rmsnorm_impl(comm, x, residual, weight, eps, algo):
    y, h = _like(x), _like(x)
    comm.all_reduce_rmsnorm(x.contiguous(), residual.contiguous(),
                            weight.contiguous(), eps, out=y, residual_out=h,
                            algo=algo)
    return y, h


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


# ------------------------------------------------------------ fake kernels
#
# Shapes for torch.compile, FakeTensorMode and make_fx; each takes the op's
# arguments (x, comm_id, ...).


def _fake_like(x, comm_id, *args):
    return _like(x)


def _fake_none(x, comm_id, *args):
    return None


def _fake_scattered(x, comm_id, *args):
    return x.new_empty(_scatter_shape(x, _nranks(comm_id)))


def _fake_gathered(x, comm_id, *args):
    return x.new_empty(_gather_shape(x, _nranks(comm_id)))


def _fake_two_like(x, comm_id, *args):
    return _like(x), _like(x)


def _fake_rmsnorm_fp8(x, comm_id, residual, weight, eps, scale, algo):
    y = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    s = (x.new_empty((*x.shape[:-1], 1), dtype=torch.float32)
         if scale is None else torch.empty_like(scale))
    return y, _like(x), s


def _fake_all_to_all_v(x, comm_id, in_splits, out_rows, algo):
    return (x.new_empty((out_rows, *x.shape[1:])),
            x.new_empty((_nranks(comm_id),), dtype=torch.int64))


# ------------------------------------------------------------------- table
#
# One row per op: its name (symnccl::<name>), its schema (every op takes x
# and the communicator's id first: communicators are passed by id; a
# Tensor(a!) argument is one the op mutates), its work, its fake kernel,
# and its autograd formulas (setup_context, backward; None: no gradient).
# Every op is out of place but all_reduce_; its formulas call the
# transposed ops, so AOTAutograd traces the backward too.

TABLE = (
    ("all_reduce", "(Tensor x, SymInt comm_id, str op, str algo) -> Tensor",
     _all_reduce_impl, _fake_like,
     (_setup_all_reduce, _backward_all_reduce)),
    ("all_reduce_",
     "(Tensor(a0!) x, SymInt comm_id, str op, str algo) -> ()",
     _all_reduce_inplace_impl, _fake_none, None),
    ("reduce_scatter",
     "(Tensor x, SymInt comm_id, str op, str algo) -> Tensor",
     _reduce_scatter_impl, _fake_scattered,
     (_setup_all_reduce, _backward_reduce_scatter)),
    ("all_gather", "(Tensor x, SymInt comm_id, str algo) -> Tensor",
     _all_gather_impl, _fake_gathered,
     (_setup_all_gather, _backward_all_gather)),
    ("broadcast",
     "(Tensor x, SymInt comm_id, SymInt root, str algo) -> Tensor",
     _broadcast_impl, _fake_like, (_setup_broadcast, _backward_broadcast)),
    ("reduce",
     "(Tensor x, SymInt comm_id, SymInt root, str op, str algo) -> Tensor",
     _reduce_impl, _fake_like, (_setup_reduce, _backward_reduce)),
    ("tp_all_reduce", "(Tensor x, SymInt comm_id, str algo) -> Tensor",
     _tp_all_reduce_impl, _fake_like,
     (_setup_tp_all_reduce, _backward_tp_all_reduce)),
    ("all_reduce_add_rmsnorm",
     "(Tensor x, SymInt comm_id, Tensor residual, Tensor weight, float eps, "
     "str algo) -> (Tensor, Tensor)",
     _all_reduce_add_rmsnorm_impl, _fake_two_like,
     (_setup_all_reduce_add_rmsnorm, _backward_all_reduce_add_rmsnorm)),
    ("all_reduce_add_rmsnorm_fp8",
     "(Tensor x, SymInt comm_id, Tensor residual, Tensor weight, float eps, "
     "Tensor? scale, str algo) -> (Tensor, Tensor, Tensor)",
     _all_reduce_add_rmsnorm_fp8_impl, _fake_rmsnorm_fp8, None),
    ("all_to_all", "(Tensor x, SymInt comm_id, str algo) -> Tensor",
     _all_to_all_impl, _fake_like, (_setup_all_to_all, _backward_all_to_all)),
    ("all_to_all_v",
     "(Tensor x, SymInt comm_id, Tensor in_splits, SymInt out_rows, "
     "str algo) -> (Tensor, Tensor)",
     _all_to_all_v_impl, _fake_all_to_all_v,
     (_setup_all_to_all_v, _backward_all_to_all_v)),
)


def _declare(name, schema, impl, fake, grad):
    """A row's op, fake kernel, autograd formula and TorchOp (OPS.<name>)."""
    def work(x, comm_id, *args):
        return impl(get_communicator(comm_id), x, *args)
    work.__name__ = work.__qualname__ = f"_{name}_op"
    op = torch.library.custom_op(
        f"symnccl::{name}", work, schema=schema,
        mutates_args=tuple(re.findall(r"Tensor\(\w+!\) (\w+)", schema)))
    op.register_fake(fake)
    fn = None
    if grad is not None:
        setup, backward = grad
        op.register_autograd(backward, setup_context=setup)
        fn = _autograd_function(
            "_" + name.title().replace("_", "") + "Fn", impl, setup, backward)
    setattr(OPS, name, TorchOp(name, getattr(torch.ops.symnccl, name), impl,
                               fn))


for _row in TABLE:
    _declare(*_row)
del _row

_ops = torch.ops.symnccl
