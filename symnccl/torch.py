"""PyTorch integration: communicators bootstrapped over torch.distributed,
and symnccl collectives as torch.library custom ops, so they work in eager
mode, under torch.compile(fullgraph=True) and inside CUDA graphs.

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
"""
from __future__ import annotations

import itertools
import os
import threading

import torch

import symnccl

__all__ = ["Communicator", "communicator", "wrap", "all_reduce",
           "all_reduce_", "comm_id", "get_communicator"]

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


@torch.library.custom_op("symnccl::all_reduce", mutates_args=())
def _all_reduce_op(x: torch.Tensor, comm_id: int, op: str,
                   algo: str) -> torch.Tensor:
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    get_communicator(comm_id).all_reduce(x.contiguous(), out=out, op=op,
                                         algo=algo)
    return out


@_all_reduce_op.register_fake
def _(x, comm_id, op, algo):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


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


def all_reduce(x: torch.Tensor, comm, op: str = "sum",
               algo: str = "auto") -> torch.Tensor:
    """Out-of-place all-reduce as the custom op symnccl::all_reduce
    (traceable by torch.compile, capturable in CUDA graphs).

    Example::

        y = symnccl.torch.all_reduce(x, comm, op="max")
    """
    return torch.ops.symnccl.all_reduce(x, comm_id(comm), op, algo)


def all_reduce_(x: torch.Tensor, comm, op: str = "sum",
                algo: str = "auto") -> torch.Tensor:
    """In-place all-reduce as the custom op symnccl::all_reduce_; returns x.

    Example::

        symnccl.torch.all_reduce_(grad, comm, op="avg")
    """
    torch.ops.symnccl.all_reduce_(x, comm_id(comm), op, algo)
    return x
