"""Input limits (issue 39, docs/FAILURES.md "Input limits" and "Refusals
every rank agrees on"): bad shapes, DLPack views, timeouts and raw
addresses are refused with a clear exception before any allocation or
launch, and a call that every rank makes with valid inputs is refused on
every rank or on none. The CPU tests run everywhere; the GPU tests skip
without a GPU."""
import contextlib
import math
import os
import warnings

import numpy as np
import pytest

import symnccl
from symnccl import _C
from conftest import LOOPBACK_GRID_KNOBS as GRID_KNOBS
from conftest import one_rank_comm
from dlpack_craft import IS_COPIED, Crafted, flagged

HUGE = (1 << 31, 1 << 33)          # 2^64 elements: the count wraps to 0


# ------------------------------------------------------------------ shapes

def test_a_shape_whose_size_wraps_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"shape \(2147483648, 8589934592\) "
                       r"of 4-byte elements spans more than"):
        _C._host_buffer(HUGE, "float32")


def test_a_zero_dimension_does_not_hide_an_overflowing_extent():
    """(0, 2^62, 8): no element, but strides that do not fit an int64."""
    with pytest.raises(ValueError, match=r"shape \(0, 4611686018427387904, "
                       r"8\)"):
        _C._host_buffer((0, 1 << 62, 8), "float32")


def test_shapes_within_the_limit_still_work():
    assert _C._host_buffer((0, 5), "float32").shape == (0, 5)
    assert _C._host_buffer((3, 0, 2), "int64").nbytes == 0
    assert _C._host_buffer(7, "bfloat16").nbytes == 14


def test_negative_dimensions_are_refused():
    with pytest.raises(ValueError, match=">= 0"):
        _C._host_buffer((4, -1), "float32")


# ----------------------------------------------------------- DLPack import

def test_import_refuses_a_negative_dimension_naming_the_shape():
    with pytest.raises(ValueError, match=r"x: shape \(4, -2\) has a "
                       r"negative dimension"):
        _C._import_info(Crafted((4, -2)), -1)


def test_import_refuses_a_shape_whose_size_wraps():
    with pytest.raises(ValueError, match=r"x: shape \(2147483648, "
                       r"8589934592\)"):
        _C._import_info(Crafted(HUGE), -1)


def test_import_refuses_strides_that_are_not_compact():
    for strides in ((-3, 1), (1 << 62, 1), (3, -1)):
        with pytest.raises(ValueError, match="not contiguous"):
            _C._import_info(Crafted((2, 3), strides=strides), -1)


def test_import_refuses_memory_outside_the_address_space():
    with pytest.raises(BufferError, match="address space"):
        _C._import_info(Crafted((4,), data=0), -1)
    with pytest.raises(BufferError, match="address space"):
        _C._import_info(Crafted((4,), byte_offset=(1 << 64) - 8), -1)
    # an empty tensor may have no memory at all
    assert _C._import_info(Crafted((0, 3), data=0), -1)["count"] == 0


def test_import_reads_the_is_copied_flag():
    assert _C._import_info(Crafted((4,), flags=IS_COPIED), -1)["copied"]
    assert not _C._import_info(Crafted((4,)), -1)["copied"]
    buf = _C._host_buffer(4, "int32")
    assert _C._import_info(flagged(buf, IS_COPIED), -1)["copied"]


# ---------------------------------------------------------------- timeouts

BAD_TIMEOUTS = [math.inf, -math.inf, math.nan, -1.0, 0.0,
                _C.MAX_TIMEOUT * 2]


@pytest.mark.parametrize("t", BAD_TIMEOUTS, ids=str)
def test_every_timeout_entry_refuses_non_finite_and_out_of_range(uid, t):
    """Before any CUDA or NCCL work: without a GPU the old code reached the
    device (CudaError) with inf and nan; with one it kept them (gcc turns
    inf * 1e9 into 0 ns: every kernel wait gave up at once)."""
    match = "finite number of seconds > 0 and <= 86400"
    with pytest.raises(ValueError, match=match):
        symnccl.Communicator(uid, 0, 1, 0, timeout=t)
    with pytest.raises(ValueError, match=match):
        symnccl.Communicator.init_all([0], timeout=t)
    with pytest.raises(ValueError, match=match):
        symnccl.Communicator._loopback(2, timeout=t)
    with pytest.raises(ValueError, match=match):
        _C._check_timeout(t)
    with pytest.raises(ValueError, match=match):
        _C._shutdown(t)     # refused before it closes anything


@pytest.mark.parametrize("t", [math.nan, math.inf, -1.0], ids=str)
def test_spawn_refuses_a_timeout_that_never_passes(t):
    """spawn's deadline was time.monotonic() + timeout: nan never passes."""
    from symnccl.bootstrap import spawn
    for kw in ({"timeout": t}, {"exit_timeout": t}):
        with pytest.raises(ValueError, match="finite number of seconds"):
            spawn(print, 1, **kw)


def test_the_limits_of_the_timeout_are_accepted_and_exported():
    assert symnccl.MAX_TIMEOUT == _C.MAX_TIMEOUT == 86400.0
    assert symnccl.DEFAULT_TIMEOUT == _C.DEFAULT_TIMEOUT
    assert _C._check_timeout(_C.MAX_TIMEOUT) == _C.MAX_TIMEOUT
    assert _C._check_timeout(1e-3) == 1e-3
    assert _C._check_timeout(5) == 5.0


def test_a_bad_exit_timeout_warns_and_exit_still_closes(monkeypatch):
    monkeypatch.setenv("SYMNCCL_EXIT_TIMEOUT", "inf")
    with pytest.warns(RuntimeWarning, match="SYMNCCL_EXIT_TIMEOUT='inf'"):
        assert symnccl._exit_timeout() == 30.0
    monkeypatch.setenv("SYMNCCL_EXIT_TIMEOUT", "soon")
    with pytest.warns(RuntimeWarning, match="using 30 s"):
        assert symnccl._exit_timeout() == 30.0
    monkeypatch.setenv("SYMNCCL_EXIT_TIMEOUT", "12.5")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert symnccl._exit_timeout() == 12.5


def test_the_maximum_timeout_is_documented():
    here = os.path.dirname(__file__)
    text = open(os.path.join(here, "..", "docs", "FAILURES.md")).read()
    assert "MAX_TIMEOUT" in text and "86400" in text


# ------------------------------------------------------ the torch registry

class _FakeComm:
    closed = False


def test_closed_communicators_leave_the_torch_registry():
    """abort-and-rebuild (docs/FAILURES.md) registered a communicator per
    rebuild and kept every dead one alive."""
    pytest.importorskip("torch")
    import symnccl.torch as snt
    old = _FakeComm()
    cid = snt.comm_id(old)
    assert snt.get_communicator(cid) is old
    old.closed = True
    new = _FakeComm()
    snt.comm_id(new)                  # the rebuild's registration
    assert cid not in snt._COMMS and id(old) not in snt._IDS
    with pytest.raises(ValueError, match="closed and aborted ones leave"):
        snt.get_communicator(cid)
    new.closed = True
    last = _FakeComm()
    snt._register(last)
    # (other tests' fakes may stand in the registry without the attribute)
    assert all(not getattr(c, "closed", False)
               for c in snt._COMMS.values())
    last.closed = True
    snt._register(old)                # pruned again: no fake stays open
    with snt._lock:
        snt._prune()


# ---------------------------------------------------------------- GPU tier

def _torch():
    return pytest.importorskip("torch")


@pytest.fixture
def comm(_module_comms):
    return one_rank_comm(_module_comms)


@pytest.mark.gpu
def test_empty_refuses_a_shape_whose_size_wraps(comm):
    """The issue's reproducer: SIGABRT (and an out-of-bounds export) on
    2800603."""
    before = comm._launches()
    for make in (comm.empty, comm.zeros):
        with pytest.raises(ValueError, match=r"shape \(2147483648, "
                           r"8589934592\)"):
            make(HUGE, "float32")
    assert comm._launches() == before
    assert comm.empty((3, 4), "float32").shape == (3, 4)


@pytest.mark.gpu
def test_a_copied_tensor_is_refused_as_an_output_and_taken_as_an_input(
        comm):
    """A result written into a copy the producer made would be lost."""
    x = comm.zeros(64, "float32")
    out = comm.zeros(64, "float32")
    with pytest.raises(BufferError, match="out is a copy.*IS_COPIED"):
        comm.all_reduce(x, out=flagged(out, IS_COPIED), algo="one_shot")
    with pytest.raises(BufferError, match="x is a copy.*pass out="):
        comm.all_reduce(flagged(x, IS_COPIED), algo="one_shot")
    comm.all_reduce(flagged(x, IS_COPIED), out=out, algo="one_shot")
    comm.check()


@pytest.mark.gpu
def test_copy_hook_checks_engine_grid_and_addresses(comm):
    src = comm.zeros(4096, "uint8")
    dst = comm.empty(4096, "uint8")
    host = np.zeros(4096, np.uint8)
    for bad, match in (
            ((dst.ptr, src.ptr, 4096, 0, "dma"), "engine must be"),
            ((dst.ptr, src.ptr, 4096, 0, "kernel", 0), "ctas must be"),
            ((dst.ptr, src.ptr, 4096, 0, "kernel", 1 << 20), "ctas must be"),
            ((dst.ptr, src.ptr, 1 << 63, 0, "memcpy"), "address space"),
            ((dst.ptr + 1, src.ptr, 64, 0, "kernel"), "16-byte aligned"),
            ((host.ctypes.data, src.ptr, 4096, 0, "memcpy"),
             "dst .* is not device memory"),
            ((dst.ptr, 64, 4096, 0, "memcpy"), "src .* is not device"),
            ((dst.ptr, src.ptr, 1 << 40, 0, "memcpy"),
             "not device memory")):
        with pytest.raises(ValueError, match=match):
            comm._copy(*bad)
    comm._copy(dst.ptr, src.ptr, 4096, 0, "kernel", 4)
    comm.barrier(blocking=True)
    assert not any(dst.to_bytes())


@pytest.mark.gpu
def test_nccl_all_to_all_v_cuts_rows_as_the_kernels_do(comm):
    """After the counts' exchange nothing is refused: device splits past
    x's rows are cut, rows past out's end dropped, out_splits says what
    was sent -- what push does with the same call (on 2800603, algo='nccl'
    raised ValueError after the exchange, which on two ranks left the peer
    waiting)."""
    torch = _torch()
    x = torch.randn(50, 8, device="cuda")
    results = {}
    for algo in ("push", "nccl"):
        out = torch.full((40, 8), float("nan"), device="cuda")
        got = torch.full((1,), -1, dtype=torch.int64, device="cuda")
        comm.all_to_all_v(x, out, torch.tensor([60], device="cuda"),
                          out_splits=got, algo=algo)
        torch.cuda.synchronize()
        results[algo] = (out.clone(), got.item())
    assert results["nccl"][1] == results["push"][1] == 50
    assert torch.equal(results["nccl"][0], x[:40])
    assert torch.equal(results["push"][0], x[:40])
    comm.check()


# ------------------------------------------- refusals every rank agrees on

@contextlib.contextmanager
def _team(monkeypatch, nranks, timeout=2.0, knobs=None):
    """A loopback team, closed at the end; on leaving without an error
    every rank's check() must pass (no rank was left waiting)."""
    for k in GRID_KNOBS:
        monkeypatch.setenv(k, "16")
    for k, v in (knobs or {}).items():
        monkeypatch.setenv(k, v)
    team = symnccl.Communicator._loopback(nranks, 0, timeout=timeout)
    try:
        yield team
        import torch
        torch.cuda.synchronize()
        for c in team:
            c.check()
    finally:
        for c in team:        # a failed one is aborted (close would raise)
            if c.failure is None:
                c.close()
            else:
                c.abort()


def _ll_rows(c, row_bytes):
    """The rows of row_bytes one LL row carries after its count (16-byte
    packets of 8 data bytes; launch.c, sn_a2a_plan)."""
    room = c._staging_layout()["ll_row"] // 16 * 8
    return (room - 8) // row_bytes


def _outcomes(calls):
    """Each rank's call in turn: the exception's type and message, or
    None."""
    seen = []
    for call in calls:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                call()
            seen.append(None)
        except Exception as e:        # noqa: BLE001 (the outcome is data)
            seen.append((type(e), str(e)))
    return seen


@pytest.mark.gpu
@pytest.mark.parametrize("nranks", [2, 3])
@pytest.mark.parametrize("device_splits", [False, True])
@pytest.mark.parametrize("delta", [-1, 0, 1, 7])
def test_ll_all_to_all_v_with_uneven_x_around_the_cap_refuses_on_no_rank(
        monkeypatch, nranks, device_splits, delta):
    """Rank 0 sends cap + delta rows, all to the last rank (a block past
    what one LL row carries when delta > 0); the others send one row each
    to rank 0. No rank refuses (on 2800603 rank 0 raised ValueError and its
    peers timed out), the last rank receives rank 0's first
    min(cap, cap + delta) rows, and every rank's out_splits says what
    arrived."""
    torch = _torch()
    with _team(monkeypatch, nranks) as team:
        d = 4                                     # rows of 16 bytes
        cap = _ll_rows(team[0], d * 4)
        sent0 = cap + delta
        xs, splits = [], []
        for q in range(nranks):
            rows = sent0 if q == 0 else 1
            xs.append(torch.arange(rows * d, device="cuda",
                                   dtype=torch.float32).reshape(rows, d)
                      + 1e6 * q)
            s = [0] * nranks
            s[nranks - 1 if q == 0 else 0] = rows
            splits.append(torch.tensor(s, device="cuda") if device_splits
                          else s)
        outs = [torch.full((cap + 8 + nranks, d), float("nan"),
                           device="cuda") for _ in team]
        gots = [torch.full((nranks,), -1, dtype=torch.int64, device="cuda")
                for _ in team]
        streams = [torch.cuda.Stream() for _ in team]
        torch.cuda.synchronize()
        seen = _outcomes([
            (lambda q=q: team[q].all_to_all_v(
                xs[q], outs[q], splits[q], out_splits=gots[q], algo="ll",
                stream=streams[q])) for q in range(nranks)])
        torch.cuda.synchronize()
        assert seen == [None] * nranks, seen
        carried = min(cap, sent0)
        last = nranks - 1
        assert gots[last][0].item() == carried
        assert torch.equal(outs[last][:carried], xs[0][:carried])
        assert gots[0][1:].tolist() == [1] * (nranks - 1)


@pytest.mark.gpu
def test_ll_all_to_all_v_warns_on_the_rank_whose_host_splits_were_cut(
        monkeypatch):
    torch = _torch()
    with _team(monkeypatch, 2) as team:
        cap = _ll_rows(team[0], 16)
        x = torch.zeros(cap + 1, 4, device="cuda")
        out = torch.zeros(cap + 2, 4, device="cuda")
        s = [torch.cuda.Stream() for _ in team]
        with pytest.warns(RuntimeWarning, match="rows past .* were not "
                          "sent"):
            team[0].all_to_all_v(x, out, [0, cap + 1], algo="ll",
                                 stream=s[0])
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            team[1].all_to_all_v(x[:1], out.clone(), [1, 0], algo="ll",
                                 stream=s[1])


@pytest.mark.gpu
@pytest.mark.parametrize("delta", [0, 1])
def test_ll_all_to_all_equal_blocks_past_the_cap_refused_on_every_rank(
        monkeypatch, delta):
    """Equal blocks: x's rows are the call's, the same on every rank, so
    every rank refuses blocks past one LL row alike (or none does)."""
    torch = _torch()
    with _team(monkeypatch, 2) as team:
        cap = _ll_rows(team[0], 16)
        rows = 2 * (cap + delta)               # two blocks of cap + delta
        x = torch.zeros(rows, 4, device="cuda")
        streams = [torch.cuda.Stream() for _ in team]   # a rank each
        torch.cuda.synchronize()
        seen = _outcomes([lambda c=c, s=s: c.all_to_all(x, algo="ll",
                                                         stream=s)
                          for c, s in zip(team, streams)])
        torch.cuda.synchronize()
        assert len(set(seen)) == 1, seen
        assert (seen[0] is None) == (delta == 0), seen


@pytest.mark.gpu
def test_auto_never_picks_ll_where_its_rows_could_be_passed(monkeypatch):
    """SYMNCCL_ALGO=ll makes "auto" ll where ll can run: equal blocks past
    one LL row, or an all_to_all_v whose out (the same on every rank) could
    keep a block past it, take push instead; the calls that fit stay on
    ll, whatever a rank's x."""
    torch = _torch()
    with _team(monkeypatch, 2, knobs={"SYMNCCL_ALGO": "ll"}) as team:
        cap = _ll_rows(team[0], 16)
        big = torch.zeros(2 * (cap + 1), 4, device="cuda")
        small = torch.zeros(2, 4, device="cuda")
        outs = [torch.zeros(4, 4, device="cuda") for _ in team]
        wide = [torch.zeros(cap + 1, 4, device="cuda") for _ in team]
        s = [torch.cuda.Stream() for _ in team]
        before = [c._launches() for c in team]
        for q, c in enumerate(team):
            c.all_to_all(big, stream=s[q])
        for q, c in enumerate(team):
            c.all_to_all_v(small, wide[q], [1, 1], stream=s[q])
        for q, c in enumerate(team):      # rank 1's x is larger: no matter
            c.all_to_all_v(small if q == 0 else big, outs[q], [1, 1],
                           stream=s[q])
        for q, c in enumerate(team):
            c.all_to_all(small, stream=s[q])
        torch.cuda.synchronize()
        for c, b in zip(team, before):
            after = c._launches()
            ran = {k: after[k] - b[k] for k in after if after[k] != b[k]}
            assert ran == {"push_all_to_all": 2, "ll_all_to_all": 2}, ran


@pytest.mark.gpu
@pytest.mark.multigpu(2)
def test_uneven_all_to_all_v_refused_on_no_rank_on_two_gpus():
    """On 2800603 this lost the communicator: rank 0 refused ll from its
    own x while rank 1 launched (issue 38), and NCCL's path refused on the
    rank whose out was short after the counts' exchange while rank 0 sent.
    Now every algorithm, with host and device splits, completes on every
    rank; the last rank's out holds rank 0's first rows and out_splits says
    how many were sent."""
    pytest.importorskip("torch")
    from symnccl.bootstrap import spawn
    from _workers import inputs as W
    res = spawn(W.all_to_all_v_uneven_every_algo, 2, timeout=300)
    for rank, results in enumerate(res):
        assert len(results) == 6, results
        for key, (outcome, got, usable, ok) in results.items():
            assert outcome is None and usable is True, (rank, key, outcome,
                                                        usable)
            if rank == 1:
                assert ok, key
            else:
                assert got == [0, 1], (key, got)
