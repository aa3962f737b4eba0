"""Rank bodies for the multi-GPU tests (run by symnccl.bootstrap.spawn)."""
import numpy as np

import symnccl
from symnccl import _check

ODD_SIZES = (1, 3, 1031, 65537, 1000003)


def _fill(buf, arr):
    buf.copy_from_host(np.ascontiguousarray(arr).view(np.uint8))


def _read(buf, npdt):
    return np.frombuffer(buf.to_bytes(), npdt)


def all_reduce_every_dtype_on_windows(rank, nranks, uid, seed):
    """Every dtype x op on SymmetricBuffers, in and out of place, poisoned
    outputs. Returns [(dtype, op, count, wrong)]."""
    comm = symnccl.Communicator(uid, rank, nranks, device=rank, timeout=120)
    assert comm.symmetric, comm.symmetric_reason
    assert comm.lsa_size == nranks and not comm.multicast
    rows = []
    for dtype in symnccl.DTYPES:
        npdt = _check.numpy_dtype(dtype)
        for count in ODD_SIZES[:4]:
            x, y = comm.empty(count, dtype), comm.empty(count, dtype)
            for op in symnccl.OPS:
                ins = [_check.make_input(dtype, count, r, seed, op)
                       for r in range(nranks)]
                _fill(x, ins[rank])
                _fill(y, _check.poison(y.nbytes))
                assert comm.all_reduce(x, out=y, op=op) is y
                rows.append((dtype, op, count,
                             _check.count_wrong(_read(y, npdt), op, ins,
                                                dtype)))
                assert comm.all_reduce(x, op=op) is x
                rows.append((dtype, op + "(in place)", count,
                             _check.count_wrong(_read(x, npdt), op, ins,
                                                dtype)))
    comm.close()
    return rows


def torch_collectives(rank, nranks, uid, seed):
    """torch tensors (caching-allocator memory, not windows) through every
    collective, results compared with float64 references."""
    import torch
    torch.cuda.set_device(rank)
    comm = symnccl.Communicator(uid, rank, nranks, device=rank, timeout=120)
    rows = []
    g = torch.Generator(device="cpu").manual_seed(seed)
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int32):
        for count in ODD_SIZES:
            def inp(r, c=count):
                gg = torch.Generator().manual_seed(seed * 1000 + r * 7 + c)
                if dtype.is_floating_point:
                    return (torch.rand(c, generator=gg, dtype=torch.float64)
                            * 2 - 1)
                return torch.randint(-100, 100, (c,), generator=gg,
                                     dtype=torch.float64)
            ref = sum(inp(r) for r in range(nranks))
            x = inp(rank).to(dtype).cuda()
            out = torch.full_like(x, float("nan") if dtype.is_floating_point
                                  else -1)
            y = comm.all_reduce(x, out=out)
            assert y is out and isinstance(y, torch.Tensor)
            got = y.double().cpu()
            refq = sum(inp(r).to(dtype).double() for r in range(nranks))
            eps = {torch.float32: 2**-23, torch.bfloat16: 2**-7,
                   torch.float16: 2**-10, torch.int32: 0}[dtype]
            tol = (nranks + 1) * eps * sum(inp(r).abs() for r in range(nranks))
            wrong = int(((got - refq).abs() > tol + 1e-30).sum()
                        + (~torch.isfinite(got)).sum())
            rows.append(("all_reduce", str(dtype), count, wrong))
            del ref
            # reduce_scatter: new tensor of x's type and first-dim shape
            xs = inp(rank, count * nranks).to(dtype).cuda()
            part = comm.reduce_scatter(xs)
            assert isinstance(part, torch.Tensor) and part.shape == (count,)
            want = sum(inp(r, count * nranks).to(dtype).double()
                       for r in range(nranks))[rank * count:(rank + 1) * count]
            tol = (nranks + 1) * eps * nranks
            rows.append(("reduce_scatter", str(dtype), count,
                         int(((part.double().cpu() - want).abs() > tol).sum())))
            # all_gather: exact
            full = comm.all_gather(x)
            assert full.shape == (count * nranks,)
            want = torch.cat([inp(r).to(dtype) for r in range(nranks)])
            rows.append(("all_gather", str(dtype), count,
                         int((full.cpu() != want).sum())))
            # broadcast in place from the last rank: exact
            b = inp(rank).to(dtype).cuda()
            assert comm.broadcast(b, root=nranks - 1) is b
            rows.append(("broadcast", str(dtype), count,
                         int((b.cpu() != inp(nranks - 1).to(dtype)).sum())))
    del g
    # 2-D reduce_scatter keeps trailing dims
    x = torch.ones(nranks * 3, 5, device="cuda")
    assert comm.reduce_scatter(x).shape == (3, 5)
    assert comm.all_gather(torch.ones(2, 5, device="cuda")).shape == \
        (2 * nranks, 5)
    # runs on torch's current stream: a side stream orders correctly
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        t = torch.full((4099,), float(rank + 1), device="cuda")
        comm.all_reduce(t)
        t.mul_(2)
    s.synchronize()
    rows.append(("stream", "float32", 4099,
                 int((t.cpu() != nranks * (nranks + 1)).sum())))
    comm.barrier(blocking=True)
    comm.close()
    return rows


def created_with_settings(rank, nranks, uid, knob, value, staging):
    """Rank 1 creates the communicator with knob=value in its environment
    (none: "") and staging_bytes=staging (0: the default); every rank
    returns what creation did: ("ok", symmetric) or (exception type,
    message)."""
    import os
    if rank == 1 and knob:
        os.environ[knob] = str(value)
    kw = {"staging_bytes": staging} if rank == 1 and staging else {}
    try:
        comm = symnccl.Communicator(uid, rank, nranks, device=rank,
                                    timeout=60, **kw)
    except Exception as e:   # noqa: BLE001
        return (type(e).__name__, str(e))
    symmetric = comm.symmetric
    comm.close()
    return ("ok", symmetric)


def errors_and_lifetime(rank, nranks, uid):
    import torch
    torch.cuda.set_device(rank)
    comm = symnccl.Communicator(uid, rank, nranks, device=rank, timeout=120)
    msgs = {}
    other = (rank + 1) % nranks
    try:
        comm.all_reduce(torch.ones(4, device=f"cuda:{other}"))
    except ValueError as e:
        msgs["device"] = str(e)
    try:
        comm.all_reduce(torch.ones(4), )
    except ValueError as e:
        msgs["cpu"] = str(e)
    try:
        comm.all_reduce(torch.ones(4, device="cuda"),
                        out=torch.ones(4, device="cuda", dtype=torch.half))
    except TypeError as e:
        msgs["dtype"] = str(e)
    try:
        comm.reduce_scatter(torch.ones(nranks * 2 + 1, device="cuda"))
    except ValueError as e:
        msgs["divisible"] = str(e)
    # views outlive the buffer object and the communicator
    buf = comm.zeros(1000, "float32")
    t = torch.from_dlpack(buf)
    t.fill_(rank + 1)
    comm.all_reduce(t)
    del buf
    torch.cuda.synchronize()
    total = float(t.sum())
    comm.close()
    comm.close()   # idempotent
    after_close = float(t.sum())
    try:
        comm.all_reduce(t)
    except RuntimeError as e:
        msgs["closed"] = str(e)
    del t
    return msgs, total, after_close


def init_all_in_one_process(devices, seed):
    """One process driving several GPUs: every collective call inside
    symnccl.group()."""
    comms = symnccl.Communicator.init_all(devices, timeout=120)
    n = len(comms)
    assert [c.rank for c in comms] == list(range(n))
    assert all(c.symmetric and c.lsa_size == n for c in comms)
    rows = []
    for dtype in ("float32", "bfloat16", "int64", "float8_e4m3fn"):
        npdt = _check.numpy_dtype(dtype)
        count = 65537
        with symnccl.group():
            bufs = [c.empty(count, dtype) for c in comms]
        ins = [_check.make_input(dtype, count, r, seed) for r in range(n)]
        for b, a in zip(bufs, ins):
            _fill(b, a)
        with symnccl.group():
            for c, b in zip(comms, bufs):
                c.all_reduce(b)
        for b in bufs:
            rows.append((dtype, _check.count_wrong(_read(b, npdt), "sum", ins,
                                                   dtype)))
    symnccl.close_all(comms)
    return rows


def reduce_scatter_windows_odd_blocks(rank, nranks, uid, seed):
    """reduce_scatter between SymmetricBuffers with per-rank blocks that are
    not 16-byte multiples (NCCL 2.28.9's symmetric kernel gets these wrong;
    symnccl must not)."""
    comm = symnccl.Communicator(uid, rank, nranks, device=rank, timeout=120)
    rows = []
    for dtype in ("bfloat16", "float16", "float8_e4m3fn", "float32"):
        npdt = _check.numpy_dtype(dtype)
        for count in (1, 1031, 4096, 4099, 65537):
            ins = [_check.make_input(dtype, count * nranks, r, seed)
                   for r in range(nranks)]
            x, y = comm.empty(count * nranks, dtype), comm.empty(count, dtype)
            _fill(x, ins[rank])
            _fill(y, _check.poison(y.nbytes))
            comm.reduce_scatter(x, out=y)
            part = [a[rank * count:(rank + 1) * count] for a in ins]
            rows.append((dtype, count, _check.count_wrong(_read(y, npdt),
                                                          "sum", part,
                                                          dtype)))
    comm.close()
    return rows


LSA_SIZES = (1, 3, 8, 1031, 65537, 1000003)


def ran_kernels(comm, before):
    """The kernels (and "nccl") launched since _launches() gave `before`."""
    after = comm._launches()
    return {k for k in after if after[k] != before[k]}


def expected_kernels(comm, algo, count, dtype, op, in_window):
    """What algo may launch for this call: its kernels (ll and ll128: the
    one- or two-shot), auto's pick's, or "nccl"."""
    if algo == "auto":
        nbytes = count * np.dtype(_check.numpy_dtype(dtype)).itemsize
        algo = comm._auto_algo(nbytes, dtype, op, in_window)
    return set(symnccl._C.ALGO_KERNELS[algo]) or {"nccl"}


def lsa_algorithms(rank, nranks, uid, seed, sizes=LSA_SIZES, env=None):
    """Every LSA algo x dtype x op x input placement against the float64
    reference, poisoned outputs, and the proof that the algorithm's own
    kernel ran (launch counters); returns rows (the last field: wrong
    elements, or what ran instead of the algorithm's kernels), per-result
    digests so the parent can check that every rank got bitwise-identical
    results, and the launch counters. env: knobs set while the communicator
    is created."""
    import hashlib
    import os
    import torch
    torch.cuda.set_device(rank)
    os.environ.update(env or {})
    try:
        comm = symnccl.Communicator(uid, rank, nranks, device=rank,
                                    timeout=120)
    finally:
        for k in env or {}:
            del os.environ[k]
    rows, digests = [], {}
    for dtype in symnccl.LSA_DTYPES:
        npdt = _check.numpy_dtype(dtype)
        tdt = getattr(torch, dtype)
        for count in sizes:
            win = comm.empty(count + 16, dtype)   # room for offset views
            wt = torch.from_dlpack(win)
            for algo in ("one_shot", "two_shot", "ll", "ll128", "push",
                         "lamport", "auto"):
                for op in symnccl.LSA_OPS:
                    # lamport: float dtypes, sum and avg (the others are
                    # refused: tests/test_loopback.py); every other
                    # algorithm takes every LSA dtype and op
                    if algo == "lamport" and not symnccl.algo_supported(
                            comm, algo, dtype, op):
                        continue
                    ins = [_check.make_input(dtype, count, r, seed, op)
                           for r in range(nranks)]
                    host = torch.from_numpy(ins[rank].view(np.uint8).copy())
                    mine = host.cuda().view(tdt)
                    for place in ("window", "window_out", "tensor",
                                  "tensor_unaligned"):
                        if place.startswith("window"):
                            x = wt[:count]
                            x.copy_(mine)
                        elif place == "tensor":
                            x = mine.clone()
                        else:
                            x = torch.empty(count + 1, dtype=tdt,
                                            device="cuda")[1:]
                            x.copy_(mine)
                        before = comm._launches()
                        if place in ("window", "tensor"):
                            out = x   # in place
                            y = comm.all_reduce(x, op=op, algo=algo)
                        else:
                            out = torch.empty_like(mine).view(torch.uint8)
                            out.fill_(0xFF)
                            out = out.view(tdt)
                            y = comm.all_reduce(x, out=out, op=op, algo=algo)
                        assert y is out
                        ran = ran_kernels(comm, before)
                        want = expected_kernels(comm, algo, count, dtype, op,
                                                place.startswith("window"))
                        got = out.view(torch.uint8).cpu().numpy().view(npdt)
                        w = _check.count_wrong(got, op, ins, dtype)
                        if not ran or not ran <= want:
                            w = f"ran {sorted(ran)}, expected {sorted(want)}"
                        rows.append((algo, dtype, op, count, place, w))
                        digests[(algo, dtype, op, count, place)] = \
                            hashlib.sha1(got.tobytes()).hexdigest()
            del wt, win
    launches = comm._launches()
    comm.close()
    return rows, digests, launches


def _comm_small_push_region(rank, nranks, uid):
    """A communicator on GPU `rank` whose push region is shrunk to 1 MiB
    (slots of 256 KiB / nranks), so that push walks many chunks at the
    sizes of the stress tests."""
    import os
    import torch
    torch.cuda.set_device(rank)
    os.environ["SYMNCCL_PUSH_REGION_MIB"] = "1"
    try:
        return symnccl.Communicator(uid, rank, nranks, device=rank,
                                    timeout=120)
    finally:
        del os.environ["SYMNCCL_PUSH_REGION_MIB"]


def _small_ints(gen, seed, it, nranks, count, tdt):
    """Every rank's input of call `it`: integers in [-8, 8] (exact in every
    dtype and summation order), drawn on the GPU from per-(call, rank)
    seeds, so each rank can compute the exact expected result."""
    import torch
    vals = []
    for r in range(nranks):
        gen.manual_seed(seed * 100003 + it * 64 + r)
        vals.append(torch.randint(-8, 9, (count,), generator=gen,
                                  device="cuda").to(tdt))
    return vals


def lsa_graph_and_stress(rank, nranks, uid, seed, iters):
    """CUDA-graph capture + replay with new data for every LSA algo, then
    `iters` eager calls with random sizes, dtypes, ops, algos, placements
    and streams, each checked on the GPU (no host sync per call); returns
    the failures. The push region is shrunk to 1 MiB so that push walks
    many chunks (slots of 256 KiB / nranks) at these sizes."""
    import torch
    comm = _comm_small_push_region(rank, nranks, uid)
    bad = []
    for algo in ("one_shot", "two_shot", "ll", "ll128", "push", "lamport"):
        x = torch.empty(100003, dtype=torch.bfloat16, device="cuda")
        out = torch.empty_like(x)
        comm.all_reduce(x, out=out, algo=algo)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            comm.all_reduce(x, out=out, algo=algo)
            # in place, 2nd op: a sum again, so that its result (nranks
            # times the first's) shows it ran
            comm.all_reduce(out, algo=algo)
        for it in range(5):
            ins = [_check.make_input("bfloat16", 100003, r, seed + it)
                   for r in range(nranks)]
            x.copy_(torch.from_numpy(ins[rank].view(np.uint16).copy())
                    .view(torch.bfloat16).cuda())
            out.fill_(float("nan"))
            g.replay()
            got = out.view(torch.uint16).cpu().numpy().view(ins[0].dtype)
            w = _check.count_wrong(got, "sum", ins * nranks, "bfloat16")
            if w:
                bad.append(("graph", algo, it, w))
    torch.cuda.synchronize()

    # Stress: every rank draws the same sequence; inputs are small integers
    # (exact in every dtype and order), regenerated for all ranks from
    # per-(iteration, rank) seeds, so the expected result is exact.
    rng = np.random.default_rng(seed)
    gen = torch.Generator(device="cuda")
    maxn = 1 << 20
    wins = {dt: torch.from_dlpack(comm.empty(maxn + 16, dt))
            for dt in ("float32", "bfloat16")}
    side = torch.cuda.Stream()
    algos = ("one_shot", "two_shot", "ll", "ll128", "push", "lamport",
             "auto", "nccl")
    # wrong elements per (algo, placement, dtype, side stream?), on the GPU
    errors = torch.zeros((len(algos), 4, 2, 2), dtype=torch.int64,
                         device="cuda")
    for it in range(iters):
        count = int(rng.integers(1, 1 << int(rng.integers(1, 21))))
        di = int(rng.integers(0, 2))
        dt = ("float32", "bfloat16")[di]
        ai = int(rng.integers(0, len(algos)))
        algo = algos[ai]
        op = ("sum", "max")[int(rng.integers(0, 2))]
        if algo == "lamport":   # sums only
            op = "sum"
        place = int(rng.integers(0, 4))
        use_side = bool(rng.integers(0, 4) == 0)
        tdt = getattr(torch, dt)
        vals = _small_ints(gen, seed, it, nranks, count, tdt)
        want = vals[0].float()
        for v in vals[1:]:
            want = want + v.float() if op == "sum" else \
                torch.maximum(want, v.float())
        s = side if use_side else torch.cuda.current_stream()
        if use_side:
            side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            if place == 0:      # in place in a window, unaligned offset
                off = int(rng.integers(0, 9))
                x = wins[dt][off:off + count]
                x.copy_(vals[rank])
                comm.all_reduce(x, op=op, algo=algo)
                got = x
            elif place == 1:    # window in, tensor out
                x = wins[dt][:count]
                x.copy_(vals[rank])
                got = torch.full_like(x, float("nan"))
                comm.all_reduce(x, out=got, op=op, algo=algo)
            elif place == 2:    # tensor in place
                got = vals[rank].clone()
                comm.all_reduce(got, op=op, algo=algo)
            else:               # tensor, new output
                got = comm.all_reduce(vals[rank], out=torch.empty_like(
                    vals[rank]), op=op, algo=algo)
            errors[ai, place, di, int(use_side)] += (got.float()
                                                      != want).sum()
        if use_side:
            torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    for idx in torch.nonzero(errors).tolist():
        ai, place, di, sd = idx
        bad.append(("stress", algos[ai], ("window_inplace_offset",
                    "window_to_tensor", "tensor_inplace", "tensor_out")[place],
                    ("float32", "bfloat16")[di], "side" if sd else "main",
                    int(errors[ai, place, di, sd])))
    # back to back, checked at the end: before each max, rank r adds r, so
    # every call moves the value by nranks - 1 (exact in float32) and a
    # call that did not run leaves the ranks apart
    five = ("one_shot", "two_shot", "ll", "ll128", "push")
    before = comm._launches()
    x = torch.full((1 << 20,), 1.0, device="cuda")
    for it in range(200):
        x.add_(float(rank))
        comm.all_reduce(x, op="max", algo=five[it % 5])
    want = 1.0 + 200 * (nranks - 1)
    if int((x != want).sum()):
        bad.append(("back_to_back", "mixed", 1 << 20, int((x != want).sum())))
    after = comm._launches()
    for algo in five:   # its one- or two-shot kernel, per world size
        ran = sum(after[k] - before[k] for k in symnccl._C.ALGO_KERNELS[algo])
        if ran < 40:
            bad.append(("back_to_back", algo, "launches", ran))
    comm.close()
    return bad


def push_chunks_under_contention(rank, nranks, uid, seed, iters):
    """push over many chunks whose last chunk is shorter than the others,
    back to back, while another stream keeps the SMs busy: CTAs then start
    and progress unevenly, so one CTA can run chunks ahead of another of
    the same rank. That once let a CTA overwrite a receive slot that a
    lagging CTA of its peer had not yet reduced (the shorter last chunk was
    cut into different CTA runs). Returns the failing calls."""
    import torch
    comm = _comm_small_push_region(rank, nranks, uid)
    # a chunk of push is nranks slots
    slot = comm._staging_layout()["push_slot"]
    assert slot < (1 << 20) // (4 * nranks) + 4096
    rng = np.random.default_rng(seed)
    gen = torch.Generator(device="cuda")
    maxn = 8 * nranks * slot // 2 + 16
    win = torch.from_dlpack(comm.empty(maxn, "bfloat16"))
    busy = torch.ones(1 << 26, device="cuda")
    side = torch.cuda.Stream()
    calls = []
    for it in range(iters):
        dt = (torch.float32, torch.bfloat16)[it % 2]
        chunk = slot // (4 if dt == torch.float32 else 2) * nranks
        # 3 to 8 chunks, the last one short by a random amount
        count = int(rng.integers(2, 8)) * chunk + int(rng.integers(1, chunk))
        place = int(rng.integers(0, 3))
        if it % 8 == 0:
            with torch.cuda.stream(side):
                busy.mul_(1.0000001)
        vals = _small_ints(gen, seed, it, nranks, count, dt)
        want = vals[0].float()
        for v in vals[1:]:
            want = want + v.float()
        if place == 0 and dt == torch.bfloat16:   # in place in a window
            got = win[:count]
            got.copy_(vals[rank])
            comm.all_reduce(got, algo="push")
            got = got.clone()
        elif place == 1:                          # tensor in place
            got = vals[rank].clone()
            comm.all_reduce(got, algo="push")
        else:                                     # tensor, new output
            got = comm.all_reduce(vals[rank], out=torch.empty_like(
                vals[rank]), algo="push")
        wrong = got.float() != want
        calls.append((it, count, str(dt)[6:], place, chunk, wrong.sum(),
                      wrong.int().argmax()))
    torch.cuda.synchronize()
    bad = [(it, count, dt, ("window", "tensor", "tensor_out")[place],
            f"{int(w)} wrong", f"first at {int(i)} (chunk {int(i) // chunk} "
            f"of {(count + chunk - 1) // chunk})")
           for it, count, dt, place, chunk, w, i in calls if int(w)]
    comm.close()
    return bad


def lsa_two_comms_two_streams(rank, nranks, uid, uid2, iters):
    """Two communicators on two streams, issued in opposite orders on
    alternate ranks, and one communicator used from two streams with no
    synchronisation between calls: nothing may hang or be wrong."""
    import torch
    torch.cuda.set_device(rank)
    c1 = symnccl.Communicator(uid, rank, nranks, device=rank, timeout=120)
    c2 = symnccl.Communicator(uid2, rank, nranks, device=rank, timeout=120)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    n = 65537
    want = float(nranks * (nranks + 1) // 2)
    a = torch.full((n,), float(rank + 1), device="cuda")
    b = torch.full((n,), float(rank + 1), device="cuda")
    torch.cuda.synchronize()
    bad = []
    for it in range(iters):
        algo = ("ll", "one_shot", "two_shot", "ll128", "push",
                "lamport")[it % 6]
        xa = a.clone()
        xb = b.clone()
        torch.cuda.synchronize()
        order = [(c1, s1, xa), (c2, s2, xb)]
        if rank % 2:
            order.reverse()
        for c, s, x in order:
            with torch.cuda.stream(s):
                c.all_reduce(x, algo=algo)
        torch.cuda.synchronize()
        w = int((xa != want).sum()) + int((xb != want).sum())
        if w:
            bad.append(("two_comms", algo, it, w))
    # one communicator, two streams, alternating, no sync between calls:
    # symnccl orders them (the later call waits for the earlier one)
    xs = [a.clone() for _ in range(8)]
    torch.cuda.synchronize()
    for i, x in enumerate(xs):
        with torch.cuda.stream((s1, s2)[i % 2]):
            c1.all_reduce(x, algo=("ll", "one_shot", "push",
                                   "ll128")[i // 2 % 4])
    torch.cuda.synchronize()
    w = sum(int((x != want).sum()) for x in xs)
    if w:
        bad.append(("one_comm_two_streams", w))
    c2.close()
    c1.close()
    return bad


def lsa_large(rank, nranks, uid, seed):
    """256 MiB-class messages (odd counts) through every algorithm, in place
    in a window and from a tensor (chunked through the staging window),
    checked on the GPU against a float64 reference."""
    import torch
    torch.cuda.set_device(rank)
    comm = symnccl.Communicator(uid, rank, nranks, device=rank, timeout=300)
    count = (256 << 20) // 2 - 3          # bf16, not a multiple of anything
    gen = torch.Generator(device="cuda")
    ref = torch.zeros(count, dtype=torch.float64, device="cuda")
    mag = torch.zeros_like(ref)
    mine = None
    for r in range(nranks):
        gen.manual_seed(seed * 1000 + r)
        v = (torch.rand(count, generator=gen, device="cuda") * 2 - 1).to(
            torch.bfloat16)
        ref += v.double()
        mag += v.double().abs()
        if r == rank:
            mine = v
    tol = (nranks + 1) * 2.0 ** -7 * mag + 2.0 ** -7 * ref.abs()
    win = torch.from_dlpack(comm.empty(count + 8, "bfloat16"))
    rows = []
    for algo in ("ll", "ll128", "lamport", "one_shot", "two_shot", "push",
                 "auto", "nccl"):
        for place in ("window", "window_aligned", "tensor"):
            before = comm._launches()
            if place.startswith("window"):
                # 2-byte offset (unaligned), or 16 bytes in
                off = 8 if place == "window_aligned" else 1
                x = win[off:off + count]
                x.copy_(mine)
                comm.all_reduce(x, algo=algo)
                got = x
            else:
                got = torch.full_like(mine, float("nan"))
                comm.all_reduce(mine, out=got, algo=algo)
            ran = ran_kernels(comm, before)
            want = expected_kernels(comm, algo, count, "bfloat16", "sum",
                                    place.startswith("window"))
            d = (got.double() - ref).abs()
            w = int(((d > tol) | ~torch.isfinite(d)).sum())
            if not ran or not ran <= want:
                w = f"ran {sorted(ran)}, expected {sorted(want)}"
            rows.append((algo, place, count, w))
            del got, d
    comm.close()
    return rows


def multimem_every_dtype(rank, nranks, uid, seed):
    """algo='multimem' for every dtype/op it supports, in place and not,
    against the float64 reference; None when multicast was not granted."""
    import torch
    torch.cuda.set_device(rank)
    comm = symnccl.Communicator(uid, rank, nranks, device=rank, timeout=120,
                                multicast=True)
    if not comm.multicast:
        comm.close()
        return None
    rows = []
    for dtype, ops in symnccl.MULTIMEM_OPS.items():
        npdt = _check.numpy_dtype(dtype)
        tdt = getattr(torch, dtype)
        for count in (1, 7, 1031, 65537, 1000003):
            win = torch.from_dlpack(comm.empty(count, dtype))
            for op in ops:
                ins = [_check.make_input(dtype, count, r, seed, op)
                       for r in range(nranks)]
                mine = torch.from_numpy(ins[rank].view(np.uint8).copy()) \
                    .cuda().view(tdt)
                for inplace in (True, False):
                    if inplace:
                        win.copy_(mine)
                        comm.all_reduce(win, op=op, algo="multimem")
                        got = win
                    else:
                        got = torch.full_like(mine, float("nan"))
                        comm.all_reduce(mine, out=got, op=op,
                                        algo="multimem")
                    out = got.view(torch.uint8).cpu().numpy().view(npdt)
                    rows.append((dtype, op, count, inplace,
                                 _check.count_wrong(out, op, ins, dtype)))
    comm.close()
    return rows
