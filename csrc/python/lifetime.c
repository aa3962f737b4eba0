/* A communicator's lifecycle as Python sees it: the object's allocation,
 * creation with the GIL released around every NCCL group and wait (and
 * its warnings), entering with the refusal raised, close and abort (their
 * waits with the GIL released, their failures raised), a buffer's window
 * left to the communicator, deallocation and interpreter exit. Every step
 * that needs no Python is runtime/lifecycle.c's (the state machine, the
 * NCCL groups of creation, the teardown's steps), in the same order as
 * when both were one file; docs/FAILURES.md, "Lifecycle".
 */
#include "symnccl.h"

#include <stdio.h>

/* ------------------------------------------------------------------ */
/* Creation. */

int
sn_parse_multicast(PyObject *obj, int *mode)
{
    if (obj == NULL || obj == Py_None) {
        *mode = SN_MC_AUTO;
        return 0;
    }
    int t = PyObject_IsTrue(obj);
    if (t < 0)
        return -1;
    *mode = t ? SN_MC_ON : SN_MC_OFF;
    return 0;
}

CommObject *
sn_comm_new(PyTypeObject *tp, int rank, int nranks, int device,
            double timeout, int multicast, size_t staging_bytes)
{
    allocfunc alloc = (allocfunc)PyType_GetSlot(tp, Py_tp_alloc);
    CommObject *c = (CommObject *)alloc(tp, 0);
    if (c == NULL)
        return NULL;
    SNState *st = sn_state_from_type(tp);
    c->st = st;
    sn_err err;
    if (sn_comm_init(c, &st->live, rank, nranks, device, timeout, multicast,
                     staging_bytes, &err) < 0) {
        sn_raise(st, &err);
        Py_DECREF(c);
        return NULL;
    }
    return c;
}

/* Device communicators for all of cs, in one group. NCCL reports an
 * unusable multicast request with ncclInvalidArgument on every rank: that
 * one failure is retried without multicast (every rank retries alike). Any
 * other failure leaves the communicators without the device API. -1 only
 * for a timeout or an interrupt (exception set). */
static int
connect_devcomms(SNState *st, CommObject **cs, int n, ncclComm_t *raw)
{
    int mc;
    if (!sn_connect_devcomms_wanted(cs, n, &mc))
        return 0;
    ncclResult_t rc;
    do {
        Py_BEGIN_ALLOW_THREADS
        rc = sn_connect_devcomms(cs, n, mc);
        Py_END_ALLOW_THREADS
        if (rc == ncclSuccess &&
            sn_wait_comms(st, raw, n, cs[0]->timeout, NULL,
                          "ncclDevCommCreate")
                < 0) {
            if (!PyErr_ExceptionMatches(st->NcclError))
                return -1;
            PyErr_Clear();
            rc = ncclInternalError;
        }
    } while (sn_connect_devcomms_retry(cs, n, rc, &mc));
    sn_err err;
    if (sn_connect_devcomms_read(cs, n, rc, &err) < 0)
        return sn_raise(st, &err);
    return 0;
}

/* Staging windows for all of cs (allocated by the caller), in one group. */
static int
register_staging(SNState *st, CommObject **cs, int n, ncclComm_t *raw)
{
    int any;
    ncclResult_t rc;
    Py_BEGIN_ALLOW_THREADS
    rc = sn_connect_staging(cs, n, &any);
    Py_END_ALLOW_THREADS
    if (rc != ncclSuccess)
        return sn_set_nccl_error(st, rc, NULL,
                                 "ncclCommWindowRegister (staging)");
    if (!any)
        return 0;
    if (sn_wait_comms(st, raw, n, cs[0]->timeout, NULL, "staging windows") < 0)
        return -1;
    sn_err err;
    if (sn_connect_staging_check(cs, n, &err) < 0 ||
        sn_connect_agree_check(cs, n, &err) < 0)
        return sn_raise(st, &err);
    return 0;
}

/* Never a silent downgrade: the first communicator of 2+ ranks in this
 * process that runs without the device API says so (its
 * device_api_reason says why); -1 if the warning was turned into an
 * error. */
static int
warn_no_device_api(CommObject **cs, int n)
{
    static int warned;
    for (int i = 0; i < n && !warned; i++) {
        CommObject *c = cs[i];
        if (c->nranks < 2 || c->symmetric)
            continue;
        warned = 1;
        return PyErr_WarnFormat(PyExc_RuntimeWarning, 1, "symnccl: rank %d "
                                "of %d (cuda:%d) runs without the NCCL device "
                                "API, so every collective goes through NCCL's "
                                "own kernels: %s (Communicator."
                                "device_api_reason; warned once per process)",
                                c->rank, c->nranks, c->device,
                                c->symmetric_reason);
    }
    return 0;
}

int
sn_comms_connect(SNState *st, CommObject **cs, int n, const ncclUniqueId *id)
{
    /* once per process: a minor that has not passed on two GPUs */
    static int warned;
    const char *caveat = sn_abi_multi_gpu_caveat(sn_abi_minor());
    if (caveat != NULL && cs[0]->nranks > 1 && !warned) {
        warned = 1;
        if (PyErr_WarnEx(PyExc_RuntimeWarning, caveat, 1) < 0)
            return -1;
    }
    ncclComm_t *raw = PyMem_Calloc((size_t)n, sizeof(ncclComm_t));
    if (raw == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    int prev;
    if (sn_device_push(st, cs[0]->device, &prev) < 0) {
        PyMem_Free(raw);
        return -1;
    }
    ncclResult_t rc;
    Py_BEGIN_ALLOW_THREADS
    rc = sn_connect_nccl(cs, n, id);
    Py_END_ALLOW_THREADS
    SN_NCCL_GOTO(st, rc, NULL, "ncclCommInitRankConfig", error);
    for (int i = 0; i < n; i++)
        raw[i] = cs[i]->comm;
    if (sn_wait_comms(st, raw, n, cs[0]->timeout, NULL,
                      "ncclCommInitRankConfig") < 0 ||
        connect_devcomms(st, cs, n, raw) < 0)
        goto error;
    for (int i = 0; i < n; i++) {
        sn_err err;
        if (sn_connect_memory(cs[i], &err) < 0) {
            sn_raise(st, &err);
            goto error;
        }
        if (sn_staging_wanted(cs[i])) {
            Py_BEGIN_ALLOW_THREADS
            rc = sn_staging_reserve(cs[i]);
            Py_END_ALLOW_THREADS
            if (rc != ncclSuccess) {
                sn_set_nccl_error(st, rc, cs[i]->comm,
                                  "ncclMemAlloc (staging)");
                goto error;
            }
            if (sn_staging_clear(cs[i], &err) < 0 ||
                sn_connect_agree_write(cs[i], &err) < 0) {
                sn_raise(st, &err);
                goto error;
            }
        }
    }
    if (register_staging(st, cs, n, raw) < 0)
        goto error;
    if (warn_no_device_api(cs, n) < 0)
        goto error;
    sn_device_pop(prev);
    PyMem_Free(raw);
    return 0;

error:
    /* no kernel has run: the abort frees everything at once */
    for (int i = 0; i < n; i++)
        sn_comm_abort(st, cs[i]);
    sn_device_pop(prev);
    PyMem_Free(raw);
    return -1;
}

/* ------------------------------------------------------------------ */
/* Entering and leaving. */

int
sn_comm_enter(SNState *st, CommObject *c)
{
    char why[240];
    switch (sn_comm_pin(c, why, sizeof(why))) {
    case 0:
        return 0;
    case SN_PIN_FAILED:   /* PeerTimeoutError, CallMismatchError */
        return sn_fault_raise(st, c);
    default:
        PyErr_SetString(PyExc_RuntimeError, why);
        return -1;
    }
}

void
sn_comm_leave(SNState *st, CommObject *c)
{
    if (sn_comm_leaving(c)) {   /* abort() came while this thread was inside */
        Py_BEGIN_ALLOW_THREADS
        sn_comm_abort_finish(c);
        Py_END_ALLOW_THREADS
    }
}

/* Waits, GIL released, until no caller is inside c (0), c->life.stop is
 * set while `stoppable` (1), or `seconds` have passed (2). */
static int
wait_callers(CommObject *c, double seconds, int stoppable)
{
    const double until = sn_deadline(seconds);
    int r;
    while ((r = sn_comm_callers_left(c, stoppable, until)) < 0) {
        Py_BEGIN_ALLOW_THREADS
        sn_comm_nap();
        Py_END_ALLOW_THREADS
    }
    return r;
}

/* Waits, GIL released, at most `seconds` for another thread's teardown
 * to end (CLOSED, ABORTED) or to be left to the callers inside
 * (abort_pending); the state then. */
static int
wait_teardown(CommObject *c, double seconds)
{
    const double until = sn_deadline(seconds);
    int state;
    while (!sn_comm_teardown_ended(c, until, &state)) {
        Py_BEGIN_ALLOW_THREADS
        sn_comm_nap();
        Py_END_ALLOW_THREADS
    }
    return state;
}

/* ------------------------------------------------------------------ */
/* Windows that buffers left to c. */

/* The windows left to c by buffers that are gone: deregistered and their
 * memory freed once c's kernels have drained (at most
 * SN_RELEASE_PROMPT_SECONDS, GIL released), else left to the next
 * release or the teardown. c entered, GIL held (the list is the GIL's;
 * it is walked again after each wait). */
static void
reap_windows(CommObject *c)
{
    int drained = -1;
    for (;;) {
        sn_window *w = c->windows;
        while (w != NULL && (w->refs != 0 || w->dead == NULL))
            w = w->next;
        if (w == NULL)
            return;
        int ok;
        Py_BEGIN_ALLOW_THREADS
        ok = sn_comm_reap_window(c, w, &drained);
        Py_END_ALLOW_THREADS
        if (!ok)
            return;
        sn_window_forget(c, w);
    }
}

int
sn_comm_release_window(CommObject *c, sn_window *w, void *mem)
{
    if (w == NULL || --w->refs > 0)
        return 1;
    int entered;
    const int state = sn_comm_take_window(c, w, mem,
                                          c->st->group_depth == 0, &entered);
    if (state == SN_CLOSED || state == SN_ABORTED) {
        /* deregistered by close, forgotten by abort */
        sn_window_forget(c, w);
        return 1;
    }
    if (entered) {
        reap_windows(c);
        sn_comm_leave(c->st, c);
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Abort. */

/* The abort, by the thread that owns the teardown (GIL held): every wait
 * on c ends, c's kernels are told to stop, the callers inside get
 * SN_ABORT_LEAVE_SECONDS to leave; the last of them finishes it if they
 * do not. */
static void
abort_owned(CommObject *c)
{
    sn_comm_abort_begin(c);
    Py_BEGIN_ALLOW_THREADS
    sn_fault_stop_kernels(c, SYMNCCL_FAULT_ABORT, 1.0);
    Py_END_ALLOW_THREADS
    if (wait_callers(c, SN_ABORT_LEAVE_SECONDS, 0) != 0 &&
        sn_comm_abort_defer(c))
        return;
    Py_BEGIN_ALLOW_THREADS
    sn_comm_abort_finish(c);
    Py_END_ALLOW_THREADS
}

void
sn_comm_abort_owned(SNState *st, CommObject *c)
{
    sn_comm_stop(c);
    if (st->on_closing != NULL)
        st->on_closing(c);
    abort_owned(c);
}

void
sn_comm_abort(SNState *st, CommObject *c)
{
    int was;
    const int state = sn_comm_abort_look(c, &was);
    if (state == SN_OPEN) {
        if (sn_comm_take_teardown(c, SN_TEAR_ABORT))
            sn_comm_abort_owned(st, c);
        else   /* another thread was quicker: as below */
            sn_comm_abort(st, c);
        return;
    }
    /* closed, aborted, or an abort under way (or left to its callers) */
    if (state != SN_CLOSING || was == SN_TEAR_ABORT)
        return;
    /* another thread's close: it sees c->life.stop in its waits and turns
     * into the abort; this thread touches nothing of c's and waits,
     * bounded */
    sn_comm_stop(c);
    (void)wait_teardown(c, SN_ABORT_ALL_SECONDS);
}

/* ------------------------------------------------------------------ */
/* Close. */

static int close_entered(SNState *st, CommObject *c, double timeout);

/* Deregisters every window of c (windows.c's list), the GIL released
 * while NCCL runs; the nodes stay for their buffers. */
static int
deregister_windows(SNState *st, CommObject *c)
{
    for (sn_window *w = c->windows; w != NULL; w = w->next) {
        if (w->win == NULL)
            continue;
        if (c->comm == NULL) {   /* a loopback rank's: its team's */
            w->win = NULL;
            continue;
        }
        ncclResult_t rc;
        Py_BEGIN_ALLOW_THREADS
        rc = ncclCommWindowDeregister(c->comm, w->win);
        Py_END_ALLOW_THREADS
        w->win = NULL;
        if (sn_nccl_complete(st, c, rc, "ncclCommWindowDeregister") < 0)
            return -1;
    }
    return 0;
}

/* close() waiting at most `timeout` for c's callers and c's work
 * (sn_comm_close: c's own timeout; exit: SYMNCCL_EXIT_TIMEOUT when
 * shorter). */
static int
close_within(SNState *st, CommObject *c, double timeout)
{
    int state, failed;
    if (!sn_comm_take_close(c, st->group_depth != 0, &state, &failed)) {
        /* a failure is the answer until the user aborts */
        if (failed && !c->life.user_aborted)
            return sn_fault_raise(st, c);
        if (state == SN_OPEN) {
            PyErr_SetString(PyExc_RuntimeError, "close() cannot be called "
                            "inside symnccl.group()");
            return -1;
        }
        /* closed, or aborted: nothing to do; being closed or aborted by
         * another thread: its outcome, once it has one */
        const int end = state == SN_CLOSING
                            ? wait_teardown(c, timeout + SN_ABORT_ALL_SECONDS)
                            : state;
        if (end != SN_CLOSING)
            return 0;
        sn_lock(c);
        const int pending = c->life.abort_pending;
        sn_unlock(c);
        if (pending)
            PyErr_SetString(PyExc_RuntimeError, "close(): the communicator "
                            "is being aborted; the abort ends when the last "
                            "call inside it returns");
        else
            PyErr_Format(PyExc_TimeoutError, "close(): another thread was "
                         "still closing or aborting this communicator "
                         "after %.1f s", timeout + SN_ABORT_ALL_SECONDS);
        return -1;
    }
    /* no XLA call enters c from now on, no method either (CLOSING) */
    if (st->on_closing != NULL)
        st->on_closing(c);
    int rc;
    switch (wait_callers(c, timeout, 1)) {
    case 0:
        rc = close_entered(st, c, timeout);
        break;
    case 1:
        PyErr_SetString(PyExc_RuntimeError, "close() was interrupted by "
                        "abort() from another thread");
        rc = -1;
        break;
    default:
        sn_lock(c);
        const int busy = c->life.busy;
        sn_unlock(c);
        PyErr_Format(PyExc_TimeoutError, "close(): %d call(s) from other "
                     "threads were still inside the communicator after "
                     "%.1f s; it was aborted instead", busy, timeout);
        rc = -1;
    }
    if (rc < 0) {
        /* A close that cannot complete must not leave peers waiting on a
         * half-closed communicator, nor callers inside it: abort. */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        abort_owned(c);
        PyErr_Restore(et, ev, tb);
    }
    return rc;
}

int
sn_comm_close(SNState *st, CommObject *c)
{
    return close_within(st, c, c->timeout);
}

/* sn_nccl_complete for close, bounded by its own timeout (close refuses
 * to run inside symnccl.group(), so the call completes here). */
static int
complete_within(SNState *st, CommObject *c, ncclResult_t rc,
                const char *what, double timeout)
{
    if (rc != ncclSuccess && rc != ncclInProgress)
        return sn_set_nccl_error(st, rc, c->comm, what);
    return sn_wait_comms(st, &c->comm, 1, timeout, &c->life.stop, what);
}

/* close() by the owner of the teardown, no caller inside. */
static int
close_entered(SNState *st, CommObject *c, double timeout)
{
    int prev;
    if (sn_device_push(st, c->device, &prev) < 0)
        return -1;
    ncclResult_t rc;
    cudaError_t ce;
    /* symnccl's and NCCL's work on c, for at most the timeout (a kernel
     * gives up after it, the watchdog ends NCCL's), then the device */
    int drained;
    Py_BEGIN_ALLOW_THREADS
    drained = sn_comm_drain_or_stop(c, timeout + SN_ABORT_DRAIN_SECONDS);
    Py_END_ALLOW_THREADS
    if (sn_fault_check(st, c) < 0)
        goto fail;
    if (drained < 0) {
        PyErr_SetString(PyExc_RuntimeError, "close() was interrupted by "
                        "abort() from another thread");
        goto fail;
    }
    if (!drained) {
        PyErr_Format(PyExc_TimeoutError, "close(): the communicator's work "
                     "did not complete within %.1f s", timeout);
        goto fail;
    }
    Py_BEGIN_ALLOW_THREADS
    ce = cudaDeviceSynchronize();
    Py_END_ALLOW_THREADS
    SN_CUDA_GOTO(st, ce, "cudaDeviceSynchronize (close)", fail);
    sn_watch_forget(c);
    Py_BEGIN_ALLOW_THREADS
    rc = sn_comm_closing_windows(c, 1);
    Py_END_ALLOW_THREADS
    if (rc != ncclSuccess) {
        sn_set_nccl_error(st, rc, c->comm,
                          "ncclCommWindowDeregister (XLA buffer)");
        goto fail;
    }
    if (c->devcomm != NULL && c->comm == NULL) {   /* a loopback rank */
        symnccl_devcomm_free(c->devcomm);
        c->devcomm = NULL;
    }
    if (c->devcomm != NULL) {
        Py_BEGIN_ALLOW_THREADS
        rc = symnccl_devcomm_destroy(c->comm, c->devcomm);
        Py_END_ALLOW_THREADS
        c->devcomm = NULL;
        if (complete_within(st, c, rc, "ncclDevCommDestroy", timeout) < 0)
            goto fail;
    }
    if (deregister_windows(st, c) < 0)
        goto fail;
    /* cudaFree synchronises the device: GIL released, as abort frees
     * (sn_comm_abort_finish) and as a buffer's deallocator does */
    Py_BEGIN_ALLOW_THREADS
    sn_comm_free_memory(c);
    Py_END_ALLOW_THREADS
    if (c->comm != NULL) {
        Py_BEGIN_ALLOW_THREADS
        rc = ncclCommFinalize(c->comm);
        Py_END_ALLOW_THREADS
        if (complete_within(st, c, rc, "ncclCommFinalize", timeout) < 0)
            goto fail;
        Py_BEGIN_ALLOW_THREADS
        rc = ncclCommDestroy(c->comm);
        Py_END_ALLOW_THREADS
        c->comm = NULL;
    }
    else
        rc = ncclSuccess;   /* a loopback rank: no NCCL communicator */
    Py_BEGIN_ALLOW_THREADS
    sn_comm_end_teardown(c, SN_CLOSED, 1);
    Py_END_ALLOW_THREADS
    sn_device_pop(prev);
    if (rc != ncclSuccess)
        return sn_set_nccl_error(st, rc, NULL, "ncclCommDestroy");
    return 0;

fail:
    sn_device_pop(prev);
    return -1;
}

/* ------------------------------------------------------------------ */
/* Deallocation and exit. */

void
sn_comm_finalize(SNState *st, CommObject *c)
{
    sn_comm_unlink(&st->live, c);
    sn_watch_forget(c);
    if (st->shutting_down)
        return;
    int failed;
    const int state = sn_comm_look(c, &failed);
    if (state == SN_OPEN && (c->comm != NULL || c->loopback != NULL)) {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        if (failed)   /* the user was told at the failure */
            sn_comm_abort(st, c);
        else if (sn_comm_close(st, c) < 0) {
            PyErr_WriteUnraisable((PyObject *)c);
            sn_comm_abort(st, c);
        }
        PyErr_Restore(et, ev, tb);
    }
    /* Callers that hold no reference may still be inside (XLA handlers
     * past an abort's bounds): c's memory must outlive them. */
    sn_comm_keep_if_busy(c);
}

int
sn_comm_shutdown_all(SNState *st, double timeout)
{
    /* the live list, as new references: closing releases the GIL, and
     * another thread may meanwhile drop a communicator of the list */
    Py_ssize_t n = 0;
    for (CommObject *c = st->live; c != NULL; c = c->life.next)
        n++;
    CommObject **cs = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof(*cs));
    if (cs == NULL)
        return 0;
    n = 0;
    for (CommObject *c = st->live; c != NULL; c = c->life.next)
        cs[n++] = (CommObject *)Py_NewRef((PyObject *)c);
    int failures = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        CommObject *c = cs[i];
        sn_lock(c);
        const int state = c->life.state;
        sn_unlock(c);
        if (state == SN_OPEN &&
            close_within(st, c, timeout < c->timeout ? timeout
                                                     : c->timeout) < 0) {
            PyErr_Clear();
            sn_comm_abort(st, c);
            failures++;
        }
    }
    /* a last reference may go here: closed or aborted above, its
     * finalisation has nothing left to do */
    for (Py_ssize_t i = 0; i < n; i++)
        Py_DECREF((PyObject *)cs[i]);
    PyMem_Free(cs);
    return failures;
}
