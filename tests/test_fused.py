"""all_reduce_rmsnorm: the all-reduce fused with the residual add and
RMSNorm (csrc/python/fused.c, csrc/kernels/rmsnorm.cuh), against a float64
reference of the unfused composition

    h = all_reduce(x) + residual
    y = h * rsqrt(mean(h * h, last axis) + eps) * weight

on loopback teams (every rank on one GPU, Communicator._loopback) of 1 to 8
ranks, and on a one-rank NCCL communicator. The CPU tests at the top check
the registry's view of the collective (which algorithm runs what)."""
import pytest

import symnccl
from _workers.serving import EPS, FP8_MAX, fp8_dynamic_scales
from _workers.serving import fp8_off_by_more_than_a_step as \
    _fp8_off_by_more_than_a_step
from _workers.serving import rmsnorm_inputs as _inputs
from _workers.serving import rmsnorm_wrong as _wrong
from conftest import LOOPBACK_GRID_KNOBS, last_rank_never_calls
from symnccl import _C

COLL = "all_reduce_rmsnorm"
DTYPES = ["float32", "float16", "bfloat16"]
# (T, H): T in {1, 3, 17, 128, 1000}, H in {8, 1000, 4096, 16384}, trimmed
SHAPES = [(1, 8), (3, 1000), (17, 4096), (128, 4096), (1000, 1000),
          (3, 16384), (1, 16384)]
WORLDS = [1, 2, 3, 4, 8]
# the fused kernels; every one's bits are one_shot's
KERNEL_ALGOS = ["one_shot", "two_shot", "ll", "ll128", "lamport"]
# the fused kernels that take an FP8 output (two_shot has none)
FP8_ALGOS = ["one_shot", "ll", "ll128", "lamport"]
TOPO_2 = dict(nranks=2, lsa_size=2, symmetric=1, staging=1, push=1,
              multicast=0)


# ------------------------------------------------------------------ CPU

def test_the_fused_kernel_is_a_row_of_the_kernel_table():
    rows = [r for r in _C.KERNEL_TABLE if r["collective"] == COLL]
    assert [(r["name"], r["algo"], r["plan"], r["unit"], r["family"])
            for r in rows] == [
        ("one_shot_rmsnorm", "one_shot", "rows", "float", "barrier"),
        ("two_shot_rmsnorm", "two_shot", "rows", "float", "barrier"),
        ("ll_rmsnorm", "ll", "rows", "float", "ll"),
        ("ll128_rmsnorm", "ll128", "rows", "float", "ll128"),
        ("lamport_rmsnorm", "lamport", "rows", "float", "lamport")]
    assert _C.COLLECTIVE_KERNELS[COLL] == {"one_shot": "one_shot_rmsnorm",
                                           "two_shot": "two_shot_rmsnorm",
                                           "ll": "ll_rmsnorm",
                                           "ll128": "ll128_rmsnorm",
                                           "lamport": "lamport_rmsnorm"}
    # besides the fused kernel, the Lamport format runs all_reduce's
    # one-shot, in the float units only (its sentinel is a float NaN)
    assert _C.ALGO_KERNELS["lamport"] == ("lamport",)
    assert [r["unit"] for r in _C.KERNEL_TABLE
            if r["algo"] == "lamport"] == ["float", "float"]


def test_only_float32_float16_bfloat16_have_the_fused_kernel():
    gate = _C._algo_unavailable_for
    for algo in KERNEL_ALGOS:
        for dt in DTYPES:
            assert gate(TOPO_2, algo, dt, "sum", COLL) is None, dt
        for dt in ("float64", "float8_e4m3fn", "int32", "int64"):
            assert "float32, float16 and bfloat16" in \
                gate(TOPO_2, algo, dt, "sum", COLL), dt
    assert "no kernel of this algorithm" in \
        gate(TOPO_2, "push", "bfloat16", "sum", COLL)
    assert gate(TOPO_2, "nccl", "float64", "sum", COLL) is None


def test_auto_runs_the_fused_kernel_where_measured_and_nccl_elsewhere(
        monkeypatch):
    monkeypatch.delenv("SYMNCCL_ALGO", raising=False)
    auto = _C._auto_algo_for
    # measured (fused_h100x1_bfloat16.json, fused_h200x2_bfloat16.json,
    # fused_h100x2_bfloat16_lamport*.json): 1 rank one_shot at every size;
    # 2 ranks lamport to 2 MiB, one_shot to 32 MiB;
    # "nccl" is the all-reduce then the add+norm (the all-reduce of
    # all_reduce's own table when asked "auto": the test below)
    one = dict(TOPO_2, nranks=1, lsa_size=1)
    for nbytes in (16, 4 << 20, 1 << 40):
        assert auto(one, nbytes, "bfloat16", "sum", False, COLL) == \
            "one_shot"
    for nbytes, algo in ((16, "lamport"), (64 << 10, "lamport"),
                         (2 << 20, "lamport"), ((2 << 20) + 16, "one_shot"),
                         (32 << 20, "one_shot"), ((32 << 20) + 16, "nccl")):
        assert auto(TOPO_2, nbytes, "bfloat16", "sum", False, COLL) == algo
    # 3 and 4 ranks lamport to 256 KiB (fused_h100x{3,4}_bfloat16_decode_*
    # .json), then nccl; 5+ not measured
    for n in (3, 4):
        topo = dict(TOPO_2, nranks=n, lsa_size=n)
        for nbytes, algo in ((16, "lamport"), (256 << 10, "lamport"),
                             ((256 << 10) + 16, "nccl")):
            assert auto(topo, nbytes, "bfloat16", "sum", False, COLL) == algo
    # 5+ ranks not measured; a dtype without the kernel; no device API
    assert auto(dict(TOPO_2, nranks=8, lsa_size=8), 16, "bfloat16", "sum",
                False, COLL) == "nccl"
    assert auto(TOPO_2, 16, "float64", "sum", False, COLL) == "nccl"
    assert auto(dict(TOPO_2, symmetric=0), 16, "bfloat16", "sum", False,
                COLL) == "nccl"


def test_the_method_is_documented_with_an_example_and_stubbed():
    import ast
    import inspect
    import os
    doc = symnccl.Communicator.all_reduce_rmsnorm.__doc__
    assert "residual_out" in doc and "Example" in doc and "rsqrt" in doc
    stub = ast.parse(open(os.path.join(os.path.dirname(_C.__file__),
                                       "_C.pyi")).read())
    cls = next(n for n in stub.body if isinstance(n, ast.ClassDef)
               and n.name == "Communicator")
    f = next(f for f in cls.body if isinstance(f, ast.FunctionDef)
             and f.name == COLL)
    sig = inspect.signature(symnccl.Communicator.all_reduce_rmsnorm)
    assert list(sig.parameters) == [a.arg for a in f.args.args +
                                    f.args.kwonlyargs]
    assert [p.name for p in sig.parameters.values()
            if p.kind == p.KEYWORD_ONLY] == [a.arg for a in f.args.kwonlyargs]


# ------------------------------------------------------------------ GPU

def _torch():
    return pytest.importorskip("torch")


def _grid(nranks):
    """CTAs per rank: the whole team's grids must be resident at once on
    one GPU (test_loopback.py's sizes)."""
    return {1: 64, 2: 32, 3: 16, 4: 16, 8: 8}[nranks]


# The timeout of the tests in which a rank never calls (each waits it out
# once): a loopback rank's kernels start within milliseconds of its call.
STOP_TIMEOUT = 0.5


def _team(monkeypatch, nranks, timeout=20.0, **kw):
    for k in ("SYMNCCL_RMSNORM_CTAS",) + LOOPBACK_GRID_KNOBS:
        monkeypatch.setenv(k, str(_grid(nranks)))
    return symnccl.Communicator._loopback(nranks, 0, timeout=timeout, **kw)


def _close(team):
    for c in team:
        c.close()


def _poisoned(torch, like, pad=0):
    full = torch.full((like.numel() + pad,), float("nan"), dtype=like.dtype,
                      device="cuda")
    return full[pad:].view(like.shape)


def _call_all(torch, team, streams, xs, res, w, ys, hs, **kw):
    torch.cuda.synchronize()
    for c, s, x, y, h in zip(team, streams, xs, ys, hs):
        c.all_reduce_rmsnorm(x, res, w, EPS, out=y, residual_out=h,
                             stream=s, **kw)
    torch.cuda.synchronize()


@pytest.mark.gpu
@pytest.mark.parametrize("nranks", WORLDS)
def test_every_dtype_and_shape_against_float64(monkeypatch, nranks):
    """one_shot, two_shot, ll, ll128 and lamport, poisoned outputs, every
    other case at an unaligned offset: within the rounding bounds of the
    float64 reference, the same bits on every rank and from every kernel.
    The shapes follow each other on one team, so each lamport call finds
    the slots the calls before it left empty."""
    torch = _torch()
    team = _team(monkeypatch, nranks)
    streams = [torch.cuda.Stream() for _ in team]
    wrong, calls, ll_launches, ll128_launches = [], 0, 0, 0
    lamport_launches = 0
    # ll's rows travel in chunks of what an LL row carries (half its
    # bytes); ll128's in whole 512-byte items of 480 data bytes a row;
    # lamport's in a Lamport row (all data)
    layout = team[0]._staging_layout()
    ll_carries = layout["ll_row"] // 2
    ll128_items = layout["ll128_row"] // 512
    lamport_carries = layout["lamport_row"]
    try:
        for dtype in DTYPES:
            for i, (T, H) in enumerate(SHAPES):
                per = ll_carries // (H * _itemsize(dtype))
                ll_launches += 1 if nranks == 1 else -(-T // per)
                per = ll128_items // -(-H * _itemsize(dtype) // 480)
                ll128_launches += 1 if nranks == 1 else -(-T // per)
                per = lamport_carries // (H * _itemsize(dtype))
                lamport_launches += 1 if nranks == 1 else -(-T // per)
                pad = 3 if i % 2 else 0      # every other case unaligned
                xs, res, w = _inputs(torch, nranks, T, H, dtype,
                                     seed=T * H + nranks, pad=pad)
                got = {}
                for algo in KERNEL_ALGOS:
                    ys = [_poisoned(torch, xs[0], pad) for _ in team]
                    hs = [_poisoned(torch, xs[0], pad) for _ in team]
                    _call_all(torch, team, streams, xs, res, w, ys, hs,
                              algo=algo)
                    got[algo] = (ys, hs)
                    bad = _wrong(torch, xs, res, w, ys[0], hs[0], dtype)
                    same = all(torch.equal(_bits(y), _bits(ys[0])) and
                               torch.equal(_bits(h), _bits(hs[0]))
                               for y, h in zip(ys[1:], hs[1:]))
                    if bad != (0, 0) or not same:
                        wrong.append((algo, dtype, T, H, pad, bad, same))
                calls += 1
                y1, h1 = got["one_shot"]
                for algo in KERNEL_ALGOS[1:]:
                    y2, h2 = got[algo]
                    if not (torch.equal(_bits(y1[0]), _bits(y2[0])) and
                            torch.equal(_bits(h1[0]), _bits(h2[0]))):
                        wrong.append((f"one_shot != {algo}", dtype, T, H))
        launches = [c._launches() for c in team]
    finally:
        _close(team)
    assert not wrong, f"{nranks} ranks: (algo, dtype, T, H, pad, (h wrong, " \
                      f"y wrong), ranks bitwise equal): {wrong}"
    for q, l in enumerate(launches):
        assert {k: v for k, v in l.items() if v} == \
            {"one_shot_rmsnorm": calls, "two_shot_rmsnorm": calls,
             "ll_rmsnorm": ll_launches, "ll128_rmsnorm": ll128_launches,
             "lamport_rmsnorm": lamport_launches}, (q, l)


@pytest.mark.gpu
@pytest.mark.parametrize("threads", [64, 256])
def test_row_groups_keep_one_shot_order_for_any_block(monkeypatch, threads):
    """ll_rmsnorm and lamport_rmsnorm take one_shot_rmsnorm's block for a
    row and hold several rows a CTA where a row is one pass: with smaller
    blocks (SYMNCCL_THREADS) a thread owns many vectors of a row (H 4096,
    16384: kept, then read back from out_h), and H 1000 at 256 threads
    puts 8 rows in a CTA of 1024 (300 rows on 32 CTAs); the bits are still
    one_shot's."""
    torch = _torch()
    monkeypatch.setenv("SYMNCCL_THREADS", str(threads))
    team = _team(monkeypatch, 2)
    streams = [torch.cuda.Stream() for _ in team]
    wrong, launches = [], []
    try:
        for dtype in ("float32", "bfloat16"):
            for T, H in [(5, 4096), (2, 16384), (300, 1000)]:
                xs, res, w = _inputs(torch, 2, T, H, dtype, seed=T + H)
                got = {}
                for algo in ("one_shot", "ll", "lamport"):
                    ys = [_poisoned(torch, xs[0]) for _ in team]
                    hs = [_poisoned(torch, xs[0]) for _ in team]
                    _call_all(torch, team, streams, xs, res, w, ys, hs,
                              algo=algo)
                    got[algo] = (ys[0], hs[0])
                    if _wrong(torch, xs, res, w, ys[0], hs[0], dtype) != \
                            (0, 0):
                        wrong.append((algo, dtype, T, H))
                for algo in ("ll", "lamport"):
                    if not all(torch.equal(_bits(a), _bits(b)) for a, b in
                               zip(got["one_shot"], got[algo])):
                        wrong.append((f"one_shot != {algo}", dtype, T, H))
        launches = [c._launches() for c in team]
    finally:
        _close(team)
    assert not wrong, wrong
    for l in launches:
        assert l["ll_rmsnorm"] == 6 and l["lamport_rmsnorm"] == 6, l


@pytest.mark.gpu
@pytest.mark.parametrize("algo", ["ll", "lamport"])
def test_decode_rows_keep_one_shot_bits_beside_the_general_path(
        monkeypatch, algo):
    """A row a CTA of whole aligned vectors, at most two a thread, takes
    the packet kernels' decode path (rmsnorm.cuh, decode_row; at any team
    size, its loops unrolled at two, the size here); anything else the
    general path, and each rank decides from its own pointers. Around each
    edge: T = the grid and one past it (a CTA of 512 threads a row), twice
    the grid and one past it (the general path's wide CTA of two such
    rows, then its rounds), four times the grid at H 2048 (four rows of
    256 threads a CTA), H with one and two vectors a thread of 512 and one
    vector past two (H 8200: bf16 1025 vectors), every tensor aligned, and
    rank 1's out misaligned (rank 0 decodes, rank 1 does not: the same
    packets either way). Every case: one_shot's bits on each rank, within
    the float64 reference's bounds."""
    torch = _torch()
    team = _team(monkeypatch, 2)
    grid = _grid(2)
    streams = [torch.cuda.Stream() for _ in team]
    layout = team[0]._staging_layout()
    carries = layout["ll_row"] // 2 if algo == "ll" else layout["lamport_row"]
    wrong, expected = [], 0
    try:
        for dtype in ("bfloat16", "float32", "float16"):
            for T, H in [(1, 4096), (grid, 4096), (grid + 1, 4096),
                         (2 * grid, 4096), (2 * grid + 1, 4096),
                         (4 * grid, 2048), (3, 8192), (2, 8200)]:
                xs, res, w = _inputs(torch, 2, T, H, dtype, seed=T * H)
                for pads in ((0, 0), (0, 3)):
                    got = {}
                    for a in ("one_shot", algo):
                        ys = [_poisoned(torch, xs[0], p) for p in pads]
                        hs = [_poisoned(torch, xs[0]) for _ in team]
                        _call_all(torch, team, streams, xs, res, w, ys, hs,
                                  algo=a)
                        got[a] = (ys, hs)
                        for q in range(2):
                            if _wrong(torch, xs, res, w, ys[q], hs[q],
                                      dtype) != (0, 0):
                                wrong.append((a, dtype, T, H, pads, q))
                    per = carries // (H * _itemsize(dtype))
                    expected += -(-T // per)
                    for q in range(2):
                        if not (torch.equal(_bits(got["one_shot"][0][q]),
                                            _bits(got[algo][0][q])) and
                                torch.equal(_bits(got["one_shot"][1][q]),
                                            _bits(got[algo][1][q]))):
                            wrong.append((f"one_shot != {algo}", dtype, T, H,
                                          pads, q))
        launches = [c._launches() for c in team]
    finally:
        _close(team)
    assert not wrong, wrong
    for l in launches:
        assert l[f"{algo}_rmsnorm"] == expected, l


@pytest.mark.gpu
@pytest.mark.parametrize("algo", ["one_shot", "ll", "lamport"])
def test_half_pairs_give_fp32_s_bits_over_every_exponent(monkeypatch, algo):
    """16-bit floats are summed a word's pair at once (HADD2: Half2,
    reduce.cuh; the decode path's two ranks, every kernel's residual): h
    must be torch's fp32 arithmetic rounded to T, T(T(x0 + x1) +
    residual), bit for bit, over random finite bit patterns (subnormals,
    both signs, every exponent: sums that cancel, overflow, or where one
    term lies far below the other's ulp), on the decode path (T 2) and the
    general path (T 2 * grid + 1). (y, whose norm such rows overflow, is
    the next test's: its helpers on every input.)"""
    torch = _torch()
    team = _team(monkeypatch, 2)
    grid = _grid(2)
    streams = [torch.cuda.Stream() for _ in team]
    g = torch.Generator().manual_seed(23)
    wrong = []

    def finite(dt, shape):
        bits = torch.randint(-2 ** 15, 2 ** 15, shape, generator=g,
                             dtype=torch.int16)
        v = bits.view(dt)
        return torch.where(v.isfinite(), v, torch.zeros_like(v)).cuda()
    try:
        for dtype in ("bfloat16", "float16"):
            dt = getattr(torch, dtype)
            for T in (2, 2 * grid + 1):
                H = 4096
                xs = [finite(dt, (T, H)) for _ in team]
                xs[1][0, :512] = -xs[0][0, :512]          # exact cancels
                res = finite(dt, (T, H))
                w = (1 + 0.5 * torch.randn(H, generator=g)).to(dt).cuda()
                ys = [_poisoned(torch, xs[0]) for _ in team]
                hs = [_poisoned(torch, xs[0]) for _ in team]
                _call_all(torch, team, streams, xs, res, w, ys, hs,
                          algo=algo)
                s = (xs[0].float() + xs[1].float()).to(dt)
                want = (s.float() + res.float()).to(dt)
                for q in range(2):
                    if not torch.equal(_bits(hs[q]), _bits(want)):
                        bad = (_bits(hs[q]) != _bits(want)).sum().item()
                        wrong.append((dtype, T, q, "h", bad))
        launches = team[0]._launches()
    finally:
        _close(team)
    assert not wrong, wrong
    assert launches[f"{algo}_rmsnorm"] >= 4, launches


def _nccl_include():
    """A directory holding nccl.h (csrc/kernels/launch.h includes it): the
    nvidia-nccl wheel's, else the headers setup.py fetched; None if
    neither is there."""
    import glob
    import os
    dirs = []
    try:
        import nvidia.nccl
        dirs += [os.path.join(p, "include") for p in nvidia.nccl.__path__]
    except ImportError:
        pass
    dirs += sorted(glob.glob(os.path.expanduser(
        "~/.cache/symnccl/nccl/*/nvidia/nccl/include")))
    return next((d for d in dirs
                 if os.path.isfile(os.path.join(d, "nccl.h"))), None)


@pytest.mark.gpu
def test_half2_helpers_give_acc_s_bits_on_every_input(tmp_path):
    """The paired 16-bit float helpers (Half2, csrc/kernels/reduce.cuh)
    against Acc's fp32 way on every input, on this GPU:
    tests/data/half2_every_input.cu, built here with nvcc against the
    tree's headers, checks the sums and products of every pair of float16
    and of bfloat16 patterns (2^32 each), the pair rounding of every fp32
    pattern and bfloat16's two bit operations: 0 mismatches, or the first
    one of each kind."""
    import os
    import shutil
    import subprocess
    torch = _torch()
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not os.path.exists(nvcc):
        pytest.skip("no nvcc to build tests/data/half2_every_input.cu")
    inc = _nccl_include()
    if inc is None:
        pytest.skip("no nccl.h (the nvidia-nccl wheel's include directory)")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    major, minor = torch.cuda.get_device_capability()
    exe = tmp_path / "half2_every_input"
    build = subprocess.run(
        [nvcc, "-O3", "-std=c++17", f"-arch=sm_{major}{minor}",
         "-I", os.path.join(root, "csrc"), "-I", inc,
         "-DSYMNCCL_NCCL_MINOR=0",
         os.path.join(root, "tests", "data", "half2_every_input.cu"),
         "-o", os.fspath(exe)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([os.fspath(exe)], capture_output=True, text=True,
                         timeout=120)
    lines = run.stdout.split("\n")
    rows = [line.split() for line in lines if line.strip()]
    assert len(rows) == 8 and all(len(r) == 5 for r in rows), run.stdout
    assert [(r[0], r[1]) for r in rows] == [
        (t, c) for t in ("float16", "bfloat16")
        for c in ("add", "mul", "round", "to")], run.stdout
    assert [r for r in rows if r[2] != "0"] == [] and run.returncode == 0, \
        run.stdout


def _itemsize(dtype):
    return {"float32": 4, "float16": 2, "bfloat16": 2}[dtype]


def _bits(t):
    import torch
    return t.reshape(-1).view(torch.int32 if t.dtype == torch.float32
                              else torch.int16)


@pytest.mark.gpu
@pytest.mark.parametrize("algo", KERNEL_ALGOS)
@pytest.mark.parametrize("nranks", [2, 3])
def test_in_place_residual_gives_the_same_bits(monkeypatch, nranks, algo):
    """residual_out=residual (vLLM's in-place form) and out=x give the bits
    of the out-of-place call."""
    torch = _torch()
    team = _team(monkeypatch, nranks)
    streams = [torch.cuda.Stream() for _ in team]
    try:
        xs, res, w = _inputs(torch, nranks, 17, 4096, "bfloat16", seed=5)
        ys = [torch.empty_like(x) for x in xs]
        hs = [torch.empty_like(x) for x in xs]
        _call_all(torch, team, streams, xs, res, w, ys, hs, algo=algo)
        ress = [res.clone() for _ in team]
        xcopy = [x.clone() for x in xs]
        torch.cuda.synchronize()
        for c, s, x, r in zip(team, streams, xcopy, ress):
            c.all_reduce_rmsnorm(x, r, w, EPS, out=x, residual_out=r,
                                 stream=s, algo=algo)
        torch.cuda.synchronize()
        for q in range(nranks):
            assert torch.equal(_bits(xcopy[q]), _bits(ys[q])), q
            assert torch.equal(_bits(ress[q]), _bits(hs[q])), q
    finally:
        _close(team)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_lamport_sends_words_of_x_that_look_empty(monkeypatch, dtype):
    """An 8-byte word of x that is all ones (each element the NaN that
    marks an empty Lamport slot) travels as another NaN: lamport's call
    ends (a word sent as it is would be waited for until the timeout) and
    gives one_shot's bits, the NaN rows included; so does the clean call
    after it, on the slots the first one left."""
    torch = _torch()
    team = _team(monkeypatch, 2, timeout=5.0)
    streams = [torch.cuda.Stream() for _ in team]
    ints = {"float32": torch.int32, "float16": torch.int16,
            "bfloat16": torch.int16}[dtype]
    per_word = 8 // _itemsize(dtype)
    T, H = 6, 4096
    try:
        for rep in range(2):
            xs, res, w = _inputs(torch, 2, T, H, dtype, seed=11 + rep)
            if rep == 0:
                words = [x.view(ints).view(T, H // per_word, per_word)
                         for x in xs]
                words[0][1, 3] = -1       # one rank's word
                words[0][2, 7] = -1       # both ranks' same word
                words[1][2, 7] = -1
                words[1][4, 10:12] = -1   # a whole 16-byte vector
            got = {}
            for algo in ("one_shot", "lamport"):
                ys = [_poisoned(torch, xs[0]) for _ in team]
                hs = [_poisoned(torch, xs[0]) for _ in team]
                _call_all(torch, team, streams, xs, res, w, ys, hs,
                          algo=algo)
                got[algo] = (ys, hs)
            for q in range(2):
                for k in range(2):
                    assert torch.equal(_bits(got["one_shot"][k][q]),
                                       _bits(got["lamport"][k][q])), \
                        (rep, q, "yh"[k])
            y, h = got["lamport"][0][0], got["lamport"][1][0]
            nan_rows = [1, 2, 4] if rep == 0 else []
            for r in range(T):
                assert bool(y[r].isnan().all()) == (r in nan_rows), (rep, r)
            assert _wrong(torch, [x[[0, 3, 5]] for x in xs], res[[0, 3, 5]],
                          w, y[[0, 3, 5]], h[[0, 3, 5]], dtype) == (0, 0)
        assert team[0]._launches()["lamport_rmsnorm"] == 2
    finally:
        _close(team)


@pytest.mark.gpu
@pytest.mark.parametrize("algo,launches", [("one_shot", 63),
                                           ("two_shot", 200), ("ll", 3),
                                           ("ll128", 2), ("lamport", 2)])
def test_rows_past_the_staging_area_take_several_launches(monkeypatch, algo,
                                                          launches):
    """A staging area of 64 KiB holds 16 rows of H 1000 fp32 (two_shot: 5,
    with their y and h): 1000 rows take 63 (200) launches of whole rows, and
    the result is unchanged. ll's rows travel in a row of the LL region
    instead (349 of them at 3 ranks: 3 launches), ll128's in a row of the
    LL128 region (606 rows of 9 items: 2 launches), lamport's in a row of
    the Lamport region (698 rows: 2 launches)."""
    torch = _torch()
    team = _team(monkeypatch, 3, staging_bytes=64 << 10)
    streams = [torch.cuda.Stream() for _ in team]
    try:
        xs, res, w = _inputs(torch, 3, 1000, 1000, "float32", seed=9)
        ys = [_poisoned(torch, xs[0]) for _ in team]
        hs = [_poisoned(torch, xs[0]) for _ in team]
        _call_all(torch, team, streams, xs, res, w, ys, hs, algo=algo)
        for y, h in zip(ys, hs):
            assert _wrong(torch, xs, res, w, y, h, "float32") == (0, 0)
        assert team[0]._launches()[algo + "_rmsnorm"] == launches
    finally:
        _close(team)


@pytest.mark.gpu
@pytest.mark.parametrize("algo", KERNEL_ALGOS)
@pytest.mark.parametrize("nranks", [2, 4])
def test_graph_replays(monkeypatch, nranks, algo):
    """Each rank captures its call; replays with new inputs carry the
    barrier epochs in device memory."""
    torch = _torch()
    team = _team(monkeypatch, nranks)
    streams = [torch.cuda.Stream() for _ in team]
    try:
        xs, res, w = _inputs(torch, nranks, 5, 4096, "bfloat16", seed=1)
        ys = [torch.empty_like(x) for x in xs]
        hs = [torch.empty_like(x) for x in xs]
        graphs = []
        torch.cuda.synchronize()
        for c, s, x, y, h in zip(team, streams, xs, ys, hs):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=s):
                c.all_reduce_rmsnorm(x, res, w, EPS, out=y, residual_out=h,
                                     algo=algo)
            graphs.append(g)
        for rep in range(4):
            new, nres, _ = _inputs(torch, nranks, 5, 4096, "bfloat16",
                                   seed=100 + rep)
            for x, n in zip(xs, new):
                x.copy_(n)
            res.copy_(nres)
            torch.cuda.synchronize()
            for g, s in zip(graphs, streams):
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    g.replay()
            torch.cuda.synchronize()
            assert _wrong(torch, xs, res, w, ys[-1], hs[-1],
                          "bfloat16") == (0, 0), rep
            assert all(torch.equal(_bits(y), _bits(ys[0])) for y in ys)
    finally:
        _close(team)


@pytest.mark.gpu
@pytest.mark.parametrize("algo", KERNEL_ALGOS)
def test_a_rank_that_never_calls_times_out_on_every_other_rank(monkeypatch,
                                                                algo):
    torch = _torch()
    team = _team(monkeypatch, 3, timeout=STOP_TIMEOUT)
    xs, res, w = _inputs(torch, 3, 17, 1000, "float32", seed=3)
    last_rank_never_calls(
        torch, team,
        lambda c, s, q: c.all_reduce_rmsnorm(xs[q], res, w, EPS, stream=s,
                                             algo=algo),
        STOP_TIMEOUT, COLL, lambda k: k == algo + "_rmsnorm")


@pytest.mark.gpu
def test_bad_arguments_name_what_was_seen_and_expected(monkeypatch):
    torch = _torch()
    team = _team(monkeypatch, 1)
    c = team[0]
    try:
        x = torch.randn(4, 64, device="cuda", dtype=torch.bfloat16)
        r = torch.randn(4, 64, device="cuda", dtype=torch.bfloat16)
        w = torch.ones(64, device="cuda", dtype=torch.bfloat16)
        f = c.all_reduce_rmsnorm
        with pytest.raises(TypeError, match="x has dtype float64, expected "
                                            "float32, float16 or bfloat16"):
            f(x.double(), r.double(), w.double(), EPS)
        with pytest.raises(TypeError, match="residual has dtype float32"):
            f(x, r.float(), w, EPS)
        with pytest.raises(ValueError, match="H .* is 12, expected a "
                                             "positive multiple of 8"):
            f(x[:, :12].contiguous(), r[:, :12].contiguous(), w[:12], EPS)
        with pytest.raises(ValueError, match="weight has 32 elements, "
                                             "expected 64"):
            f(x, r, w[:32], EPS)
        with pytest.raises(ValueError, match="residual has 128 elements"):
            f(x, r[:2], w, EPS)
        with pytest.raises(ValueError, match="out overlaps residual_out"):
            f(x, r, w, EPS, out=r, residual_out=r)
        with pytest.raises(ValueError, match="residual_out overlaps x "
                                             "without"):
            buf = torch.empty(4 * 64 + 8, device="cuda",
                              dtype=torch.bfloat16)
            f(buf[:256].view(4, 64), r, w, EPS,
              residual_out=buf[8:].view(4, 64))
        with pytest.raises(ValueError, match="eps is -1.0"):
            f(x, r, w, -1.0)
        with pytest.raises(ValueError, match="out has 64 elements"):
            f(x, r, w, EPS, out=w)
        with pytest.raises(ValueError, match="algo 'fast' is not"):
            f(x, r, w, EPS, algo="fast")
        with pytest.raises(ValueError, match="'push' cannot run this "
                                             "all_reduce_rmsnorm"):
            f(x, r, w, EPS, algo="push")
        with pytest.raises(RuntimeError, match="loopback"):
            f(x, r, w, EPS, algo="nccl")
        # nothing ran
        assert not any(c._launches().values())
        # and a good call works after all of them
        y, h = f(x, r, w, EPS)
        assert y.shape == x.shape and h.dtype == x.dtype
    finally:
        _close(team)


@pytest.mark.gpu
def test_one_rank_nccl_fallback_gives_the_bits_of_the_fused_kernel():
    """On one real rank: algo='nccl' (ncclAllReduce, then the add+norm with
    no peer) and 'one_shot' (the add+norm alone) give the same bits, and
    'auto' runs the fused kernel at decode sizes."""
    torch = _torch()
    comm = symnccl.Communicator(symnccl.get_unique_id(), 0, 1, 0)
    try:
        for dtype in DTYPES:
            xs, res, w = _inputs(torch, 1, 33, 4096, dtype, seed=7)
            y1, h1 = comm.all_reduce_rmsnorm(xs[0], res, w, EPS,
                                             algo="one_shot")
            y2, h2 = comm.all_reduce_rmsnorm(xs[0], res, w, EPS,
                                             algo="nccl")
            torch.cuda.synchronize()
            assert torch.equal(_bits(y1), _bits(y2)), dtype
            assert torch.equal(_bits(h1), _bits(h2)), dtype
            assert _wrong(torch, xs, res, w, y2, h2, dtype) == (0, 0)
        before = comm._launches()
        comm.all_reduce_rmsnorm(xs[0], res, w, EPS)
        after = comm._launches()
        assert after["one_shot_rmsnorm"] == before["one_shot_rmsnorm"] + 1
        assert after["nccl"] == before["nccl"]
    finally:
        comm.close()


@pytest.mark.gpu
def test_the_add_norm_s_grid_and_in_place_outputs_keep_the_bits(
        monkeypatch):
    """The add+norm with no peer (one rank, or after an all-reduce) goes
    round its grid's CTAs, each loading its next row before it stores this
    one: a grid of 3 CTAs for 1000 rows gives the bits of the default grid
    (two CTAs per SM), and so do y written over x and h over the residual
    (each CTA's next row is loaded before this row's stores), with rows
    past the kept vectors (H = 16384) and with an FP8 output."""
    torch = _torch()
    monkeypatch.setenv("SYMNCCL_RMSNORM_LOCAL_CTAS", "3")
    narrow = symnccl.Communicator(symnccl.get_unique_id(), 0, 1, 0)
    monkeypatch.delenv("SYMNCCL_RMSNORM_LOCAL_CTAS")
    wide = symnccl.Communicator(symnccl.get_unique_id(), 0, 1, 0)
    wrong = []
    try:
        for dtype in DTYPES:
            for T, H in ((1000, 4096), (300, 16384)):
                xs, res, w = _inputs(torch, 1, T, H, dtype, seed=T + H)
                y0, h0 = wide.all_reduce_rmsnorm(xs[0], res, w, EPS)
                y1, h1 = narrow.all_reduce_rmsnorm(xs[0], res, w, EPS)
                x, r = xs[0].clone(), res.clone()
                narrow.all_reduce_rmsnorm(x, r, w, EPS, out=x,
                                          residual_out=r)
                torch.cuda.synchronize()
                if _wrong(torch, xs, res, w, y0, h0, dtype) != (0, 0):
                    wrong.append(("reference", dtype, T, H))
                for name, y, h in (("grid 3", y1, h1), ("in place", x, r)):
                    if not (torch.equal(_bits(y), _bits(y0)) and
                            torch.equal(_bits(h), _bits(h0))):
                        wrong.append((name, dtype, T, H))
        xs, res, w = _inputs(torch, 1, 1000, 4096, "bfloat16", seed=5)
        qs = []
        for comm in (wide, narrow):
            q = torch.empty(1000, 4096, dtype=torch.float8_e4m3fn,
                            device="cuda")
            s = torch.empty(1000, dtype=torch.float32, device="cuda")
            comm.all_reduce_rmsnorm(xs[0], res, w, EPS, out=q,
                                    quant="fp8_dynamic", scale=s)
            qs.append((q.view(torch.uint8), s))
        torch.cuda.synchronize()
        if not (torch.equal(qs[0][0], qs[1][0]) and
                torch.equal(qs[0][1], qs[1][1])):
            wrong.append(("fp8_dynamic grid 3",))
    finally:
        narrow.close()
        wide.close()
    assert not wrong, wrong


@pytest.mark.gpu
def test_call_check_compares_fused_calls_too(monkeypatch):
    """SYMNCCL_CHECK=1 (the shared call helpers of collectives.c) compares
    each all_reduce_rmsnorm call first: one NCCL all-gather more per call,
    on the fused kernel and on the NCCL fallback alike; off, none. A
    loopback team, which has no NCCL to compare with, refuses the call
    with the knob on."""
    torch = _torch()
    xs, res, w = _inputs(torch, 1, 3, 64, "float32", seed=21)
    for on in (0, 1):
        monkeypatch.setenv("SYMNCCL_CHECK", str(on))
        with symnccl.Communicator(symnccl.get_unique_id(), 0, 1,
                                  device=0) as c:
            assert c.knobs["SYMNCCL_CHECK"] == on
            before = c._launches()
            c.all_reduce_rmsnorm(xs[0], res, w, EPS, algo="one_shot")
            c.all_reduce_rmsnorm(xs[0], res, w, EPS, algo="nccl")
            torch.cuda.synchronize()
            after = c._launches()
            assert after["one_shot_rmsnorm"] == \
                before["one_shot_rmsnorm"] + 2
            assert after["nccl"] == before["nccl"] + 1 + 2 * on, on
    monkeypatch.setenv("SYMNCCL_CHECK", "1")
    team = _team(monkeypatch, 1)
    try:
        with pytest.raises(RuntimeError, match="needs NCCL.*loopback"):
            team[0].all_reduce_rmsnorm(xs[0], res, w, EPS, algo="one_shot")
        assert not any(team[0]._launches().values())
    finally:
        _close(team)


# ------------------------------------------------------------ torch op

@pytest.mark.gpu
def test_torch_op_eager_compiled_and_captured_give_the_method_s_bits(
        monkeypatch):
    torch = _torch()
    st = pytest.importorskip("symnccl.torch")
    team = _team(monkeypatch, 1)
    comm = st.wrap(team[0])
    try:
        xs, res, w = _inputs(torch, 1, 17, 4096, "bfloat16", seed=11)
        x = xs[0]
        y0, h0 = comm.all_reduce_rmsnorm(x, res, w, EPS)

        def f(x, res, w):
            return st.all_reduce_add_rmsnorm(x, res, w, EPS, comm)
        outs = {"eager": f(x, res, w),
                "compiled": torch.compile(f, fullgraph=True)(x, res, w)}
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            f(x, res, w)                       # warm-up outside capture
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            yg, hg = f(x, res, w)
        g.replay()
        torch.cuda.synchronize()
        outs["graph"] = (yg, hg)
        for name, (y, h) in outs.items():
            assert torch.equal(_bits(y), _bits(y0)), name
            assert torch.equal(_bits(h), _bits(h0)), name
    finally:
        _close(team)


@pytest.mark.gpu
@pytest.mark.parametrize("compiled", [False, True])
def test_torch_op_gradients_are_the_unfused_composition_s(monkeypatch,
                                                          compiled):
    torch = _torch()
    st = pytest.importorskip("symnccl.torch")
    team = _team(monkeypatch, 1)
    comm = st.wrap(team[0])
    try:
        xs, res, w = _inputs(torch, 1, 9, 1000, "float32", seed=13)
        gy = torch.randn_like(xs[0])
        gh = torch.randn_like(xs[0])

        def fused(x, r, w):
            y, h = st.all_reduce_add_rmsnorm(x, r, w, EPS, comm)
            return (y * gy).sum() + (h * gh).sum()

        def unfused(x, r, w):
            h = st.all_reduce(x, comm) + r
            y = torch.nn.functional.rms_norm(h, (h.shape[-1],), w, EPS)
            return (y * gy).sum() + (h * gh).sum()
        # every input requiring grad; then x alone not (a frozen layer's
        # output: the residual's and the weight's gradients still flow)
        for needs in ((True, True, True), (False, True, True)):
            grads = []
            for fn in (torch.compile(fused, fullgraph=True) if compiled
                       else fused, unfused):
                leaves = [t.detach().clone().requires_grad_(q)
                          for t, q in zip((xs[0], res, w), needs)]
                fn(*leaves).backward()
                grads.append([t.grad for t in leaves])
            for name, a, b in zip(("x", "residual", "weight"), *grads):
                if a is None or b is None:
                    assert a is None and b is None, (name, needs)
                    continue
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4,
                                           msg=name)
    finally:
        _close(team)


@pytest.mark.gpu
@pytest.mark.parametrize("nranks,T,H,algo", [(3, 40, 4096, "ll128"),
                                             (2, 4100, 4096, "push")])
def test_auto_beyond_the_fused_rows_is_all_reduce_s_choice_then_the_norm(
        monkeypatch, nranks, T, H, algo):
    """Where no fused kernel serves "auto" (5+ ranks; over 256 KiB at 3-4;
    over 32 MiB at 2) the call is the unfused composition with one kernel
    for the add and the norm: the all-reduce all_reduce's own auto table
    picks (ll128 for 320 KiB at 3 ranks, push over 32 MiB at 2), then
    symnccl's add+norm, which reads the all-reduce's output only past its
    PDL wait (the all-reduce lets it launch early here, as beside NCCL >=
    2.30.7). Within the float64 bounds, the same bits on every rank, on 2 ranks the bits
    of the fused one_shot (whose sums are push's: one rounding of x0 + x1)
    and the same bits with y written over x, or over the residual (the
    sums go to y's buffer unless it is the residual), and it runs on a
    loopback team; asked "nccl", the all-reduce is NCCL's, which a
    loopback team refuses."""
    torch = _torch()
    # all resident: the add+norm, launched while the all-reduce runs, must
    # leave the other ranks' all-reduce room on the one GPU (with its
    # default grid, which fills the GPU, rank 1's push never started)
    for k in ("SYMNCCL_LL_CTAS", "SYMNCCL_PUSH_CTAS",
              "SYMNCCL_RMSNORM_LOCAL_CTAS"):
        monkeypatch.setenv(k, str(_grid(nranks)))
    team = _team(monkeypatch, nranks)
    for c in team:   # the all-reduce lets the add+norm launch at its entry
        c._pdl_early = True
    streams = [torch.cuda.Stream() for _ in team]
    try:
        xs, res, w = _inputs(torch, nranks, T, H, "bfloat16", seed=T + H)
        ys = [_poisoned(torch, xs[0]) for _ in team]
        hs = [_poisoned(torch, xs[0]) for _ in team]
        before = [c._launches() for c in team]
        _call_all(torch, team, streams, xs, res, w, ys, hs)
        ran = [{k: v - b[k] for k, v in c._launches().items() if v != b[k]}
               for c, b in zip(team, before)]
        bad = _wrong(torch, xs, res, w, ys[0], hs[0], "bfloat16")
        same = all(torch.equal(_bits(y), _bits(ys[0])) and
                   torch.equal(_bits(h), _bits(hs[0]))
                   for y, h in zip(ys[1:], hs[1:]))
        if nranks == 2:
            y1 = [_poisoned(torch, xs[0]) for _ in team]
            h1 = [_poisoned(torch, xs[0]) for _ in team]
            _call_all(torch, team, streams, xs, res, w, y1, h1,
                      algo="one_shot")
            same = same and torch.equal(_bits(y1[0]), _bits(ys[0])) and \
                torch.equal(_bits(h1[0]), _bits(hs[0]))
            for over in ("x", "residual"):
                xo = [x.clone() for x in xs]
                ro = [res.clone() for _ in team]
                torch.cuda.synchronize()
                for c, s, x, r in zip(team, streams, xo, ro):
                    c.all_reduce_rmsnorm(x, r, w, EPS, stream=s,
                                         out=x if over == "x" else r,
                                         residual_out=r if over == "x"
                                         else x)
                torch.cuda.synchronize()
                y, h = (xo[0], ro[0]) if over == "x" else (ro[0], xo[0])
                same = same and torch.equal(_bits(y), _bits(ys[0])) and \
                    torch.equal(_bits(h), _bits(hs[0]))
        with pytest.raises(RuntimeError, match="needs NCCL.*loopback"):
            team[0].all_reduce_rmsnorm(xs[0], res, w, EPS, algo="nccl")
    finally:
        _close(team)
    assert bad == (0, 0) and same, (bad, same)
    for r in ran:
        ar = set(r) - {"one_shot_rmsnorm"}
        assert r.get("one_shot_rmsnorm") == 1 and len(ar) == 1 and \
            ar <= set(symnccl._C.ALGO_KERNELS[algo]), r


# ----------------------------------------------------------------- FP8

@pytest.mark.gpu
@pytest.mark.parametrize("algo", FP8_ALGOS)
@pytest.mark.parametrize("nranks", [1, 2, 4])
def test_fp8_static_and_dynamic_outputs(monkeypatch, nranks, algo):
    """y as float8_e4m3fn: within one FP8 step of the unquantised call's y
    divided by the scale (static: the given one; dynamic: each row's
    amax / 448, bit-exact), h unchanged, every rank's bits the same, from
    each fused kernel that takes an FP8 output."""
    torch = _torch()
    team = _team(monkeypatch, nranks)
    streams = [torch.cuda.Stream() for _ in team]
    f8 = torch.float8_e4m3fn
    wrong = []
    try:
        for dtype in DTYPES:
            for i, (T, H) in enumerate([(3, 1000), (17, 4096), (2, 16384)]):
                pad = 3 if i == 1 else 0
                xs, res, w = _inputs(torch, nranks, T, H, dtype, seed=T + H,
                                     pad=pad)
                ys = [torch.empty_like(x) for x in xs]
                hs = [torch.empty_like(x) for x in xs]
                _call_all(torch, team, streams, xs, res, w, ys, hs,
                          algo="one_shot")
                y = ys[0]
                # static, a scale that saturates the largest values
                s = (y.float().abs().max() / FP8_MAX / 1.5).reshape(1)
                qs = [torch.full((T * H + pad,), 0xFF, dtype=torch.uint8,
                                 device="cuda")[pad:].view(f8).view(T, H)
                      for _ in team]
                hq = [_poisoned(torch, x) for x in xs]
                torch.cuda.synchronize()
                for c, st, x, q, h in zip(team, streams, xs, qs, hq):
                    c.all_reduce_rmsnorm(x, res, w, EPS, out=q,
                                         residual_out=h, quant="fp8_static",
                                         scale=s, stream=st, algo=algo)
                torch.cuda.synchronize()
                bad = _fp8_off_by_more_than_a_step(torch, qs[0].float(), y,
                                                   float(s))
                same = all(torch.equal(q.view(torch.uint8),
                                       qs[0].view(torch.uint8)) for q in qs)
                same &= all(torch.equal(_bits(h), _bits(hs[0])) for h in hq)
                # dynamic: a scale per row
                scales = [torch.full((T,), float("nan"), device="cuda")
                          for _ in team]
                torch.cuda.synchronize()
                for c, st, x, q, h, sc in zip(team, streams, xs, qs, hq,
                                              scales):
                    c.all_reduce_rmsnorm(x, res, w, EPS, out=q,
                                         residual_out=h,
                                         quant="fp8_dynamic", scale=sc,
                                         stream=st, algo=algo)
                torch.cuda.synchronize()
                want = fp8_dynamic_scales(torch, y)
                exact = torch.equal(scales[0], want)
                bad_d = _fp8_off_by_more_than_a_step(
                    torch, qs[0].float(), y, scales[0].double()[:, None])
                same &= all(torch.equal(q.view(torch.uint8),
                                        qs[0].view(torch.uint8)) and
                            torch.equal(sc, scales[0])
                            for q, sc in zip(qs, scales))
                if bad or bad_d or not exact or not same:
                    wrong.append((dtype, T, H, bad, bad_d, exact, same))
    finally:
        _close(team)
    assert not wrong, "(dtype, T, H, static wrong, dynamic wrong, " \
                      f"scales exact, ranks equal): {wrong}"


@pytest.mark.gpu
def test_fp8_arguments_are_checked(monkeypatch):
    torch = _torch()
    team = _team(monkeypatch, 1)
    c = team[0]
    try:
        x = torch.randn(4, 64, device="cuda", dtype=torch.bfloat16)
        r = torch.randn(4, 64, device="cuda", dtype=torch.bfloat16)
        w = torch.ones(64, device="cuda", dtype=torch.bfloat16)
        q = torch.empty(4, 64, device="cuda", dtype=torch.float8_e4m3fn)
        one = torch.ones(1, device="cuda")
        f = c.all_reduce_rmsnorm
        with pytest.raises(ValueError, match="quant='int8', expected None"):
            f(x, r, w, EPS, quant="int8")
        with pytest.raises(ValueError, match="needs out="):
            f(x, r, w, EPS, quant="fp8_static", scale=one)
        with pytest.raises(ValueError, match="needs out="):
            f(x, r, w, EPS, out=q, quant="fp8_dynamic")
        with pytest.raises(TypeError, match="out has dtype bfloat16, "
                                            "expected float8_e4m3fn"):
            f(x, r, w, EPS, out=torch.empty_like(x), quant="fp8_static",
              scale=one)
        with pytest.raises(ValueError, match="scale has dtype float32 and "
                                             "1 elements, expected float32 "
                                             "and 4"):
            f(x, r, w, EPS, out=q, quant="fp8_dynamic", scale=one)
        with pytest.raises(ValueError, match="scale= is given without"):
            f(x, r, w, EPS, scale=one)
        with pytest.raises(ValueError, match="'two_shot' has no FP8"):
            f(x, r, w, EPS, out=q, quant="fp8_static", scale=one,
              algo="two_shot")
        assert not any(c._launches().values())
    finally:
        _close(team)


@pytest.mark.gpu
def test_torch_fp8_op_eager_and_compiled(monkeypatch):
    torch = _torch()
    st = pytest.importorskip("symnccl.torch")
    team = _team(monkeypatch, 1)
    comm = st.wrap(team[0])
    try:
        xs, res, w = _inputs(torch, 1, 5, 4096, "bfloat16", seed=17)
        q0 = torch.empty(5, 4096, device="cuda", dtype=torch.float8_e4m3fn)
        s0 = torch.empty(5, device="cuda")
        comm.all_reduce_rmsnorm(xs[0], res, w, EPS, out=q0,
                                residual_out=torch.empty_like(res),
                                quant="fp8_dynamic", scale=s0)

        def f(x, r, w):
            return st.all_reduce_add_rmsnorm(x, r, w, EPS, comm, quant="fp8")
        for fn in (f, torch.compile(f, fullgraph=True)):
            q, h, s = fn(xs[0], res, w)
            assert q.dtype == torch.float8_e4m3fn and s.shape == (5, 1)
            assert torch.equal(q.view(torch.uint8), q0.view(torch.uint8))
            assert torch.equal(s.reshape(-1), s0)
        one = torch.full((1,), 0.01, device="cuda")
        q, h, s = st.all_reduce_add_rmsnorm(xs[0], res, w, EPS, comm,
                                            quant="fp8", scale=one)
        assert torch.equal(s, one) and q.dtype == torch.float8_e4m3fn
    finally:
        _close(team)
