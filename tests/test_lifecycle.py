"""The communicator's lifecycle (docs/FAILURES.md, "Lifecycle"): OPEN ->
CLOSING -> CLOSED or ABORTED, checked by every entry point; close() and
abort() while other threads call: every call returns or raises a clear
exception, the teardown returns within a bound, nothing is freed under a
caller, the process lives on. The CPU tier checks the rules the C code
must keep; the GPU tier races the teardown against callers (one-rank
communicators and loopback teams: one GPU)."""
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest

import symnccl
from conftest import xla_handler_or_skip
from layering import c_files, source
from symnccl.bootstrap import spawn

HERE = os.path.dirname(os.path.abspath(__file__))

ROUNDS = 100
# close() and abort() return within this, every caller leaves within it
# (abort's own bounds, runtime.h's SN_ABORT_*, add up to 10 s, 1 of them
# only for a communicator the watchdog revoked; a close here has nothing
# slow to wait for)
BOUND = 11.0
LEAK = 64 << 20


def _src(name):
    return source(name)


def _functions(text):
    """{name: body} of the C functions defined in text."""
    out = {}
    for m in re.finditer(r"^(\w+)\(([^)]*)\)\n\{\n(.*?)^\}", text,
                         re.S | re.M):
        out[m.group(1)] = m.group(3)
    return out


# ------------------------------------------------------------------- CPU

def test_every_method_that_uses_the_communicator_enters_it():
    """A method that reads the communicator's NCCL communicator, scratch,
    windows or failure record enters it (sn_comm_enter .. sn_comm_leave,
    or a collective's sn_call_begin): a teardown frees nothing while a
    caller is inside (2800603: check(), _lsa_pointer and _epoch read the
    memory unentered)."""
    comm = _src("comm.c")
    table = comm[comm.index("static PyMethodDef comm_methods[]"):]
    methods = re.findall(r'\{"(\w+)", \(PyCFunction\)'
                         r'(?:\(void \(\*\)\(void\)\))?(\w+)', table)
    # the collective methods: csrc/methods.py's table (SN_METHODS), whose
    # C functions are sn_<name>
    assert "SN_METHODS(SN_METHOD_DEF_)" in table
    listed = _src("methods.h").split("#define SN_METHODS(X)")[1]
    methods += [(m, "sn_" + m) for m in
                re.findall(r"X\((\w+)\)", listed.split("\n\n")[0])]
    assert "all_reduce" in dict(methods), methods
    bodies = {}
    for name in ("comm.c", "collectives.c", "fused.c", "alltoall.c"):
        bodies.update(_functions(_src(name)))
    # no state of the communicator's own, or the lifecycle itself; _copy
    # launches on raw addresses without the communicator's memory
    exempt = {"close", "abort", "__enter__", "__exit__", "init_all",
              "_loopback", "_launches", "_staging_layout", "_inject_fault",
              "_algo_unavailable", "_auto_algo", "_copy"}
    unentered = []
    for name, fn in methods:
        if name in exempt:
            continue
        body = bodies[fn]
        # the body, or the one function it hands the call to
        calls = re.findall(r"\b(\w+)\(", body)
        text = body + "".join(bodies.get(c, "") for c in calls)
        if not re.search(r"sn_comm_enter|sn_call_begin|call_begin", text):
            unentered.append(name)
    assert not unentered, unentered


def test_no_entry_point_checks_usable_then_uses_memory():
    """Only entering keeps a communicator's memory: csrc/ has no check of
    whether c is usable that does not enter it (sn_comm_check_usable was
    one: nothing may rely on such an answer afterwards; 2800603: check(),
    _lsa_pointer and _epoch read the memory unentered)."""
    from layering import CSRC
    users = [os.path.join(d, f) for d, _, files in os.walk(CSRC)
             for f in files if f.endswith((".c", ".h")) and
             "sn_comm_check_usable" in open(os.path.join(d, f)).read()]
    assert not users, users


def test_xla_handler_enters_under_the_registry_lock_and_leaves_by_unpin():
    """The handler looks its communicator up and enters it in one step
    under the registry's lock (else a close between the two frees what it
    then uses), holds a reference the registry keeps, and leaves through
    sn_comm_unpin, which finishes an abort that waited for it (2800603:
    the pointer was used after the lock, and xla_leave dropped busy
    without looking at abort_pending)."""
    fns = _functions(_src("xla_ffi.c"))
    enter = fns["xla_enter"]
    lock = enter.index("pthread_mutex_lock(&registry_lock)")
    unlock = enter.index("pthread_mutex_unlock(&registry_lock)")
    assert lock < enter.index("sn_comm_pin(") < unlock
    assert "sn_comm_unpin(" in fns["xla_leave"]
    assert "busy" not in fns["xla_leave"]
    # the registry's reference: taken by the Python face (python/xla.c),
    # stored under the registry's lock (xla_ffi.c, sn_xla_swap)
    register = _functions(_src("xla.c"))["sn_py_xla_register"]
    assert "Py_NewRef" in register and "sn_xla_swap(" in register
    swap = fns["sn_xla_swap"]
    assert swap.index("pthread_mutex_lock(&registry_lock)") < \
        swap.index("registry[device] = c") < \
        swap.index("pthread_mutex_unlock(&registry_lock)")


def test_no_lock_is_held_across_a_wait():
    """Between sn_lock and sn_unlock no C file waits: no NCCL wait, no
    device or stream synchronisation, no sleep, no GIL release or Python
    call that may release it (2800603: xla_ffi.c held c->lock through a
    window registration and its wait for the peers)."""
    waits = re.compile(r"sn_wait_nccl|sn_wait_comms|nccl_finish|xla_window\("
                       r"|Synchronize|nanosleep|Py_BEGIN_ALLOW_THREADS|"
                       r"ncclCommWindowRegister|sn_window_register|"
                       r"sn_fault_drain|"
                       r"PyObject_Call|PyErr_")
    bad = []
    for name in (f + ".c" for f in c_files()):
        for body in _functions(_src(name)).values():
            for m in re.finditer(r"sn_lock\((\w+(?:->\w+)?)\);(.*?)"
                                 r"sn_unlock\(\1\);", body, re.S):
                if waits.search(m.group(2)):
                    bad.append((name, m.group(2).strip()[:120]))
    assert not bad, bad


def test_a_deallocator_never_synchronises_the_device():
    """A buffer's deallocation waits with a bound only (2800603: an
    unbounded cudaDeviceSynchronize, then an NCCL wait of up to the
    timeout, both with the GIL held)."""
    syncs = [name for name in ("buffer.c", "windows.c")
             if "cudaDeviceSynchronize" in _src(name)]
    assert not syncs, syncs
    assert "Py_BEGIN_ALLOW_THREADS" in _functions(_src("buffer.c"))[
        "buffer_dealloc"]


def test_a_test_past_its_time_limit_fails_and_the_next_runs(tmp_path):
    """tests/conftest.py gives every test a time limit (pytest-timeout
    where installed, else SIGALRM): a test that overstays it fails, and
    the run goes on."""
    (tmp_path / "conftest.py").write_text(
        open(os.path.join(HERE, "conftest.py")).read())
    (tmp_path / "test_limit.py").write_text(textwrap.dedent("""
        import time
        import pytest

        @pytest.mark.time_limit(1)
        def test_sleeps_past_its_limit():
            time.sleep(30)

        def test_after_it():
            pass
        """))
    env = dict(os.environ)   # symnccl from where this process has it
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(symnccl.__file__))] +
        [p for p in [env.get("PYTHONPATH")] if p])
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p",
                        "no:cacheprovider", str(tmp_path)],
                       capture_output=True, text=True, timeout=120,
                       cwd=tmp_path, env=env)
    assert time.monotonic() - t0 < 25, r.stdout
    assert "1 failed, 1 passed" in r.stdout, r.stdout + r.stderr


# ------------------------------------------------------------------- GPU

def _calls_methods(torch, comm, algos):
    xs = [torch.ones(4096, device="cuda") for _ in algos]
    return [lambda x=x, a=a: comm.all_reduce(x, algo=a)
            for x, a in zip(xs, algos)]


def _calls_torch(torch, comm, algos):
    import symnccl.torch as snt
    cid = snt.comm_id(comm)
    xs = [torch.ones(4096, device="cuda") for _ in algos]
    eager = [lambda x=x, a=a: snt.all_reduce(x, comm, algo=a)
             for x, a in zip(xs, algos)]
    ops = [lambda x=x, a=a: torch.ops.symnccl.all_reduce(x, cid, "sum", a)
           for x, a in zip(xs, algos)]
    return eager + ops


def _free(torch):
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info(0)[0]


def _check_rounds(torch, make, calls_of, teardown, rounds):
    from _workers.lifecycle_workers import hammer
    free0 = None
    totals = {"ok": 0, "refused": 0}
    for r in range(rounds):
        comm = make()
        calls = calls_of(comm)
        for call in calls:   # each warm (first launches load kernels)
            call()
        torch.cuda.synchronize()
        if r == 1:
            free0 = _free(torch)
        took, error, alive, unclear, counts = hammer(
            comm, calls, teardown, BOUND)
        assert error is None, (r, error)
        assert took < BOUND, (r, took)
        assert alive == 0, f"round {r}: {alive} callers never returned"
        assert not unclear, (r, unclear[:5])
        assert comm.closed
        for k in totals:
            totals[k] += counts[k]
        del calls, comm
    torch.cuda.synchronize()
    assert torch.arange(8, device="cuda", dtype=torch.float32).sum() == 28
    assert free0 - _free(torch) < LEAK
    # the race happened: calls completed and calls were refused
    assert totals["ok"] > 0 and totals["refused"] > 0, totals


TEARDOWNS = {"close": lambda c: c.close(), "abort": lambda c: c.abort()}


@pytest.mark.gpu
@pytest.mark.time_limit(600)
@pytest.mark.parametrize("kind", ["close", "abort"])
def test_teardown_while_four_threads_call_every_algorithm(uid, kind):
    """A one-rank communicator, four threads calling all_reduce with ll,
    one_shot, push and nccl, and close() or abort() meanwhile, 100 times
    (2800603: close() did not return within 30 s; abort freed staging and
    the device communicator under launching threads)."""
    torch = pytest.importorskip("torch")
    _check_rounds(
        torch,
        lambda: symnccl.Communicator(symnccl.get_unique_id(), 0, 1,
                                     device=0, timeout=60),
        lambda c: _calls_methods(torch, c, ("ll", "one_shot", "push",
                                            "nccl")),
        TEARDOWNS[kind], ROUNDS)


@pytest.mark.gpu
@pytest.mark.time_limit(600)
@pytest.mark.parametrize("kind", ["close", "abort"])
def test_teardown_while_torch_ops_call(uid, kind):
    """The same through symnccl.torch: the eager functions and the custom
    ops (torch.ops.symnccl.*), which reach the methods."""
    torch = pytest.importorskip("torch")
    _check_rounds(
        torch,
        lambda: symnccl.Communicator(symnccl.get_unique_id(), 0, 1,
                                     device=0, timeout=60),
        lambda c: _calls_torch(torch, c, ("ll", "push")),
        TEARDOWNS[kind], ROUNDS)


@pytest.mark.gpu
@pytest.mark.time_limit(300)
@pytest.mark.parametrize("kind", ["close", "abort"])
def test_teardown_of_a_loopback_rank_while_four_threads_launch(kind):
    """The kernels' launch path on a loopback rank (no NCCL communicator):
    four threads launching ll, one_shot, push and two_shot while the rank
    is closed or aborted, 100 times."""
    torch = pytest.importorskip("torch")
    _check_rounds(
        torch,
        lambda: symnccl.Communicator._loopback(1, 0, timeout=20.0)[0],
        lambda c: _calls_methods(torch, c, ("ll", "one_shot", "push",
                                            "two_shot")),
        TEARDOWNS[kind], ROUNDS)


@pytest.mark.gpu
def test_abort_ends_a_thread_blocked_in_a_wait_and_returns_in_bound(uid):
    """abort() from another thread while a thread waits on the host for a
    call that cannot complete (a barrier whose kernel waits for a peer that
    never comes): the waiting thread leaves with a clear error within the
    abort's bound, not the 120 s timeout, and abort() returns meanwhile."""
    import threading
    torch = pytest.importorskip("torch")
    c = symnccl.Communicator(uid, 0, 1, device=0, timeout=120.0)
    # one rank: the fused call's add+norm is a kernel launch (an in-place
    # all_reduce is not), and its entry with a fault injected spins until
    # the timeout or an abort
    x, r, w = (torch.ones(2, 64, device="cuda") for _ in range(3))
    c.all_reduce_rmsnorm(x, r, w[0], 1e-6, algo="one_shot")
    torch.cuda.synchronize()
    c._inject_fault(["one_shot_rmsnorm"])
    got = []

    def blocked():
        try:
            s = torch.cuda.current_stream()
            c.all_reduce_rmsnorm(x, r, w[0], 1e-6, algo="one_shot",
                                 stream=s)
            c.barrier(stream=s, blocking=True)   # behind the stuck kernel
            got.append("returned")
        except Exception as e:   # noqa: BLE001
            got.append(f"{type(e).__name__}: {e}")

    t = threading.Thread(target=blocked)
    t.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    c.abort()
    took = time.monotonic() - t0
    t.join(BOUND)
    assert not t.is_alive()
    assert took < BOUND, took
    assert got and re.search(r"abort", got[0]), got
    assert c.closed
    assert torch.arange(8, device="cuda", dtype=torch.float32).sum() == 28


@pytest.mark.gpu
def test_close_waits_for_a_caller_inside_then_refuses_new_ones(uid):
    """close() with a caller inside: new calls are refused as soon as the
    close has begun ('being closed'), the caller inside finishes, and the
    close completes after it."""
    import threading
    torch = pytest.importorskip("torch")
    c = symnccl.Communicator(uid, 0, 1, device=0, timeout=60.0)
    x = torch.ones(1 << 20, device="cuda")
    started, seen = threading.Event(), []

    def caller():
        started.set()
        while True:
            try:
                c.all_reduce(x, algo="nccl")
            except RuntimeError as e:
                seen.append(str(e))
                return

    t = threading.Thread(target=caller)
    t.start()
    started.wait()
    c.close()
    t.join(BOUND)
    assert not t.is_alive()
    assert re.search(r"is (being )?closed", seen[0]), seen
    assert "closed" in repr(c)


@pytest.mark.gpu
def test_buffer_released_while_its_kernels_still_run_never_blocks(uid):
    """A SymmetricBuffer's last reference dropped while a kernel that uses
    its window cannot finish (it waits for a peer, 30 s timeout): the
    deallocation returns within SN_RELEASE_PROMPT_SECONDS and a bit, its
    window's release is left to the communicator, and abort() frees it
    (2800603: cudaDeviceSynchronize in the deallocator, GIL held, until
    the kernel gave up)."""
    torch = pytest.importorskip("torch")
    c = symnccl.Communicator(uid, 0, 1, device=0, timeout=30.0)
    base = c._windows
    b = c.empty(4096, "float32")
    t = torch.from_dlpack(b)
    t.fill_(1.0)
    c.all_reduce(t, algo="one_shot")
    torch.cuda.synchronize()
    c._inject_fault(["one_shot"])
    c.all_reduce(t, algo="one_shot")   # its kernel waits 30 s
    t0 = time.monotonic()
    del t, b
    assert time.monotonic() - t0 < 2.0
    assert c._windows == base + 1      # left to the communicator
    t0 = time.monotonic()
    c.abort()
    assert time.monotonic() - t0 < BOUND
    torch.cuda.synchronize()
    assert torch.arange(8, device="cuda", dtype=torch.float32).sum() == 28


@pytest.mark.gpu
@pytest.mark.time_limit(900)
@pytest.mark.parametrize("kind", ["close", "abort"])
def test_teardown_while_xla_handlers_run(kind):
    """JAX: four threads running jitted all-reduces (the XLA handler, ll,
    one_shot, push, nccl) on symnccl.jax's communicator while this thread
    closes or aborts it, 20 times (a JAX communicator costs a second to
    make): every call returns or fails with an XLA error naming why, the
    teardown returns within its bound (2800603: the handler used a
    registry pointer it did not own, and a deferred abort was lost)."""
    pytest.importorskip("jax")
    xla_handler_or_skip("all_reduce")
    from _workers import lifecycle_workers as W
    res = spawn(W.xla_hammer, 1, args=(20, kind, BOUND), timeout=800)[0]
    assert res["alive"] == 0, res
    assert not res["errors"], res["errors"]
    assert max(res["took"]) < BOUND, res["took"]
    assert not res["unclear"], res["unclear"]
    assert res["ok"] > 0 and res["refused"] > 0, res
    assert res["usable"] == 28.0
