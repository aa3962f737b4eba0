"""Rank bodies for the serving collectives on real peers (one process per
GPU, run by symnccl.bootstrap.spawn from tests/test_multigpu.py): the fused
all-reduce + residual add + RMSNorm (Communicator.all_reduce_rmsnorm) and
the all-to-alls (all_to_all, all_to_all_v). Each returns rows whose last
field is what went wrong (0: nothing), digests of its outputs so that the
test can compare the ranks' bits, and its launch counters.

Also home of the fused call's float64 reference and rounding bounds
(rmsnorm_wrong), and of the FP8 output's bound, which tests/test_fused.py
imports for its loopback teams: one bound for both."""
import hashlib
import random

import numpy as np

import symnccl

EPS = 1e-6
FP8_MAX = 448.0
RMSNORM = "all_reduce_rmsnorm"
# the fused kernels (their bits are the same: one_shot's)
FUSED_ALGOS = ("one_shot", "two_shot", "ll", "ll128", "lamport")
# the fused kernels with an FP8 output (two_shot has none)
FP8_ALGOS = ("one_shot", "ll", "ll128", "lamport")


# ------------------------------------------------- the bounds (pure torch)

def ulp(dtype):
    """The spacing of the dtype's numbers at 1."""
    return {"float32": 2.0 ** -23, "float16": 2.0 ** -10,
            "bfloat16": 2.0 ** -7}[dtype]


def rmsnorm_wrong(torch, xs, res, w, y, h, dtype, eps=EPS,
                  rounded_steps=False):
    """Elements of h and y outside the rounding bounds of the float64
    reference of h = sum(xs) + res, y = h * rsqrt(mean(h * h) + eps) * w
    (NaN, from a poisoned output left unwritten, counts). rounded_steps:
    the all-reduce may round its partial sums to the dtype at each of its
    n - 1 steps (NCCL's ring; the unfused path), not once."""
    x64 = sum(x.double() for x in xs)
    r64 = res.double()
    h64 = x64 + r64
    H = h64.shape[-1]
    rstd = torch.rsqrt((h64 * h64).sum(-1, keepdim=True) / H + eps)
    y64 = h64 * rstd * w.double()
    u = ulp(dtype)
    # h: the all-reduce and the add each round once (fp32 accumulation of
    # n terms adds n fp32 roundings); rounded_steps: each of the n - 1
    # partial sums is rounded to the dtype too
    mag = sum(x.double().abs() for x in xs) + r64.abs()
    hb = 2 * u * mag + len(xs) * 2.0 ** -23 * mag + 1e-30
    if rounded_steps:
        hb = hb + len(xs) * u * mag
    # y: h's error carried through the norm (each element's, and the
    # row's sum of squares'), the fp32 sum of squares (at most 64 roundings
    # deep), then two roundings
    rel = ((h64.abs() * hb).sum(-1, keepdim=True) /
           (h64 * h64).sum(-1, keepdim=True))
    yb = (w.double().abs() * rstd * hb * 1.01 +
          y64.abs() * (rel * 1.01 + 64 * 2.0 ** -24 + 3 * u) + 1e-6 * rstd)
    bad_h = ~((h.double() - h64).abs() <= hb)
    bad_y = ~((y.double() - y64).abs() <= yb)
    return int(bad_h.sum()), int(bad_y.sum())


def fp8_off_by_more_than_a_step(torch, q, y, s):
    """Elements of q (float8_e4m3fn) whose dequantised value q * s is more
    than one e4m3 step from y (y / s saturated to +-448): a step is 2^-3 of
    the value's binade, 2^-9 below the normal range."""
    v = (y.double() / s).clamp(-FP8_MAX, FP8_MAX)
    step = torch.where(v.abs() >= 2.0 ** -6,
                       2.0 ** (torch.floor(torch.log2(v.abs())) - 3),
                       torch.full_like(v, 2.0 ** -9))
    return int((~((q.double() - v).abs() <= step)).sum())


def fp8_dynamic_scales(torch, y):
    """The per-row scales of quant='fp8_dynamic' for y: max(amax / 448,
    1 / (448 * 512)). The kernel's fp32 division, correctly rounded: the
    float64 quotient rounded to float32 is the same number (53 >= 2 * 24 +
    2 bits). Divided by a tensor: torch's tensor / scalar multiplies by
    the reciprocal instead."""
    amax = y.float().abs().amax(-1).double()
    return torch.clamp(amax / torch.full_like(amax, FP8_MAX),
                       min=1.0 / (FP8_MAX * 512)).float()


# ----------------------------------------------------------- helpers

def _comm(rank, nranks, uid, env=None):
    import os
    import torch
    torch.cuda.set_device(rank)
    os.environ.update(env or {})
    try:
        return symnccl.Communicator(uid, rank, nranks, device=rank,
                                    timeout=120)
    finally:
        for k in env or {}:
            del os.environ[k]


def _ran(comm, before):
    """{kernel: launches} since _launches() gave `before`."""
    after = comm._launches()
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


def _digest(t):
    import torch
    return hashlib.sha1(t.contiguous().reshape(-1).view(torch.uint8)
                        .cpu().numpy().tobytes()).hexdigest()


def _bits(t):
    import torch
    return t.reshape(-1).view(torch.int32 if t.dtype == torch.float32
                              else torch.int16)


# ------------------------------------------------ all_reduce_rmsnorm

# T x H: decode (1, 3), a small batch (17), prefill-sized (128); H 4096
# and 16384 (model widths; 16384 past the vectors a thread keeps), 1000
# (not a power of two: 125 vectors of 8) and 8 (the smallest): H must be
# a positive multiple of 8 (1031 is refused on every rank, checked below)
RMSNORM_T = (1, 3, 17, 128)
RMSNORM_H = (4096, 1000, 16384, 8)
RMSNORM_ALGOS = FUSED_ALGOS + ("auto", "nccl")


def rmsnorm_inputs(torch, nranks, T, H, dtype, seed, pad=0):
    """Every rank's x, the residual and weight (the same on every rank, as
    in a tensor-parallel layer), drawn on the host from `seed` (so every
    process has every rank's inputs), on this GPU as views `pad` elements
    into their allocations (pad odd: not 16-byte aligned). Also
    tests/test_fused.py's, for its loopback teams."""
    g = torch.Generator().manual_seed(seed)
    dt = getattr(torch, dtype)

    def dev(t):
        full = torch.empty(t.numel() + pad, dtype=dt, device="cuda")
        v = full[pad:].view(t.shape)
        v.copy_(t.to(dt))
        return v
    xs = [dev(torch.randn(T, H, generator=g)) for _ in range(nranks)]
    res = dev(torch.randn(T, H, generator=g))
    w = dev(1.0 + 0.5 * torch.randn(H, generator=g))
    return xs, res, w


def _poisoned(torch, like, pad):
    full = torch.full((like.numel() + pad,), float("nan"), dtype=like.dtype,
                      device="cuda")
    return full[pad:].view(like.shape)


def _rmsnorm_expected(comm, algo, nbytes, dtype):
    """(the kernels algo may launch, whether the call is the fused kernel):
    a fused kernel; 'nccl': NCCL's all-reduce, then the add+norm (counted
    as one_shot_rmsnorm); 'auto': the fused kernel of AUTO_TABLE's pick, or
    past its rows the all-reduce all_reduce's own 'auto' picks, then the
    add+norm (csrc/python/fused.c)."""
    kernels = symnccl._C.COLLECTIVE_KERNELS[RMSNORM]
    if algo == "auto":
        algo = comm._auto_algo(nbytes, dtype, "sum", False, RMSNORM)
        if algo == "nccl":
            ar = comm._auto_algo(nbytes, dtype, "sum", False, "all_reduce")
            return ({kernels["one_shot"]} |
                    (set(symnccl._C.ALGO_KERNELS[ar]) or {"nccl"}), False)
    if algo == "nccl":
        return {kernels["one_shot"], "nccl"}, False
    return {kernels[algo]}, True


def fused_rmsnorm_every_kernel(rank, nranks, uid, seed):
    """all_reduce_rmsnorm through every algo (one_shot, two_shot, ll, ll128,
    lamport, auto, nccl) x float32/float16/bfloat16 x T x H, every other
    shape at an unaligned offset, poisoned outputs, against the float64
    reference (rmsnorm_wrong); y over x and h over the residual (in place,
    vLLM's form) for the fused kernels; FP8 static and dynamic outputs of
    one_shot, ll, ll128 and lamport. Each call's launch counters must show the
    kernels its algo runs (and only those).

    Returns (rows, digests, launches): rows (what, algo, dtype, T, H, pad,
    wrong) with wrong 0 or what was wrong; digests {(what, algo, dtype, T,
    H, pad): (family, sha1)} with family "fused" (a fused kernel ran:
    every such algo must give the same bits), "symnccl" (symnccl's
    all-reduce then the add+norm) or "nccl" (NCCL's all-reduce: its
    summation order is NCCL's, the same on every rank is not asserted)."""
    import torch
    comm = _comm(rank, nranks, uid)
    rows, digests = [], {}
    case = 0

    def record(what, algo, dtype, T, H, pad, wrong, family, *outs):
        rows.append((what, algo, dtype, T, H, pad, wrong))
        digests[(what, algo, dtype, T, H, pad)] = (
            family, "".join(_digest(o) for o in outs))

    for dtype in ("float32", "float16", "bfloat16"):
        itemsize = torch.empty(0, dtype=getattr(torch, dtype)).element_size()
        for T in RMSNORM_T:
            for H in RMSNORM_H:
                case += 1
                pad = 3 if case % 2 else 0
                xs, res, w = rmsnorm_inputs(torch, nranks, T, H, dtype,
                                             seed * 1000 + case, pad)
                x = xs[rank]
                for algo in RMSNORM_ALGOS:
                    y = _poisoned(torch, x, pad)
                    h = _poisoned(torch, x, pad)
                    before = comm._launches()
                    got = comm.all_reduce_rmsnorm(x, res, w, EPS, out=y,
                                                  residual_out=h, algo=algo)
                    torch.cuda.synchronize()
                    ran = _ran(comm, before)
                    want, fused = _rmsnorm_expected(comm, algo, T * H *
                                                    itemsize, dtype)
                    via_nccl = "nccl" in want
                    wrong = rmsnorm_wrong(torch, xs, res, w, y, h, dtype,
                                          rounded_steps=not fused)
                    wrong = 0 if wrong == (0, 0) else \
                        f"(h, y) wrong: {wrong}"
                    if got[0] is not y or got[1] is not h:
                        wrong = "did not return (out, residual_out)"
                    if fused and set(ran) != want:
                        wrong = f"ran {ran}, expected {sorted(want)}"
                    if not fused and not (
                            "one_shot_rmsnorm" in ran and set(ran) <= want
                            and len(ran) == 2 and
                            ran["one_shot_rmsnorm"] == 1):
                        wrong = f"ran {ran}, expected one of " \
                                f"{sorted(want)} then the add+norm"
                    record("y,h", algo, dtype, T, H, pad, wrong,
                           "fused" if fused else
                           "nccl" if via_nccl else "symnccl", y, h)
                # in place (y over x, h over the residual) gives the bits
                # of the out-of-place call
                if T == 17:
                    for algo in FUSED_ALGOS:
                        xi, ri = x.clone(), res.clone()
                        comm.all_reduce_rmsnorm(xi, ri, w, EPS, out=xi,
                                                residual_out=ri, algo=algo)
                        torch.cuda.synchronize()
                        record("in place", algo, dtype, T, H, pad, 0,
                               "fused", xi, ri)
                if (T, H) == (17, 4096) or (T, H) == (3, 1000):
                    _fp8_cases(torch, comm, xs, res, w, x, dtype, T, H, pad,
                               record)
                del xs, res, w, x
    # H not a multiple of 8: refused on every rank before any launch
    before = comm._launches()
    xb = torch.ones(3, 1031, device="cuda")
    try:
        comm.all_reduce_rmsnorm(xb, xb.clone(), torch.ones(1031,
                                                           device="cuda"),
                                EPS, algo="one_shot")
        msg = "accepted H 1031"
    except ValueError as e:
        msg = 0 if "multiple of 8" in str(e) else str(e)
    if _ran(comm, before):
        msg = f"launched {_ran(comm, before)}"
    rows.append(("H 1031 refused", "one_shot", "float32", 3, 1031, 0, msg))
    launches = comm._launches()
    comm.close()
    return rows, digests, launches


def _fp8_cases(torch, comm, xs, res, w, x, dtype, T, H, pad, record):
    """FP8 static (a scale that saturates the largest values) and dynamic
    (per-row scales, bit-exact) outputs of FP8_ALGOS: within one FP8
    step of the unquantised y divided by the scale, h unchanged."""
    f8 = torch.float8_e4m3fn
    y0, h0 = comm.all_reduce_rmsnorm(x, res, w, EPS, algo="one_shot")
    torch.cuda.synchronize()
    s = (y0.float().abs().max() / FP8_MAX / 1.5).reshape(1)
    want_scales = fp8_dynamic_scales(torch, y0)
    kernels = symnccl._C.COLLECTIVE_KERNELS[RMSNORM]
    for algo in FP8_ALGOS:
        for quant in ("fp8_static", "fp8_dynamic"):
            q = torch.full((T * H + pad,), 0xFF, dtype=torch.uint8,
                           device="cuda")[pad:].view(f8).view(T, H)
            h = _poisoned(torch, x, pad)
            sc = s if quant == "fp8_static" else \
                torch.full((T,), float("nan"), device="cuda")
            before = comm._launches()
            comm.all_reduce_rmsnorm(x, res, w, EPS, out=q, residual_out=h,
                                    quant=quant, scale=sc, algo=algo)
            torch.cuda.synchronize()
            ran = _ran(comm, before)
            scale = float(s) if quant == "fp8_static" else \
                sc.double()[:, None]
            wrong = fp8_off_by_more_than_a_step(torch, q.float(), y0, scale)
            wrong = 0 if not wrong else f"{wrong} off by more than a step"
            if not torch.equal(_bits(h), _bits(h0)):
                wrong = "h differs from the unquantised call's"
            if quant == "fp8_dynamic" and not torch.equal(sc, want_scales):
                wrong = "scales not max(amax / 448, 1 / (448 * 512))"
            if set(ran) != {kernels[algo]}:
                wrong = f"ran {ran}, expected {kernels[algo]}"
            outs = (q.view(torch.uint8), h) if quant == "fp8_static" else \
                (q.view(torch.uint8), h, sc)
            record(quant, algo, dtype, T, H, pad, wrong, "fused", *outs)


# --------------------------------------------------------- all-to-all

A2A_KERNEL = {"push": "push_all_to_all", "ll": "ll_all_to_all",
              "nccl": "nccl"}
# the push region shrunk to 1 MiB (slots of 256 KiB / nranks), so that the
# larger blocks cross push's slots in several chunks
SMALL_PUSH = {"SYMNCCL_PUSH_REGION_MIB": "1"}


def _ll_room(comm):
    """Bytes of a block that surely fits ll's one row of LL packets per
    source (a packet carries half its bytes; half of that, to be safe)."""
    return comm._staging_layout()["ll_row"] // 4


def _a2a_expected(comm, algo, nbytes, dtype, block_bytes):
    """The kernels of which exactly one may run: algo's; 'auto': AUTO_TABLE's
    pick by nbytes, where ll's pick becomes push when the largest block a
    receiver keeps (block_bytes) passes ll's row (launch.c, sn_a2a_plan;
    either where that is not sure here)."""
    if algo == "auto":
        algo = comm._auto_algo(nbytes, dtype, "sum", False, "all_to_all")
        if algo == "ll" and block_bytes > _ll_room(comm):
            return {A2A_KERNEL["ll"], A2A_KERNEL["push"]}
    return {A2A_KERNEL[algo]}


def _host_bytes(seed, rank, nbytes):
    """A rank's input as random bytes (every bit pattern: the all-to-alls
    move bytes), the same in every process."""
    return np.frombuffer(np.random.default_rng([seed, rank]).bytes(nbytes),
                         np.uint8)


def _on_device(torch, b, tdt, itemsize, rows, d, pad):
    """Bytes b on this GPU as a (rows, d) tensor of tdt starting `pad`
    elements into its allocation (pad 1: not 16-byte aligned)."""
    full = torch.empty((pad + rows * d) * itemsize, dtype=torch.uint8,
                       device="cuda")
    v = full[pad * itemsize:]
    v.copy_(torch.from_numpy(b.copy()))
    return v.view(tdt).view(rows, d)


def _poisoned_rows(torch, tdt, itemsize, rows, d, pad):
    full = torch.full(((pad + rows * d) * itemsize,), 0xFF,
                      dtype=torch.uint8, device="cuda")
    return full[pad * itemsize:].view(tdt).view(rows, d)


def _bytes_of(t):
    import torch
    return t.contiguous().reshape(-1).view(torch.uint8).cpu().numpy() \
        .tobytes()


def random_splits(rng, nranks, rows_max, mode):
    """Each rank's rows per destination: random with zeros, or (mode
    'one') every rank sending everything to one rank, or (mode 'none')
    one rank sending nothing. Also tests/test_alltoall.py's."""
    sp = []
    dest = rng.randrange(nranks)
    quiet = rng.randrange(nranks)
    for q in range(nranks):
        if mode == "one":
            s = [rng.randint(0, rows_max) if k == dest else 0
                 for k in range(nranks)]
        else:
            s = [0 if rng.random() < 0.3 else rng.randint(0, rows_max)
                 for _ in range(nranks)]
            if mode == "none" and q == quiet:
                s = [0] * nranks
        sp.append(s)
    return sp


# (m rows per block, d elements per row): one element; odd rows; blocks of
# 3001 x 64 (push and NCCL only: past ll's row of packets), which cross
# the shrunk push region's slots in several chunks
A2A_SHAPES = ((1, 1), (257, 3), (3001, 64))
A2A_ALGOS = ("push", "ll", "auto", "nccl")
V_DTYPES = ("float32", "bfloat16", "int8", "float64", "uint64", "float16")


def all_to_all_every_kernel(rank, nranks, uid, seed):
    """all_to_all (equal blocks) with push, ll, auto and nccl in every
    dtype (1-, 2-, 4- and 8-byte elements), rows of 1, 3 and 64 elements,
    every other case at an unaligned offset, poisoned outputs: rank j's
    out is block j of every rank's x in rank order, bit for bit. Then
    all_to_all_v with random uneven splits (zeros, everything to one rank,
    a rank sending nothing), from the host and from the device, each algo:
    the rows in place, the rest of out still poisoned, out_splits and
    out_offsets right. Each call's launch counters must show its algo's
    kernel (auto: AUTO_TABLE's pick) and only it.

    Returns (rows, launches): rows (kind, algo, dtype, shape, pad, ...,
    wrong) with wrong 0 or what was wrong."""
    import torch
    comm = _comm(rank, nranks, uid, SMALL_PUSH)
    rows = []
    case = 0
    for dtype in symnccl.DTYPES:
        tdt = getattr(torch, dtype)
        itemsize = torch.empty(0, dtype=tdt).element_size()
        for m, d in A2A_SHAPES:
            for algo in A2A_ALGOS:
                if algo == "ll" and m * d * itemsize > _ll_room(comm):
                    continue   # a block must fit one row of LL packets
                case += 1
                pad = case % 2
                n = nranks * m * d * itemsize
                hs = [_host_bytes(seed * 1000 + case, q, n)
                      for q in range(nranks)]
                x = _on_device(torch, hs[rank], tdt, itemsize, nranks * m, d,
                               pad)
                out = _poisoned_rows(torch, tdt, itemsize, nranks * m, d, pad)
                before = comm._launches()
                got = comm.all_to_all(x, out=out, algo=algo)
                torch.cuda.synchronize()
                ran = _ran(comm, before)
                blk = m * d * itemsize
                want = b"".join(h[rank * blk:(rank + 1) * blk].tobytes()
                                for h in hs)
                wrong = 0 if _bytes_of(out) == want else "not bit-exact"
                if got is not out:
                    wrong = "did not return out"
                exp = _a2a_expected(comm, algo, n, dtype, blk)
                if len(ran) != 1 or not set(ran) <= exp:
                    wrong = f"ran {ran}, expected {sorted(exp)}"
                rows.append(("all_to_all", algo, dtype, (m, d), pad, wrong))
                del x, out
    # all_to_all_v: every process draws the same splits
    rng = random.Random(seed)
    for it in range(24):
        dtype = V_DTYPES[it % len(V_DTYPES)]
        tdt = getattr(torch, dtype)
        itemsize = torch.empty(0, dtype=tdt).element_size()
        for algo in A2A_ALGOS:
            # ll: a block within one row of packets
            d = (1, 5, 128 if algo != "ll" else 16)[it % 3]
            rows_max = (3, 300, 4000 if algo != "ll" else 100)[(it // 3) % 3]
            mode = ("random", "one", "none")[it % 3]
            sp = random_splits(rng, nranks, rows_max, mode)
            out_rows = nranks * rows_max + 3
            on_dev = (it + A2A_ALGOS.index(algo)) % 2 == 0
            pad = it % 2
            case += 1
            # 2 rows more than the splits send: rows past them stay home
            hs = [_host_bytes(seed * 1000 + case, q,
                              (sum(sp[q]) + 2) * d * itemsize)
                  for q in range(nranks)]
            x = _on_device(torch, hs[rank], tdt, itemsize, sum(sp[rank]) + 2,
                           d, pad)
            out = _poisoned_rows(torch, tdt, itemsize, out_rows, d, pad)
            got = torch.full((nranks,), -7, dtype=torch.int64, device="cuda")
            offs = torch.full((nranks,), -7, dtype=torch.int64,
                              device="cuda")
            splits = torch.tensor(sp[rank], dtype=torch.int64,
                                  device="cuda") if on_dev else sp[rank]
            before = comm._launches()
            r = comm.all_to_all_v(x, out, splits, out_splits=got,
                                  algo=algo, out_offsets=offs)
            torch.cuda.synchronize()
            ran = _ran(comm, before)
            row = d * itemsize
            parts = []
            for i in range(nranks):
                start = sum(sp[i][:rank]) * row
                parts.append(hs[i][start:start + sp[i][rank] * row]
                             .tobytes())
            want = b"".join(parts)
            have = _bytes_of(out)
            wrong = []
            if have[:len(want)] != want:
                wrong.append("rows")
            if have[len(want):] != b"\xff" * (len(have) - len(want)):
                wrong.append("poison overwritten")
            recv = [sp[i][rank] for i in range(nranks)]
            if got.cpu().tolist() != recv:
                wrong.append(f"out_splits {got.cpu().tolist()}, "
                             f"expected {recv}")
            want_off = [sum(recv[:i]) for i in range(nranks)]
            if offs.cpu().tolist() != want_off:
                wrong.append(f"out_offsets {offs.cpu().tolist()}, "
                             f"expected {want_off}")
            if r is not out:
                wrong.append("did not return out")
            exp = _a2a_expected(comm, algo, out_rows * d * itemsize, dtype,
                                out_rows * d * itemsize)
            if len(ran) != 1 or not set(ran) <= exp:
                wrong.append(f"ran {ran}, expected {sorted(exp)}")
            rows.append(("all_to_all_v", algo, dtype, (rows_max, d), pad,
                         mode, "device" if on_dev else "host",
                         "; ".join(wrong) or 0))
            del x, out
    launches = comm._launches()
    comm.close()
    return rows, launches
