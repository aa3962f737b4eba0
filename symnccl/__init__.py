"""symnccl: NCCL symmetric memory and device-initiated collectives for any
Python GPU framework, through DLPack, zero-copy.

Example (one process per GPU; rank 0 makes the id and shares it)::

    import symnccl, torch
    comm = symnccl.Communicator(uid, rank, nranks, device=rank)
    buf = comm.empty((4096,), "bfloat16")     # symmetric window
    t = torch.from_dlpack(buf)                # same memory
    t.normal_()
    comm.all_reduce(t)                        # in place, torch's stream
    comm.close()
"""
from __future__ import annotations

import atexit
import contextlib

from . import _loader

_NCCL_PATH = _loader.preload()

# libnccl must be loaded first; importing _C picks the kernel build for it
# and raises ImportError when none may run on it (csrc/runtime/abi.c)
from . import _C  # noqa: E402

from . import _frameworks  # noqa: E402
from ._C import (  # noqa: E402
    CallMismatchError,
    Communicator,
    CudaError,
    DeviceArray,
    NcclError,
    PeerTimeoutError,
    SymmetricBuffer,
    get_unique_id,
)

_C._set_hooks(_frameworks.default_stream, _frameworks)

__version__ = "0.1.0"
__all__ = [
    "Communicator", "SymmetricBuffer", "DeviceArray", "NcclError",
    "CudaError", "PeerTimeoutError", "CallMismatchError", "get_unique_id",
    "group", "close_all", "abort_on_signal", "versions",
    "ALGORITHMS", "OPS", "DTYPES", "LSA_DTYPES", "LSA_OPS", "MULTIMEM_OPS",
    "AUTO_TABLE", "KERNEL_TABLE", "algo_supported", "DEFAULT_TIMEOUT",
    "MAX_TIMEOUT",
]

# What symnccl knows is declared once, in the C registry (csrc/runtime/registry.c);
# these are its views.

#: a communicator's timeout when none is given, and the longest it takes
#: (seconds; docs/FAILURES.md, "Timeouts").
DEFAULT_TIMEOUT = _C.DEFAULT_TIMEOUT
MAX_TIMEOUT = _C.MAX_TIMEOUT
#: all_reduce algorithms (besides "auto"): NCCL's own, and symnccl's
#: kernels on the NCCL device API.
ALGORITHMS = _C.ALGORITHMS
#: dtypes accepted by every collective.
DTYPES = _C.DTYPES
#: reduction ops.
OPS = _C.OPS
#: dtypes and ops symnccl's kernels handle (one_shot, two_shot, ll, ll128,
#: push; lamport takes float32, float16 and bfloat16 sums of them, and
#: algo_supported() says so); anything else runs through NCCL under
#: algo="auto".
LSA_DTYPES = _C.KERNEL_DTYPES
LSA_OPS = _C.KERNEL_OPS
#: what the multicast kernel reduces in the NVSwitch (multimem.ld_reduce).
MULTIMEM_OPS = _C.MULTIMEM_OPS
#: which algorithm algo="auto" picks: one row per collective and world
#: sizes up to max_ranks, limits on the call's larger buffer (an
#: all-gather's output, else the input) in the order ll, ll128, lamport,
#: one_shot, two_shot, push, else `above`; no row for a collective or world
#: size: NCCL.
AUTO_TABLE = _C.AUTO_TABLE
#: the kernels, one row each (csrc/kernels/table.h): name, collective,
#: algorithm, shot, the slots they share (family), launch plan, bytes.
KERNEL_TABLE = _C.KERNEL_TABLE


def algo_supported(comm, algo: str, dtype: str, op: str = "sum",
                   collective: str = "all_reduce") -> bool:
    """Whether collective(algo=algo) can run dtype/op on comm (the
    registry's answer, the one the collective itself acts on).

    Example::

        symnccl.algo_supported(comm, "one_shot", "bfloat16")  # True on NVLink
        symnccl.algo_supported(comm, "ll", "int8", collective="all_gather")
    """
    if not isinstance(comm, Communicator):
        raise TypeError(f"algo_supported: comm must be a symnccl."
                        f"Communicator, got {type(comm).__name__} "
                        f"{comm!r:.40}: algo_supported(comm, algo, dtype, "
                        f"op='sum', collective='all_reduce')")
    if algo not in ALGORITHMS and algo != "auto":
        raise ValueError(f"unknown algo {algo!r}: expected one of "
                         f"{ALGORITHMS + ('auto',)}")
    return comm._algo_unavailable(algo, dtype, op, collective) is None


@contextlib.contextmanager
def group():
    """Bracket calls on several communicators driven by this thread
    (ncclGroupStart/End). Needed around every collective call — including
    empty()/zeros(), whose window registration is collective — when one
    thread drives several GPUs. Buffers made inside are usable after exit.

    Example::

        comms = symnccl.Communicator.init_all([0, 1])
        with symnccl.group():
            bufs = [c.zeros(1024, "float32") for c in comms]
        with symnccl.group():
            for c, b in zip(comms, bufs):
                c.all_reduce(b)
    """
    _C._group_start()
    try:
        yield
    finally:
        _C._group_end()


def abort_on_signal(signals=None) -> None:
    """Make SIGINT and SIGTERM (or ``signals``) end a collective that is
    waiting, instead of leaving it to its timeout.

    Installs a C signal handler that raises the abort flag of every live
    communicator of this process, then hands the signal to the handler that
    was installed before it (Python's, for KeyboardInterrupt, or the
    default action). symnccl's kernels see the flag within milliseconds and
    give up, the watchdog aborts a communicator whose NCCL call is in
    flight, so a stream stuck in a collective drains and Python can handle
    the signal; the communicators then raise PeerTimeoutError (reason
    "abort") until abort() (README: Failures). Install your own Python
    signal handlers first: signal.signal() afterwards replaces this one.

    Example::

        symnccl.abort_on_signal()
        try:
            train()
        except KeyboardInterrupt:
            comm.abort()
    """
    import signal
    for s in (signal.SIGINT, signal.SIGTERM) if signals is None else signals:
        _C._abort_on_signal(int(s))


def close_all(comms) -> None:
    """Close several communicators (e.g. from init_all) from one thread.

    Example::

        symnccl.close_all(comms)
    """
    errors = []
    for c in comms:
        try:
            c.close()
        except Exception as e:  # close the rest, then report
            errors.append(e)
    if errors:
        raise errors[0]


def versions() -> dict:
    """Versions of everything symnccl depends on, for reports: the NCCL
    library loaded (nccl_runtime, nccl_library), the kernel build that
    runs beside it and the NCCL headers it was compiled against
    (nccl_kernels: one build serves several NCCL minors, docs/BUILD.md),
    every build this module holds (nccl_kernel_builds) and the nccl.h of
    the host code (nccl_host_headers).

    Example::

        >>> symnccl.versions()["nccl_runtime"]
        '2.30.7'
        >>> symnccl.versions()["nccl_kernels"]
        '2.29.7'
    """
    def fmt(code):
        return ".".join(map(str, _loader.version_tuple(code)))
    cuda = _C.cuda_versions()

    def cfmt(v):
        return f"{v // 1000}.{(v % 1000) // 10}" if v else "none"
    heads = _C.NCCL_DEVICE_API_HEADERS
    return {
        "symnccl": __version__,
        "nccl_runtime": fmt(_C.nccl_runtime_version()),
        "nccl_library": _loader.loaded_nccl_path() or _NCCL_PATH,
        "nccl_kernels": fmt(heads[_C.nccl_device_api()[1]]),
        "nccl_kernel_builds": ", ".join(fmt(heads[m]) for m in sorted(heads)),
        "nccl_host_headers": fmt(_C.NCCL_BUILD_VERSION),
        "cuda_build": cfmt(_C.CUDA_BUILD_VERSION),
        "cuda_runtime": cfmt(cuda["runtime"]),
        "cuda_driver": cfmt(cuda["driver"]),
        "device_count": cuda["device_count"],
    }


def _at_exit() -> None:
    # Close what the program left open so that exit never hangs on NCCL:
    # each close is bounded, and aborts when it cannot complete.
    _C._shutdown(_exit_timeout())


#: SYMNCCL_EXIT_TIMEOUT (seconds, 30 when unset), from the knob table
#: (csrc/runtime/registry.c): a value the timeout check refuses is named in a
#: warning and 30 is used, so that exit still closes every communicator.
_exit_timeout = _C._exit_timeout


atexit.register(_at_exit)
