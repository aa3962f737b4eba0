"""Property-based fuzz of the Python API (issue 39): shapes, strides,
dtypes, offsets, flags, timeouts and splits, drawn by hypothesis, must
give a result or a clear exception (TypeError, ValueError, BufferError,
OverflowError) -- never a crash, a hang or a wrong size. The CPU part
drives what runs without a GPU (argument parsing, the shape and timeout
checks, DLPack import); the GPU part (skipped without one) drives the real
calls on a one-rank communicator and a loopback team of two. Each test is
bounded (max_examples, deadline) so the tier stays fast; no example
database is written."""
import math

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, assume, example, given, settings  # noqa
from hypothesis import strategies as st  # noqa: E402

import symnccl  # noqa: E402
from symnccl import _C  # noqa: E402
from symnccl.bootstrap import local_device_count  # noqa: E402
from dlpack_craft import IS_COPIED, READ_ONLY, Crafted  # noqa: E402

CLEAR = (TypeError, ValueError, BufferError, OverflowError)
MAX_BYTES = (1 << 63) - 1
ITEMSIZE = {"float32": 4, "int64": 8, "uint8": 1, "bfloat16": 2,
            "float16": 2, "int32": 4}
CPU = settings(max_examples=150, deadline=1000, database=None,
               suppress_health_check=[HealthCheck.too_slow])
GPU = settings(max_examples=30, deadline=None, database=None,
               suppress_health_check=[HealthCheck.too_slow,
                                      HealthCheck.function_scoped_fixture])

# dimensions: mostly small, some at the edges of int64 and past them
dims = st.one_of(st.integers(0, 9), st.integers(-3, -1),
                 st.sampled_from([1 << 31, 1 << 33, 1 << 62, (1 << 63) - 1,
                                  1 << 63, 1 << 64]),
                 st.integers(0, 1 << 40))
shapes = st.lists(dims, min_size=0, max_size=5)
dtypes = st.sampled_from(sorted(ITEMSIZE))


def _extent(shape, itemsize):
    """What sn_shape_size allows: (count, bytes), or None when refused."""
    n, ext = 1, itemsize
    for d in shape:
        if d < 0:
            return None
        n *= d
        ext *= max(d, 1)
    return None if ext > MAX_BYTES else (n, n * itemsize)


def _expected(shape, dtype, limit):
    """_extent of a shape whose dimensions fit an int64 (None: refused);
    examples whose allocation would pass `limit` bytes are skipped."""
    want = _extent(shape, ITEMSIZE[dtype]) if \
        all(d < (1 << 63) for d in shape) else None
    assume(want is None or want[1] <= limit)
    return want


# --------------------------------------------------------------- CPU part

@CPU
@given(shape=shapes, dtype=dtypes)
def test_fuzz_host_buffer_shapes(shape, dtype):
    want = _expected(shape, dtype, 1 << 20)
    try:
        b = _C._host_buffer(tuple(shape), dtype)
    except CLEAR:
        assert want is None, (shape, dtype)
        return
    assert want is not None, (shape, dtype)
    assert b.shape == tuple(shape) and b.nbytes == want[1]


@CPU
@given(shape=shapes, dtype=dtypes,
       strides=st.one_of(st.none(), st.lists(
           st.one_of(st.integers(-4, 40), st.sampled_from([1 << 62, -1 << 62])),
           min_size=0, max_size=5)),
       byte_offset=st.one_of(st.integers(0, 64),
                             st.sampled_from([1 << 63, (1 << 64) - 8])),
       null=st.booleans(), flags=st.sampled_from([0, READ_ONLY, IS_COPIED]))
def test_fuzz_dlpack_import(shape, dtype, strides, byte_offset, null, flags):
    assume(all(-(1 << 63) <= d < (1 << 63) for d in shape))
    if strides is not None:
        strides = (strides + [1] * len(shape))[:len(shape)]
    obj = Crafted(shape, dtype, strides=strides, byte_offset=byte_offset,
                  flags=flags, data=0 if null else None)
    try:
        info = _C._import_info(obj, -1)
    except CLEAR:
        return
    want = _extent(shape, ITEMSIZE[dtype])
    assert want is not None, (shape, dtype)
    assert info["count"] == want[0] and info["shape"] == tuple(shape)
    assert info["copied"] == bool(flags & IS_COPIED)
    assert info["readonly"] == bool(flags & READ_ONLY)
    if want[0] > 1 and strides is not None:   # accepted: compact row-major
        expect = 1
        for d, s in reversed(list(zip(shape, strides))):
            assert d == 1 or s == expect, (shape, strides)
            expect *= d
    if want[0] > 0:
        assert not null and byte_offset <= MAX_BYTES


@CPU
@given(t=st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                   st.integers(-10, 10 ** 6), st.integers(10 ** 308, 10 ** 400),
                   st.text(max_size=3), st.none()))
def test_fuzz_timeouts(t):
    try:
        got = _C._check_timeout(t)
    except CLEAR:
        assert not (isinstance(t, (int, float)) and 0 < t <= _C.MAX_TIMEOUT)
        return
    assert 0 < got <= _C.MAX_TIMEOUT and math.isfinite(got)


@CPU
@given(name=st.one_of(st.text(max_size=12), st.sampled_from(
    sorted(symnccl.DTYPES) + ["bf16", "fp8_e5m2", "torch.float32"])))
def test_fuzz_dtype_names(name):
    try:
        info = _C._dtype_info(name)
    except CLEAR:
        return
    assert info[0] in symnccl.DTYPES


@CPU
@example(nranks=2, staging=0, timeout=math.inf)
@given(nranks=st.integers(-2, 40), staging=st.one_of(
           st.integers(-4096, 1 << 20), st.just(4096 * 3)),
       timeout=st.floats(allow_nan=True, allow_infinity=True))
def test_fuzz_loopback_arguments_before_any_gpu_work(nranks, staging,
                                                     timeout):
    valid = 1 <= nranks <= 32 and staging >= 0 and staging % 4096 == 0 \
        and 0 < timeout <= _C.MAX_TIMEOUT
    # a valid team would be built on the GPU: only without one is that an
    # error (no device), and then a CUDA error, never a crash
    assume(not valid or local_device_count() == 0)
    with pytest.raises(CLEAR if not valid else (symnccl.CudaError,
                                                RuntimeError)):
        symnccl.Communicator._loopback(nranks, staging_bytes=staging,
                                       timeout=timeout)


@CPU
@example(rank=0, nranks=1, uid_len=128, timeout=math.inf, staging=0)
@example(rank=0, nranks=1, uid_len=128, timeout=math.nan, staging=0)
@given(rank=st.integers(-3, 40), nranks=st.integers(-3, 40),
       uid_len=st.sampled_from([0, 16, 128, 129]),
       timeout=st.floats(allow_nan=True, allow_infinity=True),
       staging=st.integers(-4096, 1 << 16))
def test_fuzz_communicator_arguments(rank, nranks, uid_len, timeout,
                                     staging):
    valid = uid_len == 128 and 0 <= rank < nranks and \
        0 < timeout <= _C.MAX_TIMEOUT and staging >= 0 and \
        staging % 4096 == 0
    assume(not valid or local_device_count() == 0)   # no peers would come
    with pytest.raises(CLEAR if not valid else symnccl.CudaError):
        symnccl.Communicator(b"u" * uid_len, rank, nranks, 0,
                             timeout=timeout, staging_bytes=staging)


# --------------------------------------------------------------- GPU part

def _torch():
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def team():
    if local_device_count() < 1:
        pytest.skip("needs a CUDA GPU: none is visible to this process")
    t = symnccl.Communicator._loopback(2, 0, timeout=5.0)
    yield t
    for c in t:
        if not c.closed:
            c.close()


@pytest.mark.gpu
@GPU
@given(shape=shapes, dtype=dtypes)
def test_fuzz_gpu_empty(_module_comms, shape, dtype):
    from conftest import one_rank_comm
    comm = one_rank_comm(_module_comms)
    want = _expected(shape, dtype, 1 << 24)
    try:
        b = comm.empty(tuple(shape), dtype)
    except CLEAR:
        assert want is None, shape
        return
    assert want is not None and b.nbytes == want[1]


@pytest.mark.gpu
@GPU
@given(rows=st.lists(st.integers(0, 40), min_size=2, max_size=2),
       out_rows=st.lists(st.integers(0, 60), min_size=2, max_size=2),
       width=st.integers(0, 5), algo=st.sampled_from(["push", "ll"]),
       device=st.booleans(), data=st.data())
def test_fuzz_gpu_all_to_all_v_every_rank_or_none(team, rows, out_rows,
                                                  width, algo, device, data):
    """Splits anything (negative, past x's rows, on the host or the
    device): every rank raises the same exception or none does, and no
    rank is left waiting (check() passes)."""
    torch = _torch()
    splits = [data.draw(st.lists(st.integers(-5, 50), min_size=2,
                                 max_size=2)) for _ in team]
    xs = [torch.randn(r, width, device="cuda") for r in rows]
    outs = [torch.zeros(o, width, device="cuda") for o in out_rows]
    streams = [torch.cuda.Stream() for _ in team]
    seen = []
    torch.cuda.synchronize()
    for q, c in enumerate(team):
        s = torch.tensor(splits[q], device="cuda") if device else splits[q]
        try:
            import warnings
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                c.all_to_all_v(xs[q], outs[q], s, algo=algo,
                               stream=streams[q])
            seen.append(None)
        except CLEAR as e:
            seen.append(type(e))
    torch.cuda.synchronize()
    # host splits that are wrong on their own (negative, past x) are that
    # rank's bad argument (docs/FAILURES.md): only valid calls must agree
    own = [not device and (min(sp) < 0 or sum(sp) > r)
           for sp, r in zip(splits, rows)]
    if not any(own):
        assert len(set(seen)) == 1, (seen, splits, rows, out_rows)
        for c in team:
            c.check()
    elif any(x is None for x in seen):
        # a peer launched while this rank refused: the peer gives up at the
        # timeout; start from a fresh team
        for c in team:
            c.abort()
        team[:] = symnccl.Communicator._loopback(2, 0, timeout=5.0)


@pytest.mark.gpu
@GPU
@given(n=st.integers(0, 5000), dtype=st.sampled_from(
    ["float32", "bfloat16", "int32", "float16"]),
       out_n=st.integers(0, 5000),
       algo=st.sampled_from(["auto", "one_shot", "ll", "push", "nccl"]))
def test_fuzz_gpu_all_reduce_result_or_clear_error(_module_comms, n, dtype,
                                                   out_n, algo):
    from conftest import one_rank_comm
    torch = _torch()
    comm = one_rank_comm(_module_comms)
    x = torch.ones(n, dtype=getattr(torch, dtype), device="cuda")
    out = torch.zeros(out_n, dtype=x.dtype, device="cuda")
    try:
        y = comm.all_reduce(x, out=out, algo=algo)
    except CLEAR as e:
        # out's size, or an algorithm that cannot run here (named)
        assert out_n != n or "cannot run" in str(e), str(e)
        return
    torch.cuda.synchronize()
    assert out_n == n and torch.equal(y, x)
    comm.check()
