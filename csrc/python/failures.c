/* A communicator's failure as Python sees it (runtime/faults.c keeps the
 * record): Communicator.failure's dict, PeerTimeoutError and
 * CallMismatchError raised from the record, the bounded wait of an eager
 * NCCL call with the GIL released, abort_on_signal's installer, and
 * _fault_code (testing).
 */
#include "symnccl.h"

PyObject *
sn_fault_dict(CommObject *c)
{
    if (!sn_fault_poll(c))
        Py_RETURN_NONE;
    const symnccl_fault *f = &c->fail.failure;
    char msg[700];
    sn_fault_describe(c, msg, sizeof(msg));
    PyObject *rank = f->peer >= 0 ? PyLong_FromLong(f->peer)
                                  : Py_NewRef(Py_None);
    return Py_BuildValue(
        "{s:s,s:s,s:s,s:N,s:d,s:i,s:K,s:s}",
        "reason", sn_fault_reason_name((int)f->reason),
        "collective", sn_collective_name(f->collective),
        "kernel", sn_kernel_name(f->kernel),
        "rank", rank, "waited", (double)f->waited_ns * 1e-9, "cta", f->cta,
        "flag", (unsigned long long)f->flag, "message", msg);
}

int
sn_fault_raise(SNState *st, CommObject *c)
{
    PyObject *d = sn_fault_dict(c);
    if (d == NULL || d == Py_None) {
        Py_XDECREF(d);
        return d == NULL ? -1 : 0;
    }
    PyObject *type = c->fail.failure.reason == SYMNCCL_FAULT_MISMATCH
                         ? st->CallMismatchError : st->PeerTimeoutError;
    PyObject *exc = PyObject_CallFunctionObjArgs(
        type, PyDict_GetItemString(d, "message"), NULL);
    static const char *const attrs[] = {"rank", "collective", "kernel",
                                        "reason", "waited"};
    for (size_t i = 0; exc != NULL && i < sizeof(attrs) / sizeof(*attrs);
         i++)
        if (PyObject_SetAttrString(exc, attrs[i],
                                   PyDict_GetItemString(d, attrs[i])) < 0)
            Py_CLEAR(exc);
    Py_DECREF(d);
    if (exc == NULL)
        return -1;
    PyErr_SetObject(type, exc);
    Py_DECREF(exc);
    return -1;
}

int
sn_fault_check(SNState *st, CommObject *c)
{
    return sn_fault_poll(c) ? sn_fault_raise(st, c) : 0;
}

int
sn_fault_wait_nccl(SNState *st, CommObject *c, int collective)
{
    double start = sn_now(), deadline = start + c->timeout;
    const double spin = start + SN_WAIT_SPIN_SECONDS;
    for (;;) {
        int done;
        double slice = sn_deadline(0.05);
        Py_BEGIN_ALLOW_THREADS
        while (!(done = sn_event_done(c->watch.event)) && !c->life.stop &&
               sn_now() < (slice < deadline ? slice : deadline))
            if (sn_now() >= spin)   /* spin first (runtime.h) */
                sn_fault_nap();
        Py_END_ALLOW_THREADS
        /* an abort first: the work it stopped may complete as it gives up,
         * and the call must not read as a success then */
        if (c->life.stop) {
            PyErr_Format(PyExc_RuntimeError, "%s on rank %d was interrupted "
                         "by abort()", sn_collective_name(collective), c->rank);
            return -1;
        }
        if (done)
            return 0;
        if (PyErr_CheckSignals() < 0)
            return -1;
        if (sn_now() >= deadline) {
            sn_fault_record(c, SYMNCCL_FAULT_TIMEOUT, SYMNCCL_K_COUNT,
                            collective, -1, SYMNCCL_WAIT_NCCL,
                            sn_now() - start, NULL);
            return sn_fault_raise(st, c);
        }
    }
}

PyObject *
sn_py_abort_on_signal(PyObject *module, PyObject *arg)
{
    int sig = PyLong_AsLong(arg);
    if (sig == -1 && PyErr_Occurred())
        return NULL;
    const int rc = sn_abort_on_signal(sig);
    if (rc == -2) {
        PyErr_Format(PyExc_ValueError, "signal %d is out of range", sig);
        return NULL;
    }
    if (rc < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ */
/* Testing: the fault word's code, for the CPU tests
 * (tests/test_faults.py). */

static PyObject *
py_fault_code(PyObject *module, PyObject *args)
{
    int reason, origin, blamed;
    if (!PyArg_ParseTuple(args, "iii:_fault_code", &reason, &origin,
                          &blamed))
        return NULL;
    if (origin < 0 || origin >= SYMNCCL_MAX_RANKS || blamed < -1 ||
        blamed >= SYMNCCL_MAX_RANKS) {
        PyErr_Format(PyExc_ValueError, "ranks 0..%d (blamed: -1 too) "
                     "expected", SYMNCCL_MAX_RANKS - 1);
        return NULL;
    }
    const uint64_t w = SYMNCCL_FAULT_CODE(reason, origin, blamed);
    return Py_BuildValue("(Kiii)", (unsigned long long)w,
                         SYMNCCL_FAULT_REASON(w), SYMNCCL_FAULT_ORIGIN(w),
                         SYMNCCL_FAULT_NAMED(w));
}

static PyMethodDef fault_methods[] = {
    {"_fault_code", py_fault_code, METH_VARARGS,
     "_fault_code(reason, origin, blamed)\n--\n\n"
     "Testing: a fault word's code and what it decodes to: (word, reason, "
     "origin, named)."},
    {NULL, NULL, 0, NULL},
};

int
sn_fault_export(PyObject *module)
{
    return PyModule_AddFunctions(module, fault_methods);
}
