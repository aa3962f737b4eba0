/* The Python face of the XLA handlers (xla/xla_ffi.c, which never calls
 * the Python API): the module functions _xla_handler, _xla_register and
 * _xla_stats, _C.XLA_HANDLERS, and the closing hook, which drops the
 * handlers' registry's references. */
#include "symnccl.h"

#include <stdio.h>
#include <string.h>

/* The closing hook (SNState.on_closing, GIL held): c leaves the registry
 * and the registry's reference goes (the caller holds one of its own), so
 * no handler enters c again. */
static void
on_closing(CommObject *c)
{
    int held = sn_xla_unregister(c);
    while (held-- > 0)
        Py_DECREF((PyObject *)c);
}

void
sn_xla_init(SNState *st)
{
    st->on_closing = on_closing;
    sn_comm_on_close(sn_xla_on_close);
}

/* _xla_handler(collective="all_reduce") -> PyCapsule of that collective's
 * handler, for jax.ffi.register_ffi_target. */
PyObject *
sn_py_xla_handler(PyObject *module, PyObject *args)
{
    const char *which = "all_reduce";
    if (!PyArg_ParseTuple(args, "|s:_xla_handler", &which))
        return NULL;
    char names[256];
    size_t len = 0;
    const size_t n = sn_xla_n_handlers();
    for (size_t i = 0; i < n; i++) {
        if (strcmp(which, sn_xla_handler_name(i)) == 0)
            return PyCapsule_New(sn_xla_handler_fn(i), NULL, NULL);
        if (len < sizeof(names))
            len += (size_t)snprintf(names + len, sizeof(names) - len,
                                    "%s'%s'", i == 0 ? ""
                                              : i + 1 < n ? ", " : " or ",
                                    sn_xla_handler_name(i));
    }
    PyErr_Format(PyExc_ValueError, "no XLA handler for '%s': expected %s",
                 which, names);
    return NULL;
}

int
sn_xla_export(PyObject *module)
{
    const size_t n = sn_xla_n_handlers();
    PyObject *names = PyTuple_New((Py_ssize_t)n);
    for (size_t i = 0; names != NULL && i < n; i++) {
        PyObject *s = PyUnicode_FromString(sn_xla_handler_name(i));
        /* PyTuple_SetItem steals s, even when it fails */
        if (s == NULL || PyTuple_SetItem(names, (Py_ssize_t)i, s) < 0)
            Py_CLEAR(names);
    }
    const int bad = names == NULL ||
                    PyModule_AddObjectRef(module, "XLA_HANDLERS", names) < 0;
    Py_XDECREF(names);
    return bad ? -1 : 0;
}


/* _xla_register(comm): the handler uses comm for comm.device. */
PyObject *
sn_py_xla_register(PyObject *module, PyObject *arg)
{
    SNState *st = PyModule_GetState(module);
    if (!PyObject_TypeCheck(arg, st->CommunicatorType)) {
        PyErr_Format(PyExc_TypeError, "expected a symnccl.Communicator, got "
                     "%T", arg);
        return NULL;
    }
    CommObject *c = (CommObject *)arg;
    if (c->device < 0 || c->device >= SN_XLA_MAX_DEVICES) {
        PyErr_Format(PyExc_ValueError, "device %d is out of range for the "
                     "XLA handler (< %d)", c->device, SN_XLA_MAX_DEVICES);
        return NULL;
    }
    if (c->loopback != NULL) {
        PyErr_SetString(PyExc_ValueError, "a loopback communicator "
                        "(Communicator._loopback) has no NCCL communicator "
                        "for the XLA handler");
        return NULL;
    }
    /* entered while it goes in: an OPEN communicator (a teardown that
     * begins later takes it out again: on_closing) */
    if (sn_comm_enter(st, c) < 0)
        return NULL;
    CommObject *old =
        sn_xla_swap(c->device, (CommObject *)Py_NewRef((PyObject *)c));
    sn_comm_leave(st, c);
    /* the one it replaces may go now (its teardown waits for the handlers
     * inside it) */
    Py_XDECREF((PyObject *)old);
    Py_RETURN_NONE;
}

/* _xla_stats(device) -> (window_calls, staged_calls, registrations) */
PyObject *
sn_py_xla_stats(PyObject *module, PyObject *arg)
{
    long d = PyLong_AsLong(arg);
    if (d == -1 && PyErr_Occurred())
        return NULL;
    if (d < 0 || d >= SN_XLA_MAX_DEVICES) {
        PyErr_Format(PyExc_ValueError, "device %ld is out of range", d);
        return NULL;
    }
    unsigned long long s[3];
    sn_xla_get_stats((int)d, s);
    return Py_BuildValue("(KKK)", s[0], s[1], s[2]);
}
