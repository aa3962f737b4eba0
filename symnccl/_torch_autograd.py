"""symnccl.torch's autograd formulas: each op's setup_context and
backward, which _torch_ops.py's table registers for the op
(register_autograd) and builds the eager path's autograd Function from.
The backward's collectives go through the eager path or the ops (_call),
as the public functions do."""
from __future__ import annotations

import torch

from ._torch_eager import OPS, _call
from ._torch_ids import _nranks, get_communicator


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
    return grad_sum * hit / _call(OPS.all_reduce, hit, cid, "sum", "auto")


def _no_gradient(collective: str, op: str):
    return NotImplementedError(
        f"symnccl.torch.{collective}: op {op!r} has no gradient here "
        "(sum and avg have, and all_reduce's and reduce_scatter's max and "
        "min)")


def _setup_all_reduce(ctx, inputs, output):
    """all_reduce's and reduce_scatter's: max and min keep x and y for the
    arg-extreme share of the gradient."""
    x, ctx.cid, ctx.op, ctx.algo = inputs
    if ctx.op in ("max", "min"):
        ctx.save_for_backward(x, output)


def _backward_all_reduce(ctx, grad):
    if ctx.op == "prod":
        raise _no_gradient("all_reduce", ctx.op)
    if ctx.op in ("sum", "avg"):
        return _call(OPS.all_reduce, grad, ctx.cid, ctx.op, ctx.algo), \
            None, None, None
    x, y = ctx.saved_tensors
    g = _call(OPS.all_reduce, grad, ctx.cid, "sum", ctx.algo)
    return _arg_extreme_share(x, y, g, ctx.cid), None, None, None


def _backward_reduce_scatter(ctx, grad):
    if ctx.op == "prod":
        raise _no_gradient("reduce_scatter", ctx.op)
    # the same algorithm: reduce_scatter and all_gather take the same ones
    g = _call(OPS.all_gather, grad, ctx.cid, ctx.algo)
    if ctx.op == "avg":
        g = g / _nranks(ctx.cid)
    elif ctx.op in ("max", "min"):
        x, y = ctx.saved_tensors
        ys = _call(OPS.all_gather, y, ctx.cid, ctx.algo)
        g = _arg_extreme_share(x, ys, g, ctx.cid)
    return g, None, None, None


def _setup_all_gather(ctx, inputs, output):
    x, ctx.cid, ctx.algo = inputs
    ctx.shape = x.shape   # a 0-d x gathers into (nranks,)


def _backward_all_gather(ctx, grad):
    g = _call(OPS.reduce_scatter, grad, ctx.cid, "sum", ctx.algo)
    return g.reshape(ctx.shape), None, None


# broadcast and reduce are each other's transpose, and take the same
# algorithms: the backward runs on the forward's.
def _setup_broadcast(ctx, inputs, output):
    _, ctx.cid, ctx.root, ctx.algo = inputs


def _backward_broadcast(ctx, grad):
    # the sum of every rank's gradient, on the root; nothing elsewhere
    g = _call(OPS.reduce, grad, ctx.cid, ctx.root, "sum", ctx.algo)
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
    g = _call(OPS.broadcast, grad, ctx.cid, ctx.root, ctx.algo)
    if ctx.op == "avg":
        g = g / _nranks(ctx.cid)
    return g, None, None, None, None


def _setup_tp_all_reduce(ctx, inputs, output):
    pass


def _backward_tp_all_reduce(ctx, grad):
    # the sum's output feeds replicated computation: each rank's partial
    # sum gets the gradient of the sum as it is
    return grad, None, None


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
    return (_call(OPS.all_reduce, g, ctx.cid, "sum", "auto"), None, g, gw,
            None, None)


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
        return (_call(OPS.all_reduce, grad, ctx.cid, "sum", ctx.algo), None,
                None)


# all-to-all: the backward sends the gradient rows back where they came
# from.
def _setup_all_to_all(ctx, inputs, output):
    _, ctx.cid, ctx.algo = inputs


def _backward_all_to_all(ctx, grad):
    return _call(OPS.all_to_all, grad, ctx.cid, ctx.algo), None, None


def _setup_all_to_all_v(ctx, inputs, output):
    x, ctx.cid, _, _, ctx.algo = inputs
    ctx.x_rows = x.shape[0]
    ctx.save_for_backward(output[1])


def _backward_all_to_all_v(ctx, grad, _grad_splits):
    (got,) = ctx.saved_tensors
    gx, _ = _call(OPS.all_to_all_v, grad, ctx.cid, got, ctx.x_rows,
                  ctx.algo)
    return gx, None, None, None, None
