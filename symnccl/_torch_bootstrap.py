"""symnccl.torch's bootstrap: a communicator over the ranks of a
torch.distributed group, its unique id through torch.distributed's store.
Re-exported by symnccl.torch (communicator)."""
from __future__ import annotations

import itertools
import os

import torch

import symnccl

from ._torch_ids import Communicator, _lock

_bootstraps: dict[str, itertools.count] = {}


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
