"""Failures (README: Failures): a dead, stalled or mismatched peer never
kills the process and never hangs it.

Two GPUs: a peer that exits, sleeps past the timeout, passes another size,
or a call ended by abort() from another thread, for every algorithm. One
GPU: a fault injected into each kernel (Communicator._inject_fault makes a
kernel wait at entry for something that never comes, so it gives up through
the same path as a wait for a dead peer), the watchdog of NCCL calls, graph
replays, abort from another thread and abort_on_signal. Every test checks
the exception and its fields, the time taken against the timeout, that the
CUDA context still works, and that abort() gave the memory back."""
import os
import signal
import subprocess
import sys
import threading
import time
import warnings

import pytest

import symnccl
from symnccl.bootstrap import SlowExitWarning, spawn

from _workers import faults as W
from conftest import LOOPBACK_GRID_KNOBS as STOP_KNOBS
from conftest import ranks_param

TIMEOUT = 3.0
SLACK = 5.0           # the bound: timeout + 5 s
GIVE_UP = 1.0         # the timeout of the tests that wait it out once
LEAK = W.LEAK         # the staging window alone is over 100 MiB
ALGOS = ["ll", "ll128", "one_shot", "two_shot", "push", "nccl"]


# ------------------------------------------------------------- 2 GPUs

# a rank's process ends within this of returning its result: its exit's
# close (SYMNCCL_EXIT_TIMEOUT, 3 s in the worker) and abort's bounded waits
EXIT = 20.0


def peer_failure(nranks, scenario, collective, algo, timeout):
    """W.peer_failure on every rank, with a second unique id for its
    rehearsal communicator and a third for the survivors' new one (see
    there). Every process, the survivors' too, must also end on its own
    within EXIT seconds of returning: a failure may not leave a process
    that cannot exit."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SlowExitWarning)
        res = spawn(W.peer_failure, nranks,
                    args=(scenario, collective, algo, timeout,
                          symnccl.get_unique_id(), symnccl.get_unique_id()),
                    timeout=300, exit_timeout=EXIT)
    slow = [str(w.message) for w in caught
            if issubclass(w.category, SlowExitWarning)]
    assert not slow, slow
    return res


def _survivor(res, algo, collective="all_reduce"):
    r0 = res[0]
    err = r0["call_error"] or r0["check_error"]
    assert err is not None and err["type"] == "PeerTimeoutError", r0
    assert err["timeout_error"] and err["collective"] == collective, err
    assert err["kernel"] == W.KERNEL[algo], err
    assert err["reason"] == "timeout", err
    if algo != "nccl":
        assert err["rank"] == 1, err   # the peer that did not arrive
    assert TIMEOUT - 0.5 <= err["waited"] <= TIMEOUT + SLACK, err
    assert r0["sync_seconds"] <= TIMEOUT + SLACK, r0
    return r0


def _after(r, error="PeerTimeoutError"):
    """Refuses further calls (with the failure's error) until aborted,
    context usable, memory back, and a new communicator among the
    survivors works."""
    assert r["refused"] is not None and r["refused"]["type"] == error, r
    assert r["failure"] is not None, r
    assert r["usable"] == 28.0 and r["closed"], r
    assert r["leaked"] < LEAK, r
    assert r["fresh_ok"], r


@ranks_param(2)
@pytest.mark.parametrize("algo", ALGOS)
def test_peer_exits(nranks, algo):
    pytest.importorskip("torch")
    res = peer_failure(nranks, "exit", "all_reduce", algo, TIMEOUT)
    _after(_survivor(res, algo))


@ranks_param(2)
@pytest.mark.parametrize("collective",
                         ["reduce_scatter", "all_gather", "broadcast"])
def test_peer_exits_nccl_collectives(nranks, collective):
    pytest.importorskip("torch")
    res = peer_failure(nranks, "exit", collective, "nccl", TIMEOUT)
    _after(_survivor(res, "nccl", collective))


@ranks_param(2)
@pytest.mark.parametrize("algo", ALGOS)
def test_peer_sleeps_past_the_timeout_and_comes_back(nranks, algo):
    """The survivor times out; the sleeper, back, gets an error too (the
    survivor gave up, or its own wait times out), never a result. Except
    on NCCL's path: there the sleeper's call can complete (2x H100: NCCL
    leaves a collective whose peer aborted with undefined output, and
    nothing tells the sleeper); then its next call fails within the
    timeout (docs/FAILURES.md, 'Runs on real peers')."""
    pytest.importorskip("torch")
    res = peer_failure(nranks, "sleep", "all_reduce", algo, TIMEOUT)
    _after(_survivor(res, algo))
    r1 = res[1]
    err = r1["call_error"] or r1["check_error"]
    if algo != "nccl":   # rank 0 told it when it gave up
        assert err is not None and err["type"] == "PeerTimeoutError", r1
        assert err["reason"] == "peer" and err["rank"] == 0, err
        assert r1["sync_seconds"] < 2.0, r1
    elif err is None:
        err = r1["next_error"]
        assert err is not None and err["type"] == "PeerTimeoutError", r1
        assert r1["next_seconds"] <= TIMEOUT + SLACK, r1
    else:
        assert err["type"] == "PeerTimeoutError", r1
        assert r1["sync_seconds"] <= TIMEOUT + SLACK, r1
    _after(r1)


@ranks_param(2)
@pytest.mark.parametrize("algo", ALGOS)
def test_size_mismatch_under_check_raises_on_every_rank(nranks, algo):
    pytest.importorskip("torch")
    res = peer_failure(nranks, "mismatch_checked", "all_reduce", algo,
                       TIMEOUT)
    n = W.COUNT * nranks
    for r in res:
        err = r["call_error"]
        assert err is not None and err["type"] == "CallMismatchError", r
        assert f"count {n}," in err["message"] and \
            f"count {n + 8 * nranks}," in err["message"], err
        assert r["sync_seconds"] < 2.0, r
        _after(r, "CallMismatchError")


@ranks_param(2)
def test_size_mismatch_unchecked_is_an_exception_not_a_dead_context(nranks):
    """Without SYMNCCL_CHECK, sizes that differ by 16 elements leave ll's
    larger rank waiting for packets that never come (the case that trapped
    before): it times out, tells the other rank, and both raise within two
    calls with a usable context. (Other algorithms may complete such calls
    with wrong data: that is what SYMNCCL_CHECK=1 is for.)"""
    pytest.importorskip("torch")
    res = peer_failure(nranks, "mismatch", "all_reduce", "ll", TIMEOUT)
    for r in res:
        err = r["call_error"] or r["check_error"] or r.get("second_error")
        assert err is not None and err["type"] == "PeerTimeoutError", r
        assert r["sync_seconds"] <= TIMEOUT + SLACK, r
        assert r["usable"] == 28.0 and r["leaked"] < LEAK, r


# 4 and 8 GPUs: the bound, every survivor within timeout + 1 s
EVERY_SLACK = 1.0


@ranks_param(4, 8)
@pytest.mark.parametrize("algo", ALGOS)
def test_every_survivor_on_real_peers_names_the_rank_that_left(nranks,
                                                               algo):
    """Rank 1 exits after the warm-up; every other rank (0, 2, 3, ...)
    raises PeerTimeoutError within the timeout + 1 s: on symnccl's kernels
    naming rank 1 (.rank), whether it gave up on its own timeout or was
    told by a survivor that gave up first (at least one gave up on its
    own); on NCCL (the watchdog's abort at each rank's timeout) with .rank
    None, as _survivor() has it. Then each survivor's CUDA context works,
    its memory came back, and the survivors' new communicator (ranks
    renumbered 0 .. n-2) all-reduces right."""
    pytest.importorskip("torch")
    res = peer_failure(nranks, "exit", "all_reduce", algo, TIMEOUT)
    assert res[1] == {"rank": 1, "left": True}, res[1]
    survivors = [r for q, r in enumerate(res) if q != 1]
    kernels = symnccl._C.ALGO_KERNELS[algo] or ("nccl",)
    errs = {}
    for r in survivors:
        err = r["call_error"] or r["check_error"]
        assert err is not None and err["type"] == "PeerTimeoutError", r
        assert err["timeout_error"] and err["collective"] == "all_reduce", \
            err
        assert err["kernel"] in kernels, (kernels, err)
        if algo == "nccl":
            assert (err["reason"], err["rank"]) == ("timeout", None), err
        else:
            assert err["reason"] in ("timeout", "peer") and \
                err["rank"] == 1, err
        if err["reason"] == "timeout":
            assert TIMEOUT - 0.5 <= err["waited"] <= \
                TIMEOUT + EVERY_SLACK, err
        assert r["sync_seconds"] <= TIMEOUT + EVERY_SLACK, r
        errs[r["rank"]] = (err["reason"], err["rank"], err["waited"],
                           r["sync_seconds"])
        _after(r)
        assert r["fresh_nranks"] == nranks - 1, r
    assert sorted(errs) == [q for q in range(nranks) if q != 1], errs
    assert any(reason == "timeout" for reason, _, _, _ in errs.values()), \
        errs


@ranks_param(2)
@pytest.mark.parametrize("algo", ALGOS)
def test_abort_from_another_thread_ends_a_waiting_collective(nranks, algo):
    pytest.importorskip("torch")
    res = peer_failure(nranks, "abort", "all_reduce", algo, 120.0)
    r0 = res[0]
    assert r0["sync_seconds"] < 1.0 + SLACK, r0   # not the 120 s timeout
    assert r0["closed"] and r0["usable"] == 28.0, r0
    assert r0["leaked"] < LEAK and r0["fresh_ok"], r0


# -------------------------------------------------------------- 1 GPU

KERNEL_ALGOS = ["ll", "ll128", "one_shot", "two_shot", "push"]


def _free(torch):
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info(0)[0]


@pytest.fixture(scope="module")
def _process_warm():
    """What this process keeps after its first communicator (NCCL's
    process-wide state, torch's allocator pools) is not a leak: made
    before any free-memory baseline."""
    torch = pytest.importorskip("torch")
    with symnccl.Communicator(symnccl.get_unique_id(), 0, 1, device=0) as c:
        x = torch.randn(4099, device="cuda")
        for algo in KERNEL_ALGOS + ["nccl"]:
            c.all_reduce(x, algo=algo)
        torch.cuda.synchronize()
    return True


def _armed(torch, uid, algo, timeout):
    """A 1-rank communicator whose next `algo` launch gets a fault
    injected, its input, and the free device memory before it."""
    free0 = _free(torch)
    c = symnccl.Communicator(uid, 0, 1, device=0, timeout=timeout)
    x = torch.randn(4099, device="cuda")
    c.all_reduce(x, algo=algo)
    torch.cuda.synchronize()
    c._inject_fault([algo])
    return c, x, free0


@pytest.mark.gpu
@pytest.mark.parametrize("algo", KERNEL_ALGOS)
def test_kernel_that_gives_up_raises_and_leaves_the_context_usable(
        uid, algo, _process_warm):
    torch = pytest.importorskip("torch")
    c, x, free0 = _armed(torch, uid, algo, GIVE_UP)
    t0 = time.monotonic()
    c.all_reduce(x, algo=algo)   # returns at once: the kernel is async
    torch.cuda.synchronize()
    took = time.monotonic() - t0
    assert GIVE_UP <= took < GIVE_UP + SLACK, took
    with pytest.raises(symnccl.PeerTimeoutError) as e:
        c.check()
    err = e.value
    assert isinstance(err, TimeoutError)
    assert (err.reason, err.kernel, err.collective, err.rank) == \
        ("timeout", algo, "all_reduce", 0), str(err)
    assert GIVE_UP <= err.waited < GIVE_UP + SLACK
    assert "waited" in str(err) and "abort() it" in str(err)
    f = c.failure
    assert f["reason"] == "timeout" and f["kernel"] == algo
    # refuses every further call, kernels and NCCL alike, until aborted
    for a in (algo, "nccl"):
        with pytest.raises(symnccl.PeerTimeoutError):
            c.all_reduce(x, algo=a)
    with pytest.raises(symnccl.PeerTimeoutError):
        c.close()   # close answers with the failure, and aborts
    assert c.closed
    assert torch.arange(8, device="cuda", dtype=torch.float32).sum() == 28
    del x
    assert free0 - _free(torch) < LEAK
    with symnccl.Communicator(symnccl.get_unique_id(), 0, 1, device=0) as d:
        y = torch.full((1031,), 3.0, device="cuda")
        d.all_reduce(y, algo=algo)
        torch.cuda.synchronize()
        assert (y == 3).all()


@pytest.mark.gpu
def test_graph_replay_that_gives_up_is_raised_and_later_replays_leave(uid):
    torch = pytest.importorskip("torch")
    c = symnccl.Communicator(uid, 0, 1, device=0, timeout=GIVE_UP)
    x = torch.randn(4099, device="cuda")
    c.all_reduce(x, algo="ll")
    torch.cuda.synchronize()
    c._inject_fault(["ll"])   # baked into the captured launch
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        c.all_reduce(x, algo="ll")
    assert c.failure is None
    t0 = time.monotonic()
    g.replay()
    torch.cuda.synchronize()
    assert GIVE_UP <= time.monotonic() - t0 < GIVE_UP + SLACK
    with pytest.raises(symnccl.PeerTimeoutError) as e:
        c.check()
    assert e.value.kernel == "ll" and e.value.reason == "timeout"
    t0 = time.monotonic()
    g.replay()   # a replay after the failure leaves at entry
    torch.cuda.synchronize()
    assert time.monotonic() - t0 < 0.5
    del g
    c.abort()


@pytest.mark.gpu
def test_watchdog_aborts_an_nccl_call_that_overstays_the_timeout(uid):
    """An NCCL call that cannot complete within the timeout (here: queued
    behind a 3 s kernel) is aborted by the watchdog at the timeout; the
    stream drains, the failure is raised, the context still works."""
    torch = pytest.importorskip("torch")
    c = symnccl.Communicator(uid, 0, 1, device=0, timeout=1.0)
    x = torch.randn(1024, device="cuda")
    c.all_reduce(x, algo="nccl")
    torch.cuda.synchronize()
    hz = torch.cuda.get_device_properties(0).clock_rate * 1000  # kHz -> Hz
    torch.cuda._sleep(int(3 * hz))
    t0 = time.monotonic()
    c.all_reduce(x, algo="nccl")
    while c.failure is None and time.monotonic() - t0 < 1.0 + SLACK:
        time.sleep(0.02)
    seen = time.monotonic() - t0
    assert c.failure is not None and 1.0 <= seen < 1.0 + SLACK, seen
    assert c.failure["kernel"] == "nccl" and \
        c.failure["reason"] == "timeout", c.failure
    torch.cuda.synchronize()
    with pytest.raises(symnccl.PeerTimeoutError) as e:
        c.all_reduce(x, algo="nccl")
    assert e.value.kernel == "nccl" and e.value.rank is None
    while not c.closed and time.monotonic() - t0 < 3.0 + SLACK:
        time.sleep(0.05)
    assert c.closed   # the watchdog aborted it
    assert torch.arange(8, device="cuda", dtype=torch.float32).sum() == 28
    c.abort()


@pytest.mark.gpu
@pytest.mark.parametrize("algo", ["ll", "one_shot", "push"])
def test_abort_from_another_thread_ends_a_waiting_kernel(uid, algo,
                                                         _process_warm):
    torch = pytest.importorskip("torch")
    c, x, free0 = _armed(torch, uid, algo, 120.0)
    aborter = threading.Timer(0.5, c.abort)
    aborter.start()
    t0 = time.monotonic()
    c.all_reduce(x, algo=algo)
    torch.cuda.synchronize()   # ends with the abort, not the timeout
    assert time.monotonic() - t0 < 0.5 + SLACK
    aborter.join(SLACK)        # abort() returns once NCCL's abort has run
    assert not aborter.is_alive()
    assert c.closed
    with pytest.raises(RuntimeError, match="aborted"):
        c.all_reduce(x, algo=algo)
    del x
    assert free0 - _free(torch) < LEAK


@pytest.mark.gpu
def test_abort_on_signal_ends_a_waiting_kernel_and_python_gets_the_signal(
        uid):
    torch = pytest.importorskip("torch")
    got = []
    old = signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))
    try:
        symnccl.abort_on_signal([signal.SIGUSR1])
        c, x, _ = _armed(torch, uid, "ll", 120.0)
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        t0 = time.monotonic()
        c.all_reduce(x, algo="ll")
        torch.cuda.synchronize()
        assert time.monotonic() - t0 < 0.5 + SLACK
        time.sleep(0.1)
        assert got == [signal.SIGUSR1]   # handed on to Python's handler
        with pytest.raises(symnccl.PeerTimeoutError) as e:
            c.check()
        assert e.value.reason == "abort"
        c.abort()
    finally:
        signal.signal(signal.SIGUSR1, old)


@pytest.mark.gpu
def test_call_check_compares_each_call_and_is_free_when_off(uid,
                                                             monkeypatch):
    """SYMNCCL_CHECK=1 adds one all-gather per call (NCCL counter) and
    passes identical calls; off, it adds nothing."""
    torch = pytest.importorskip("torch")
    x = torch.randn(1031, device="cuda")
    for on in (0, 1):
        monkeypatch.setenv("SYMNCCL_CHECK", str(on))
        with symnccl.Communicator(symnccl.get_unique_id(), 0, 1,
                                  device=0) as c:
            assert c.knobs["SYMNCCL_CHECK"] == on
            before = c._launches()
            c.all_reduce(x, algo="ll")
            c.broadcast(x, algo="nccl")
            after = c._launches()
            assert after["ll"] == before["ll"] + 1
            assert after["nccl"] == before["nccl"] + 1 + 2 * on


# ------------------------------------------------------------ no GPU

def test_exceptions_and_the_knob_are_declared():
    assert issubclass(symnccl.PeerTimeoutError, TimeoutError)
    assert issubclass(symnccl.CallMismatchError, RuntimeError)
    assert "SYMNCCL_CHECK" in symnccl._C.KNOBS
    assert "PeerTimeoutError" in symnccl.__all__


def test_no_kernel_can_trap():
    """A trap kills the process's CUDA context: no kernel source may hold
    one (waits give up through give_up, kernels/primitives.cuh)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    kdir = os.path.join(root, "csrc", "kernels")
    import re
    bad = []
    for name in sorted(os.listdir(kdir)):
        text = open(os.path.join(kdir, name)).read()
        for pat in (r"__trap", r"\btrap;", r"\bexit;", r"(?<!\w)assert\("):
            if re.search(pat, text):
                bad.append((name, pat))
    assert not bad, bad


def test_abort_on_signal_hands_the_signal_on():
    """The handler chains: Python's handler still runs (KeyboardInterrupt),
    and a signal whose action was the default still ends the process."""
    code = ("import os, signal, time, symnccl\n"
            "symnccl.abort_on_signal()\n"
            "try:\n"
            "    os.kill(os.getpid(), signal.SIGINT); time.sleep(5)\n"
            "except KeyboardInterrupt:\n"
            "    print('interrupted')\n"
            "os.kill(os.getpid(), signal.SIGTERM); time.sleep(5)\n"
            "print('survived')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, timeout=60)
    assert r.stdout.strip() == "interrupted", r.stdout + r.stderr
    assert r.returncode == -signal.SIGTERM, r.returncode


@pytest.mark.gpu
def test_watchdog_never_breaks_a_graph_capture_in_another_thread(uid):
    """An eager NCCL call arms the watchdog, whose thread then queries an
    event until it sees it complete (every 50 ms). A CUDA graph captured
    meanwhile in the default global mode must not be invalidated by those
    queries: many captures, each begun right after an eager NCCL call."""
    torch = pytest.importorskip("torch")
    with symnccl.Communicator(uid, 0, 1, device=0, timeout=60) as c:
        x = torch.randn(1031, device="cuda")
        for attempt in range(40):
            c.all_reduce(x, algo="nccl")          # arms the watchdog
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):             # global capture mode
                for _ in range(100):
                    c.all_reduce(x, algo="ll")
            g.replay()
            del g
        torch.cuda.synchronize()
        assert c.failure is None


# ------------------------------------------- who stopped, on 3+ ranks

# Every kernel/collective case of a loopback team (test_loopback.py) whose
# ranks wait for each other: (collective, algo).
STOP_CASES = [("all_reduce", a) for a in ("one_shot", "two_shot", "ll",
                                          "ll128", "push")] + \
    [(c, a) for c in ("reduce_scatter", "all_gather")
     for a in ("ll", "ll128", "push")] + \
    [("reduce", "one_shot"), ("broadcast", "one_shot")]
# Grids small enough for every rank of the team to be resident on one GPU
# at once (as test_loopback.py's _grid).
STOP_GRID = {4: 16, 8: 8}


# 8 ranks for every case; 4 (other grids) for one case of each family
STOP_RUNS = [(8, c, a) for c, a in STOP_CASES] + \
    [(4, c, a) for c, a in (("all_reduce", "one_shot"), ("all_reduce", "ll"),
                            ("all_gather", "ll128"),
                            ("reduce_scatter", "push"))]


@pytest.mark.gpu
@pytest.mark.parametrize("nranks,collective,algo", STOP_RUNS,
                         ids=[f"{c}-{a}-{n}" for n, c, a in STOP_RUNS])
def test_every_survivor_names_the_rank_that_stopped(monkeypatch, nranks,
                                                    collective, algo):
    """The last rank of a loopback team never makes the call. Every other
    rank raises PeerTimeoutError naming that rank (.rank), whether it gave
    up on its own timeout or was told by a rank that gave up first, and
    all of them within the timeout + 1 s. (Before: a survivor told by its
    fault word named the survivor that had given up first.)"""
    torch = pytest.importorskip("torch")
    for k in STOP_KNOBS:
        monkeypatch.setenv(k, str(STOP_GRID[nranks]))
    timeout = 0.5   # waited out once per run (17): the tier's length
    team = symnccl.Communicator._loopback(nranks, 0, timeout=timeout)
    dead = nranks - 1
    streams = [torch.cuda.Stream() for _ in team]
    x = [torch.randn(nranks * 1000, device="cuda") for _ in team]
    kw = {"root": 0} if collective in ("reduce", "broadcast") else {}
    errors = {}
    try:
        torch.cuda.synchronize()
        t0 = time.monotonic()
        for c, s, xq in zip(team[:dead], streams, x):
            getattr(c, collective)(xq, algo=algo, stream=s, **kw)
        for c, s in zip(team[:dead], streams):
            s.synchronize()
        for q, c in enumerate(team[:dead]):
            with pytest.raises(symnccl.PeerTimeoutError) as e:
                c.check()
            errors[q] = e.value
        took = time.monotonic() - t0
    finally:
        for c in team:
            c.abort()
    named = {q: (e.reason, e.rank) for q, e in errors.items()}
    assert all(rank == dead and reason in ("timeout", "peer")
               for reason, rank in named.values()), \
        (named, [str(e) for e in errors.values()])
    assert any(reason == "timeout" for reason, _ in named.values()), named
    assert timeout <= took <= timeout + 1.0, took
    assert torch.arange(8, device="cuda", dtype=torch.float32).sum() == 28


def test_fault_word_carries_reason_origin_and_the_rank_named():
    """The code the first rank to give up writes into every fault word
    (launch.h, SYMNCCL_FAULT_CODE) decodes to what was put in, for every
    rank a team can have: a rank told by its word names the same rank."""
    C = symnccl._C
    for reason in (1, 2, 3):            # timeout, peer, abort
        for origin in range(32):
            for named in (-1, 0, origin, 31 - origin):
                w, r, o, b = C._fault_code(reason, origin, named)
                assert (r, o, b) == (reason, origin, named), \
                    (reason, origin, named, hex(w))
                assert w != 0   # a kernel reads any set word as a fault
