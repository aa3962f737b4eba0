/* The waits of Python callers (the methods, close, the group's end,
 * buffers' registration) and the timeout check every timeout passes:
 * runtime/wait.c's bounded wait with the GIL released in slices, Ctrl-C
 * honoured between them, and its outcome raised.
 */
#include "symnccl.h"

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

int
sn_wait_comms(SNState *st, ncclComm_t *comms, int n, double timeout,
              const volatile int *stop, const char *what)
{
    int failed = -1;
    ncclResult_t bad = ncclSuccess;
    /* Fast path, GIL held: usually everything has completed already. */
    double start = sn_now();
    int r = sn_wait_nccl_since(comms, n, start, 0.0, stop, &failed, &bad);
    double deadline = start + timeout;
    while (r == SN_WAIT_TIMEOUT) {
        double slice = sn_deadline(SLICE_SECONDS);
        Py_BEGIN_ALLOW_THREADS
        r = sn_wait_nccl_since(comms, n, start,
                               slice < deadline ? slice : deadline, stop,
                               &failed, &bad);
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
