/* The one bounded wait for non-blocking NCCL communicators.
 *
 * Every NCCL call symnccl makes is on a non-blocking communicator
 * (ncclConfig_t.blocking = 0), so that every wait for peers is bounded by
 * the communicator's timeout and interruptible by Ctrl-C: the call returns
 * at once and the communicator reports ncclInProgress until it completes.
 * sn_wait_nccl polls that without Python (for the XLA handler, which runs on
 * XLA's threads, and for deallocators); sn_wait_comms wraps it for Python
 * callers.
 */
#include "symnccl.h"

#include <time.h>

/* After the spin (SN_WAIT_SPIN_SECONDS), naps of this length. */
#define NAP_NS 20000
/* Python callers release the GIL for slices of this length, and check for
 * signals between them. */
#define SLICE_SECONDS 0.05

int
sn_check_timeout(double seconds, const char *what)
{
    /* NaN fails every comparison: the test is written so that it fails */
    if (seconds > 0 && seconds <= SN_MAX_TIMEOUT)
        return 0;
    PyObject *seen = PyFloat_FromDouble(seconds);
    if (seen == NULL)
        return -1;
    PyErr_Format(PyExc_ValueError, "%s must be a finite number of seconds "
                 "> 0 and <= %d (symnccl.MAX_TIMEOUT), got %R", what,
                 (int)SN_MAX_TIMEOUT, seen);
    Py_DECREF(seen);
    return -1;
}

double
sn_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double
sn_deadline(double seconds)
{
    return sn_now() + seconds;
}

/* since: when the whole wait began (for the spin phase). */
static int
wait_nccl(ncclComm_t *comms, int n, double since, double until,
          const volatile int *stop, int *failed, ncclResult_t *bad)
{
    for (;;) {
        if (stop != NULL && *stop)
            return SN_WAIT_STOPPED;
        int busy = 0;
        for (int i = 0; i < n; i++) {
            ncclResult_t async = ncclSuccess;
            ncclResult_t rc = ncclCommGetAsyncError(comms[i], &async);
            if (rc == ncclSuccess && async == ncclInProgress) {
                busy = 1;
                continue;
            }
            if (rc != ncclSuccess || async != ncclSuccess) {
                *failed = i;
                *bad = rc != ncclSuccess ? rc : async;
                return SN_WAIT_FAILED;
            }
        }
        if (!busy)
            return SN_WAIT_DONE;
        double now = sn_now();
        if (now >= until)
            return SN_WAIT_TIMEOUT;
        if (now - since > SN_WAIT_SPIN_SECONDS) {
            struct timespec pause = {0, NAP_NS};
            nanosleep(&pause, NULL);
        }
    }
}

int
sn_wait_nccl(ncclComm_t *comms, int n, double until,
             const volatile int *stop, int *failed, ncclResult_t *bad)
{
    return wait_nccl(comms, n, sn_now(), until, stop, failed, bad);
}

int
sn_wait_comms(SNState *st, ncclComm_t *comms, int n, double timeout,
              const volatile int *stop, const char *what)
{
    int failed = -1;
    ncclResult_t bad = ncclSuccess;
    /* Fast path, GIL held: usually everything has completed already. */
    double start = sn_now();
    int r = wait_nccl(comms, n, start, 0.0, stop, &failed, &bad);
    double deadline = start + timeout;
    while (r == SN_WAIT_TIMEOUT) {
        double slice = sn_deadline(SLICE_SECONDS);
        Py_BEGIN_ALLOW_THREADS
        r = wait_nccl(comms, n, start, slice < deadline ? slice : deadline,
                      stop, &failed, &bad);
        Py_END_ALLOW_THREADS
        if (r != SN_WAIT_TIMEOUT)
            break;
        if (PyErr_CheckSignals() < 0)
            return -1;
        if (sn_now() >= deadline) {
            PyErr_Format(PyExc_TimeoutError,
                         "%s did not complete within %.1f s: are all ranks "
                         "making the same call? (the communicator can still "
                         "be aborted with abort())", what, timeout);
            return -1;
        }
    }
    if (r == SN_WAIT_FAILED)
        return sn_set_nccl_error(st, bad, comms[failed], what);
    if (r == SN_WAIT_STOPPED) {
        PyErr_Format(PyExc_RuntimeError, "%s was interrupted by abort() "
                     "from another thread", what);
        return -1;
    }
    return 0;
}

int
sn_nccl_complete(SNState *st, CommObject *c, ncclResult_t rc,
                 const char *what)
{
    if (rc != ncclSuccess && rc != ncclInProgress)
        return sn_set_nccl_error(st, rc, c->comm, what);
    if (st->group_depth > 0)   /* completes at group end */
        return PyList_Append(st->group_pending, (PyObject *)c);
    /* A non-blocking communicator may still be busy after a call returned
     * ncclSuccess; the next call would fail. Wait for it (cheap when done). */
    return sn_wait_comms(st, &c->comm, 1, c->timeout, &c->life.stop, what);
}
