"""Ranks of tests/test_torch_backend.py's CPU tests: the "symnccl" backend's
classes on CPU tensors, with gloo as the fallback and a communicator that
records what it is asked and computes it through gloo."""
import datetime
import os
import queue
import traceback

TIMEOUT = datetime.timedelta(seconds=60)


class RecordingComm:
    """symnccl.Communicator's methods as the backend calls them (x, out,
    op, algo, stream), computed through a gloo group; `calls` lists
    (collective, algo)."""

    def __init__(self, gloo, rank, size):
        self.gloo, self.rank, self.nranks = gloo, rank, size
        self.lsa_size, self.device = size, -1
        self.calls = []
        self.closed = False
        self.failure = None
        self.unsupported = set()     # (dtype, op, collective) refused
        self.nccl_bytes = set()      # sizes the resolver gives NCCL

    def _algo_unavailable(self, algo, dtype, op, collective):
        if (dtype, op, collective) in self.unsupported:
            return f"{collective} does not take {dtype} {op} (test)"
        return None

    def _auto_algo(self, nbytes, dtype, op, in_window, collective):
        return "nccl" if nbytes in self.nccl_bytes else "ll"

    def check(self):
        if self.failure is not None:
            import symnccl
            raise symnccl.PeerTimeoutError(self.failure)

    def close(self):
        self.closed = True

    abort = close

    def _op(self, op):
        import torch.distributed as dist
        return {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM,
                "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
                "max": dist.ReduceOp.MAX}[op]

    def all_reduce(self, x, out, op, algo, stream):
        import torch.distributed as dist
        self.calls.append(("all_reduce", op, algo, stream))
        o = dist.AllreduceOptions()
        o.reduceOp = self._op(op)
        self.gloo.allreduce([x], o).wait()
        if op == "avg":
            x.div_(self.nranks)
        return x

    def all_gather(self, x, out, algo, stream):
        self.calls.append(("all_gather", algo, stream))
        # symnccl's contract: out holds nranks * x.numel() elements
        assert out.numel() == x.numel() * self.nranks, (out.shape, x.shape)
        self.gloo._allgather_base(out.reshape(-1), x.reshape(-1)).wait()
        return out

    def reduce_scatter(self, x, out, op, algo, stream):
        import torch.distributed as dist
        self.calls.append(("reduce_scatter", op, algo, stream))
        # symnccl's contract: x holds nranks * out.numel() elements
        assert x.numel() == out.numel() * self.nranks, (x.shape, out.shape)
        o = dist.ReduceScatterOptions()
        o.reduceOp = self._op(op)
        self.gloo._reduce_scatter_base(out.reshape(-1), x.reshape(-1),
                                       o).wait()
        if op == "avg":
            out.div_(self.nranks)
        return out

    def all_to_all(self, x, out, algo, stream):
        self.calls.append(("all_to_all", algo, stream))
        self.gloo.alltoall_base(out, x, [], []).wait()
        return out

    def all_to_all_v(self, x, out, in_splits, out_splits, algo, stream):
        import torch
        self.calls.append(("all_to_all_v", algo, stream))
        ins = torch.tensor(in_splits, dtype=torch.int64)
        got = torch.empty_like(ins)
        self.gloo.alltoall_base(got, ins, [], []).wait()
        rows = int(got.sum())
        self.gloo.alltoall_base(out[:rows], x, got.tolist(),
                                list(in_splits)).wait()
        return out

    def broadcast(self, x, root, out, algo, stream):
        import torch.distributed as dist
        self.calls.append(("broadcast", root, algo, stream))
        o = dist.BroadcastOptions()
        o.rootRank = root
        self.gloo.broadcast([x], o).wait()
        return x

    def reduce(self, x, root, out, op, algo, stream):
        import torch.distributed as dist
        self.calls.append(("reduce", root, op, algo, stream))
        o = dist.ReduceOptions()
        o.rootRank, o.reduceOp = root, self._op(op)
        self.gloo.reduce([x], o).wait()
        return x

    def barrier(self, stream, blocking=False):
        self.calls.append(("barrier", blocking))
        self.gloo.barrier().wait()


def make_group(rank, size, name="symnccl_cpu_test"):
    """A group of `size` ranks on the symnccl backend's class (this torch
    version's), CPU tensors, gloo fallback, a RecordingComm."""
    import torch.distributed as dist
    from symnccl import torch_backend as tb
    made = {}

    def create(store, r, n, timeout):
        fallback = dist.ProcessGroupGloo(dist.PrefixStore("fb", store), r, n,
                                         timeout)
        inner = dist.ProcessGroupGloo(dist.PrefixStore("comm", store), r, n,
                                      timeout)

        def make_comm(store, r, n, timeout, device):
            made["comm"] = RecordingComm(inner, r, n)
            return made["comm"]
        cls = tb.SymncclBackend if tb.PER_DEVICE else tb.SymncclProcessGroup
        made["backend"] = cls(store, r, n, timeout, fallback=fallback,
                              make_comm=make_comm, device_type="cpu")
        return made["backend"]

    if name.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(name, create, devices=["cpu"])
    g = dist.new_group(list(range(size)), backend=name, timeout=TIMEOUT)
    return g, made


def routing(rank, size):
    """Every c10d call on the group: its result, and whether the
    RecordingComm ran it (else the fallback)."""
    import torch
    import torch.distributed as dist
    g, made = make_group(rank, size)
    out = {}

    def run(name, fn):
        comm = made.get("comm")
        before = len(comm.calls) if comm else 0
        ok = fn()
        comm = made["comm"] if "comm" in made else None
        calls = comm.calls[before:] if comm else []
        out[name] = (bool(ok), [c[0] for c in calls],
                     sorted({c[-2] if c[0] != "barrier" else "auto"
                             for c in calls}))

    r = rank
    for op, want in (("SUM", 3.), ("AVG", 1.5), ("MAX", 2.), ("MIN", 1.),
                     ("PRODUCT", 2.)):
        x = torch.full((4,), float(r + 1))
        run(f"all_reduce {op}", lambda: (dist.all_reduce(
            x, getattr(dist.ReduceOp, op), group=g), x.eq(want).all())[1])
    def async_op():
        x = torch.full((4,), 1.)
        w = dist.all_reduce(x, group=g, async_op=True)
        return w.wait() and w.get_future().wait()[0].eq(2).all()
    run("all_reduce async_op", async_op)

    def agt():
        o = torch.empty(2 * size)
        dist.all_gather_into_tensor(o, torch.full((2,), float(r)), group=g)
        return o.tolist() == [0., 0., 1., 1.]
    run("all_gather_into_tensor", agt)

    def rst():
        o = torch.empty(2)
        dist.reduce_scatter_tensor(o, torch.arange(4.) + r, group=g)
        return o.tolist() == [[1., 3.], [5., 7.]][r]
    run("reduce_scatter_tensor", rst)

    def coalesced(kind):
        def f():
            if kind == "all_reduce":
                xs = [torch.ones(3), torch.ones(5)]
            else:
                xs = [torch.empty(2 * size if kind == "all_gather" else 2)
                      for _ in range(2)]
            with dist._coalescing_manager(group=g, async_ops=True) as cm:
                for o in xs:
                    if kind == "all_reduce":
                        dist.all_reduce(o, group=g)
                    elif kind == "all_gather":
                        dist.all_gather_into_tensor(
                            o, torch.full((2,), float(r)), group=g)
                    else:
                        dist.reduce_scatter_tensor(o, torch.arange(4.) + r,
                                                   group=g)
            cm.wait()
            want = {"all_reduce": None, "all_gather": [0., 0., 1., 1.],
                    "reduce_scatter": [[1., 3.], [5., 7.]][r]}[kind]
            return all(o.eq(2).all() if want is None else o.tolist() == want
                       for o in xs)
        return f
    for kind in ("all_reduce", "all_gather", "reduce_scatter"):
        run(f"{kind} coalesced", coalesced(kind))

    def a2a():
        o = torch.empty(4)
        dist.all_to_all_single(o, torch.arange(4.) + 10 * r, group=g)
        return o.tolist() == [[0., 1., 10., 11.], [2., 3., 12., 13.]][r]
    run("all_to_all_single even", a2a)

    def a2av():
        ins = [[1, 2], [3, 1]][r]
        outs = [[1, 3], [2, 1]][r]
        o = torch.empty(sum(outs))
        dist.all_to_all_single(o, torch.arange(float(sum(ins))) + 10 * r,
                               outs, ins, group=g)
        return o.tolist() == [[0., 10., 11., 12.], [1., 2., 13.]][r]
    run("all_to_all_single uneven", a2av)

    def bc():
        x = torch.full((3,), float(r))
        dist.broadcast(x, src=1, group=g)
        return x.eq(1).all()
    run("broadcast", bc)

    def rd():
        x = torch.full((3,), float(r + 1))
        dist.reduce(x, dst=0, group=g)
        return r != 0 or x.eq(3).all()
    run("reduce", rd)
    run("barrier", lambda: dist.barrier(group=g) or True)

    # Works made in Python and held by C++: DDP's buckets (get_future),
    # functional collectives (wait_tensor calls Work.wait from C++)
    def ddp():
        from torch.nn.parallel import DistributedDataParallel as DDP
        torch.manual_seed(0)
        m = torch.nn.Linear(4, 3)
        d = DDP(m, process_group=g)
        torch.manual_seed(r)
        d(torch.randn(2, 4)).sum().backward()
        grads = [torch.empty_like(m.weight.grad) for _ in range(size)]
        dist.all_gather(grads, m.weight.grad)       # the default group
        return torch.equal(grads[0], grads[1])
    run("DDP", ddp)

    def funcol():
        import gc

        import torch.distributed._functional_collectives as fc
        y = fc.all_reduce(torch.full((4,), float(r + 1)), "sum", g)
        z = fc.reduce_scatter_tensor(torch.arange(4.) + r, "sum", 0, g)
        gc.collect()                # the Python Works, held by C++ only
        y = y.wait() if hasattr(y, "wait") else y
        z = z.wait() if hasattr(z, "wait") else z
        return y.eq(3).all() and z.tolist() == [[1., 3.], [5., 7.]][r]
    run("functional collectives", funcol)

    # what goes to the fallback
    def sr():
        x = torch.full((2,), float(r))
        if r == 0:
            dist.send(x + 5, dst=1, group=g)
            return True
        dist.recv(x, src=0, group=g)
        return x.eq(5).all()
    run("send/recv", sr)

    def ag_list():
        outs = [torch.empty(2) for _ in range(size)]
        dist.all_gather(outs, torch.full((2,), float(r)), group=g)
        return [o.tolist() for o in outs] == [[0., 0.], [1., 1.]]
    run("all_gather list", ag_list)

    def obj():
        box = [{"r": r}]
        dist.broadcast_object_list(box, src=0, group=g)
        return box[0] == {"r": 0}
    run("broadcast_object_list", obj)

    def band():
        x = torch.tensor([3 + r], dtype=torch.int32)
        dist.all_reduce(x, dist.ReduceOp.BAND, group=g)
        return x.item() == 3 & 4
    run("all_reduce BAND", band)

    def bool_sum():
        x = torch.tensor([True, bool(r)])
        dist.all_reduce(x, dist.ReduceOp.MAX, group=g)
        return x.tolist() == [True, True]
    run("all_reduce bool", bool_sum)

    def strided():   # the fallback's own semantics (NCCL: an error; the
        # CPU harness's gloo: no error): what is checked is that the call
        # went to the fallback and not to symnccl (the routing table)
        x = torch.ones(4, 2)[:, 0]
        try:
            dist.all_reduce(x, group=g)
        except (RuntimeError, ValueError):
            pass
        return True
    run("all_reduce non-contiguous", strided)

    def delegated_tensor_calls():   # bool: no symnccl dtype
        o = torch.empty(2 * size, dtype=torch.bool)
        dist.all_gather_into_tensor(o, torch.tensor([True, bool(r)]),
                                    group=g)
        ok = o.tolist() == [True, False, True, True]
        o = torch.empty(4, dtype=torch.bool)
        ins = torch.tensor([True, bool(r), False, True])
        dist.all_to_all_single(o, ins, group=g)
        ok &= o.tolist() == [[True, False, True, True],
                             [False, True, False, True]][r]
        # the same through C++ (functional collectives: torch 2.12-2.13
        # call the methods by 2.14's names)
        import torch.distributed._functional_collectives as funcol
        a = funcol.all_gather_tensor(torch.tensor([True, bool(r)]), 0, g)
        b = funcol.all_to_all_single(ins, None, None, g)
        a, b = (t.wait() if hasattr(t, "wait") else t for t in (a, b))
        ok &= a.tolist() == [True, False, True, True]
        ok &= b.tolist() == o.tolist()
        return ok
    run("all_gather_into_tensor, all_to_all_single bool",
        delegated_tensor_calls)

    made["comm"].nccl_bytes.add(48 * 4)

    def resolved_to_nccl():
        x = torch.full((48,), float(r + 1))
        dist.all_reduce(x, group=g)
        return x.eq(3).all()
    run("all_reduce the resolver gives NCCL", resolved_to_nccl)

    made["comm"].unsupported.add(("float64", "min", "all_reduce"))

    def refused():
        x = torch.full((2,), float(r), dtype=torch.float64)
        dist.all_reduce(x, dist.ReduceOp.MIN, group=g)
        return x.eq(0).all()
    run("all_reduce the registry refuses", refused)
    dist.barrier()
    return out


def failure(rank, size):
    """A communicator failure comes out of Work.wait() (and out of the
    synchronous call, which waits), as symnccl's exception."""
    import torch
    import torch.distributed as dist
    import symnccl
    g, made = make_group(rank, size)
    x = torch.ones(2)
    dist.all_reduce(x, group=g)
    made["comm"].failure = "rank 1 did not arrive within 5 s (test)"
    seen = []
    w = dist.all_reduce(x, group=g, async_op=True)
    try:
        w.wait()
    except symnccl.PeerTimeoutError as e:
        seen.append(("wait", str(e)))
    try:
        dist.all_reduce(x, group=g)
    except symnccl.PeerTimeoutError as e:
        seen.append(("sync", str(e)))
    made["comm"].failure = None
    from symnccl import torch_backend as tb
    tb.abort(g)
    seen.append(("aborted", made["comm"].closed))
    try:
        dist.all_reduce(x, group=g)
    except RuntimeError as e:
        seen.append(("after abort", str(e)))
    return seen


class FakeCuda:
    """torch_backend._cuda's calls, logged: streams are ("stream", key),
    events ("event", n); the current stream is `cur`, the current device
    `dev`. Lets the CPU tests follow the async path's stream and event
    order (the GPU tests check what the GPU does)."""

    def __init__(self, cur, dev):
        self.cur, self.dev = cur, dev
        self.log = []
        self.events = 0

    def current(self, index):
        self.log.append(("current", index))
        return self.cur

    def device(self):
        return self.dev

    def set(self, key):
        self.log.append(("set", key))
        self.cur = key

    def record(self, ev, stream):
        self.log.append(("record", ev, stream))

    def wait(self, ev, stream):
        self.log.append(("wait", ev, stream))

    def stream(self, key):
        self.log.append(("stream", key))
        return ("stream", key)

    def event(self):
        self.events += 1
        return FakeEvent(self.events)

    def record_stream(self, t, stream):
        self.log.append(("record_stream", t.data_ptr(), stream))

    def stream_context(self, stream):
        raise AssertionError("the async path took torch.cuda.stream()")


class FakeEvent(tuple):
    def __new__(cls, n):
        return super().__new__(cls, ("event", n))

    def query(self):
        return True

    def __reduce__(self):            # back to the test: a plain tuple
        return tuple, (tuple(self),)


def async_path(rank, size):
    """The async path's stream and event calls through a FakeCuda (the
    backend made as on a GPU: its stream, key and fork event set by
    hand), with the RecordingComm computing the results."""
    import gc

    import torch
    import torch.distributed as dist
    from symnccl import torch_backend as tb
    g, made = make_group(rank, size)
    x = torch.ones(4)
    dist.all_reduce(x, group=g)          # makes the communicator
    b, comm = made["backend"], made["comm"]
    cur, key = (7, 0, 1), (9, 0, 1)
    fake = FakeCuda(cur, 0)
    saved, saved_work = tb._cuda, tb._AsyncWork
    made["works"] = []

    class Work(tb._AsyncWork):     # the backend's Works, seen by the test
        def __init__(self, *a):
            super().__init__(*a)
            made["works"].append(self)
    tb._cuda, tb._AsyncWork = fake, Work
    out = {}
    try:
        b._stream, b._key, b._index = ("stream", key), key, 0
        b._streams = {key: ("stream", key)}
        b._pool = []
        r = rank

        # 1. an async all_reduce: fork, the backend's stream current for
        # the launch (stream None to symnccl), back, the completion event
        x = torch.full((4,), float(r + 1))
        fake.log.clear()
        w = dist.all_reduce(x, group=g, async_op=True)
        out["launch stream"] = comm.calls[-1][-1]
        out["async log"] = list(fake.log)
        ours = made["works"][-1]          # torch 2.14+ hands back its own
        out["keeps"] = [t.data_ptr() for t in ours._keep] == [x.data_ptr()]
        del ours
        fake.log.clear()
        w.wait()
        out["wait log"] = list(fake.log)
        out["kept after wait"] = made["works"][-1]._keep
        out["value"] = x.tolist()
        fake.log.clear()
        fut = w.get_future()
        out["future log"] = list(fake.log)
        out["future value"] = fut.wait()[0].tolist()
        ours = made["works"][-1]
        out["same future"] = ours._future is not None and \
            ours.get_future() is ours.get_future()
        del ours
        fake.log.clear()
        del w, fut
        made["works"].clear()
        gc.collect()
        out["waited work dropped"] = list(fake.log)
        out["pool"] = list(b._pool)

        # 2. the next call reuses the pooled event; dropped unwaited, its
        # tensors are recorded on the backend's stream
        o = torch.empty(2 * size)
        i = torch.full((2,), float(r))
        fake.log.clear()
        before = fake.events
        w = dist.all_gather_into_tensor(o, i, group=g, async_op=True)
        out["new events"] = fake.events - before
        out["pooled event used"] = made["works"][-1]._event
        dist.barrier()            # the RecordingComm ran it synchronously
        out["all_gather"] = o.tolist()
        fake.log.clear()
        del w
        made["works"].clear()
        gc.collect()
        out["unwaited work dropped"] = [
            e if e[0] != "record_stream" else
            (e[0], {o.data_ptr(): "output", i.data_ptr(): "input"}[e[1]],
             e[2]) for e in fake.log]

        # 3. another current device: the stream handed to symnccl, torch's
        # current stream left alone
        fake.dev = 1
        fake.log.clear()
        w = dist.all_reduce(x, group=g, async_op=True)
        out["other device launch stream"] = comm.calls[-1][-1]
        out["other device sets"] = [e for e in fake.log if e[0] == "set"]
        w.wait()
        fake.dev = 0

        # 4. a launch that raises leaves torch's current stream as it was
        real = comm.all_reduce

        def boom(*a):
            raise RuntimeError("launch failed (test)")
        comm.all_reduce = boom
        fake.log.clear()
        try:
            dist.all_reduce(x, group=g, async_op=True)
            out["raised"] = False
        except RuntimeError as e:
            out["raised"] = "launch failed" in str(e)
        comm.all_reduce = real
        out["current after raise"] = fake.cur
        dist.barrier()

        # 5. synchronous calls touch no stream or event
        fake.log.clear()
        dist.all_reduce(x, group=g)
        out["sync log"] = list(fake.log)
        made["works"].clear()
        gc.collect()
    finally:
        tb._cuda, tb._AsyncWork = saved, saved_work
        b._stream = None
    return out


def _child(fn, rank, size, port, q):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        import torch
        import torch.distributed as dist
        torch.set_num_threads(1)
        import symnccl.torch  # noqa: F401  (registers "symnccl")
        dist.init_process_group("gloo", rank=rank, world_size=size,
                                timeout=TIMEOUT)
        res = globals()[fn](rank, size)
        dist.destroy_process_group()
        q.put((rank, True, res))
    except BaseException as e:
        q.put((rank, False, f"{type(e).__name__}: {e}\n"
                            f"{traceback.format_exc()}"))


def spawn(fn, size=2, timeout=180):
    """fn's results on `size` CPU ranks (fresh processes)."""
    import multiprocessing as mp

    from symnccl.bootstrap import free_port
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_child, args=(fn, r, size, port, q),
                         daemon=True) for r in range(size)]
    for p in procs:
        p.start()
    res = {}
    try:
        for _ in procs:
            rank, ok, val = q.get(timeout=timeout)
            if not ok:
                raise RuntimeError(f"rank {rank}: {val}")
            res[rank] = val
    except queue.Empty:
        raise TimeoutError(f"{fn}: ranks did not finish in {timeout} s")
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.terminate()
    return [res[r] for r in range(size)]
