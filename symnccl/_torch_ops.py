"""symnccl.torch's custom ops: one torch.library op per collective
(torch.ops.symnccl.*), its fake kernel and its work (the _impl functions,
which the eager path calls without the op). Their autograd formulas are
symnccl/_torch_autograd.py's."""
from __future__ import annotations

from typing import Optional

import torch

from ._torch_ids import get_communicator


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
