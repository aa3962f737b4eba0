"""symnccl.torch's eager path: the gate that lets a call skip its custom
op (_eager, one C call), the call itself (_eager_call: the op's work, or
its autograd Function's C++ apply where autograd records the call), and
the rows of _torch_ops.py's table as the eager path reads them (OPS)."""
from __future__ import annotations

import torch

import symnccl

from ._torch_ids import _raw, comm_id, get_communicator


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


class TorchOp:
    """One op of symnccl.torch, as the calls read it: the custom op
    (torch.ops.symnccl.<name>), its work (impl(comm, x, *args), which the
    op runs and the eager path calls without it) and, where it has a
    gradient, the eager path's autograd Function (fn; else None). Made by
    _torch_ops.py's table, one row each."""
    __slots__ = ("name", "op", "impl", "fn")

    def __init__(self, name, op, impl, fn):
        self.name, self.op, self.impl, self.fn = name, op, impl, fn

    def __repr__(self):
        return f"<symnccl.torch op {self.name}>"


class _Ops:
    """Every TorchOp by name (OPS.all_reduce). _torch_ops.py's table fills
    it; the backward formulas (_torch_autograd.py, imported before the
    table, which names them) find here the ops they call."""


OPS = _Ops()


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


def _eager_call(mode, row, x, comm, *args):
    """The eager path of a call of the TorchOp row whose _eager(x) is mode
    (not 0)."""
    if mode == _RECORDED:
        if _functorch_wrapped(x):
            return row.fn.apply(x, comm_id(comm), *args)
        return row.fn.eager_apply(x, comm_id(comm), *args)
    return row.impl(_raw(comm), x, *args)


def _call(row, x, cid, *args):
    """A call of the TorchOp row by communicator id (the backward formulas'
    collectives): the eager path where _eager(x) allows it, else the
    op."""
    if (m := _eager(x)):
        return _eager_call(m, row, x, get_communicator(cid), *args)
    return row.op(x, cid, *args)
