"""symnccl as a torch.distributed backend: code written against
torch.distributed (DDP, FSDP2, DTensor, functional collectives, Megatron-
style dist.all_reduce) runs symnccl's collectives with a one-line switch::

    import symnccl.torch                       # registers "symnccl"
    dist.init_process_group("symnccl")         # or "cpu:gloo,cuda:symnccl"
    g = dist.new_group([0, 1], backend="symnccl")

What each torch version hands to a Python backend, and so what runs on
symnccl, was measured (scripts/probe_torch_backend.py; the matrix is in
docs/FRAMEWORKS.md, 'symnccl as a torch.distributed backend').

Routing. Every group owns a ProcessGroupNCCL over its ranks and, from the
first call symnccl can run, a symnccl Communicator (its unique id through
the group's store). all_reduce (every op of symnccl.OPS), reduce_scatter_
tensor, all_gather_into_tensor and their coalesced forms, broadcast,
reduce, all_to_all_single (even and uneven splits) and barrier go to the
Communicator with algo "auto" when the call is one symnccl takes (a single
contiguous CUDA tensor on the communicator's device, a dtype and op the
registry accepts for that collective, a size the resolver gives one of
symnccl's kernels); everything else (send/recv, gather/scatter, list
all_gather/reduce_scatter, all_gather_object, what "auto" would run on
NCCL, a group wider than one NVLink domain) goes to the NCCL backend,
with its semantics.

Streams, as ProcessGroupNCCL: a call with async_op=False runs on the
current stream and returns a finished Work; with async_op=True (every
call DDP's reducer and the functional collectives make) it runs on the
backend's own stream after the current stream's work, and Work.wait()
makes the current stream wait for it (no host synchronisation; with a
timeout the host waits, at most that long). get_future() gives a
CUDA-aware torch.futures.Future completed on the backend's stream, as
ProcessGroupNCCL's: its wait() and then() callbacks are stream-ordered,
the host never polls. The tensors of an async call stay referenced by
its Work until wait() (the current stream is then past the collective,
as ProcessGroupNCCL's stash); a Work dropped unwaited records them on the
backend's stream (record_stream), so the caching allocator keeps them
until the collective is done. The async path makes no torch.cuda.Stream
or Event per call: torch's stream calls directly, the backend's stream
made torch's current one for the launch (so symnccl reads the tensors
without DLPack's stream handshake), the fork and completion events from
the group's pool (docs/PERFORMANCE.md, 'The torch backend's async path').

Failures: Work.wait() raises the communicator's failure
(symnccl.PeerTimeoutError naming the rank, CallMismatchError); the
communicator's timeout is the group's (init_process_group's timeout=).
destroy_process_group() closes the communicator, the abort path
(torch's _abort_process_group, or abort(group) here) aborts it.
"""
from __future__ import annotations

import datetime
import os
import time
import warnings

import torch
import torch.distributed as dist

import symnccl

__all__ = ["NAME", "register", "abort", "communicator_of", "routed",
           "ROUTED", "PER_DEVICE"]

NAME = "symnccl"

#: what the backend runs on symnccl: c10d's method names (torch 2.11-2.13's
#: and torch 2.14's) -> the symnccl collective
ROUTED = {
    "allreduce": "all_reduce",
    "allreduce_coalesced": "all_reduce",
    "_allgather_base": "all_gather",
    "all_gather_single": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather",
    "all_gather_single_coalesced": "all_gather",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "reduce_scatter_single_coalesced": "reduce_scatter",
    "alltoall_base": "all_to_all",
    "all_to_all_single": "all_to_all",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "barrier": "barrier",
}

# torch's reduction ops -> symnccl's (symnccl.OPS); the rest (BAND, BOR,
# BXOR, PREMUL_SUM) go to NCCL
_OPS = {"SUM": "sum", "AVG": "avg", "PRODUCT": "prod", "MIN": "min",
        "MAX": "max"}
_OP_TYPES = {getattr(dist.ReduceOp.RedOpType, k): v for k, v in _OPS.items()}
_DTYPES = {getattr(torch, n): n for n in symnccl.DTYPES if hasattr(torch, n)}

# torch's c10d Backend class takes a Python subclass from torch 2.14 (the
# probe): then "symnccl" is a per-device backend ("cpu:gloo,cuda:symnccl");
# before, a Python ProcessGroup that replaces the group's, with NCCL as its
# CUDA backend and gloo as its CPU one.
_c10d = torch._C._distributed_c10d
_CBackend = _c10d.Backend


def _backend_constructible() -> bool:
    try:
        type("_Probe", (_CBackend,), {})(0, 1)
        return True
    except TypeError:
        return False


#: whether this torch takes "symnccl" per device ("cpu:gloo,cuda:symnccl")
PER_DEVICE = _backend_constructible()

# resolver answers a group remembers (by collective, dtype, op, bytes)
_ALGO_CACHE = 4096

_warned: set = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


class _Cuda:
    """torch's CUDA stream and event calls as the async path makes them:
    the C functions under torch.cuda's wrappers (torch.cuda.current_stream
    builds a Stream object, ~4 us; Event.record(None) asks for it again).
    A stream is named by torch's key (stream_id, device_index,
    device_type). Replaced by a fake in the CPU tests."""

    def __init__(self):
        c = torch._C
        self.current = getattr(c, "_cuda_getCurrentStream", None)
        self.device = getattr(c, "_cuda_getDevice", None)
        self._set = getattr(c, "_cuda_setStream", None)
        base = getattr(c, "_CudaEventBase", None)
        self.record = base.record if base is not None else None
        self.wait = base.wait if base is not None else None

    def set(self, key):
        """Make the stream `key` torch's current stream (of its device,
        which must be the current device: torch's setStream also sets
        the device)."""
        self._set(stream_id=key[0], device_index=key[1], device_type=key[2])

    @staticmethod
    def stream(key):
        return torch.cuda.Stream(stream_id=key[0], device_index=key[1],
                                 device_type=key[2])

    @staticmethod
    def event():
        return torch.cuda.Event()

    @staticmethod
    def record_stream(t, stream):
        t.record_stream(stream)

    @staticmethod
    def stream_context(stream):
        return torch.cuda.stream(stream)


_cuda = _Cuda()

# completion events a group keeps for reuse; torch.cuda.Stream objects it
# keeps for the current streams it has seen
_EVENT_POOL = 64
_STREAM_CACHE = 64
_NO_TIMEOUT = datetime.timedelta(0)


class _Work(dist.Work):
    """A collective symnccl ran: on `stream` (None: the current stream,
    finished as far as torch's streams are concerned) and done at `event`
    (the group's, back to its pool when this Work goes). `keep`: the
    tensors an async call touched, held until wait() orders the current
    stream after the collective (ProcessGroupNCCL's stash); a Work dropped
    unwaited records them on `stream` instead. wait() raises the
    communicator's failure."""

    def __init__(self, owner, result, stream=None, event=None, keep=None):
        super().__init__()
        self._owner = owner
        self._result = result
        self._stream = stream
        self._event = event
        self._keep = keep
        self._future = None

    def wait(self, timeout=_NO_TIMEOUT):
        ev = self._event
        if ev is not None:
            owner = self._owner
            if timeout:
                seconds = timeout.total_seconds()
                if seconds > 0:
                    owner._host_wait(ev, seconds)
            _cuda.wait(ev, owner._stream_of(_cuda.current(owner._index)))
            self._keep = None
        self._owner._check()
        return True

    def synchronize(self):
        self.wait()

    def block_current_stream(self):
        self.wait()

    def is_completed(self):
        return self._event is None or self._event.query()

    def is_success(self):
        return self.is_completed() and self._owner._failure() is None

    def exception(self):
        return None

    def result(self):
        return self._result

    def get_future(self):
        """A torch.futures.Future of the result (the same one every
        call), CUDA-aware for a CUDA group: completed on the stream the
        collective ran on, as ProcessGroupNCCL's (made at the first
        call: a later first call marks it past work queued on that stream
        since, which waits longer, never less)."""
        fut = self._future
        if fut is None:
            fut = self._future = self._owner._future(self._result,
                                                     self._stream)
        return fut


class _AsyncWork(_Work):
    """An async call's Work: dropped unwaited, it records the tensors it
    kept on its stream; its event goes back to the group's pool. (The
    synchronous calls' _Work has no finalizer: nothing to do.)"""

    def __del__(self):
        ev = getattr(self, "_event", None)
        if ev is None:
            return
        keep, s = self._keep, self._stream
        if keep:
            # unwaited: the caching allocator keeps the memory until the
            # backend's stream is past the collective
            for t in keep:
                _cuda.record_stream(t, s)
        pool = self._owner._pool
        if len(pool) < _EVENT_POOL:
            pool.append(ev)


class _Routes:
    """The routing both classes share (a ProcessGroup subclass before torch
    2.14, a c10d Backend subclass from it). `_fallback` is the NCCL backend
    the group owns; `_comm` the symnccl Communicator, made at the first
    call symnccl runs (every rank makes that call, in the same order)."""

    def _setup(self, store, rank, size, timeout, fallback, make_comm,
               device_type):
        self._store = store
        self._rank, self._size = rank, size
        self._timeout = timeout
        self._fallback = fallback
        self._make_comm = make_comm
        self._device_type = device_type
        self._comm = None
        self._ended = None         # "aborted" or "shut down"
        self._nvlink = True        # False: wider than one NVLink domain
        self._stream = None        # the stream of async_op calls
        self._key = None           # its torch key (stream_id, device, type)
        self._index = None         # the communicator's CUDA device
        self._devices = None       # [that device]: the futures' devices
        self._pool: list = []      # free events (forks, completions)
        self._streams: dict = {}   # torch.cuda.Stream objects by key
        self._supported: dict = {}
        self._algos: dict = {}     # resolver answers, by call
        self._coalesced = None     # inside _start/_end_coalescing: Works

    # ------------------------------------------------------------ decisions
    def _comm_for(self, device):
        """The symnccl communicator for a call on `device`, or None: the
        call goes to NCCL."""
        comm = self._comm
        if comm is None:
            if self._ended:
                raise RuntimeError(
                    f"symnccl backend: this group was {self._ended}; make a "
                    "new group (dist.new_group) among the ranks left")
            if not self._nvlink:
                return None
            comm = self._create(device)
            if comm is None:
                return None
        return comm if device.index == comm.device or \
            self._device_type == "cpu" else None

    def _create(self, device):
        """The group's communicator, made by its first call symnccl runs
        (a collective: every rank makes that call, in the same order, as
        every call on a group; no lock is held across it)."""
        index = device.index if device.index is not None else \
            torch.cuda.current_device() if device.type == "cuda" else -1
        comm = self._make_comm(self._store, self._rank, self._size,
                               self._timeout, index)
        if getattr(comm, "lsa_size", self._size) < self._size:
            # past one NVLink domain: NCCL's own algorithms
            self._nvlink = False
            _warn_once("nvlink", f"symnccl backend: group of "
                       f"{self._size} ranks spans more than one NVLink "
                       f"domain ({comm.lsa_size} ranks); its "
                       "collectives run on NCCL")
            comm.close()
            return None
        if self._device_type == "cuda":
            s = torch.cuda.Stream(device=index)
            self._stream, self._index = s, index
            self._key = (s.stream_id, s.device_index, s.device_type)
            self._streams[self._key] = s
            self._devices = [torch.device("cuda", index)]
        self._comm = comm
        return comm

    def _takes(self, comm, t, collective, op) -> bool:
        """Whether symnccl takes `collective` of tensor t with op at all
        (the registry's answer, symnccl.algo_supported's)."""
        dtype = _DTYPES.get(t.dtype)
        if dtype is None or not t.is_contiguous() or t.is_sparse or \
                t.dim() > symnccl._C.MAX_NDIM:   # taken as is, unflattened
            return False
        key = (dtype, op, collective)
        ok = self._supported.get(key)
        if ok is None:
            ok = self._supported[key] = comm._algo_unavailable(
                "auto", dtype, op, collective) is None
        return ok

    def _resolves_to_nccl(self, comm, collective, dtype, op, nbytes):
        """Whether symnccl's resolver ("auto") gives this call to NCCL:
        then the group's NCCL backend makes it (the same NCCL algorithm,
        without symnccl's non-blocking launch; docs/PERFORMANCE.md, 'Eager
        NCCL calls')."""
        key = (collective, dtype, op, nbytes)
        algo = self._algos.get(key)
        if algo is None:
            if len(self._algos) >= _ALGO_CACHE:
                self._algos.clear()
            algo = self._algos[key] = comm._auto_algo(
                nbytes, _DTYPES[dtype], op, False, collective)
        return algo == "nccl"

    def _target(self, tensors, collective, op="sum", sizes=()):
        """The communicator that runs this call, or None (NCCL): every
        tensor one symnccl takes, and every size in `sizes` (the bytes of
        each call's larger buffer) one its resolver gives a kernel."""
        if not tensors:
            return None
        t = tensors[0]
        if t.device.type != self._device_type:
            return None
        comm = self._comm_for(t.device)
        if comm is None:
            return None
        for x in tensors:
            if x.device != t.device or not self._takes(comm, x, collective,
                                                       op):
                return None
        for nbytes in sizes:
            if self._resolves_to_nccl(comm, collective, t.dtype, op, nbytes):
                return None
        return comm

    # -------------------------------------------------------------- running
    def _run(self, opts, launch, result, keep):
        """launch(stream) makes the call's symnccl launches on `stream`
        (None: torch's current stream). asyncOp=False: on the current
        stream, a finished Work. asyncOp=True: on the backend's stream
        after the current stream's work; the Work's event marks its end
        and it holds `keep` (the tensors touched) until wait()."""
        s = self._stream
        if s is None or not getattr(opts, "asyncOp", True):
            launch(None)
            work = _Work(self, result)
        else:
            cuda = _cuda
            index = self._index
            cur = cuda.current(index)
            fork = self._pooled()
            cuda.record(fork, self._stream_of(cur))
            cuda.wait(fork, s)
            self._pool.append(fork)  # free again: the wait is queued
            try:
                if cuda.device() == index:
                    # torch's current stream for the launch: symnccl reads
                    # the tensors directly (with another stream handed to
                    # it, each tensor would take DLPack's stream
                    # handshake, ~22 us)
                    cuda.set(self._key)
                    try:
                        launch(None)
                    finally:
                        cuda.set(cur)
                else:
                    launch(s)
            except BaseException:
                # a launch of a coalesced call (or an NCCL completion) may
                # have queued work on s before it raised: no Work keeps the
                # tensors, so the allocator must wait for s
                for t in keep:
                    cuda.record_stream(t, s)
                raise
            done = self._pooled()
            cuda.record(done, s)
            work = _AsyncWork(self, result, s, done, keep)
        if self._coalesced is not None:
            self._coalesced.append(work)
        return work

    def _pooled(self):
        """A free event of the group's pool, or a new one (a pop that
        another thread emptied the pool under falls back too)."""
        try:
            return self._pool.pop()
        except IndexError:
            return _cuda.event()

    def _stream_of(self, key):
        """The torch.cuda.Stream of a stream key (torch's current
        stream's, which event record and wait take), kept."""
        st = self._streams.get(key)
        if st is None:
            if len(self._streams) >= _STREAM_CACHE:
                self._streams.clear()
                self._streams[self._key] = self._stream
            st = self._streams[key] = _cuda.stream(key)
        return st

    def _future(self, result, stream):
        """A completed torch.futures.Future of `result`: CUDA-aware for
        a CUDA group, its events recorded on `stream` (None: the current
        stream), as ProcessGroupNCCL marks its future completed under its
        stream; the host never waits."""
        fut = torch.futures.Future(devices=self._devices)
        if stream is None:
            fut.set_result(result)
        elif _cuda.device() == self._index:
            cur = _cuda.current(self._index)
            _cuda.set(self._key)
            try:
                fut.set_result(result)
            finally:
                _cuda.set(cur)
        else:
            with _cuda.stream_context(stream):
                fut.set_result(result)
        return fut

    def _host_wait(self, event, seconds):
        """Work.wait(timeout): the host waits for the event, at most
        `seconds` (naps from 20 us to 1 ms; only with a timeout)."""
        deadline = time.monotonic() + seconds
        nap = 2e-5
        while not event.query():
            if time.monotonic() > deadline:
                self._check()
                raise dist.DistBackendError(
                    f"symnccl backend: collective not finished after "
                    f"{seconds:g} s (Work.wait timeout); the communicator's "
                    f"own timeout is {self._timeout.total_seconds():g} s")
            time.sleep(nap)
            nap = min(nap * 2, 1e-3)

    def _check(self):
        if self._comm is not None:
            self._comm.check()

    def _failure(self):
        return None if self._comm is None else self._comm.failure

    def _nccl(self, name, *args):
        """The call as the NCCL backend makes it (under its own name: the
        ProcessGroup of torch 2.12-2.13 calls methods by the names of
        2.14, which their NCCL binding does not have yet); CPU tensors
        (torch's object collectives) to the group's CPU backend, where it
        has one (the ProcessGroup before 2.14 is handed every call)."""
        cpu = getattr(self, "_cpu", None)
        first = _first_tensor(args)
        if cpu is not None and first is not None and \
                first.device.type == "cpu":
            fn = getattr(cpu, name, None)
            for alias in _ALIASES.get(name, ()):
                fn = fn or getattr(cpu, alias, None)
            if fn is not None:
                return fn(*args)
        fn = getattr(self._fallback, name, None)
        if fn is not None:
            return fn(*args)
        for alias in _ALIASES.get(name, ()):
            fn = getattr(self._fallback, alias, None)
            if fn is not None:
                return fn(*args)
        fn = _COALESCED.get(name)
        if fn is None:
            raise NotImplementedError(
                f"symnccl backend: torch {torch.__version__}'s NCCL "
                f"backend has no {name}")
        return fn(self._fallback, *args, inside=self._coalesced is not None)

    @staticmethod
    def _op(opts):
        """symnccl's name of the call's reduction op, None: not symnccl's."""
        return _OP_TYPES.get(opts.reduceOp.op)

    # ------------------------------------------------------- the collectives
    def allreduce(self, tensors, opts=None):
        opts = opts if opts is not None else _c10d.AllreduceOptions()
        op = self._op(opts)
        comm = self._target(tensors, "all_reduce", op,
                            (tensors[0].nbytes,)) \
            if op and len(tensors) == 1 else None
        if comm is None:
            return self._nccl("allreduce", tensors, opts)
        t = tensors[0]
        return self._run(opts, lambda s: comm.all_reduce(t, None, op, "auto",
                                                         s),
                         tensors, tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts if opts is not None else _c10d.AllreduceCoalescedOptions()
        op = self._op(opts)
        comm = self._target(tensors, "all_reduce", op,
                            [t.nbytes for t in tensors]) if op else None
        if comm is None:
            return self._nccl("allreduce_coalesced", tensors, opts)
        def launch(s):
            for t in tensors:
                comm.all_reduce(t, None, op, "auto", s)
        return self._run(opts, launch, tensors, list(tensors))

    def _allgather_base(self, output, input, opts=None):
        return self._all_gather("_allgather_base", output, input, opts)

    def all_gather_single(self, output, input, opts=None):
        return self._all_gather("all_gather_single", output, input, opts)

    def _all_gather(self, name, output, input, opts):
        opts = opts if opts is not None else _c10d.AllgatherOptions()
        comm = self._target([output, input], "all_gather", "sum",
                            (output.nbytes,))
        if comm is None or output.numel() != input.numel() * self._size:
            return self._nccl(name, output, input, opts)
        # symnccl checks element counts only: no views to make (each a
        # torch op, ~1-2 us)
        return self._run(opts, lambda s: comm.all_gather(input, output,
                                                         "auto", s),
                         [output], (output, input))

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        return self._all_gather_coalesced("allgather_into_tensor_coalesced",
                                          outputs, inputs, opts)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self._all_gather_coalesced("all_gather_single_coalesced",
                                          outputs, inputs, opts)

    def _all_gather_coalesced(self, name, outputs, inputs, opts):
        opts = opts if opts is not None else _c10d.AllgatherOptions()
        comm = self._target([*outputs, *inputs], "all_gather", "sum",
                            [o.nbytes for o in outputs])
        if comm is None or any(o.numel() != i.numel() * self._size
                               for o, i in zip(outputs, inputs)):
            return self._nccl(name, outputs, inputs, opts)
        def launch(s):
            for o, i in zip(outputs, inputs):
                comm.all_gather(i, o, "auto", s)
        return self._run(opts, launch, list(outputs), (*outputs, *inputs))

    def _reduce_scatter_base(self, output, input, opts=None):
        return self._reduce_scatter("_reduce_scatter_base", output, input,
                                    opts)

    def reduce_scatter_single(self, output, input, opts=None):
        return self._reduce_scatter("reduce_scatter_single", output, input,
                                    opts)

    def _reduce_scatter(self, name, output, input, opts):
        opts = opts if opts is not None else _c10d.ReduceScatterOptions()
        op = self._op(opts)
        comm = self._target([output, input], "reduce_scatter", op,
                            (input.nbytes,)) if op else None
        if comm is None or input.numel() != output.numel() * self._size:
            return self._nccl(name, output, input, opts)
        return self._run(opts, lambda s: comm.reduce_scatter(input, output,
                                                             op, "auto", s),
                         [output], (output, input))

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        return self._reduce_scatter_coalesced(
            "reduce_scatter_tensor_coalesced", outputs, inputs, opts)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        return self._reduce_scatter_coalesced(
            "reduce_scatter_single_coalesced", outputs, inputs, opts)

    def _reduce_scatter_coalesced(self, name, outputs, inputs, opts):
        opts = opts if opts is not None else _c10d.ReduceScatterOptions()
        op = self._op(opts)
        comm = self._target([*outputs, *inputs], "reduce_scatter", op,
                            [i.nbytes for i in inputs]) if op else None
        if comm is None or any(i.numel() != o.numel() * self._size
                               for o, i in zip(outputs, inputs)):
            return self._nccl(name, outputs, inputs, opts)
        def launch(s):
            for o, i in zip(outputs, inputs):
                comm.reduce_scatter(i, o, op, "auto", s)
        return self._run(opts, launch, list(outputs), (*outputs, *inputs))

    def alltoall_base(self, output, input, output_split_sizes,
                      input_split_sizes, opts=None):
        return self._all_to_all("alltoall_base", output, input,
                                output_split_sizes, input_split_sizes, opts)

    def all_to_all_single(self, output, input, output_split_sizes,
                          input_split_sizes, opts=None):
        return self._all_to_all("all_to_all_single", output, input,
                                output_split_sizes, input_split_sizes, opts)

    def _all_to_all(self, name, output, input, out_splits, in_splits, opts):
        opts = opts if opts is not None else _c10d.AllToAllOptions()
        n = self._size
        even = not out_splits and not in_splits
        # every rank must choose alike: equal blocks by x's bytes (the same
        # on every rank), uneven splits by nothing that differs by rank
        # (torch sizes each rank's output for what it receives): push,
        # which carries any size
        comm = self._target([output, input], "all_to_all", "sum",
                            (input.nbytes,) if even else ())
        if comm is None or input.dim() == 0 or output.dim() == 0 or (
                even and (input.shape[0] % n or output.shape != input.shape)):
            return self._nccl(name, output, input, out_splits, in_splits,
                              opts)
        if even:
            def launch(s):
                comm.all_to_all(input, output, "auto", s)
        else:
            ins = list(in_splits) or [input.shape[0] // n] * n

            def launch(s):
                comm.all_to_all_v(input, output, ins, None, "push", s)
        return self._run(opts, launch, [output], (output, input))

    def broadcast(self, tensors, opts=None):
        opts = opts if opts is not None else _c10d.BroadcastOptions()
        comm = self._target(tensors, "broadcast", "sum",
                            (tensors[0].nbytes,)) \
            if len(tensors) == 1 and opts.rootTensor == 0 else None
        if comm is None:
            return self._nccl("broadcast", tensors, opts)
        t, root = tensors[0], opts.rootRank
        return self._run(opts, lambda s: comm.broadcast(t, root, None,
                                                        "auto", s),
                         tensors, tensors)

    def reduce(self, tensors, opts=None):
        opts = opts if opts is not None else _c10d.ReduceOptions()
        op = self._op(opts)
        comm = self._target(tensors, "reduce", op, (tensors[0].nbytes,)) \
            if op and len(tensors) == 1 and opts.rootTensor == 0 else None
        if comm is None:
            return self._nccl("reduce", tensors, opts)
        t, root = tensors[0], opts.rootRank
        return self._run(opts, lambda s: comm.reduce(t, root, None, op,
                                                     "auto", s),
                         tensors, tensors)

    def barrier(self, opts=None):
        opts = opts if opts is not None else _c10d.BarrierOptions()
        if self._comm is not None and self._device_type == "cuda":
            device = torch.device("cuda", self._comm.device)
        elif self._device_type == "cuda":
            ids = list(getattr(opts, "device_ids", None) or ())
            dev = getattr(opts, "device", None)
            index = ids[0] if ids else (
                dev.index if dev is not None and dev.type == "cuda" else
                int(os.environ.get("LOCAL_RANK",
                                   torch.cuda.current_device())))
            device = torch.device("cuda", index)
        else:
            device = torch.device("cpu")
        comm = self._comm_for(device)
        if comm is None:
            return self._nccl("barrier", opts)
        # as ProcessGroupNCCL's barrier: the host waits for it, bounded by
        # the communicator's timeout, GIL released
        stream = torch.cuda.current_stream(device).cuda_stream \
            if device.type == "cuda" else None
        comm.barrier(stream, blocking=True)
        return _Work(self, [])

    # ----------------------------------------------------------- lifetime
    def getBackendName(self):
        return NAME

    def name(self):
        return NAME

    def _close(self, abort: bool):
        self._ended = self._ended or ("aborted" if abort else "shut down")
        comm, self._comm = self._comm, None
        if comm is not None and not comm.closed:
            comm.abort() if abort else comm.close()


def _coalesced(single):
    """A coalesced call that a torch version's NCCL binding lacks: the
    single-tensor calls between _start_coalescing and _end_coalescing, as
    torch's _coalescing_manager makes them."""
    def run(backend, outputs, inputs, opts, inside=False):
        call = getattr(backend, single)
        if inside:
            # within the group's _start/_end_coalescing: the calls join
            # that coalesced group, whose _end_coalescing gives the Work
            for o, i in zip(outputs, inputs):
                call(o, i, opts)
            return None
        if not getattr(backend, "supports_coalescing", False):
            # one call after another (gloo: the CPU tests' fallback)
            works = [call(o, i, opts) for o, i in zip(outputs, inputs)]
            for w in works[:-1]:
                w.wait()
            return works[-1]
        device = outputs[0].device
        backend._start_coalescing(device)
        for o, i in zip(outputs, inputs):
            call(o, i, opts)
        return backend._end_coalescing(device)
    return run


_COALESCED = {
    "allgather_into_tensor_coalesced": _coalesced("_allgather_base"),
    "reduce_scatter_tensor_coalesced": _coalesced("_reduce_scatter_base"),
    "all_gather_single_coalesced": _coalesced("_allgather_base"),
    "reduce_scatter_single_coalesced": _coalesced("_reduce_scatter_base"),
}
# c10d's names of torch 2.14 -> those of the backends' bindings before
_ALIASES = {
    "all_gather_single": ("_allgather_base",),
    "reduce_scatter_single": ("_reduce_scatter_base",),
    "all_to_all_single": ("alltoall_base",),
    "all_gather_single_coalesced": ("allgather_into_tensor_coalesced",),
    "reduce_scatter_single_coalesced": ("reduce_scatter_tensor_coalesced",),
}


def _first_tensor(args):
    """The first tensor in a call's arguments (a tensor, or lists of
    them), or None."""
    for a in args:
        if isinstance(a, torch.Tensor):
            return a
        if isinstance(a, (list, tuple)):
            t = _first_tensor(a)
            if t is not None:
                return t
    return None


class SymncclProcessGroup(_Routes, dist.ProcessGroup):
    """The backend before torch 2.14: a Python ProcessGroup (torch's
    PyProcessGroup trampoline hands it the methods of ROUTED). Its CUDA
    backend is the NCCL one, its CPU backend gloo: what the trampoline
    does not hand to Python, and what symnccl does not take, runs there
    without Python."""

    def __init__(self, store, rank, size, timeout, *, fallback,
                 make_comm=None, device_type="cuda", cpu=None):
        dist.ProcessGroup.__init__(self, rank, size)
        self._setup(store, rank, size, timeout, fallback,
                    make_comm or _make_comm, device_type)
        types = dist.ProcessGroup.BackendType
        kind = types.NCCL if isinstance(fallback, _nccl_class()) \
            else types.GLOO
        self._register_backend(torch.device(device_type), kind, fallback)
        if cpu is None and device_type == "cuda" and dist.is_gloo_available():
            cpu = dist.ProcessGroupGloo(dist.PrefixStore("gloo", store),
                                        rank, size, timeout)
        if cpu is not None:
            self._register_backend(torch.device("cpu"), types.GLOO, cpu)
        self._set_default_backend(kind)
        self._cpu = cpu

    # The base's method is called from the override of the same name: only
    # then does pybind11 not hand the call back to the override (recursion).
    def _start_coalescing(self, device):
        # torch's _coalescing_manager(device=...): the collectives inside
        # come as one coalesced call, then _end_coalescing's Work is the
        # one waited for: symnccl's where symnccl ran it
        self._coalesced = []
        dist.ProcessGroup._start_coalescing(self, device)

    def _end_coalescing(self, device):
        work = dist.ProcessGroup._end_coalescing(self, device)
        ours, self._coalesced = self._coalesced, None
        return ours[-1] if ours else work

    def shutdown(self):
        self._close(abort=False)
        dist.ProcessGroup.shutdown(self)     # the NCCL and gloo backends

    def abort(self):
        self._close(abort=True)
        dist.ProcessGroup.abort(self)


def _delegate(name):
    def call(self, *args):
        return self._nccl(name, *args)
    call.__name__ = name
    return call


if PER_DEVICE:
    class SymncclBackend(_Routes, _CBackend):
        """The backend from torch 2.14: a c10d Backend for CUDA tensors,
        next to the group's others ("cpu:gloo,cuda:symnccl"). What
        symnccl does not take goes to the NCCL backend it owns."""

        def __init__(self, store, rank, size, timeout, *, fallback,
                     make_comm=None, device_type="cuda"):
            _CBackend.__init__(self, rank, size)
            self._setup(store, rank, size, timeout, fallback,
                        make_comm or _make_comm, device_type)

        def shutdown(self):
            self._close(abort=False)
            self._fallback.shutdown()

        def abort(self):
            self._close(abort=True)
            self._fallback.abort()

    # the c10d calls symnccl has no kernel for: the NCCL backend's
    for _name in ("allgather", "allgather_coalesced", "alltoall", "gather",
                  "gather_single", "gather_into_tensor", "scatter", "send",
                  "recv", "recv_anysource", "reduce_scatter",
                  "monitored_barrier", "allreduce_sparse"):
        if hasattr(_CBackend, _name):
            setattr(SymncclBackend, _name, _delegate(_name))
    del _name


def _nccl_class():
    return getattr(dist, "ProcessGroupNCCL", ())


def _nccl_backend(store, rank, size, timeout, ranks=None, name=None,
                  options=None, split_from=None):
    """The NCCL backend the group owns, over the same ranks and store, as
    torch makes the "nccl" one: split from the default group's NCCL
    communicator where torch splits (a bound default group; the ranks
    outside the group then make the same split)."""
    nccl = _nccl_class()
    if not nccl:
        raise RuntimeError("symnccl backend: this torch has no NCCL backend "
                           "(torch.distributed.is_nccl_available() is "
                           "False)")
    opts = options if isinstance(options, nccl.Options) else nccl.Options()
    opts._timeout = timeout
    if ranks is not None:
        opts.global_ranks_in_group = ranks
    if name is not None:
        opts.group_name = name
    if split_from is not None:
        opts.split_from = split_from
        opts.split_color = dist.distributed_c10d._process_group_color(ranks)
    return nccl(dist.PrefixStore("nccl", store), rank, size, opts)


def _split_source():
    """What torch splits a new group's NCCL communicator from (its
    _get_split_source, for torch versions that do not hand it to a
    backend's creator): the default group's NCCL backend, if the default
    group is bound to a device."""
    nccl = _nccl_class()
    if not nccl or not dist.is_initialized():
        return None
    default = dist.distributed_c10d._get_default_group()
    if not default.bound_device_id:
        return None
    try:
        b = default._get_backend(default.bound_device_id)
    except RuntimeError:
        return None
    return b if isinstance(b, nccl) and b.supports_splitting else None


def _make_comm(store, rank, size, timeout, device):
    """The group's symnccl Communicator: rank 0's unique id through the
    group's store (no collective), the group's timeout."""
    key = "symnccl/uid"
    if rank == 0:
        store.set(key, symnccl.get_unique_id())
    uid = bytes(store.get(key))
    return symnccl.Communicator(uid, rank, size, device=device,
                                timeout=timeout.total_seconds())


def _create(dist_opts, options):
    """torch's creator (extended_api): the group's NCCL backend, then the
    symnccl one around it."""
    store, rank = dist_opts.store, dist_opts.group_rank
    size, timeout = dist_opts.group_size, dist_opts.timeout
    ranks = list(dist_opts.global_ranks_in_group) or list(range(size))
    split = dist_opts.split_from if hasattr(dist_opts, "split_from") \
        else _split_source()
    fallback = _nccl_backend(store, rank, size, timeout, ranks,
                             dist_opts.group_id, options, split)
    cls = SymncclBackend if PER_DEVICE else SymncclProcessGroup
    return cls(store, rank, size, timeout, fallback=fallback)


def register() -> None:
    """Register the backend "symnccl" with torch.distributed (import
    symnccl.torch does it; again is a no-op)."""
    if NAME.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    dist.Backend.register_backend(NAME, _create, extended_api=True,
                                  devices=["cuda"])


def _backend_of(group):
    group = group if group is not None else dist.group.WORLD
    if isinstance(group, _Routes):
        return group
    for device in ("cuda", "cpu"):
        try:
            b = group._get_backend(torch.device(device))
        except RuntimeError:
            continue
        if isinstance(b, _Routes):
            return b
    return None


def communicator_of(group=None):
    """The symnccl Communicator a "symnccl" group runs on (None before its
    first collective symnccl ran, or for another backend's group)."""
    b = _backend_of(group)
    return None if b is None else b._comm


def routed(group=None) -> bool:
    """Whether `group` is a "symnccl" group whose collectives can run on
    symnccl (one NVLink domain)."""
    b = _backend_of(group)
    return b is not None and b._nvlink


def abort(group=None) -> None:
    """Abort a "symnccl" group after a failure: its symnccl communicator
    and its NCCL backend; then destroy_process_group(group) and make a new
    group among the ranks that are left."""
    b = _backend_of(group)
    if b is None:
        raise ValueError(f"{group!r} is not a {NAME!r} group")
    b.abort()
