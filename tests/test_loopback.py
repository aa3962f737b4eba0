"""GPU tier, one GPU: symnccl's kernels at world sizes 2, 3, 4 and 8 on a
loopback team (Communicator._loopback, csrc/runtime/loopback.c): every rank of the
team on this GPU, each rank's calls on a stream of its own, the kernels and
the host launch path unchanged. The kernels' peer logic (packets, epochs,
slots, barriers, flags, the fault words) runs here as on NVLink, through
this GPU's memory instead; what only NVLink shows (its ordering and speed)
still needs the multi-GPU tier."""
import random
import time

import numpy as np
import pytest

import symnccl
from conftest import LOOPBACK_GRID_KNOBS as GRID_KNOBS
from conftest import last_rank_never_calls
from symnccl import _check

pytestmark = pytest.mark.gpu

# The kernels and the knob settings that make the launch path pick each:
# (algo, kernel reported by _launches(), knobs).
KERNELS = [
    ("one_shot", "one_shot", {}),
    ("two_shot", "two_shot", {}),
    ("ll", "ll", {"SYMNCCL_LL_TWO_SHOT_KIB": "1048576"}),
    ("ll", "ll_two_shot", {"SYMNCCL_LL_TWO_SHOT_KIB": "0"}),
    ("ll128", "ll128", {"SYMNCCL_LL128_TWO_SHOT_KIB": "1048576"}),
    ("ll128", "ll128_two_shot", {"SYMNCCL_LL128_TWO_SHOT_KIB": "0"}),
    ("push", "push", {}),
    ("lamport", "lamport", {}),
]
KERNEL_IDS = [k[1] for k in KERNELS]
OPS = ["sum", "max", "min", "avg"]
# what lamport takes (its empty word is a float NaN; max and min would
# pass a stand-in NaN's bits through): every other pair is refused
LAMPORT_TAKES = {(dt, op) for dt in ("float32", "float16", "bfloat16")
                 for op in ("sum", "avg")}
SIZES = [1, 4099, 100_003]
WORLDS = [2, 3, 4, 8]
def _torch():
    return pytest.importorskip("torch")


def _grid(nranks):
    """CTAs per rank: the whole team's grids must be resident at once on
    one GPU (132 SMs on H100/H200)."""
    return {2: 32, 3: 16, 4: 16, 8: 8}.get(nranks, 4)


# The timeout of the tests in which a rank never calls: every such test
# waits it out once, so it sets the one-GPU tier's length (a loopback
# rank's kernels start within milliseconds of its call).
STOP_TIMEOUT = 0.5


def _team(monkeypatch, nranks, knobs=None, timeout=20.0, **kw):
    for k in GRID_KNOBS:
        monkeypatch.setenv(k, str(_grid(nranks)))
    for k, v in (knobs or {}).items():
        monkeypatch.setenv(k, v)
    return symnccl.Communicator._loopback(nranks, 0, timeout=timeout, **kw)


def _close(team):
    for c in team:
        c.close()


def _device(torch, a):
    """A numpy array's bytes in device memory, viewed as the torch dtype of
    the same name."""
    t = torch.from_numpy(np.ascontiguousarray(a).view(np.uint8)).cuda()
    return t.view(getattr(torch, a.dtype.name))


def _host(t, npdt):
    import torch
    return t.view(torch.uint8).cpu().numpy().view(npdt)


def _run(torch, team, streams, xs, outs, **kw):
    """Rank q's all_reduce of xs[q] into outs[q] on streams[q], every rank
    enqueued before any is waited for, as the ranks of a job do."""
    torch.cuda.synchronize()
    for c, s, x, o in zip(team, streams, xs, outs):
        c.all_reduce(x, out=o, stream=s, **kw)
    torch.cuda.synchronize()


def _inputs(torch, nranks, dtype, count, op, seed, pad):
    """Every rank's input, random, as device views starting `pad` elements
    into their allocation (pad 1: not 16-byte aligned), and the poisoned
    outputs likewise."""
    npdt = _check.numpy_dtype(dtype)
    hs = [_check.make_input(dtype, count, q, seed, op) for q in range(nranks)]
    xs, outs = [], []
    for h in hs:
        full = np.concatenate([h[:1].repeat(pad), h]) if pad else h
        xs.append(_device(torch, full)[pad:])
        o = _device(torch, _check.poison((count + pad) * npdt.itemsize)
                    .view(npdt))
        outs.append(o[pad:])
    return hs, xs, outs


@pytest.mark.parametrize("nranks", WORLDS)
@pytest.mark.parametrize("algo,kernel,knobs", KERNELS, ids=KERNEL_IDS)
def test_every_kernel_dtype_op_and_size_against_float64(monkeypatch, nranks,
                                                         algo, kernel, knobs):
    torch = _torch()
    team = _team(monkeypatch, nranks, knobs)
    streams = [torch.cuda.Stream() for _ in team]
    wrong = []
    calls = refused = 0
    try:
        for dtype in symnccl.LSA_DTYPES:
            npdt = _check.numpy_dtype(dtype)
            if npdt is None:
                pytest.skip(f"{dtype} needs ml_dtypes, which is not installed")
            for op in OPS:
                if algo == "lamport" and (dtype, op) not in LAMPORT_TAKES:
                    # refused on the caller's rank before any launch
                    hs, xs, outs = _inputs(torch, nranks, dtype, 5, op,
                                           seed=1, pad=0)
                    with pytest.raises(ValueError, match="lamport|float32"):
                        team[0].all_reduce(xs[0], out=outs[0], op=op,
                                           algo=algo)
                    refused += 1
                    continue
                for count in SIZES:
                    pad = count % 2   # odd sizes also start unaligned
                    hs, xs, outs = _inputs(torch, nranks, dtype, count, op,
                                           seed=count + nranks, pad=pad)
                    _run(torch, team, streams, xs, outs, op=op, algo=algo)
                    calls += 1
                    res = [_host(o, npdt) for o in outs]
                    bad = _check.count_wrong(res[0], op, hs, dtype)
                    same = all(r.tobytes() == res[0].tobytes()
                               for r in res[1:])
                    if bad or not same:
                        wrong.append((dtype, op, count, bad, same))
        launches = [c._launches() for c in team]
    finally:
        _close(team)
    assert calls + refused * len(SIZES) == 8 * len(OPS) * len(SIZES)
    assert refused == (8 * len(OPS) - len(LAMPORT_TAKES)
                       if algo == "lamport" else 0)
    assert not wrong, f"{kernel} on {nranks} ranks: (dtype, op, count, " \
                      f"elements wrong, ranks bitwise equal): {wrong}"
    # the kernel named ran, and no other
    for q, l in enumerate(launches):
        ran = {k for k, v in l.items() if v}
        assert ran == {kernel}, (q, l)


@pytest.mark.parametrize("nranks", [3, 4])
def test_every_algorithm_gives_the_same_bits(monkeypatch, nranks):
    """The reduction order is fixed (rank 0, 1, ... n-1) in every kernel, so
    every algorithm's result is bitwise the same, on every rank."""
    torch = _torch()
    monkeypatch.setenv("SYMNCCL_LL_TWO_SHOT_KIB", "64")
    monkeypatch.setenv("SYMNCCL_LL128_TWO_SHOT_KIB", "64")
    team = _team(monkeypatch, nranks)
    streams = [torch.cuda.Stream() for _ in team]
    try:
        for dtype in ("bfloat16", "float32", "float16"):
            npdt = _check.numpy_dtype(dtype)
            if npdt is None:
                continue
            for count in (3001, 77_777):
                seen = {}
                for algo in ("one_shot", "two_shot", "ll", "ll128", "push",
                             "lamport"):
                    hs, xs, outs = _inputs(torch, nranks, dtype, count,
                                           "sum", seed=5, pad=0)
                    _run(torch, team, streams, xs, outs, algo=algo)
                    for q, o in enumerate(outs):
                        seen[(algo, q)] = _host(o, npdt).tobytes()
                assert len(set(seen.values())) == 1, (
                    dtype, count, sorted({k[0] for k, v in seen.items()
                                          if v != seen[("one_shot", 0)]}))
    finally:
        _close(team)


@pytest.mark.parametrize("nranks", [2, 3, 8])
def test_stress_back_to_back_random_sizes_algorithms_and_places(monkeypatch,
                                                                 nranks):
    """Calls of random size, algorithm and placement (in place or not,
    aligned or not) enqueued back to back on every rank, nothing waited for
    until the last, with random ranks held back before random calls: the
    kernels' epochs and flags alone keep consecutive calls apart, and
    peers that arrive late find what the early ones left."""
    torch = _torch()
    monkeypatch.setenv("SYMNCCL_LL_TWO_SHOT_KIB", "16")
    monkeypatch.setenv("SYMNCCL_LL128_TWO_SHOT_KIB", "32")
    team = _team(monkeypatch, nranks)
    streams = [torch.cuda.Stream() for _ in team]
    rng = random.Random(1234 + nranks)
    npdt = np.dtype(np.float32)
    calls = []
    for i in range(120):
        algo = rng.choice(["one_shot", "two_shot", "ll", "ll128", "push",
                           "lamport"])
        count = rng.choice([rng.randint(1, 64), rng.randint(64, 20_000),
                            rng.randint(20_000, 300_000)])
        pad = rng.randint(0, 3)
        in_place = rng.random() < 0.4
        hs, xs, outs = _inputs(torch, nranks, "float32", count, "sum",
                               seed=i, pad=pad)
        late = rng.randrange(nranks) if rng.random() < 0.3 else -1
        calls.append((algo, count, pad, in_place, hs, xs,
                      xs if in_place else outs, late))
    # Loaded before any rank waits: CUDA loads a kernel at its first launch
    # (lazy loading), and the load waits for the kernels running in the
    # context, here the early ranks' kernels, which wait for the late rank
    # (loopback.c).
    torch.cuda._sleep(1)
    torch.cuda.synchronize()
    failures = []
    try:
        for algo, count, pad, in_place, hs, xs, outs, late in calls:
            for q, (c, s, x, o) in enumerate(zip(team, streams, xs, outs)):
                if q == late:   # about 50 us behind the others
                    with torch.cuda.stream(s):
                        torch.cuda._sleep(100_000)
                c.all_reduce(x, out=None if in_place else o, stream=s,
                             algo=algo)
        torch.cuda.synchronize()
        for i, (algo, count, pad, in_place, hs, xs, outs, late) in \
                enumerate(calls):
            res = [_host(o, npdt) for o in outs]
            bad = _check.count_wrong(res[0], "sum", hs, "float32")
            same = all(r.tobytes() == res[0].tobytes() for r in res[1:])
            if bad or not same:
                failures.append((i, algo, count, pad, in_place, bad, same))
        for c in team:
            c.check()
    finally:
        _close(team)
    assert not failures, failures


def _replay(torch, graphs, streams):
    """Every rank's graph replayed on its stream, after the inputs the
    current stream wrote."""
    torch.cuda.synchronize()
    for g, s in zip(graphs, streams):
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            g.replay()
    torch.cuda.synchronize()


@pytest.mark.parametrize("nranks", [2, 4])
def test_graph_replays_on_every_rank(monkeypatch, nranks):
    """Each rank captures its call into a CUDA graph; the replays (new
    inputs each time) carry the epochs in device memory."""
    torch = _torch()
    team = _team(monkeypatch, nranks)
    streams = [torch.cuda.Stream() for _ in team]
    try:
        for algo in ("one_shot", "two_shot", "ll", "ll128", "push",
                     "lamport"):
            xs = [torch.empty(5000, device="cuda") for _ in team]
            outs = [torch.empty(5000, device="cuda") for _ in team]
            graphs = []
            for c, s, x, o in zip(team, streams, xs, outs):
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, stream=s):
                    c.all_reduce(x, out=o, algo=algo)
                graphs.append(g)
            for rep in range(6):
                hs = [_check.make_input("float32", 5000, q, rep)
                      for q in range(nranks)]
                for x, h in zip(xs, hs):
                    x.copy_(torch.from_numpy(h))
                _replay(torch, graphs, streams)
                for o in outs:
                    assert _check.count_wrong(o.cpu().numpy(), "sum", hs,
                                              "float32") == 0, (algo, rep)
    finally:
        _close(team)


@pytest.mark.parametrize("algo", ["one_shot", "two_shot", "ll", "ll128",
                                  "push", "lamport"])
def test_a_rank_that_never_calls_times_out_on_every_other_rank(monkeypatch,
                                                                algo):
    """Rank 2 of 3 never makes the call: ranks 0 and 1 give up after the
    timeout, each raises PeerTimeoutError, one of them names rank 2, and
    the GPU stays usable."""
    torch = _torch()
    team = _team(monkeypatch, 3, timeout=STOP_TIMEOUT)
    x = [torch.randn(4099, device="cuda") for _ in team]
    last_rank_never_calls(
        torch, team, lambda c, s, q: c.all_reduce(x[q], algo=algo, stream=s),
        STOP_TIMEOUT, "all_reduce", lambda k: k.startswith(algo))


@pytest.mark.parametrize("op", ["sum", "avg"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_lamport_sends_words_of_x_that_look_empty(monkeypatch, dtype, op):
    """An 8-byte word of x that is all ones (each element the NaN that
    marks an empty Lamport slot) travels as another NaN: the call ends (a
    word sent as it is would be waited for until the timeout), gives
    one_shot's bits on every rank, NaN exactly where a rank's word was; so
    does the clean call after it, on the slots the first one left."""
    torch = _torch()
    nranks, count = 3, 4104
    team = _team(monkeypatch, nranks, timeout=5.0)
    streams = [torch.cuda.Stream() for _ in team]
    ints = {"float32": torch.int32, "float16": torch.int16,
            "bfloat16": torch.int16}[dtype]
    npdt = _check.numpy_dtype(dtype)
    per_word = 8 // npdt.itemsize
    try:
        for rep in range(2):
            marked = set()
            hs, xs, _ = _inputs(torch, nranks, dtype, count, op,
                                seed=21 + rep, pad=0)
            if rep == 0:
                words = [x.view(ints).view(-1, per_word) for x in xs]
                for q, word in ((0, 3), (0, 7), (1, 7), (2, 7), (1, 10),
                                (1, 11), (2, count // per_word - 1)):
                    words[q][word] = -1   # (1, 10-11): a whole packet
                    marked.add(word)
            got = {}
            for algo in ("one_shot", "lamport"):
                outs = [_device(torch, _check.poison(count * npdt.itemsize)
                                .view(npdt)) for _ in team]
                _run(torch, team, streams, xs, outs, op=op, algo=algo)
                got[algo] = [_host(o, npdt) for o in outs]
            for q in range(nranks):
                assert got["lamport"][q].tobytes() == \
                    got["one_shot"][q].tobytes(), (rep, q)
            nan_words = np.isnan(got["lamport"][0].astype(np.float32)) \
                .reshape(-1, per_word).any(axis=1)
            assert set(np.flatnonzero(nan_words)) == marked, rep
        assert team[0]._launches()["lamport"] == 2
    finally:
        _close(team)


@pytest.mark.parametrize("nranks", [2, 3])
def test_lamport_all_reduce_and_fused_kernel_share_their_slots(monkeypatch,
                                                               nranks):
    """all_reduce(algo="lamport") and all_reduce_rmsnorm(algo="lamport")
    use one Lamport region and one set of call counters: enqueued in turn
    on every rank with no wait between them, each call finds the slots the
    other kernel's calls left empty. Every result has one_shot's bits."""
    torch = _torch()
    # the fused one_shot's grid resident beside the other ranks' too
    monkeypatch.setenv("SYMNCCL_RMSNORM_CTAS", str(_grid(nranks)))
    team = _team(monkeypatch, nranks)
    streams = [torch.cuda.Stream() for _ in team]
    rng = random.Random(77 + nranks)
    T, H, eps = 5, 1024, 1e-6
    calls = []
    for i in range(24):
        count = rng.choice([rng.randint(1, 300), rng.randint(300, 70_000)])
        hs, xs, _ = _inputs(torch, nranks, "float32", count, "sum", seed=i,
                            pad=rng.randint(0, 1))
        gen = torch.Generator(device="cuda").manual_seed(i)
        rows = [torch.randn(T, H, device="cuda", generator=gen)
                for _ in team]
        res = torch.randn(T, H, device="cuda", generator=gen)
        w = torch.randn(H, device="cuda", generator=gen)
        calls.append((xs, rows, res, w))

    def enqueue(algo):
        # every rank's first call of each kernel waited for before the
        # next: CUDA loads a kernel at its first launch, and that load
        # waits for the kernels running on the GPU, here the ranks' calls
        # before, which wait for the rank whose launch is loading
        # (loopback.c)
        xs, rows, res, w = calls[0]
        for op in ("all_reduce", "all_reduce_rmsnorm"):
            for q, c in enumerate(team):
                if op == "all_reduce":
                    c.all_reduce(xs[q], out=torch.empty_like(xs[q]),
                                 stream=streams[q], algo=algo)
                else:
                    c.all_reduce_rmsnorm(
                        rows[q], res, w, eps, out=torch.empty_like(rows[q]),
                        residual_out=torch.empty_like(rows[q]),
                        stream=streams[q], algo=algo)
            torch.cuda.synchronize()
        outs = []
        for xs, rows, res, w in calls:
            o = [torch.empty_like(x) for x in xs]
            ys = [torch.empty_like(r) for r in rows]
            hs = [torch.empty_like(r) for r in rows]
            for q, (c, s) in enumerate(zip(team, streams)):
                c.all_reduce(xs[q], out=o[q], stream=s, algo=algo)
                c.all_reduce_rmsnorm(rows[q], res, w, eps, out=ys[q],
                                     residual_out=hs[q], stream=s,
                                     algo=algo)
            outs.append((o, ys, hs))
        torch.cuda.synchronize()
        return outs

    try:
        want = enqueue("one_shot")
        got = enqueue("lamport")
        for i, (w_, g_) in enumerate(zip(want, got)):
            for k in range(3):
                for q in range(nranks):
                    assert torch.equal(
                        g_[k][q].view(torch.int32),
                        w_[k][q].view(torch.int32)), \
                        (i, ("out", "y", "h")[k], q)
        launches = team[0]._launches()
        assert launches["lamport"] == 25 and \
            launches["lamport_rmsnorm"] == 25, launches
    finally:
        _close(team)


def test_loopback_ranks_run_kernels_only(monkeypatch):
    torch = _torch()
    team = _team(monkeypatch, 2)
    try:
        c = team[0]
        assert (c.rank, c.nranks, c.lsa_size, c.symmetric) == (0, 2, 2, True)
        assert c.multicast is False and "loopback" in c.multicast_reason
        x = torch.ones(64, device="cuda")
        with pytest.raises(RuntimeError, match="loopback"):
            c.all_reduce(x, algo="nccl")
        with pytest.raises(RuntimeError, match="loopback"):
            c.reduce_scatter(x, algo="nccl")
        with pytest.raises(RuntimeError, match="loopback"):
            c.barrier()
        with pytest.raises(RuntimeError, match="loopback"):
            c.empty(16)
    finally:
        _close(team)
    with pytest.raises(ValueError, match="nranks"):
        symnccl.Communicator._loopback(0)


# ------------------------------------------------ reduce_scatter, all_gather

RS_SIZES = [1, 1031, 50_001]   # elements per rank's block of the output
SLICE_ALGOS = ["ll", "ll128", "push"]
# a 1 MiB push region: slots of 128 KiB at 2 ranks, 32 KiB at 8, so the
# larger slices take several chunks of the push kernels, and a short last
# one; the reduce-scatter and all-gather take 16 KiB chunks, each CTA split
# into senders and consumers
SMALL_PUSH = {"SYMNCCL_PUSH_REGION_MIB": "1", "SYMNCCL_PUSH_CHUNK_KIB": "16"}


def _slices(torch, nranks, dtype, m, op, seed, pad, per_rank):
    """Every rank's input of `per_rank` elements and a poisoned output of
    the other size (n*m and m for reduce_scatter, m and n*m for
    all_gather), both `pad` elements into their allocation."""
    npdt = _check.numpy_dtype(dtype)
    n_out = nranks * m if per_rank == m else m
    hs = [_check.make_input(dtype, per_rank, q, seed, op)
          for q in range(nranks)]
    xs, outs = [], []
    for h in hs:
        full = np.concatenate([h[:1].repeat(pad), h]) if pad else h
        xs.append(_device(torch, full)[pad:])
        o = _device(torch, _check.poison((n_out + pad) * npdt.itemsize)
                    .view(npdt))
        outs.append(o[pad:])
    return hs, xs, outs


def _kernels_ran(team):
    return [{k for k, v in c._launches().items() if v} for c in team]


@pytest.mark.parametrize("nranks", WORLDS)
@pytest.mark.parametrize("algo", SLICE_ALGOS)
def test_reduce_scatter_is_every_rank_s_block_of_the_all_reduce(
        monkeypatch, nranks, algo):
    """Every dtype and op against float64, and bitwise equal to the block
    of symnccl's all_reduce of the same inputs (the same reduction order)."""
    torch = _torch()
    team = _team(monkeypatch, nranks, SMALL_PUSH)
    streams = [torch.cuda.Stream() for _ in team]
    wrong = []
    try:
        for dtype in symnccl.LSA_DTYPES:
            npdt = _check.numpy_dtype(dtype)
            if npdt is None:
                pytest.skip(f"{dtype} needs ml_dtypes, which is not installed")
            # the largest block up to 4 ranks only (its host reference is
            # the cost); at 8 ranks 50_001-element blocks already span
            # several rounds of the 1 MiB push region (4- and 8-byte dtypes)
            sizes = RS_SIZES + ([300_007] if dtype in ("float32", "bfloat16")
                                and nranks <= 4 else [])
            for op in OPS:
                for m in sizes:
                    pad = m % 2
                    hs, xs, outs = _slices(torch, nranks, dtype, m, op,
                                           seed=m + nranks, pad=pad,
                                           per_rank=nranks * m)
                    ars = [torch.empty_like(x) for x in xs]
                    torch.cuda.synchronize()
                    # every rank's first call before any rank's second:
                    # a kernel's first launch (CUDA's lazy loading) waits
                    # for the kernels running, which wait for the ranks
                    # not yet called (loopback.c)
                    for c, s, x, o in zip(team, streams, xs, outs):
                        c.reduce_scatter(x, out=o, op=op, algo=algo,
                                         stream=s)
                    for c, s, x, r in zip(team, streams, xs, ars):
                        c.all_reduce(x, out=r, op=op, algo=algo, stream=s)
                    torch.cuda.synchronize()
                    for q in range(nranks):
                        res = _host(outs[q], npdt)
                        block = _host(ars[q], npdt)[q * m:(q + 1) * m]
                        bad = _check.count_wrong(
                            res, op, [h[q * m:(q + 1) * m] for h in hs], dtype)
                        if bad or res.tobytes() != block.tobytes():
                            wrong.append((dtype, op, m, q, bad))
        ran = _kernels_ran(team)
    finally:
        _close(team)
    assert not wrong, f"(dtype, op, m, rank, elements wrong): {wrong[:10]}"
    rs = symnccl._C.COLLECTIVE_KERNELS["reduce_scatter"][algo]
    for r in ran:
        assert rs in r and not (r - {rs, algo, algo + "_two_shot"}), r


@pytest.mark.parametrize("nranks", WORLDS)
@pytest.mark.parametrize("algo", SLICE_ALGOS)
def test_all_gather_every_dtype_bit_exact(monkeypatch, nranks, algo):
    torch = _torch()
    team = _team(monkeypatch, nranks, SMALL_PUSH)
    streams = [torch.cuda.Stream() for _ in team]
    wrong = []
    try:
        for dtype in symnccl.DTYPES:
            npdt = _check.numpy_dtype(dtype)
            if npdt is None:
                pytest.skip(f"{dtype} needs ml_dtypes, which is not installed")
            for m in RS_SIZES + [300_007]:
                pad = m % 2
                hs, xs, outs = _slices(torch, nranks, dtype, m, "sum",
                                       seed=m, pad=pad, per_rank=m)
                torch.cuda.synchronize()
                for c, s, x, o in zip(team, streams, xs, outs):
                    c.all_gather(x, out=o, algo=algo, stream=s)
                torch.cuda.synchronize()
                want = np.concatenate(hs).tobytes()
                for q in range(nranks):
                    if _host(outs[q], npdt).tobytes() != want:
                        wrong.append((dtype, m, q))
        ran = _kernels_ran(team)
    finally:
        _close(team)
    assert not wrong, f"(dtype, m, rank): {wrong[:10]}"
    ag = symnccl._C.COLLECTIVE_KERNELS["all_gather"][algo]
    assert all(r == {ag} for r in ran), ran


@pytest.mark.parametrize("algo", SLICE_ALGOS)
def test_reduce_scatter_and_all_gather_in_place(monkeypatch, algo):
    """Rank r's block of the buffer is its reduce_scatter output, or its
    all_gather input."""
    torch = _torch()
    n, m = 3, 40_099   # several push chunks
    team = _team(monkeypatch, n, SMALL_PUSH)
    streams = [torch.cuda.Stream() for _ in team]
    try:
        hs = [_check.make_input("float32", n * m, q, 7) for q in range(n)]
        bufs = [torch.from_numpy(h).cuda() for h in hs]
        torch.cuda.synchronize()
        for q, (c, s, b) in enumerate(zip(team, streams, bufs)):
            c.reduce_scatter(b, out=b[q * m:(q + 1) * m], algo=algo, stream=s)
        torch.cuda.synchronize()
        blocks = [b[q * m:(q + 1) * m].cpu().numpy()
                  for q, b in enumerate(bufs)]
        for q in range(n):
            assert _check.count_wrong(
                blocks[q], "sum", [h[q * m:(q + 1) * m] for h in hs],
                "float32") == 0, q
        for q, (c, s, b) in enumerate(zip(team, streams, bufs)):
            c.all_gather(b[q * m:(q + 1) * m], out=b, algo=algo, stream=s)
        torch.cuda.synchronize()
        for b in bufs:
            assert b.cpu().numpy().tobytes() == \
                np.concatenate(blocks).tobytes()
    finally:
        _close(team)


@pytest.mark.parametrize("nranks", [2, 3])
@pytest.mark.parametrize("chunk_kib", [0, 16, 40])
def test_push_slices_take_one_epoch_per_chunk(monkeypatch, nranks,
                                              chunk_kib):
    """The push reduce_scatter and all_gather walk every slice in chunks of
    SYMNCCL_PUSH_CHUNK_KIB (0: a whole slot, unsplit; smaller: each CTA's
    senders up to two chunks ahead of its consumers): right at every chunk
    size, a short last chunk and unaligned views included, and the call
    counter advances once per chunk (so the kernel took the chunk the knob
    asked for)."""
    torch = _torch()
    team = _team(monkeypatch, nranks, {"SYMNCCL_PUSH_REGION_MIB": "1",
                                       "SYMNCCL_PUSH_CHUNK_KIB":
                                       str(chunk_kib)})
    streams = [torch.cuda.Stream() for _ in team]
    slot = team[0]._staging_layout()["push_slot"]
    step = slot if chunk_kib == 0 else min(slot, chunk_kib << 10)
    m = 100_003                      # float32: 400 KB per slice
    steps = -(-m * 4 // step)
    assert steps >= 3
    try:
        for seed, op in enumerate(("sum", "max")):
            hs, xs, outs = _slices(torch, nranks, "float32", m, op, seed=seed,
                                   pad=1, per_rank=nranks * m)
            before = [c._epoch("push_reduce_scatter") for c in team]
            torch.cuda.synchronize()
            for c, s, x, o in zip(team, streams, xs, outs):
                c.reduce_scatter(x, out=o, op=op, algo="push", stream=s)
            torch.cuda.synchronize()
            for q in range(nranks):
                assert _check.count_wrong(
                    _host(outs[q], np.float32), op,
                    [h[q * m:(q + 1) * m] for h in hs], "float32") == 0, \
                    (op, q)
            assert [c._epoch("push_reduce_scatter") - b
                    for c, b in zip(team, before)] == [steps] * nranks
            gathered = [torch.full((nranks * m + 1,), float("nan"),
                                   device="cuda")[1:] for _ in team]
            before = [c._epoch("push_all_gather") for c in team]
            for c, s, o, g in zip(team, streams, outs, gathered):
                c.all_gather(o, out=g, algo="push", stream=s)
            torch.cuda.synchronize()
            want = np.concatenate([_host(o, np.float32) for o in outs])
            for g in gathered:
                assert _host(g, np.float32).tobytes() == want.tobytes()
            assert [c._epoch("push_all_gather") - b
                    for c, b in zip(team, before)] == [steps] * nranks
        ran = _kernels_ran(team)
    finally:
        _close(team)
    assert all(r == {"push_reduce_scatter", "push_all_gather"}
               for r in ran), ran


def test_reduce_scatter_and_all_gather_graph_replays(monkeypatch):
    """Every kernel of both, captured on every rank of 3 and replayed with
    new inputs: their call counters and epochs live in device memory."""
    torch = _torch()
    n, m = 3, 30_001   # several push chunks
    team = _team(monkeypatch, n, SMALL_PUSH)
    streams = [torch.cuda.Stream() for _ in team]
    try:
        for coll in ("reduce_scatter", "all_gather"):
            for algo in SLICE_ALGOS:
                rs = coll == "reduce_scatter"
                per_rank, n_out = (n * m, m) if rs else (m, n * m)
                xs = [torch.empty(per_rank, device="cuda") for _ in team]
                outs = [torch.empty(n_out, device="cuda") for _ in team]
                graphs = []
                for c, s, x, o in zip(team, streams, xs, outs):
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g, stream=s):
                        getattr(c, coll)(x, out=o, algo=algo)
                    graphs.append(g)
                for rep in range(4):
                    hs = [_check.make_input("float32", per_rank, q, rep)
                          for q in range(n)]
                    for x, h in zip(xs, hs):
                        x.copy_(torch.from_numpy(h))
                    for o in outs:
                        o.fill_(float("nan"))
                    _replay(torch, graphs, streams)
                    for q, o in enumerate(outs):
                        res = o.cpu().numpy()
                        if coll == "all_gather":
                            ok = res.tobytes() == np.concatenate(hs).tobytes()
                        else:
                            ok = _check.count_wrong(
                                res, "sum", [h[q * m:(q + 1) * m] for h in hs],
                                "float32") == 0
                        assert ok, (coll, algo, rep, q)
    finally:
        _close(team)


def test_symnccl_algo_sets_the_auto_of_the_collectives(monkeypatch):
    """SYMNCCL_ALGO=push: reduce_scatter's and all_gather's "auto" run the
    push kernels, though their table picks ll128 / ll for these sizes;
    reduce has no push kernel, so its auto follows its own table (one_shot
    at 2 ranks, symnccl.AUTO_TABLE)."""
    torch = _torch()
    n, m = 2, 5003
    team = _team(monkeypatch, n, {"SYMNCCL_ALGO": "push"})
    streams = [torch.cuda.Stream() for _ in team]
    try:
        hs = [_check.make_input("float32", n * m, q, 3) for q in range(n)]
        xs = [torch.from_numpy(h).cuda() for h in hs]
        torch.cuda.synchronize()
        parts = [c.reduce_scatter(x, stream=s)
                 for c, s, x in zip(team, streams, xs)]
        fulls = [c.all_gather(p, stream=s)
                 for c, s, p in zip(team, streams, parts)]
        torch.cuda.synchronize()
        blocks = []
        for q, p in enumerate(parts):
            blocks.append(p.cpu().numpy())
            assert _check.count_wrong(
                blocks[q], "sum", [h[q * m:(q + 1) * m] for h in hs],
                "float32") == 0, q
        for f in fulls:
            assert f.cpu().numpy().tobytes() == \
                np.concatenate(blocks).tobytes()
        assert all(r == {"push_reduce_scatter", "push_all_gather"}
                   for r in _kernels_ran(team)), _kernels_ran(team)
        outs = [c.reduce(x, root=0, stream=s)
                for c, s, x in zip(team, streams, xs)]
        torch.cuda.synchronize()
        assert _check.count_wrong(outs[0].cpu().numpy(), "sum", hs,
                                  "float32") == 0
        assert all(r == {"push_reduce_scatter", "push_all_gather",
                         "one_shot_reduce"}
                   for r in _kernels_ran(team)), _kernels_ran(team)
    finally:
        _close(team)


@pytest.mark.parametrize("nranks", [2, 3, 8])
def test_stress_all_reduce_reduce_scatter_all_gather_share_the_slots(
        monkeypatch, nranks):
    """Back-to-back calls of every collective on every kernel, random sizes
    and ranks held back: the packet kernels share each format's slots and
    call counters, the load kernels (all-reduce, reduce, broadcast) the
    barrier lines and theirs, the push kernels the push region."""
    torch = _torch()
    monkeypatch.setenv("SYMNCCL_LL_TWO_SHOT_KIB", "16")
    team = _team(monkeypatch, nranks, SMALL_PUSH)
    streams = [torch.cuda.Stream() for _ in team]
    rng = random.Random(99 + nranks)
    calls = []
    for i in range(120):
        coll = rng.choice(["all_reduce", "reduce_scatter", "all_gather",
                           "reduce", "broadcast"])
        algo = rng.choice(
            ["ll", "ll128", "push", "one_shot", "two_shot"]
            if coll == "all_reduce" else SLICE_ALGOS
            if coll in ("reduce_scatter", "all_gather") else ["one_shot"])
        root = rng.randrange(nranks)
        m = rng.choice([rng.randint(1, 64), rng.randint(64, 5000),
                        rng.randint(5000, 120_000)])
        pad = rng.randint(0, 3)
        per_rank = nranks * m if coll == "reduce_scatter" else m
        if coll in ("all_reduce", "reduce", "broadcast"):
            hs, xs, outs = _inputs(torch, nranks, "float32", m, "sum",
                                   seed=i, pad=pad)
        else:
            hs, xs, outs = _slices(torch, nranks, "float32", m, "sum",
                                   seed=i, pad=pad, per_rank=per_rank)
        late = rng.randrange(nranks) if rng.random() < 0.3 else -1
        calls.append((coll, algo, m, hs, xs, outs, late, root))
    torch.cuda._sleep(1)   # loaded before any rank waits (loopback.c)
    torch.cuda.synchronize()
    failures = []
    try:
        for coll, algo, m, hs, xs, outs, late, root in calls:
            for q, (c, s, x, o) in enumerate(zip(team, streams, xs, outs)):
                if q == late:
                    with torch.cuda.stream(s):
                        torch.cuda._sleep(100_000)
                kw = {"root": root} if coll in ("reduce", "broadcast") else {}
                getattr(c, coll)(x, out=o, algo=algo, stream=s, **kw)
        torch.cuda.synchronize()
        for i, (coll, algo, m, hs, xs, outs, late, root) in enumerate(calls):
            for q, o in enumerate(outs):
                res = o.cpu().numpy()
                if coll == "reduce" and q != root:
                    continue   # only the root's output is a result
                if coll == "broadcast":
                    bad = res.tobytes() != hs[root].tobytes()
                elif coll == "all_gather":
                    bad = res.tobytes() != np.concatenate(hs).tobytes()
                elif coll == "reduce_scatter":
                    bad = _check.count_wrong(
                        res, "sum", [h[q * m:(q + 1) * m] for h in hs],
                        "float32")
                else:
                    bad = _check.count_wrong(res, "sum", hs, "float32")
                if bad:
                    failures.append((i, coll, algo, m, q, bad))
        for c in team:
            c.check()
    finally:
        _close(team)
    assert not failures, failures[:10]


@pytest.mark.parametrize("collective,algo", [
    ("reduce_scatter", "ll"), ("all_gather", "ll128"),
    ("reduce_scatter", "push"), ("all_gather", "push"),
    ("reduce", "one_shot"), ("broadcast", "one_shot")])
def test_every_collective_raises_when_a_rank_never_calls(
        monkeypatch, collective, algo):
    torch = _torch()
    team = _team(monkeypatch, 3, timeout=STOP_TIMEOUT)
    streams = [torch.cuda.Stream() for _ in team]
    x = [torch.randn(3 * 1000, device="cuda") for _ in team]
    torch.cuda.synchronize()
    for c, s, xq in zip(team[:2], streams, x):
        getattr(c, collective)(xq, algo=algo, stream=s)
    torch.cuda.synchronize()
    errors = []
    for c in team[:2]:
        with pytest.raises(symnccl.PeerTimeoutError) as e:
            c.check()
        errors.append(e.value)
    assert any(e.reason == "timeout" and e.rank == 2 for e in errors)
    kernel = symnccl._C.COLLECTIVE_KERNELS[collective][algo]
    assert all(e.collective == collective and e.kernel == kernel
               for e in errors), [str(e) for e in errors]
    for c in team:
        c.abort()
    assert torch.arange(8, device="cuda", dtype=torch.float32).sum() == 28


LATE_CALLS = [("all_reduce", a) for a in ("one_shot", "two_shot", "ll",
                                           "ll128", "push")] + \
    [(c, a) for c in ("reduce_scatter", "all_gather") for a in SLICE_ALGOS] + \
    [("reduce", "one_shot"), ("broadcast", "one_shot")]


@pytest.mark.parametrize("collective,algo", LATE_CALLS)
def test_a_rank_that_calls_after_the_timeout_gets_an_error_not_data(
        monkeypatch, collective, algo):
    """Rank 1 of 2 makes its call only after rank 0 gave up on it: rank 0
    raises PeerTimeoutError naming rank 1 after the timeout; rank 1's
    kernel finds its fault word set (rank 0's give_up), leaves before it
    touches any memory, and its check raises PeerTimeoutError with reason
    "peer" naming rank 0, at once; its output keeps its poison; both
    communicators refuse further calls until aborted; the GPU stays
    usable."""
    torch = _torch()
    team = _team(monkeypatch, 2, timeout=STOP_TIMEOUT)
    streams = [torch.cuda.Stream() for _ in team]
    m = 3001
    per_rank = 2 * m if collective == "reduce_scatter" else m
    kw = {"root": 1} if collective in ("reduce", "broadcast") else {}
    if collective == "all_reduce" or kw:
        _, xs, outs = _inputs(torch, 2, "float32", m, "sum", seed=5, pad=0)
    else:
        _, xs, outs = _slices(torch, 2, "float32", m, "sum", seed=5, pad=0,
                              per_rank=per_rank)
    poison = _host(outs[1], np.float32).tobytes()
    kernel = (symnccl._C.ALGO_KERNELS[algo][0] if collective == "all_reduce"
              else symnccl._C.COLLECTIVE_KERNELS[collective][algo])

    def call(q):
        """Rank q's call alone: (seconds until its stream drained, the
        error its check raises)."""
        t = time.monotonic()
        getattr(team[q], collective)(xs[q], out=outs[q], algo=algo,
                                     stream=streams[q], **kw)
        streams[q].synchronize()
        took = time.monotonic() - t
        with pytest.raises(symnccl.PeerTimeoutError) as e:
            team[q].check()
        return took, e

    try:
        torch.cuda.synchronize()
        took0, e0 = call(0)     # rank 1 has not called: rank 0 gives up
        took1, e1 = call(1)     # then rank 1 calls
        late_out = _host(outs[1], np.float32).tobytes()
        for c, x in zip(team, xs):
            with pytest.raises(symnccl.PeerTimeoutError):
                getattr(c, collective)(x, algo=algo, **kw)
    finally:
        for c in team:
            c.abort()
    assert STOP_TIMEOUT <= took0 < STOP_TIMEOUT + 5.0, took0
    assert took1 < 1.0, took1
    assert (e0.value.reason, e0.value.rank) == ("timeout", 1), str(e0.value)
    assert (e1.value.reason, e1.value.rank) == ("peer", 0), str(e1.value)
    for e in (e0.value, e1.value):
        assert (e.collective, e.kernel) == (collective, kernel), str(e)
    assert late_out == poison
    assert torch.arange(8, device="cuda", dtype=torch.float32).sum() == 28


def test_reduce_scatter_and_all_gather_refuse_algorithms_without_kernels(
        monkeypatch):
    torch = _torch()
    team = _team(monkeypatch, 2)
    try:
        x = torch.ones(64, device="cuda")
        for algo in ("one_shot", "two_shot"):
            with pytest.raises(ValueError, match="no kernel of this.*those "
                               "that do: ll, ll128, push, nccl"):
                team[0].reduce_scatter(x, algo=algo)
            with pytest.raises(ValueError, match="no kernel of this"):
                team[0].all_gather(x, algo=algo)
        with pytest.raises(ValueError, match="no symnccl kernel"):
            team[0].reduce_scatter(x, algo="ll", op="prod")
        with pytest.raises(ValueError, match="no symnccl kernel"):
            team[0].reduce_scatter(x.to(torch.uint8), algo="ll")
        # what algo_supported answers is what the calls act on
        sup = symnccl.algo_supported
        assert sup(team[0], "ll", "int8", collective="all_gather")
        assert sup(team[0], "one_shot", "uint64", collective="broadcast")
        assert sup(team[0], "ll128", "bfloat16", "max", "reduce_scatter")
        assert not sup(team[0], "ll", "uint8", collective="reduce_scatter")
        assert sup(team[0], "push", "float32", collective="all_gather")
        assert not sup(team[0], "push", "uint8", collective="reduce_scatter")
        assert not sup(team[0], "two_shot", "float32",
                       collective="all_gather")
        assert not sup(team[0], "ll", "float32", collective="reduce")
        for algo in ("ll", "ll128", "two_shot", "push"):
            with pytest.raises(ValueError, match="those that do: "
                               "one_shot, nccl"):
                team[0].reduce(x, algo=algo)
            with pytest.raises(ValueError, match="those that do: "
                               "one_shot, nccl"):
                team[0].broadcast(x, algo=algo)
    finally:
        _close(team)


# ------------------------------------------------------ reduce, broadcast


@pytest.mark.parametrize("nranks", WORLDS)
def test_reduce_every_dtype_op_size_and_root_is_the_all_reduce(monkeypatch,
                                                                nranks):
    """The root's result against float64 and bitwise equal to symnccl's
    all_reduce of the same inputs; a 64 KiB staging area makes the larger
    sizes take several launches."""
    torch = _torch()
    team = _team(monkeypatch, nranks, staging_bytes=65536)
    streams = [torch.cuda.Stream() for _ in team]
    wrong = []
    try:
        for dtype in symnccl.LSA_DTYPES:
            npdt = _check.numpy_dtype(dtype)
            if npdt is None:
                pytest.skip(f"{dtype} needs ml_dtypes, which is not installed")
            for op in OPS:
                for count in SIZES:
                    root = (len(dtype) + OPS.index(op) + count) % nranks
                    pad = count % 2
                    hs, xs, outs = _inputs(torch, nranks, dtype, count, op,
                                           seed=count, pad=pad)
                    ars = [torch.empty_like(x) for x in xs]
                    torch.cuda.synchronize()
                    # every rank's first call before any rank's second
                    # (CUDA's lazy loading, as above)
                    for c, s, x, o in zip(team, streams, xs, outs):
                        c.reduce(x, root=root, out=o, op=op,
                                 algo="one_shot", stream=s)
                    for c, s, x, r in zip(team, streams, xs, ars):
                        c.all_reduce(x, out=r, op=op, algo="one_shot",
                                     stream=s)
                    torch.cuda.synchronize()
                    res = _host(outs[root], npdt)
                    bad = _check.count_wrong(res, op, hs, dtype)
                    if bad or res.tobytes() != _host(ars[root],
                                                     npdt).tobytes():
                        wrong.append((dtype, op, count, root, bad))
        ran = _kernels_ran(team)
    finally:
        _close(team)
    assert not wrong, f"(dtype, op, count, root, elements wrong): {wrong}"
    assert all(r == {"one_shot_reduce", "one_shot"} for r in ran), ran


@pytest.mark.parametrize("nranks", WORLDS)
def test_broadcast_every_dtype_size_and_root_bit_exact(monkeypatch, nranks):
    torch = _torch()
    team = _team(monkeypatch, nranks, staging_bytes=65536)
    streams = [torch.cuda.Stream() for _ in team]
    wrong = []
    try:
        for dtype in symnccl.DTYPES:
            npdt = _check.numpy_dtype(dtype)
            if npdt is None:
                pytest.skip(f"{dtype} needs ml_dtypes, which is not installed")
            for count in SIZES:
                for root in {0, nranks - 1}:
                    for in_place in (False, True):
                        pad = count % 2
                        hs, xs, outs = _inputs(torch, nranks, dtype, count,
                                               "sum", seed=count + root,
                                               pad=pad)
                        torch.cuda.synchronize()
                        for c, s, x, o in zip(team, streams, xs, outs):
                            c.broadcast(x, root=root,
                                        out=None if in_place else o,
                                        algo="one_shot", stream=s)
                        torch.cuda.synchronize()
                        for q in range(nranks):
                            got = xs[q] if in_place else outs[q]
                            if _host(got, npdt).tobytes() != \
                                    hs[root].tobytes():
                                wrong.append((dtype, count, root, in_place,
                                              q))
        ran = _kernels_ran(team)
    finally:
        _close(team)
    assert not wrong, f"(dtype, count, root, in place, rank): {wrong[:10]}"
    assert all(r == {"one_shot_broadcast"} for r in ran), ran
