/* symnccl.SymmetricBuffer: device memory from ncclMemAlloc, registered as
 * one NCCL_WIN_COLL_SYMMETRIC window, exported zero-copy through DLPack.
 * symnccl.DeviceArray: plain cudaMalloc memory with the same export, used
 * for results handed to frameworks that cannot be written in place (JAX).
 *
 * Lifetime: every DLPack capsule and every consumer view holds a reference
 * to the buffer, and the buffer holds one to its communicator, so memory and
 * window live as long as any view. Closing the communicator deregisters the
 * window but leaves the memory valid; it is freed when the last view dies.
 */
#include "symnccl.h"

#include <stdlib.h>
#include <string.h>

#define SN_WINDOW_ALIGN 4096

int
sn_is_buffer(SNState *st, PyObject *o)
{
    return Py_TYPE(o) == st->SymmetricBufferType ||
           Py_TYPE(o) == st->DeviceArrayType;
}

void
sn_buffer_mark_written(BufferObject *b, cudaStream_t stream)
{
    b->last_stream = stream;
    b->has_last_stream = 1;
}

int
sn_buffer_finish_pending(SNState *st, BufferObject *b)
{
    b->pending = 0;
    return 0;
}

PyObject *
sn_buffer_new(SNState *st, CommObject *comm, PyTypeObject *tp, int ndim,
              const int64_t *shape, SN_DLDataType dtype, int zero,
              cudaStream_t stream)
{
    int device = comm->device;
    size_t count = 1;
    for (int i = 0; i < ndim; i++)
        count *= (size_t)shape[i];
    size_t nbytes = count * (size_t)sn_dtype_itemsize(dtype);
    /* Same size on every rank (registration is collective) and a whole
     * number of pages, so kernels may read past the tail safely. */
    size_t alloc = (nbytes + SN_WINDOW_ALIGN - 1) / SN_WINDOW_ALIGN *
                   SN_WINDOW_ALIGN;
    if (alloc == 0)
        alloc = SN_WINDOW_ALIGN;

    allocfunc tp_alloc = (allocfunc)PyType_GetSlot(tp, Py_tp_alloc);
    BufferObject *b = (BufferObject *)tp_alloc(tp, 0);
    if (b == NULL)
        return NULL;
    b->ndim = ndim;
    b->dtype = dtype;
    b->nbytes = nbytes;
    int64_t stride = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        b->shape[i] = shape[i];
        b->strides[i] = stride;
        stride *= shape[i] > 0 ? shape[i] : 1;
    }
    b->device = device;

    int prev;
    if (sn_device_push(st, device, &prev) < 0) {
        Py_DECREF(b);
        return NULL;
    }
    if (tp == st->SymmetricBufferType) {
        ncclResult_t rc;
        void *p = NULL;
        Py_BEGIN_ALLOW_THREADS
        rc = ncclMemAlloc(&p, alloc);
        Py_END_ALLOW_THREADS
        if (rc != ncclSuccess) {
            sn_set_nccl_error(st, rc, comm->comm, "ncclMemAlloc");
            goto error;
        }
        b->ptr = p;
        b->alloc_kind = SN_ALLOC_NCCL;
        b->comm = (CommObject *)Py_NewRef((PyObject *)comm);
    }
    else {
        void *p = NULL;
        SN_CUDA_GOTO(st, cudaMalloc(&p, alloc), "cudaMalloc", error);
        b->ptr = p;
        b->alloc_kind = SN_ALLOC_CUDA;
    }
    if (zero) {
        cudaError_t e;
        Py_BEGIN_ALLOW_THREADS
        e = cudaMemsetAsync(b->ptr, 0, alloc, NULL);
        if (e == cudaSuccess)
            e = cudaStreamSynchronize(NULL);
        Py_END_ALLOW_THREADS
        SN_CUDA_GOTO(st, e, "cudaMemset", error);
    }
    if (stream != NULL)
        sn_buffer_mark_written(b, stream);
    if (tp == st->SymmetricBufferType) {
        b->win = sn_comm_window_acquire(st, comm, b->ptr, alloc);
        if (b->win == NULL)
            goto error;
        if (st->group_depth > 0) {
            b->pending = 1;
            if (PyList_Append(st->group_pending, (PyObject *)b) < 0)
                goto error;
        }
    }
    sn_device_pop(prev);
    return (PyObject *)b;

error:
    sn_device_pop(prev);
    Py_DECREF(b);
    return NULL;
}

static void
buffer_dealloc(BufferObject *self)
{
    PyTypeObject *tp = Py_TYPE((PyObject *)self);
    SNState *st = sn_state_from_type(tp);
    int leak = st == NULL || st->shutting_down;
    if (self->alloc_kind == SN_ALLOC_HOST) {
        free(self->ptr);
        self->ptr = NULL;
    }
    if (!leak && self->ptr != NULL) {
        int prev;
        if (cudaGetDevice(&prev) == cudaSuccess) {
            cudaSetDevice(self->device);
            if (self->comm != NULL && self->win != NULL)
                sn_comm_window_release(self->comm, self->win);
            if (self->event != NULL)
                cudaEventDestroy(self->event);
            if (self->alloc_kind == SN_ALLOC_NCCL)
                ncclMemFree(self->ptr);
            else
                cudaFree(self->ptr);
            cudaSetDevice(prev);
        }
        (void)cudaGetLastError();
    }
    self->ptr = NULL;
    Py_CLEAR(self->comm);
    freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    tp_free(self);
    Py_DECREF(tp);
}

/* ------------------------------------------------------------------ */

static PyObject *
buffer_dlpack(BufferObject *self, PyObject *args, PyObject *kw)
{
    return sn_buffer_dlpack(self, args, kw);
}

static PyObject *
buffer_dlpack_device(BufferObject *self, PyObject *unused)
{
    return Py_BuildValue("(ii)", self->alloc_kind == SN_ALLOC_HOST
                                     ? SN_kDLCPU : SN_kDLCUDA, self->device);
}

PyObject *
sn_py_host_buffer(PyObject *module, PyObject *args)
{
    SNState *st = PyModule_GetState(module);
    PyObject *shape_obj, *dtype_obj;
    if (!PyArg_ParseTuple(args, "OO", &shape_obj, &dtype_obj))
        return NULL;
    int ndim;
    int64_t shape[SN_MAX_NDIM];
    SN_DLDataType dt;
    if (sn_parse_shape(shape_obj, &ndim, shape) < 0 ||
        sn_parse_dtype(dtype_obj, &dt) < 0)
        return NULL;
    PyTypeObject *tp = st->DeviceArrayType;
    BufferObject *b = (BufferObject *)((allocfunc)PyType_GetSlot(
        tp, Py_tp_alloc))(tp, 0);
    if (b == NULL)
        return NULL;
    size_t count = 1;
    int64_t stride = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        b->shape[i] = shape[i];
        b->strides[i] = stride;
        stride *= shape[i] > 0 ? shape[i] : 1;
        count *= (size_t)shape[i];
    }
    b->ndim = ndim;
    b->dtype = dt;
    b->nbytes = count * (size_t)sn_dtype_itemsize(dt);
    b->alloc_kind = SN_ALLOC_HOST;
    b->ptr = calloc(1, b->nbytes ? b->nbytes : 1);
    if (b->ptr == NULL) {
        Py_DECREF(b);
        return PyErr_NoMemory();
    }
    return (PyObject *)b;
}

static int
buffer_ready(SNState *st, BufferObject *b)
{
    if (b->pending) {
        PyErr_SetString(PyExc_RuntimeError, "buffer is not ready until the "
                        "enclosing symnccl.group() exits");
        return -1;
    }
    return 0;
}

/* Host copies, for framework-free use (the CLI self-check, tests). They
 * order after the last op that wrote the buffer and wait for completion. */
static PyObject *
buffer_copy_from_host(BufferObject *self, PyObject *arg)
{
    SNState *st = sn_state_from_type(Py_TYPE((PyObject *)self));
    if (buffer_ready(st, self) < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    PyObject *res = NULL;
    if ((size_t)view.len != self->nbytes) {
        PyErr_Format(PyExc_ValueError, "copy_from_host: source has %zd "
                     "bytes, buffer has %zu", view.len, self->nbytes);
        goto done;
    }
    if (self->alloc_kind == SN_ALLOC_HOST) {
        memcpy(self->ptr, view.buf, self->nbytes);
        res = Py_NewRef(Py_None);
        goto done;
    }
    int prev;
    if (sn_device_push(st, self->device, &prev) < 0)
        goto done;
    cudaStream_t s = self->has_last_stream ? self->last_stream : NULL;
    cudaError_t e;
    Py_BEGIN_ALLOW_THREADS
    e = cudaMemcpyAsync(self->ptr, view.buf, self->nbytes,
                        cudaMemcpyHostToDevice, s);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(s);
    Py_END_ALLOW_THREADS
    sn_device_pop(prev);
    if (e != cudaSuccess) {
        sn_set_cuda_error(st, e, "cudaMemcpy (host to device)");
        goto done;
    }
    res = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&view);
    return res;
}

static PyObject *
buffer_to_bytes(BufferObject *self, PyObject *unused)
{
    SNState *st = sn_state_from_type(Py_TYPE((PyObject *)self));
    if (buffer_ready(st, self) < 0)
        return NULL;
    PyObject *out = PyBytes_FromStringAndSize(NULL,
                                              (Py_ssize_t)self->nbytes);
    if (out == NULL)
        return NULL;
    if (self->alloc_kind == SN_ALLOC_HOST) {
        memcpy(PyBytes_AsString(out), self->ptr, self->nbytes);
        return out;
    }
    int prev;
    if (sn_device_push(st, self->device, &prev) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    cudaStream_t s = self->has_last_stream ? self->last_stream : NULL;
    char *dst = PyBytes_AsString(out);
    cudaError_t e;
    Py_BEGIN_ALLOW_THREADS
    e = cudaMemcpyAsync(dst, self->ptr, self->nbytes, cudaMemcpyDeviceToHost,
                        s);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(s);
    Py_END_ALLOW_THREADS
    sn_device_pop(prev);
    if (e != cudaSuccess) {
        Py_DECREF(out);
        return (sn_set_cuda_error(st, e, "cudaMemcpy (device to host)"),
                NULL);
    }
    return out;
}

static PyObject *
get_shape(BufferObject *s, void *c)
{
    PyObject *t = PyTuple_New(s->ndim);
    for (int i = 0; t != NULL && i < s->ndim; i++)
        PyTuple_SetItem(t, i, PyLong_FromLongLong(s->shape[i]));
    return t;
}

static PyObject *get_dtype(BufferObject *s, void *c) { return PyUnicode_FromString(sn_dtype_name(s->dtype)); }
static PyObject *get_nbytes(BufferObject *s, void *c) { return PyLong_FromSize_t(s->nbytes); }
static PyObject *get_bdevice(BufferObject *s, void *c) { return PyLong_FromLong(s->device); }
static PyObject *get_ptr(BufferObject *s, void *c) { return PyLong_FromVoidPtr(s->ptr); }
static PyObject *get_exports(BufferObject *s, void *c) { return PyLong_FromSsize_t(s->exports); }

static PyObject *
get_size(BufferObject *s, void *c)
{
    long long n = 1;
    for (int i = 0; i < s->ndim; i++)
        n *= s->shape[i];
    return PyLong_FromLongLong(n);
}

static PyObject *
get_registered(BufferObject *s, void *c)
{
    return PyBool_FromLong(s->win != NULL && s->win->win != NULL &&
                           !s->pending);
}

static PyObject *
get_comm(BufferObject *s, void *c)
{
    return Py_NewRef(s->comm ? (PyObject *)s->comm : Py_None);
}

static PyObject *
buffer_repr(BufferObject *s)
{
    PyObject *shape = get_shape(s, NULL);
    if (shape == NULL)
        return NULL;
    PyObject *r = PyUnicode_FromFormat(
        "<symnccl.%s shape=%R dtype=%s device=cuda:%d%s>",
        s->alloc_kind == SN_ALLOC_NCCL ? "SymmetricBuffer" : "DeviceArray",
        shape, sn_dtype_name(s->dtype), s->device,
        s->alloc_kind == SN_ALLOC_NCCL
            ? (s->win && s->win->win ? " window" : " unregistered") : "");
    Py_DECREF(shape);
    return r;
}

static PyGetSetDef buffer_getset[] = {
    {"shape", (getter)get_shape, NULL, "Shape tuple.", NULL},
    {"dtype", (getter)get_dtype, NULL, "dtype name, e.g. 'bfloat16'.", NULL},
    {"size", (getter)get_size, NULL, "Number of elements.", NULL},
    {"nbytes", (getter)get_nbytes, NULL, "Bytes of data.", NULL},
    {"device", (getter)get_bdevice, NULL, "CUDA device ordinal.", NULL},
    {"ptr", (getter)get_ptr, NULL, "Device address of element 0.", NULL},
    {"registered", (getter)get_registered, NULL,
     "True while an NCCL symmetric window covers the buffer.", NULL},
    {"comm", (getter)get_comm, NULL, "The owning Communicator, or None.",
     NULL},
    {"_exports", (getter)get_exports, NULL, NULL, NULL},
    {NULL},
};

static PyMethodDef buffer_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))buffer_dlpack,
     METH_VARARGS | METH_KEYWORDS,
     "__dlpack__(*, stream=None, max_version=None, dl_device=None, "
     "copy=None)\n\nDLPack export, zero-copy. Returns a versioned capsule "
     "when max_version >= (1, 0), else a legacy one. The data is made ready "
     "on `stream` (the consumer's)."},
    {"__dlpack_device__", (PyCFunction)buffer_dlpack_device, METH_NOARGS,
     "(2, device): kDLCUDA."},
    {"copy_from_host", (PyCFunction)buffer_copy_from_host, METH_O,
     "copy_from_host(obj)\n\nCopies a C-contiguous host object with the "
     "buffer protocol (numpy array, bytes) of exactly nbytes bytes into the "
     "buffer, and waits.\n\nExample:\n    buf.copy_from_host(np.ones(n, "
     "np.float32))"},
    {"to_bytes", (PyCFunction)buffer_to_bytes, METH_NOARGS,
     "to_bytes() -> bytes\n\nA host copy of the data (waits).\n\nExample:\n"
     "    a = np.frombuffer(buf.to_bytes(), np.float32)"},
    {NULL},
};

static PyObject *
buffer_new_refused(PyTypeObject *tp, PyObject *a, PyObject *k)
{
    PyErr_SetString(PyExc_TypeError, "buffers cannot be created directly: "
                    "use Communicator.empty() or Communicator.zeros()");
    return NULL;
}

static PyType_Slot symmetric_slots[] = {
    {Py_tp_doc,
     "Device memory from ncclMemAlloc with one NCCL symmetric window, made "
     "by Communicator.empty()/zeros(). Exported zero-copy with DLPack: "
     "torch.from_dlpack(buf), jax.dlpack.from_dlpack(buf), "
     "cupy.from_dlpack(buf) all see buf.ptr."},
    {Py_tp_new, buffer_new_refused},
    {Py_tp_dealloc, buffer_dealloc},
    {Py_tp_repr, buffer_repr},
    {Py_tp_methods, buffer_methods},
    {Py_tp_getset, buffer_getset},
    {0, NULL},
};

static PyType_Slot device_array_slots[] = {
    {Py_tp_doc,
     "Plain device memory (cudaMalloc) with DLPack export: results symnccl "
     "hands to frameworks whose arrays are immutable."},
    {Py_tp_new, buffer_new_refused},
    {Py_tp_dealloc, buffer_dealloc},
    {Py_tp_repr, buffer_repr},
    {Py_tp_methods, buffer_methods},
    {Py_tp_getset, buffer_getset},
    {0, NULL},
};

PyType_Spec sn_symmetric_buffer_spec = {
    .name = "symnccl.SymmetricBuffer",
    .basicsize = sizeof(BufferObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = symmetric_slots,
};

PyType_Spec sn_device_array_spec = {
    .name = "symnccl.DeviceArray",
    .basicsize = sizeof(BufferObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = device_array_slots,
};
