import faulthandler
import os
import signal
import sys

import pytest

import symnccl
from symnccl.bootstrap import local_device_count

NGPU = local_device_count()

# Every test's time limit, in seconds: the default, the one of tests marked
# slow, or its time_limit(seconds) marker's; SYMNCCL_TEST_TIME_LIMIT
# overrides the default. Past it the test fails with a traceback (through
# pytest-timeout where installed, else SIGALRM), and a test that does not
# return to Python then (stuck in C) ends the run with every thread's
# traceback GRACE seconds later: the tier never hangs.
TIME_LIMIT = float(os.environ.get("SYMNCCL_TEST_TIME_LIMIT", "180"))
SLOW_TIME_LIMIT = 1800.0
GRACE = 30.0

# The knobs of every grid whose CTAs wait on peers (the CTA counts of
# one_shot, two_shot, the packet kernels, all_reduce's lamport and push):
# a loopback team's ranks share one GPU, so its tests cap each, for every
# rank's grid to be resident at once.
LOOPBACK_GRID_KNOBS = ("SYMNCCL_ONE_SHOT_CTAS", "SYMNCCL_TWO_SHOT_CTAS",
                       "SYMNCCL_LL_CTAS", "SYMNCCL_LAMPORT_CTAS",
                       "SYMNCCL_PUSH_CTAS")


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", default=False,
                     help="also run the tests marked slow (the training "
                     "examples and the failure scenarios that wait out "
                     "timeouts); SYMNCCL_RUN_SLOW=1 does the same")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: minutes of GPU time (training examples, failure "
        "scenarios that wait out timeouts); skipped unless --run-slow")
    config.addinivalue_line(
        "markers", "time_limit(seconds): this test's time limit, above the "
        f"default {TIME_LIMIT:.0f} s (conftest.py, TIME_LIMIT)")


def time_limit(item) -> float:
    """The test's limit in seconds (TIME_LIMIT's comment)."""
    m = item.get_closest_marker("time_limit")
    if m is not None:
        return float(m.args[0])
    return SLOW_TIME_LIMIT if "slow" in item.keywords else TIME_LIMIT


def _has_pytest_timeout(config) -> bool:
    return config.pluginmanager.hasplugin("timeout")


class TimeLimitExceeded(Exception):
    """A test ran past its time limit (conftest.py, TIME_LIMIT)."""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """The time limit of one test, its fixtures included: pytest-timeout's
    where that plugin is installed (pytest_collection_modifyitems gives
    each test its marker), else SIGALRM; in both cases faulthandler ends
    the process GRACE seconds later if the test never returned to
    Python."""
    limit = time_limit(item)
    alarm = None
    if not _has_pytest_timeout(item.config) and \
            hasattr(signal, "SIGALRM") and \
            signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None):
        def alarm(signum, frame, limit=limit, name=item.nodeid):
            raise TimeLimitExceeded(
                f"{name} ran past its time limit of {limit:.0f} s "
                "(tests/conftest.py, TIME_LIMIT; raise it with "
                "@pytest.mark.time_limit(seconds))")
        signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, limit)
    faulthandler.dump_traceback_later(limit + GRACE, exit=True,
                                      file=sys.__stderr__)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        if alarm is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)


def pytest_collection_modifyitems(config, items):
    run_slow = config.getoption("--run-slow") or \
        os.environ.get("SYMNCCL_RUN_SLOW") == "1"
    timeout_plugin = _has_pytest_timeout(config)
    for item in items:
        if timeout_plugin and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(time_limit(item),
                                                method="signal"))
        if "slow" in item.keywords and not run_slow:
            item.add_marker(pytest.mark.skip(
                reason="slow: run with --run-slow (or SYMNCCL_RUN_SLOW=1)"))
        if "gpu" in item.keywords and NGPU < 1:
            item.add_marker(pytest.mark.skip(
                reason="needs a CUDA GPU: none is visible to this process"))
        need = item.get_closest_marker("multigpu")
        if need is not None:
            n = need.args[0] if need.args else 2
            if NGPU < n:
                item.add_marker(pytest.mark.skip(
                    reason=f"needs {n} CUDA GPUs, {NGPU} visible"))


def symnccl_ops_dispatched(fn):
    """fn's result, and how many symnccl custom ops the dispatcher ran
    meanwhile, from torch's record-function events. The profiler without
    Kineto (profiler_legacy), where torch still has it: Kineto's profiler
    subscribes CUPTI callbacks for the process's life, and at exit, after
    libtorch's static objects are gone, cudart's release of the primary
    context calls them into freed memory; glibc then aborts the pytest
    process ("double free or corruption", exit 134; caught on 2x H100
    with NCCL 2.28.9 and 2.30.7 alike, docs/FAILURES.md, 'NCCL
    versions')."""
    import warnings

    import torch
    try:
        from torch.autograd.profiler_legacy import profile
    except ImportError:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as kineto

        def profile():
            return kineto(activities=[ProfilerActivity.CPU])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)   # deprecated
        prof = profile()
    with prof:
        r = fn()
    events = prof.function_events if hasattr(prof, "function_events") \
        else prof.events()
    return r, sum(1 for e in events if e.name.startswith("symnccl::"))


def ranks_param(*ns):
    """Parametrize over world sizes, each marked with the GPUs it needs."""
    return pytest.mark.parametrize(
        "nranks", [pytest.param(n, marks=[pytest.mark.gpu,
                                           pytest.mark.multigpu(n)])
                   for n in ns])


@pytest.fixture
def uid():
    return symnccl.get_unique_id()


@pytest.fixture(scope="module")
def _module_comms():
    """The one-rank communicators of a module's `comm` fixture. Closing a
    communicator waits for NCCL's teardown (~0.5 s on an H100), which made
    a fresh one per test a tenth of the GPU tier; a test that closes,
    aborts or breaks its communicator gets a new one for the next test."""
    live = []
    yield live
    for c, _ in live:
        if not c.closed:
            c.close()


def one_rank_comm(live, wrap=lambda c: c):
    """The module's shared one-rank communicator on GPU 0 (a new one when
    the last was closed or failed). Tests that use it compare counters
    before and after their call, never against zero."""
    if not live or live[-1][0].closed or live[-1][0].failure is not None:
        c = symnccl.Communicator(symnccl.get_unique_id(), 0, 1, device=0,
                                 timeout=60)
        live.append((c, wrap(c)))
    return live[-1][1]


def xla_handler_or_skip(*name):
    """Skips with the build's reason where symnccl has no XLA FFI handler
    (`name`, or the all-reduce's)."""
    from symnccl import _C
    try:
        _C._xla_handler(*name)
    except RuntimeError as e:
        pytest.skip(str(e))


def last_rank_never_calls(torch, team, call, timeout, collective, kernel):
    """call(c, stream, q) on every rank q of a loopback team but the last,
    which never makes it: each gives up after `timeout` with
    PeerTimeoutError, one of them names the last rank (the other may name
    it or the first to give up, told by its fault word), every error names
    `collective` and a kernel for which kernel(name) holds, and the GPU
    stays usable after abort()."""
    import time
    streams = [torch.cuda.Stream() for _ in team]
    torch.cuda.synchronize()
    t0 = time.monotonic()
    for q, (c, s) in enumerate(zip(team[:-1], streams)):
        call(c, s, q)
    torch.cuda.synchronize()
    took = time.monotonic() - t0
    errors = []
    for c in team[:-1]:
        with pytest.raises(symnccl.PeerTimeoutError) as e:
            c.check()
        errors.append(e.value)
    assert timeout <= took < timeout + 8.0, took
    last = len(team) - 1
    assert any(e.reason == "timeout" and e.rank == last for e in errors), \
        [str(e) for e in errors]
    assert all(e.collective == collective and kernel(e.kernel)
               for e in errors), [str(e) for e in errors]
    for c in team:
        c.abort()
    assert torch.arange(8, device="cuda", dtype=torch.float32).sum() == 28


def spawn_cpu(fn, *args):
    """fn(*args) in a fresh process (JAX reads XLA_FLAGS once)."""
    import multiprocessing as mp
    with mp.get_context("spawn").Pool(1) as pool:
        return pool.apply(fn, args)
