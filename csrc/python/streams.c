/* Streams and devices. Internally a stream is a cudaStream_t, NULL being the
 * legacy default; DLPack's numbering (1 legacy, 2 per-thread) equals
 * cudaStreamLegacy and cudaStreamPerThread.
 */
#include "symnccl.h"

static int
stream_from_int(PyObject *v, cudaStream_t *out)
{
    unsigned long long h = PyLong_AsUnsignedLongLong(v);
    if (h == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "stream handle must be a "
                     "non-negative integer, got %R", v);
        return -1;
    }
    *out = h == 1 ? NULL : (cudaStream_t)(uintptr_t)h;
    return 0;
}

int
sn_parse_stream(PyObject *obj, cudaStream_t *out)
{
    if (obj == NULL || obj == Py_None) {
        *out = NULL;
        return 0;
    }
    if (PyLong_Check(obj))
        return stream_from_int(obj, out);
    PyObject *v = NULL;
    if (PyObject_HasAttrString(obj, "__cuda_stream__")) {
        /* CUDA stream protocol: returns (version, handle). */
        PyObject *pair = PyObject_CallMethod(obj, "__cuda_stream__", NULL);
        if (pair == NULL)
            return -1;
        if (PyTuple_Check(pair) && PyTuple_Size(pair) == 2)
            v = Py_NewRef(PyTuple_GetItem(pair, 1));
        Py_DECREF(pair);
    }
    else if (PyObject_HasAttrString(obj, "cuda_stream"))   /* torch */
        v = PyObject_GetAttrString(obj, "cuda_stream");
    else if (PyObject_HasAttrString(obj, "ptr"))   /* cupy */
        v = PyObject_GetAttrString(obj, "ptr");
    if (v == NULL || !PyLong_Check(v)) {
        Py_XDECREF(v);
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_TypeError,
                         "stream must be an int handle or a CUDA stream "
                         "object (torch.cuda.Stream, cupy Stream, or one "
                         "with __cuda_stream__), got %R", Py_TYPE(obj));
        return -1;
    }
    int rc = stream_from_int(v, out);
    Py_DECREF(v);
    return rc;
}

int
sn_torch_lookup(SNState *st)
{
    if (st->torch_tensor != NULL)
        return 1;
    PyObject *mods = PySys_GetObject("modules");   /* borrowed */
    PyObject *torch = mods ? PyDict_GetItemString(mods, "torch") : NULL;
    if (torch == NULL)
        return 0;
    PyObject *tensor = PyObject_GetAttrString(torch, "Tensor");
    PyObject *c = PyObject_GetAttrString(torch, "_C");
    PyObject *raw = c ? PyObject_GetAttrString(c, "_cuda_getCurrentRawStream")
                      : NULL;
    Py_XDECREF(c);
    if (tensor == NULL || raw == NULL || !PyType_Check(tensor)) {
        PyErr_Clear();
        Py_XDECREF(tensor);
        Py_XDECREF(raw);
        return 0;
    }
    st->torch_tensor = tensor;
    st->torch_raw_stream = raw;
    return 1;
}

int
sn_is_torch_tensor(SNState *st, PyObject *obj)
{
    return obj != Py_None && sn_torch_lookup(st) &&
           PyObject_TypeCheck(obj, (PyTypeObject *)st->torch_tensor);
}

PyObject *
sn_py_torch_eager_install(PyObject *module, PyObject *args)
{
    SNState *st = PyModule_GetState(module);
    PyObject *types, *attr, *checks, *grad_mode;
    if (!PyArg_ParseTuple(args, "O!UO!O", &PyTuple_Type, &types, &attr,
                          &PyTuple_Type, &checks, &grad_mode))
        return NULL;
    PyObject *old[4] = {st->eager_types, st->eager_attr, st->eager_checks,
                        st->eager_grad_mode};
    st->eager_types = Py_NewRef(types);
    st->eager_attr = Py_NewRef(attr);
    st->eager_checks = Py_NewRef(checks);
    st->eager_grad_mode = Py_NewRef(grad_mode);
    for (int i = 0; i < 4; i++)
        Py_XDECREF(old[i]);
    Py_RETURN_NONE;
}

/* 0 unless x's type is exactly one of eager_types, x.<eager_attr> is true
 * and every check returns a false value; then 2 when autograd records a
 * call on x (x.requires_grad, grad mode on), else 1. Seven Python calls
 * cost ~1.5 us a call; this one ~0.4 (issue 29). 0 until installed. */
PyObject *
sn_py_torch_eager(PyObject *module, PyObject *x)
{
    SNState *st = PyModule_GetState(module);
    if (st->eager_types == NULL)
        return PyLong_FromLong(0);
    /* held here: a check that reinstalls the gate cannot free them */
    PyObject *types = Py_NewRef(st->eager_types);
    PyObject *attr = Py_NewRef(st->eager_attr);
    PyObject *checks = Py_NewRef(st->eager_checks);
    PyObject *grad_mode = Py_NewRef(st->eager_grad_mode);
    int ok = 0;
    const Py_ssize_t ntypes = PyTuple_Size(types);
    for (Py_ssize_t i = 0; i < ntypes; i++)   /* borrowed items */
        ok |= (PyObject *)Py_TYPE(x) == PyTuple_GetItem(types, i);
    PyObject *r;
    if (ok) {
        r = PyObject_GetAttr(x, attr);
        ok = r != NULL ? PyObject_IsTrue(r) : -1;
        Py_XDECREF(r);
    }
    const Py_ssize_t nchecks = PyTuple_Size(checks);
    for (Py_ssize_t i = 0; ok == 1 && i < nchecks; i++) {
        r = PyObject_CallNoArgs(PyTuple_GetItem(checks, i));
        const int active = r != NULL ? PyObject_IsTrue(r) : -1;
        Py_XDECREF(r);
        ok = active < 0 ? -1 : !active;
    }
    if (ok == 1) {   /* 2 when autograd records it */
        r = PyObject_GetAttr(x, st->torch_names[SN_TORCH_REQUIRES_GRAD]);
        int rec = r != NULL ? PyObject_IsTrue(r) : -1;
        Py_XDECREF(r);
        if (rec == 1) {
            r = PyObject_CallNoArgs(grad_mode);
            rec = r != NULL ? PyObject_IsTrue(r) : -1;
            Py_XDECREF(r);
        }
        ok = rec < 0 ? -1 : 1 + rec;
    }
    Py_DECREF(types);
    Py_DECREF(attr);
    Py_DECREF(checks);
    Py_DECREF(grad_mode);
    return ok < 0 ? NULL : PyLong_FromLong(ok);
}

int
sn_default_stream(SNState *st, PyObject *tensor, int device,
                  cudaStream_t *out, int *torch_current)
{
    *out = NULL;
    if (torch_current != NULL)
        *torch_current = 0;
    /* a torch tensor: torch's current stream, read here (the hook's Python
     * frame cost about a microsecond per call) */
    if (sn_is_torch_tensor(st, tensor)) {
        PyObject *dev = PyLong_FromLong(device);
        PyObject *r = dev != NULL ? PyObject_CallFunctionObjArgs(
                                        st->torch_raw_stream, dev, NULL)
                                  : NULL;
        Py_XDECREF(dev);
        if (r == NULL)
            return -1;
        *out = PyLong_AsVoidPtr(r);
        Py_DECREF(r);
        if (PyErr_Occurred())
            return -1;
        if (torch_current != NULL)
            *torch_current = 1;
        return 0;
    }
    if (st->stream_hook == NULL)
        return 0;
    PyObject *dev = PyLong_FromLong(device);
    if (dev == NULL)
        return -1;
    PyObject *r = PyObject_CallFunctionObjArgs(st->stream_hook, tensor, dev,
                                               NULL);
    Py_DECREF(dev);
    if (r == NULL)
        return -1;
    int rc = sn_parse_stream(r, out);
    Py_DECREF(r);
    return rc;
}

intptr_t
sn_stream_to_dlpack(cudaStream_t s)
{
    return s == NULL ? SN_DLPACK_STREAM_LEGACY : (intptr_t)s;
}

int
sn_device_push(SNState *st, int device, int *prev)
{
    cudaError_t e = cudaGetDevice(prev);
    if (e != cudaSuccess)
        return sn_set_cuda_error(st, e, "cudaGetDevice");
    if (*prev != device) {
        e = cudaSetDevice(device);
        if (e != cudaSuccess)
            return sn_set_cuda_error(st, e, "cudaSetDevice");
    }
    return 0;
}

void
sn_device_pop(int prev)
{
    int cur;
    if (cudaGetDevice(&cur) == cudaSuccess && cur != prev)
        (void)cudaSetDevice(prev);
}
