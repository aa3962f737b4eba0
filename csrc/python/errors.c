/* Errors: one formatter per library (NCCL, CUDA); the exceptions carry
 * .code. sn_raise turns the runtime's sn_err (runtime/base.c) into one. */
#include "symnccl.h"

static int
raise_with_code(PyObject *type, int code, PyObject *msg)
{
    if (msg == NULL)
        return -1;
    PyObject *exc = PyObject_CallFunctionObjArgs(type, msg, NULL);
    Py_DECREF(msg);
    if (exc == NULL)
        return -1;
    PyObject *pycode = PyLong_FromLong(code);
    if (pycode == NULL || PyObject_SetAttrString(exc, "code", pycode) < 0) {
        Py_XDECREF(pycode);
        Py_DECREF(exc);
        return -1;
    }
    Py_DECREF(pycode);
    PyErr_SetObject(type, exc);
    Py_DECREF(exc);
    return -1;
}

int
sn_set_nccl_error(SNState *st, ncclResult_t rc, ncclComm_t comm,
                  const char *what)
{
    const char *last = ncclGetLastError(comm);
    PyObject *msg;
    if (last != NULL && last[0] != '\0')
        msg = PyUnicode_FromFormat("%s failed: %s (ncclResult_t %d): %s",
                                   what, ncclGetErrorString(rc), (int)rc,
                                   last);
    else
        msg = PyUnicode_FromFormat("%s failed: %s (ncclResult_t %d)", what,
                                   ncclGetErrorString(rc), (int)rc);
    return raise_with_code(st->NcclError, (int)rc, msg);
}

int
sn_set_cuda_error(SNState *st, cudaError_t rc, const char *what)
{
    (void)cudaGetLastError();   /* clear the (non-sticky) error slot */
    /* With no driver at all the runtime says its driver is too old; a
     * driver version of 0 means none could be loaded (CUDA runtime API,
     * cudaDriverGetVersion), which is what the user needs to hear. */
    int driver = -1;
    if (rc == cudaErrorInsufficientDriver &&
        cudaDriverGetVersion(&driver) == cudaSuccess && driver == 0)
        return raise_with_code(
            st->CudaError, (int)rc,
            PyUnicode_FromFormat("%s failed: no NVIDIA driver was found "
                                 "(libcuda.so.1 could not be loaded; "
                                 "symnccl needs an NVIDIA GPU and its "
                                 "driver) (%s, cudaError_t %d)",
                                 what, cudaGetErrorName(rc), (int)rc));
    PyObject *msg = PyUnicode_FromFormat("%s failed: %s (%s, cudaError_t %d)",
                                         what, cudaGetErrorString(rc),
                                         cudaGetErrorName(rc), (int)rc);
    return raise_with_code(st->CudaError, (int)rc, msg);
}

int
sn_raise(SNState *st, const sn_err *e)
{
    if (e->nccl != ncclSuccess)
        return sn_set_nccl_error(st, e->nccl, NULL, e->msg);
    if (e->cuda != cudaSuccess)
        return sn_set_cuda_error(st, e->cuda, e->msg);
    switch (e->kind) {
    case SN_ERR_NO_MEMORY:
        PyErr_NoMemory();
        return -1;
    case SN_ERR_NOT_IMPLEMENTED:
        PyErr_SetString(PyExc_NotImplementedError, e->msg);
        return -1;
    case SN_ERR_VALUE:
        PyErr_SetString(PyExc_ValueError, e->msg);
        return -1;
    case SN_ERR_SYSTEM:
        PyErr_SetString(PyExc_SystemError, e->msg);
        return -1;
    default:
        PyErr_SetString(PyExc_RuntimeError, e->msg);
        return -1;
    }
}
