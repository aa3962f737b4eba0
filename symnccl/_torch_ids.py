"""symnccl.torch's id registry: custom ops cannot take Python objects, so
communicators are passed to them by an integer id (comm_id); the wrapper
Communicator carries its id as `.cid`, which torch.compile reads as a
constant. Public names are re-exported by symnccl.torch."""
from __future__ import annotations

import itertools
import threading

import symnccl

# Custom ops cannot take Python objects: communicators are passed by id.
# The registry keeps open communicators alive until interpreter exit (where
# symnccl closes whatever is still open); closed and aborted ones leave it
# at the next registration (_prune), so abort-and-rebuild does not keep
# every dead communicator.
_COMMS: dict[int, symnccl.Communicator] = {}
_IDS: dict[int, int] = {}          # id(comm) -> registry id
_next_id = itertools.count(1)
_lock = threading.Lock()


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


def _nranks(cid: int) -> int:
    return get_communicator(cid).nranks


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


def _raw(comm):
    """The symnccl.Communicator behind comm (a wrapper or itself)."""
    return comm.comm if isinstance(comm, Communicator) else comm
