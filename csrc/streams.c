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
sn_default_stream(SNState *st, PyObject *tensor, int device,
                  cudaStream_t *out)
{
    *out = NULL;
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

cudaError_t
sn_capture_id(cudaStream_t s, unsigned long long *id)
{
    enum cudaStreamCaptureStatus cs;
    unsigned long long i = 0;
    cudaError_t e = cudaStreamGetCaptureInfo(s, &cs, &i, NULL, NULL, NULL,
                                             NULL);
    *id = e == cudaSuccess && cs == cudaStreamCaptureStatusActive ? i : 0;
    return e;
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
