"""all_to_all and all_to_all_v (issue 32): symnccl's push kernel
(push_all_to_all, csrc/kernels/alltoall.cuh) on loopback teams of 2, 3, 4
and 8 ranks (Communicator._loopback: every rank on this GPU, each on a
stream of its own), and at 1 rank against NCCL's send/recv; the CPU tier
checks what the registry says about it."""
import random
import time

import numpy as np
import pytest

import symnccl
from _workers.serving import random_splits as _random_splits
from conftest import LOOPBACK_GRID_KNOBS as GRID_KNOBS
from conftest import last_rank_never_calls, one_rank_comm
from symnccl import _C, _check

WORLDS = [2, 3, 4, 8]
KERNEL = "push_all_to_all"
LL_KERNEL = "ll_all_to_all"
KERNEL_OF = {"push": KERNEL, "ll": LL_KERNEL}
# a 1 MiB push region: slots of 128 KiB at 2 ranks, 32 KiB at 8, so larger
# blocks take several chunks
SMALL_PUSH = {"SYMNCCL_PUSH_REGION_MIB": "1"}


# ----------------------------------------------------------------- CPU tier

def test_the_kernel_table_has_the_all_to_all_kernels_of_push_and_ll():
    rows = {r["name"]: r for r in _C.KERNEL_TABLE
            if r["collective"] == "all_to_all"}
    assert {n: (r["algo"], r["family"], r["plan"], r["bytes"])
            for n, r in rows.items()} == {
        KERNEL: ("push", "push", "all_to_all", True),
        LL_KERNEL: ("ll", "ll", "all_to_all", True)}
    assert _C.COLLECTIVE_KERNELS["all_to_all"] == {"push": KERNEL,
                                                   "ll": LL_KERNEL}


def test_the_mixed_sequences_check_passes_right_outputs_only():
    """_ranks_wrong, the check of the mixed-sequence GPU tests, on outputs
    made on the host: right ones pass for every kind those tests make
    (its "ll_all_reduce" once read as "areduce" and failed every right
    answer, 7f804cf), and one changed element names its rank."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    n, m, i = 3, 7, 11
    hs = [_rows("float32", n * m, 1, q, i) for q in range(n)]
    total = sum(h.astype(np.float64) for h in hs).astype(np.float32)
    sp = [[2, 0, 5], [1, 3, 0], [0, 4, 2]]
    cap = 12
    poison = np.frombuffer(b"\xff" * 4 * cap, np.float32).reshape(cap, 1)

    def v_out(j):
        got = poison.copy()
        rows = np.concatenate([hs[q][sum(sp[q][:j]):sum(sp[q][:j + 1])]
                               for q in range(n)])
        got[:len(rows)] = rows
        return got
    right = {
        "equal": [np.concatenate([h[j * m:(j + 1) * m] for h in hs])
                  for j in range(n)],
        "all_gather": [np.concatenate(hs) for _ in range(n)],
        "all_reduce": [total for _ in range(n)],
        "ll_all_reduce": [total for _ in range(n)],
        "reduce_scatter": [total[j * m:(j + 1) * m] for j in range(n)],
        "v": [v_out(j) for j in range(n)],
        "ll_v": [v_out(j) for j in range(n)],
    }
    for kind, outs in right.items():
        gather = kind == "all_gather"
        args = dict(splits=sp, cap=cap) if kind.endswith("v") else \
            dict(m=m)
        hin = [h[:m] for h in hs] if gather else hs
        if gather:
            outs = [np.concatenate(hin) for _ in range(n)]
        ts = [torch.from_numpy(o.copy()) for o in outs]
        assert _ranks_wrong(kind, hin, ts, **args) == [], kind
        ts[1].view(-1)[0] += 1
        assert 1 in [b if isinstance(b, int) else b[1] for b in
                     _ranks_wrong(kind, hin, ts, **args)], kind


def test_all_to_all_methods_are_documented_with_an_example():
    for name in ("all_to_all", "all_to_all_v"):
        doc = getattr(symnccl.Communicator, name).__doc__
        assert doc and "Example:" in doc, name
    assert "synchronises" in symnccl.Communicator.all_to_all_v.__doc__


def test_push_and_ll_run_all_to_all_in_every_dtype():
    """The registry's answer for a 2-rank NVLink team: push, ll and nccl
    run all_to_all, in every dtype (bytes); the other algorithms are
    refused naming those that do; auto is ll, then push (its
    row of AUTO_TABLE, by the bytes every rank agrees on); at 3 and 4
    ranks ll, push, then NCCL."""
    topo = dict(nranks=2, lsa_size=2, symmetric=1, staging=1, push=1,
                multicast=0)
    gate = _C._algo_unavailable_for
    for dtype in symnccl.DTYPES:
        for algo in ("push", "ll"):
            assert gate(topo, algo, dtype, "sum", "all_to_all") is None, \
                (algo, dtype)
    for algo in ("ll128", "one_shot", "two_shot", "multimem"):
        assert gate(topo, algo, "float32", "sum", "all_to_all") == (
            "no kernel of this algorithm runs this collective (those that "
            "do: ll, push, nccl)"), algo
    assert "push region" in gate(dict(topo, push=0), "push", "float32",
                                 "sum", "all_to_all")
    for nbytes, algo in ((4096, "ll"), (1 << 20, "ll"),
                         ((1 << 20) + 1, "push"), (16 << 20, "push"),
                         ((16 << 20) + 1, "push"), (1 << 30, "push")):
        assert _C._auto_algo_for(topo, nbytes, "bfloat16", "sum", False,
                                 "all_to_all") == algo, nbytes
    # 3 and 4 ranks: ll, push to 32 MiB (session 23's 3x / 4x H100 run),
    # then NCCL
    for n, ll in ((3, 1 << 20), (4, 512 << 10)):
        t = dict(topo, nranks=n, lsa_size=n)
        for nbytes, algo in ((ll, "ll"), (ll + 1, "push"),
                             (32 << 20, "push"), ((32 << 20) + 1, "nccl")):
            assert _C._auto_algo_for(t, nbytes, "bfloat16", "sum", False,
                                     "all_to_all") == algo, (n, nbytes)
    with pytest.raises(ValueError, match="all_to_all"):
        gate(topo, "push", "float32", "sum", "all_to_al")


# ----------------------------------------------------------------- GPU tier

def _torch():
    return pytest.importorskip("torch")


def _grid(nranks):
    return {2: 32, 3: 16, 4: 16, 8: 8}.get(nranks, 4)


# The timeout of the tests in which a rank never calls (each waits it out
# once): a loopback rank's kernels start within milliseconds of its call.
STOP_TIMEOUT = 0.5


def _team(monkeypatch, nranks, knobs=None, timeout=20.0):
    for k in GRID_KNOBS:
        monkeypatch.setenv(k, str(_grid(nranks)))
    for k, v in (knobs or {}).items():
        monkeypatch.setenv(k, v)
    return symnccl.Communicator._loopback(nranks, 0, timeout=timeout)


def _close(team):
    for c in team:
        c.close()


def _device(torch, a, pad=0):
    """numpy array a on the GPU as the torch dtype of the same name, a view
    starting `pad` elements into its allocation (pad 1: not 16-byte
    aligned)."""
    flat = np.ascontiguousarray(a).reshape(-1)
    if pad:
        flat = np.concatenate([flat[:pad], flat])
    t = torch.from_numpy(flat.view(np.uint8)).cuda()
    return t.view(getattr(torch, a.dtype.name))[pad:].reshape(a.shape)


def _unaligned(torch, a):
    return _device(torch, a, pad=1)


def _host(t, npdt):
    import torch
    b = t.contiguous().reshape(-1).view(torch.uint8).cpu().numpy()
    return b.view(npdt).reshape(tuple(t.shape))


def _poisoned(torch, rows, d, npdt, pad):
    p = _check.poison(rows * d * npdt.itemsize).view(npdt).reshape(rows, d)
    return _device(torch, p, pad)


def _kernels_ran(team):
    return [{k for k, v in c._launches().items() if v} for c in team]


def _rows(dtype, rows, d, rank, seed):
    return _check.make_input(dtype, rows * d, rank, seed).reshape(rows, d)


@pytest.mark.gpu
@pytest.mark.parametrize("nranks", WORLDS)
@pytest.mark.parametrize("algo", ["push", "ll"])
def test_all_to_all_every_dtype_bit_exact(monkeypatch, nranks, algo):
    """Block j of rank i's x lands in block i of rank j's out, bitwise, in
    every dtype, for unaligned views and rows of 1, 3 and 64 elements; the
    kernel that ran is push_all_to_all."""
    torch = _torch()
    team = _team(monkeypatch, nranks, SMALL_PUSH)
    streams = [torch.cuda.Stream() for _ in team]
    wrong = []
    try:
        for dtype in symnccl.DTYPES:
            npdt = _check.numpy_dtype(dtype)
            if npdt is None:
                pytest.skip(f"{dtype} needs ml_dtypes")
            for m, d in ((1, 1), (257, 3)) + (((3001, 64),) if algo == "push"
                                              else ()):
                pad = (m + d) % 2
                hs = [_rows(dtype, nranks * m, d, q, m) for q in range(nranks)]
                xs = [_unaligned(torch, h) if pad else _device(torch, h)
                      for h in hs]
                outs = [_poisoned(torch, nranks * m, d, npdt, pad)
                        for _ in team]
                torch.cuda.synchronize()
                for c, s, x, o in zip(team, streams, xs, outs):
                    c.all_to_all(x, out=o, algo=algo, stream=s)
                torch.cuda.synchronize()
                for j in range(nranks):
                    want = np.concatenate([h[j * m:(j + 1) * m] for h in hs])
                    if _host(outs[j], npdt).tobytes() != want.tobytes():
                        wrong.append((dtype, m, d, j))
        ran = _kernels_ran(team)
    finally:
        _close(team)
    assert not wrong, f"(dtype, m, d, rank): {wrong[:10]}"
    assert all(r == {KERNEL_OF[algo]} for r in ran), ran


def _ranks_wrong(kind, hs, outs, m=None, splits=None, cap=None):
    """The ranks whose out is wrong after one call of a mixed sequence
    (float32 rows): kind "v" an all_to_all_v of `splits` into outs of
    `cap` rows, "equal" an all_to_all of m rows a block, "all_gather" of
    m rows a rank, "all_reduce", "reduce_scatter" of m elements a rank;
    hs each rank's input on the host. An "ll_" kind (ll_v, ll_all_reduce)
    is checked as the same call on push."""
    f32 = np.dtype(np.float32)
    n = len(outs)
    kind = kind.removeprefix("ll_")
    if kind == "v":
        return _check_v(hs, splits, outs, None, f32, cap)
    if kind in ("equal", "all_gather"):
        return [j for j in range(n) if _host(outs[j], f32).tobytes() !=
                np.concatenate([h[j * m:(j + 1) * m] if kind == "equal"
                                else h for h in hs]).tobytes()]
    want = ([h.reshape(-1) for h in hs] if kind == "all_reduce" else None)
    return [j for j in range(n) if _check.count_wrong(
        _host(outs[j], f32).reshape(-1), "sum",
        want or [h.reshape(-1)[j * m:(j + 1) * m] for h in hs], "float32")]


def _check_v(hs, sp, outs, out_splits, npdt, out_rows, offsets=None):
    """Rank j's out: rank 0's rows for j, then rank 1's, ...; the rest of
    out keeps its poison; out_splits[j][i] = sp[i][j], offsets[j][i] =
    where rank i's rows start. Returns what is wrong."""
    n = len(hs)
    bad = []
    for j in range(n):
        parts = []
        for i in range(n):
            start = sum(sp[i][:j])
            parts.append(hs[i][start:start + sp[i][j]])
        want = np.concatenate(parts)
        got = _host(outs[j], npdt)
        if got[:len(want)].tobytes() != want.tobytes():
            bad.append(("rows", j))
        rest = got[len(want):out_rows].tobytes()
        if rest != b"\xff" * len(rest):
            bad.append(("poison", j))
        if out_splits is not None and \
                out_splits[j].cpu().tolist() != [sp[i][j] for i in range(n)]:
            bad.append(("out_splits", j, out_splits[j].cpu().tolist()))
        want_off = [sum(sp[i][j] for i in range(r)) for r in range(n)]
        if offsets is not None and offsets[j].cpu().tolist() != want_off:
            bad.append(("out_offsets", j, offsets[j].cpu().tolist()))
    return bad


@pytest.mark.gpu
@pytest.mark.parametrize("nranks", WORLDS)
@pytest.mark.parametrize("algo", ["push", "ll"])
def test_all_to_all_v_random_splits_host_and_device(monkeypatch, nranks,
                                                    algo):
    """Random uneven splits with zeros, every rank sending to one rank, a
    rank sending nothing; splits from the host and from the device;
    several dtypes and row sizes; out sized for the worst case and
    poisoned: the rows received are in place, the rest keeps its poison,
    out_splits holds the counts."""
    torch = _torch()
    team = _team(monkeypatch, nranks, SMALL_PUSH)
    streams = [torch.cuda.Stream() for _ in team]
    rng = random.Random(7 + nranks)
    wrong = []
    try:
        for it in range(12):
            dtype = ("float32", "bfloat16", "int8", "float64")[it % 4]
            npdt = _check.numpy_dtype(dtype)
            if npdt is None:
                continue
            # ll: the whole of x in one row of packets
            d = (1, 5, 128 if algo == "push" else 16)[it % 3]
            rows_max = (3, 300, 4000 if algo == "push" else 100)[
                (it // 3) % 3]
            mode = ("random", "one", "none")[it % 3]
            sp = _random_splits(rng, nranks, rows_max, mode)
            out_rows = nranks * rows_max + 3
            hs = [_rows(dtype, sum(sp[q]) + 2, d, q, it) for q in range(nranks)]
            pad = it % 2
            xs = [_unaligned(torch, h) if pad else _device(torch, h)
                  for h in hs]
            outs = [_poisoned(torch, out_rows, d, npdt, pad) for _ in team]
            on_dev = it % 2 == 0
            got = [torch.full((nranks,), -7, dtype=torch.int64, device="cuda")
                   for _ in team]
            offs = [torch.full((nranks,), -7, dtype=torch.int64,
                               device="cuda") for _ in team]
            torch.cuda.synchronize()
            for q, (c, s, x, o) in enumerate(zip(team, streams, xs, outs)):
                splits = torch.tensor(sp[q], device="cuda") if on_dev \
                    else sp[q]
                r = c.all_to_all_v(x, o, splits, out_splits=got[q],
                                   algo=algo, stream=s,
                                   out_offsets=offs[q])
                assert r is o
            torch.cuda.synchronize()
            for b in _check_v(hs, sp, outs, got, npdt, out_rows, offs):
                wrong.append((it, dtype, d, mode, on_dev) + b)
        ran = _kernels_ran(team)
    finally:
        _close(team)
    assert not wrong, wrong[:10]
    assert all(r == {KERNEL_OF[algo]} for r in ran), ran


@pytest.mark.gpu
@pytest.mark.parametrize("nranks", [2, 3])
@pytest.mark.parametrize("chunk_kib", [0, 40])
def test_all_to_all_v_takes_one_epoch_per_chunk(monkeypatch, nranks,
                                                 chunk_kib):
    """A block of 400 KB crosses a 1 MiB push region's slots in several
    chunks (of a slot, or of SYMNCCL_PUSH_CHUNK_KIB): the call counter
    advances by the chunks of the largest block (the splits travel beside
    chunk 0 and take no epoch of their own), on every rank alike; the
    result is right."""
    torch = _torch()
    team = _team(monkeypatch, nranks, dict(
        SMALL_PUSH, SYMNCCL_PUSH_CHUNK_KIB=str(chunk_kib)))
    streams = [torch.cuda.Stream() for _ in team]
    slot = team[0]._staging_layout()["push_slot"]
    step = slot if chunk_kib == 0 else min(slot, chunk_kib << 10)
    big = 100_003                       # float32 rows of 1: 400 KB
    sp = [[big if k == (q + 1) % nranks else 5 for k in range(nranks)]
          for q in range(nranks)]
    chunks = -(-big * 4 // step)
    assert chunks >= 3
    try:
        hs = [_rows("float32", sum(sp[q]), 1, q, 1) for q in range(nranks)]
        xs = [_device(torch, h) for h in hs]
        outs = [_poisoned(torch, big + 5 * nranks, 1, np.dtype(np.float32), 0)
                for _ in team]
        before = [c._epoch(KERNEL) for c in team]
        torch.cuda.synchronize()
        for q, (c, s, x, o) in enumerate(zip(team, streams, xs, outs)):
            c.all_to_all_v(x, o, sp[q], algo="push", stream=s)
        torch.cuda.synchronize()
        after = [c._epoch(KERNEL) for c in team]
        bad = _check_v(hs, sp, outs, None, np.dtype(np.float32),
                       big + 5 * nranks)
    finally:
        _close(team)
    assert not bad, bad
    assert [a - b for a, b in zip(after, before)] == [chunks] * nranks


@pytest.mark.gpu
def test_rows_past_the_end_of_out_are_dropped_and_reported(monkeypatch):
    torch = _torch()
    team = _team(monkeypatch, 2)
    streams = [torch.cuda.Stream() for _ in team]
    try:
        sp = [[1, 6], [2, 3]]          # rank 1 receives 6 + 3 rows
        hs = [_rows("float32", 7, 2, 0, 3), _rows("float32", 5, 2, 1, 3)]
        xs = [_device(torch, h) for h in hs]
        outs = [_poisoned(torch, 4, 2, np.dtype(np.float32), 0)
                for _ in team]
        got = [torch.zeros(2, dtype=torch.int64, device="cuda")
               for _ in team]
        torch.cuda.synchronize()
        for q, (c, s, x, o) in enumerate(zip(team, streams, xs, outs)):
            c.all_to_all_v(x, o, sp[q], out_splits=got[q], algo="push",
                           stream=s)
        torch.cuda.synchronize()
        out1 = _host(outs[1], np.float32)
        assert out1.tobytes() == hs[0][1:5].tobytes()   # 4 of rank 0's 6
        assert got[1].cpu().tolist() == [6, 3]
        assert _host(outs[0], np.float32)[:3].tobytes() == \
            np.concatenate([hs[0][:1], hs[1][:2]]).tobytes()
    finally:
        _close(team)


@pytest.mark.gpu
@pytest.mark.parametrize("nranks", [3, 4])
@pytest.mark.parametrize("algo", ["push", "ll"])
def test_graph_replays_read_new_device_splits(monkeypatch, nranks, algo):
    """Each rank captures all_to_all_v with device splits once; between
    replays the splits (and inputs) change on the device: each replay moves
    the rows the splits say and writes their counts, with no host in the
    loop."""
    torch = _torch()
    team = _team(monkeypatch, nranks, SMALL_PUSH)
    streams = [torch.cuda.Stream() for _ in team]
    rng = random.Random(11)
    rows_max, d = 700, 16
    cap = nranks * rows_max
    try:
        xs = [torch.empty(cap, d, device="cuda") for _ in team]
        outs = [torch.empty(cap, d, device="cuda") for _ in team]
        splits = [torch.zeros(nranks, dtype=torch.int64, device="cuda")
                  for _ in team]
        got = [torch.zeros(nranks, dtype=torch.int64, device="cuda")
               for _ in team]
        graphs = []
        torch.cuda.synchronize()
        for c, s, x, o, sq, g in zip(team, streams, xs, outs, splits, got):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=s):
                c.all_to_all_v(x, o, sq, out_splits=g, algo=algo)
            graphs.append(graph)
        for rep in range(5):
            sp = _random_splits(rng, nranks, rows_max,
                                ("random", "one", "none")[rep % 3])
            hs = [_rows("float32", cap, d, q, rep) for q in range(nranks)]
            for q in range(nranks):
                xs[q].copy_(torch.from_numpy(hs[q]))
                splits[q].copy_(torch.tensor(sp[q]))
                outs[q].view(torch.int32).fill_(-1)
            torch.cuda.synchronize()
            for g, s in zip(graphs, streams):
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    g.replay()
            torch.cuda.synchronize()
            bad = _check_v(hs, sp, outs, got, np.dtype(np.float32), cap)
            assert not bad, (rep, sp, bad)
    finally:
        _close(team)


@pytest.mark.gpu
@pytest.mark.parametrize("nranks", [2, 3, 8])
def test_stress_all_to_all_and_the_push_kernels_share_the_slots(monkeypatch,
                                                                 nranks):
    """Back-to-back all_to_all_v, all_to_all and push all_reduce /
    reduce_scatter calls of random sizes with random ranks held back: they
    share push's slots, flags and call counters."""
    torch = _torch()
    team = _team(monkeypatch, nranks, SMALL_PUSH)
    streams = [torch.cuda.Stream() for _ in team]
    rng = random.Random(5 + nranks)
    calls = []
    for i in range(60):
        kind = rng.choice(["v", "v", "ll_v", "equal", "all_reduce",
                           "reduce_scatter", "ll_all_reduce"])
        late = rng.randrange(nranks) if rng.random() < 0.3 else -1
        if kind in ("v", "ll_v"):
            sp = _random_splits(rng, nranks, rng.choice(
                [4, 900, 20_000] if kind == "v" else [4, 900, 5000]),
                rng.choice(["random", "one", "none"]))
            hs = [_rows("float32", sum(sp[q]), 1, q, i)
                  for q in range(nranks)]
            cap = max(sum(sp[q][j] for q in range(nranks))
                      for j in range(nranks))
            xs = [_device(torch, h) for h in hs]
            outs = [_poisoned(torch, cap, 1, np.dtype(np.float32), 0)
                    for _ in team]
            calls.append((kind, sp, hs, xs, outs, late, cap))
        else:
            m = rng.choice([7, 3000, 50_000])
            hs = [_rows("float32", nranks * m, 1, q, i)
                  for q in range(nranks)]
            xs = [_device(torch, h) for h in hs]
            n_out = m if kind == "reduce_scatter" else nranks * m
            outs = [_poisoned(torch, n_out, 1, np.dtype(np.float32), 0)
                    for _ in team]
            calls.append((kind, m, hs, xs, outs, late, None))
    # every kernel loaded before any rank waits: a kernel's first launch
    # (CUDA's lazy loading) waits for the kernels running, which wait for
    # the ranks not yet called (loopback.c)
    w = [torch.zeros(nranks * 64, device="cuda") for _ in team]
    for kind, algo in (("all_reduce", "push"), ("reduce_scatter", "push"),
                       ("all_to_all", "push"), ("all_reduce", "ll"),
                       ("all_to_all", "ll")):
        torch.cuda.synchronize()
        for c, s, x in zip(team, streams, w):
            getattr(c, kind)(x, algo=algo, stream=s)
    torch.cuda.synchronize()
    failures = []
    try:
        for kind, arg, hs, xs, outs, late, cap in calls:
            for q, (c, s, x, o) in enumerate(zip(team, streams, xs, outs)):
                if q == late:
                    with torch.cuda.stream(s):
                        torch.cuda._sleep(100_000)
                if kind in ("v", "ll_v"):
                    c.all_to_all_v(x, o, arg[q], stream=s,
                                   algo="push" if kind == "v" else "ll")
                elif kind == "equal":
                    c.all_to_all(x, out=o, algo="push", stream=s)
                elif kind == "ll_all_reduce":
                    c.all_reduce(x.reshape(-1), out=o.reshape(-1),
                                 algo="ll", stream=s)
                else:
                    getattr(c, kind)(x.reshape(-1), out=o.reshape(-1),
                                     algo="push", stream=s)
        torch.cuda.synchronize()
        for i, (kind, arg, hs, xs, outs, late, cap) in enumerate(calls):
            if kind in ("v", "ll_v"):
                bad = _ranks_wrong(kind, hs, outs, splits=arg, cap=cap)
            else:
                bad = _ranks_wrong(kind, hs, outs, m=arg)
            if bad:
                failures.append((i, kind, bad))
        for c in team:
            c.check()
    finally:
        _close(team)
    assert not failures, failures[:10]


@pytest.mark.gpu
@pytest.mark.parametrize("nranks", [2, 4])
@pytest.mark.parametrize("chunk_kib", [0, 16])
def test_push_calls_end_without_waiting_for_their_readers(monkeypatch,
                                                          nranks, chunk_kib):
    """No push kernel waits at its end for the peers to read its last
    chunks; the next push call's entry does, and the all-to-all's CTA 0
    waits for every CTA of every peer before it rewrites their splits area
    (alltoall.cuh). Back-to-back push all_to_all_v (random uneven splits,
    from the host and from device tensors, mostly one chunk), all_to_all,
    all_gather, reduce_scatter (chunks of a slot, or split 16 KiB chunks)
    and all_reduce on one team, a rank held back before most calls (the
    others finish a call and start the next while it still reads the one
    before), and another stream keeping SMs busy now and then (a rank's
    CTAs start unevenly): every result right, no fault, the push call
    counters equal on every rank."""
    torch = _torch()
    team = _team(monkeypatch, nranks, dict(
        SMALL_PUSH, SYMNCCL_PUSH_CHUNK_KIB=str(chunk_kib)))
    streams = [torch.cuda.Stream() for _ in team]
    rng = random.Random(23 + nranks + chunk_kib)
    f32 = np.dtype(np.float32)
    calls = []
    late = 0
    for i in range(90):
        if i % 10 == 0:
            late = rng.randrange(nranks)
        kind = rng.choice(["v", "v", "v_dev", "v_dev", "equal", "all_gather",
                           "reduce_scatter", "all_reduce"])
        held = late if rng.random() < 0.7 else -1
        if kind in ("v", "v_dev"):
            sp = _random_splits(rng, nranks, rng.choice([3, 700, 3000,
                                                         40_000]),
                                rng.choice(["random", "random", "one",
                                            "none"]))
            hs = [_rows("float32", sum(sp[q]), 1, q, i)
                  for q in range(nranks)]
            cap = max(sum(sp[q][j] for q in range(nranks))
                      for j in range(nranks))
            arg = (sp, [torch.tensor(sp[q], device="cuda")
                        for q in range(nranks)] if kind == "v_dev" else sp,
                   cap)
            n_out = cap
        else:
            m = rng.choice([5, 700, 3000, 50_000])
            hs = [_rows("float32", nranks * m, 1, q, i)
                  for q in range(nranks)]
            arg = m
            n_out = m if kind == "reduce_scatter" else nranks * m
            if kind == "all_gather":
                hs = [h[:m] for h in hs]
        xs = [_device(torch, h) for h in hs]
        outs = [_poisoned(torch, n_out, 1, f32, 0) for _ in team]
        calls.append((kind, arg, hs, xs, outs, held))
    busy = torch.ones(1 << 24, device="cuda")
    side = torch.cuda.Stream()
    # every kernel loaded before any rank waits (loopback.c): a kernel's
    # first launch waits for the kernels running
    w = [torch.zeros(nranks * 64, device="cuda") for _ in team]
    wi = [torch.zeros(64, device="cuda") for _ in team]
    for kind in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all"):
        torch.cuda.synchronize()
        for c, s, x, xi in zip(team, streams, w, wi):
            if kind == "all_gather":
                c.all_gather(xi, out=x, algo="push", stream=s)
            else:
                getattr(c, kind)(x, algo="push", stream=s)
    torch.cuda._sleep(1)
    busy.mul_(1.0)
    torch.cuda.synchronize()
    before = [c._epoch(KERNEL) for c in team]
    failures = []
    try:
        for i, (kind, arg, hs, xs, outs, held) in enumerate(calls):
            if i % 7 == 3:
                with torch.cuda.stream(side):
                    busy.mul_(1.0000001)
            for q, (c, s, x, o) in enumerate(zip(team, streams, xs, outs)):
                if q == held:
                    with torch.cuda.stream(s):
                        torch.cuda._sleep(rng.choice([2_000, 60_000]))
                if kind in ("v", "v_dev"):
                    c.all_to_all_v(x, o, arg[1][q], algo="push", stream=s)
                elif kind == "equal":
                    c.all_to_all(x, out=o, algo="push", stream=s)
                else:
                    getattr(c, kind)(x.reshape(-1), out=o.reshape(-1),
                                     algo="push", stream=s)
        torch.cuda.synchronize()
        after = [c._epoch(KERNEL) for c in team]
        for i, (kind, arg, hs, xs, outs, held) in enumerate(calls):
            if kind in ("v", "v_dev"):
                bad = _ranks_wrong("v", hs, outs, splits=arg[0], cap=arg[2])
            else:
                bad = _ranks_wrong(kind, hs, outs, m=arg)
            if bad:
                failures.append((i, kind, held, bad))
        for c in team:
            c.check()
    finally:
        _close(team)
    assert not failures, failures[:10]
    assert len(set(after)) == 1 and after[0] - before[0] >= len(calls), \
        (before, after)


@pytest.mark.gpu
@pytest.mark.parametrize("device_splits", [False, True])
@pytest.mark.parametrize("algo", ["push", "ll"])
def test_a_rank_that_never_calls_times_out_on_every_other_rank(
        monkeypatch, device_splits, algo):
    torch = _torch()
    team = _team(monkeypatch, 3, timeout=STOP_TIMEOUT)
    xs = [torch.randn(30, 4, device="cuda") for _ in team]
    outs = [torch.empty(90, 4, device="cuda") for _ in team]
    sp = [10, 10, 10]
    splits = torch.tensor(sp, device="cuda") if device_splits else sp
    last_rank_never_calls(
        torch, team,
        lambda c, s, q: c.all_to_all_v(xs[q], outs[q], splits, algo=algo,
                                       stream=s),
        STOP_TIMEOUT, "all_to_all", lambda k: k == KERNEL_OF[algo])


@pytest.mark.gpu
@pytest.mark.parametrize("algo", ["push", "ll"])
def test_a_rank_that_calls_after_the_timeout_gets_an_error_not_data(
        monkeypatch, algo):
    torch = _torch()
    team = _team(monkeypatch, 2, timeout=STOP_TIMEOUT)
    streams = [torch.cuda.Stream() for _ in team]
    xs = [torch.randn(2000, device="cuda") for _ in team]
    outs = [torch.full((2000,), float("nan"), device="cuda") for _ in team]
    try:
        torch.cuda.synchronize()
        t = time.monotonic()
        team[0].all_to_all(xs[0], out=outs[0], algo=algo, stream=streams[0])
        streams[0].synchronize()
        took0 = time.monotonic() - t
        t = time.monotonic()
        team[1].all_to_all(xs[1], out=outs[1], algo=algo, stream=streams[1])
        streams[1].synchronize()
        took1 = time.monotonic() - t
        errs = []
        for c in team:
            with pytest.raises(symnccl.PeerTimeoutError) as e:
                c.check()
            errs.append(e.value)
        late = outs[1].isnan().all().item()
    finally:
        for c in team:
            c.abort()
    assert STOP_TIMEOUT <= took0 < STOP_TIMEOUT + 5.0 and took1 < 1.0, \
        (took0, took1)
    assert (errs[0].reason, errs[0].rank) == ("timeout", 1), str(errs[0])
    assert (errs[1].reason, errs[1].rank) == ("peer", 0), str(errs[1])
    assert late


@pytest.mark.gpu
def test_argument_errors_name_what_was_seen_and_expected(monkeypatch):
    torch = _torch()
    team = _team(monkeypatch, 2)
    c = team[0]
    x = torch.zeros(6, 4, device="cuda")
    out = torch.zeros(12, 4, device="cuda")
    try:
        with pytest.raises(ValueError, match="7 rows.*multiple of nranks"):
            c.all_to_all(torch.zeros(7, 4, device="cuda"), algo="push")
        with pytest.raises(ValueError, match="scalar"):
            c.all_to_all(torch.zeros((), device="cuda"), algo="push")
        with pytest.raises(ValueError, match="overlaps x"):
            c.all_to_all(x, out=x, algo="push")
        with pytest.raises(TypeError, match="float64, expected float32"):
            c.all_to_all(x, out=out[:6].double(), algo="push")
        with pytest.raises(ValueError, match="3 entries, expected nranks"):
            c.all_to_all_v(x, out, [1, 2, 3], algo="push")
        with pytest.raises(ValueError, match=r"in_splits\[1\] is -1"):
            c.all_to_all_v(x, out, [1, -1], algo="push")
        with pytest.raises(ValueError, match="sum to 7 rows, but x has 6"):
            c.all_to_all_v(x, out, [3, 4], algo="push")
        with pytest.raises(TypeError, match="in_splits has dtype int32, "
                           "expected int64"):
            c.all_to_all_v(x, out, torch.ones(2, dtype=torch.int32,
                                              device="cuda"), algo="push")
        with pytest.raises(ValueError, match="out_splits has 3 elements"):
            c.all_to_all_v(x, out, [1, 1], algo="push",
                           out_splits=torch.zeros(3, dtype=torch.int64,
                                                  device="cuda"))
        # an output sharing memory with another tensor of the call (the
        # kernels' CTAs run in no order: a late one would read it changed)
        sp = torch.ones(2, dtype=torch.int64, device="cuda")
        with pytest.raises(ValueError, match="out_splits shares memory "
                           "with in_splits"):
            c.all_to_all_v(x, out, sp, out_splits=sp, algo="push")
        with pytest.raises(ValueError, match="out_offsets shares memory "
                           "with out_splits"):
            c.all_to_all_v(x, out, [1, 1], algo="push", out_splits=sp,
                           out_offsets=sp)
        with pytest.raises(ValueError, match="in_splits shares memory "
                           "with out"):
            c.all_to_all_v(x, out, out.view(-1).view(torch.int64)[:2],
                           algo="push")
        with pytest.raises(ValueError, match="rows of 8 elements, expected "
                           "4"):
            c.all_to_all_v(x, torch.zeros(3, 8, device="cuda"), [1, 1],
                           algo="push")
        with pytest.raises(TypeError, match="out is None"):
            c.all_to_all_v(x, None, [1, 1], algo="push")
        with pytest.raises(ValueError, match="those that do: ll, push, "
                           "nccl"):
            c.all_to_all(x, algo="ll128")
        big = torch.zeros(2 << 20, device="cuda")      # 8 MiB: no LL row
        with pytest.raises(ValueError, match="algo 'll' carries blocks of "
                           "at most"):
            c.all_to_all(big, algo="ll")
        with pytest.raises(RuntimeError, match="loopback"):
            c.all_to_all(big, algo="nccl")   # a loopback team has no NCCL
    finally:
        _close(team)


def _one_rank(torch, live):
    """The module's shared one-rank communicator (conftest), as a context
    that leaves it open."""
    import contextlib
    return contextlib.nullcontext(one_rank_comm(live))


@pytest.mark.gpu
@pytest.mark.parametrize("algo", ["push", "ll", "nccl"])
def test_one_rank_all_to_all_is_a_copy_and_v_takes_the_splits(
        _module_comms, algo):
    torch = _torch()
    with _one_rank(torch, _module_comms) as c:
        for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.uint8):
            x = (torch.arange(3003, device="cuda") % 251).to(dtype)
            x = x.reshape(1001, 3)
            y = c.all_to_all(x, algo=algo)
            assert y.shape == x.shape and torch.equal(y, x)
        x = torch.randn(50, 8, device="cuda")
        out = torch.full((64, 8), float("nan"), device="cuda")
        got = torch.zeros(1, dtype=torch.int64, device="cuda")
        off = torch.full((1,), 5, dtype=torch.int64, device="cuda")
        for splits in ([37], torch.tensor([37], device="cuda"), [0]):
            out.fill_(float("nan"))
            c.all_to_all_v(x, out, splits, out_splits=got, algo=algo,
                           out_offsets=off)
            assert off.item() == 0
            k = int(splits[0])
            torch.cuda.synchronize()
            assert torch.equal(out[:k], x[:k]), splits
            assert out[k:].isnan().all()
            assert got.item() == k


@pytest.mark.gpu
def test_one_rank_all_to_all_single_semantics(_module_comms):
    """torch.distributed.all_to_all_single at world size 1: the output is
    the input (equal splits) or its first in_split rows."""
    torch = _torch()
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_nccl_available():
        pytest.skip("torch.distributed with NCCL is not available")
    import os
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    started = not dist.is_initialized()
    if started:
        dist.init_process_group("nccl", rank=0, world_size=1,
                                device_id=torch.device("cuda", 0))
    try:
        x = torch.randn(40, 6, device="cuda")
        ref = torch.empty(23, 6, device="cuda")
        dist.all_to_all_single(ref, x[:23], [23], [23])
        import symnccl.torch as snt
        with _one_rank(torch, _module_comms) as c:
            out = torch.empty(23, 6, device="cuda")
            c.all_to_all_v(x, out, [23], algo="push")
            torch.cuda.synchronize()
            assert torch.equal(out, ref)
            ref2 = torch.empty_like(x)
            dist.all_to_all_single(ref2, x)
            assert torch.equal(c.all_to_all(x, algo="push"), ref2)
            # the torch ops alike
            assert torch.equal(snt.all_to_all(x, c, algo="push"), ref2)
            y, got = snt.all_to_all_v(x, torch.empty(23, 6, device="cuda"),
                                      torch.tensor([23], device="cuda"), c,
                                      algo="push")
            assert torch.equal(y, ref) and got.tolist() == [23]
    finally:
        if started:
            dist.destroy_process_group()


@pytest.mark.gpu
def test_nccl_all_to_all_v_waits_for_its_own_stream_only(_module_comms):
    """algo='nccl' reads the counts on the host, so it waits for its
    stream; it no longer allocates and frees pinned memory per call
    (cudaFreeHost synchronised the whole device): a kernel sleeping on
    another stream still runs after 20 calls with host and device splits,
    each of which moved the right rows and wrote its counts."""
    torch = _torch()
    with _one_rank(torch, _module_comms) as c:
        x = torch.randn(50, 8, device="cuda")
        outs = [torch.full((64, 8), float("nan"), device="cuda")
                for _ in range(20)]
        gots = [torch.full((1,), -1, dtype=torch.int64, device="cuda")
                for _ in range(20)]
        offs = [torch.full((1,), -1, dtype=torch.int64, device="cuda")
                for _ in range(20)]
        dev = [torch.tensor([k], device="cuda") for k in range(20)]
        s, other = torch.cuda.Stream(), torch.cuda.Stream()
        warm = torch.empty(64, 8, device="cuda")
        c.all_to_all_v(x, warm, [1], algo="nccl", stream=s)
        torch.cuda.synchronize()
        done = torch.cuda.Event()
        with torch.cuda.stream(other):
            torch.cuda._sleep(int(3e9))       # > 1 s on any current GPU
            done.record()
        for k in range(20):
            c.all_to_all_v(x, outs[k], dev[k] if k % 2 else [k],
                           out_splits=gots[k], algo="nccl", stream=s,
                           out_offsets=offs[k])
        running = not done.query()
        s.synchronize()
        torch.cuda.synchronize()
        bad = [k for k in range(20)
               if not torch.equal(outs[k][:k], x[:k]) or
               not outs[k][k:].isnan().all() or gots[k].item() != k or
               offs[k].item() != 0]
    assert running, "the calls waited for another stream's kernel"
    assert not bad, bad


@pytest.mark.gpu
def test_torch_ops_on_a_loopback_team_equal_all_to_all_single(monkeypatch):
    """torch.distributed cannot run 3 ranks in one process: the torch ops
    on a loopback team of 3 against all_to_all_single's documented result,
    computed per rank: rank j's output is, for i = 0, 1, 2, rank i's rows
    [sum(in_splits_i[:j]), + in_splits_i[j]) (equal splits: block j of
    every rank); output_split_sizes are the counts received."""
    torch = _torch()
    import symnccl.torch as snt
    team = _team(monkeypatch, 3)
    streams = [torch.cuda.Stream() for _ in team]
    sp = [[2, 0, 5], [1, 3, 0], [4, 4, 4]]
    try:
        xs = [torch.randn(12, 5, device="cuda") for _ in team]
        bufs = [torch.full((16, 5), float("nan"), device="cuda")
                for _ in team]
        splits = [torch.tensor(v, device="cuda") for v in sp]
        torch.cuda.synchronize()
        ys, vs = [], []
        for c, s, x in zip(team, streams, xs):
            with torch.cuda.stream(s):
                ys.append(snt.all_to_all(x, c, algo="push"))
        for c, s, x, b, q in zip(team, streams, xs, bufs, splits):
            with torch.cuda.stream(s):
                vs.append(snt.all_to_all_v(x, b, q, c, algo="push"))
        torch.cuda.synchronize()
        for j in range(3):
            want = torch.cat([x[4 * j:4 * j + 4] for x in xs])
            assert torch.equal(ys[j], want), j
            parts = [xs[i][sum(sp[i][:j]):sum(sp[i][:j + 1])]
                     for i in range(3)]
            rows = sum(p.shape[0] for p in parts)
            y, got = vs[j]
            assert torch.equal(y[:rows], torch.cat(parts)), j
            assert got.tolist() == [sp[i][j] for i in range(3)], j
        assert all(r == {KERNEL} for r in _kernels_ran(team))
    finally:
        _close(team)


# ------------------------------------------------------------ symnccl.torch

class _FakeComm:
    rank, nranks = 0, 4


def test_torch_ops_have_fake_kernels_and_transposed_backwards():
    """Shapes under FakeTensorMode, and backwards traced (make_fx, as
    AOTAutograd does) into the same all-to-all: no GPU needed."""
    torch = pytest.importorskip("torch")
    import symnccl.torch as snt
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    cid = snt.comm_id(_FakeComm())
    ops = torch.ops.symnccl
    with FakeTensorMode():
        x = torch.empty(8, 3)
        assert ops.all_to_all(x, cid, "push").shape == (8, 3)
        y, got = ops.all_to_all_v(x, cid, torch.empty(4, dtype=torch.int64),
                                  21, "push")
        assert y.shape == (21, 3) and got.shape == (4,) and \
            got.dtype == torch.int64

    def fwd_bwd(f):
        def run(x, s):
            y = f(x, s)
            return torch.autograd.grad(y, x, torch.ones_like(y))[0]
        return run
    for name, f, rows in (
            ("all_to_all", lambda x, s: ops.all_to_all(x, cid, "push"), 8),
            ("all_to_all_v",
             lambda x, s: ops.all_to_all_v(x, cid, s, 21, "push")[0], 8)):
        x = torch.empty(rows, 3, requires_grad=True)
        s = torch.empty(4, dtype=torch.int64)
        g = make_fx(fwd_bwd(f), tracing_mode="fake")(x, s)
        called = [n.target._schema.name.split("::")[1]
                  for n in g.graph.nodes if n.op == "call_function" and
                  getattr(n.target, "namespace", "") == "symnccl"]
        assert called == [name, name], (name, called)


@pytest.mark.gpu
def test_torch_all_to_all_v_value_gradient_compile_and_graph(
        _module_comms):
    """At 1 rank: the rows the splits send, their gradient back (zeros for
    rows not sent), the same under torch.compile(fullgraph=True), and a CUDA
    graph of the eager call replayed with new device splits."""
    torch = _torch()
    import symnccl.torch as snt
    with _one_rank(torch, _module_comms) as comm:
        x = torch.randn(50, 8, device="cuda", requires_grad=True)
        buf = torch.empty(64, 8, device="cuda")
        splits = torch.tensor([37], device="cuda")
        y, got = snt.all_to_all_v(x, buf, splits, comm, algo="push")
        gy = torch.randn_like(y)
        y.backward(gy)
        assert torch.equal(y[:37], x.detach()[:37]) and got.item() == 37
        assert torch.equal(x.grad[:37], gy[:37])
        assert not x.grad[37:].any()
        # equal splits, and its own transpose as gradient
        x2 = torch.randn(6, 5, device="cuda", requires_grad=True)
        y2 = snt.all_to_all(x2, comm, algo="push")
        y2.backward(torch.ones_like(y2))
        assert torch.equal(y2, x2.detach()) and \
            torch.equal(x2.grad, torch.ones_like(x2))

        def f(t, s, out):
            return snt.all_to_all_v(t * 2, out, s, comm, algo="push")[0]
        cf = torch.compile(f, fullgraph=True)
        t = torch.randn(50, 8, device="cuda")
        out = torch.zeros(64, 8, device="cuda")
        r = cf(t, splits, out)
        assert torch.equal(r[:37], 2 * t[:37])
        assert torch.equal(out[:37], 2 * t[:37])

        s2 = torch.tensor([0], device="cuda")
        o2 = torch.zeros(64, 8, device="cuda")
        st = torch.cuda.Stream()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=st):
            snt.all_to_all_v(t, o2, s2, comm, algo="push")
        for k in (5, 50, 0, 17):
            s2.fill_(k)
            o2.zero_()
            g.replay()
            torch.cuda.synchronize()
            assert torch.equal(o2[:k], t[:k]) and not o2[k:].any(), k
