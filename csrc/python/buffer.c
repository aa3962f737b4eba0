/* symnccl.SymmetricBuffer: device memory from ncclMemAlloc, registered as
 * one NCCL_WIN_COLL_SYMMETRIC window, exported zero-copy through DLPack
 * (__dlpack__ is here; importing other producers' tensors is dlpack.c).
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

void
sn_buffer_finish_pending(BufferObject *b)
{
    b->pending = 0;
}

int
sn_buffer_order(SNState *st, BufferObject *b, cudaStream_t stream)
{
    if (b->alloc_kind == SN_ALLOC_HOST || !b->has_last_stream ||
        b->last_stream == stream)
        return 0;
    if (b->event == NULL)
        SN_CUDA_GOTO(st, cudaEventCreateWithFlags(&b->event,
                                                  cudaEventDisableTiming),
                     "cudaEventCreate", error);
    SN_CUDA_GOTO(st, cudaEventRecord(b->event, b->last_stream),
                 "cudaEventRecord", error);
    SN_CUDA_GOTO(st, cudaStreamWaitEvent(stream, b->event, 0),
                 "cudaStreamWaitEvent", error);
    return 0;
error:
    return -1;
}

/* The window of a SymmetricBuffer's memory [base, base+size): the live
 * window that holds it (windows.c), else one registered now (collective:
 * every rank registers its buffer), the GIL released while NCCL runs;
 * NULL with an exception. */
static sn_window *
window_acquire(SNState *st, CommObject *c, char *base, size_t size)
{
    sn_window *w = sn_window_share(c, base, size);
    if (w != NULL)
        return w;
    if (c->comm == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a loopback communicator "
                        "(Communicator._loopback) registers no windows");
        return NULL;
    }
    w = sn_window_node(c, base, size);
    if (w == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    ncclResult_t rc;
    Py_BEGIN_ALLOW_THREADS
    rc = sn_window_register(c, w);
    Py_END_ALLOW_THREADS
    if (sn_nccl_complete(st, c, rc, "ncclCommWindowRegister") < 0) {
        /* taken but not completed in time (a timeout, abort()): NCCL may
         * still write w->win, so the node stays, lost */
        if (rc == ncclSuccess || rc == ncclInProgress)
            sn_window_lose(c, w);
        else
            sn_window_forget(c, w);
        return NULL;
    }
    return w;
}

/* A new buffer object of type tp with a C-contiguous shape (its memory
 * not yet set: the callers' own). */
static BufferObject *
buffer_alloc(PyTypeObject *tp, int ndim, const int64_t *shape,
             const sn_dtype *dtype, size_t nbytes)
{
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
    return b;
}

PyObject *
sn_buffer_new(SNState *st, CommObject *comm, PyTypeObject *tp, int ndim,
              const int64_t *shape, const sn_dtype *dtype, int zero,
              cudaStream_t stream)
{
    int device = comm->device;
    size_t nbytes;
    /* before anything is allocated: a shape whose size wraps would export
     * its full shape over a short allocation */
    if (sn_shape_size("buffer", ndim, shape, (size_t)dtype->itemsize, NULL,
                      &nbytes) < 0)
        return NULL;
    /* Same size on every rank (registration is collective) and a whole
     * number of pages, so kernels may read past the tail safely. */
    size_t alloc = (nbytes + SN_WINDOW_ALIGN - 1) / SN_WINDOW_ALIGN *
                   SN_WINDOW_ALIGN;
    if (alloc == 0)
        alloc = SN_WINDOW_ALIGN;

    BufferObject *b = buffer_alloc(tp, ndim, shape, dtype, nbytes);
    if (b == NULL)
        return NULL;
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
        b->win = window_acquire(st, comm, b->ptr, alloc);
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
        /* The window first: its communicator may take the memory over
         * (sn_comm_release_window: never an unbounded wait). Then the
         * memory, GIL released: freeing waits for the device's work, which
         * the watchdog (it needs the GIL) may have to end. */
        int mine = 1;
        if (self->comm != NULL && self->win != NULL)
            mine = sn_comm_release_window(self->comm, self->win, self->ptr);
        self->win = NULL;
        char *p = self->ptr;
        const int nccl = self->alloc_kind == SN_ALLOC_NCCL;
        const int device = self->device;
        cudaEvent_t ev = self->event;
        Py_BEGIN_ALLOW_THREADS
        int prev;
        if (cudaGetDevice(&prev) == cudaSuccess) {
            cudaSetDevice(device);
            if (ev != NULL)
                cudaEventDestroy(ev);
            if (mine && nccl)
                ncclMemFree(p);
            else if (mine)
                cudaFree(p);
            cudaSetDevice(prev);
        }
        (void)cudaGetLastError();
        Py_END_ALLOW_THREADS
    }
    self->ptr = NULL;
    Py_CLEAR(self->comm);
    freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    tp_free(self);
    Py_DECREF(tp);
}

/* ------------------------------------------------------------------ */

/* ------------------------------------------------------------------ */
/* Export                                                               */

typedef struct {
    SN_DLManagedTensorVersioned v;   /* used when versioned */
    SN_DLManagedTensor l;            /* used when legacy */
    int64_t shape[SN_MAX_NDIM];
    int64_t strides[SN_MAX_NDIM];
} sn_export;

static void
export_release(void *ctx)
{
    /* May be called by a consumer from any thread, GIL held or not. */
    sn_export *ex = ctx;
    BufferObject *owner = ex->v.manager_ctx ? ex->v.manager_ctx
                                            : ex->l.manager_ctx;
    PyGILState_STATE g = PyGILState_Ensure();
    owner->exports--;
    Py_DECREF((PyObject *)owner);
    PyGILState_Release(g);
    free(ex);
}

static void
deleter_versioned(SN_DLManagedTensorVersioned *m)
{
    export_release((sn_export *)((char *)m - offsetof(sn_export, v)));
}

static void
deleter_legacy(SN_DLManagedTensor *m)
{
    export_release((sn_export *)((char *)m - offsetof(sn_export, l)));
}

static void
capsule_destructor_versioned(PyObject *cap)
{
    if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        SN_DLManagedTensorVersioned *m =
            PyCapsule_GetPointer(cap, "dltensor_versioned");
        m->deleter(m);
    }
}

static void
capsule_destructor_legacy(PyObject *cap)
{
    if (PyCapsule_IsValid(cap, "dltensor")) {
        SN_DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
        m->deleter(m);
    }
}

static PyObject *
buffer_dlpack(BufferObject *b, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"stream", "max_version", "dl_device", "copy",
                             NULL};
    SNState *st = sn_state_from_type(Py_TYPE((PyObject *)b));
    PyObject *stream_obj = Py_None, *maxv = Py_None, *dl_device = Py_None,
             *copy = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$OOOO:__dlpack__", kwlist,
                                     &stream_obj, &maxv, &dl_device, &copy))
        return NULL;
    if (b->pending) {
        PyErr_SetString(PyExc_BufferError, "buffer is not ready until the "
                        "enclosing symnccl.group() exits");
        return NULL;
    }
    if (b->ptr == NULL) {
        PyErr_SetString(PyExc_BufferError, "buffer has been freed");
        return NULL;
    }
    if (copy == Py_True) {
        PyErr_SetString(PyExc_BufferError, "copy=True is not supported: a "
                        "SymmetricBuffer is exported zero-copy only");
        return NULL;
    }
    if (dl_device != Py_None) {
        int type, id;
        if (!PyArg_ParseTuple(dl_device, "ii", &type, &id))
            return NULL;
        int want = b->alloc_kind == SN_ALLOC_HOST ? SN_kDLCPU : SN_kDLCUDA;
        if (type != want || id != b->device) {
            PyErr_Format(PyExc_BufferError, "dl_device (%d, %d) requested, "
                         "but the buffer lives on (%d, %d) and cannot be "
                         "copied", type, id, want, b->device);
            return NULL;
        }
    }
    int versioned = 0, minor = 0;
    if (maxv != Py_None) {
        int major;
        if (!PyArg_ParseTuple(maxv, "ii", &major, &minor)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "max_version must be a (major, "
                         "minor) tuple, got %R", maxv);
            return NULL;
        }
        versioned = major >= 1;
        if (major > 1)
            minor = SYMNCCL_DLPACK_MINOR;
    }
    /* Stream protocol: make the data ready on the consumer's stream. */
    cudaStream_t consumer = NULL;
    int sync = 1;
    if (stream_obj != Py_None) {
        long long sv = PyLong_AsLongLong(stream_obj);
        if (sv == -1 && PyErr_Occurred())
            return NULL;
        if (sv == 0) {
            PyErr_SetString(PyExc_ValueError, "stream=0 is ambiguous for CUDA "
                            "in DLPack: use 1 (legacy default), 2 "
                            "(per-thread default) or a stream handle");
            return NULL;
        }
        if (sv == SN_DLPACK_STREAM_NO_SYNC)
            sync = 0;
        else if (sv < -1) {
            PyErr_Format(PyExc_ValueError, "invalid DLPack stream %lld", sv);
            return NULL;
        }
        else
            consumer = sv == 1 ? NULL : (cudaStream_t)(uintptr_t)sv;
    }
    if (b->alloc_kind == SN_ALLOC_HOST)
        sync = 0;
    if (sync) {
        int prev;
        if (sn_device_push(st, b->device, &prev) < 0)
            return NULL;
        int rc = sn_buffer_order(st, b, consumer);
        sn_device_pop(prev);
        if (rc < 0)
            return NULL;
    }

    sn_export *ex = calloc(1, sizeof(sn_export));
    if (ex == NULL)
        return PyErr_NoMemory();
    SN_DLTensor *dl = versioned ? &ex->v.dl_tensor : &ex->l.dl_tensor;
    dl->data = b->ptr;
    dl->device.device_type = b->alloc_kind == SN_ALLOC_HOST ? SN_kDLCPU
                                                            : SN_kDLCUDA;
    dl->device.device_id = b->device;
    dl->ndim = b->ndim;
    dl->dtype.code = b->dtype->dl_code;
    dl->dtype.bits = b->dtype->dl_bits;
    dl->dtype.lanes = 1;
    dl->shape = ex->shape;
    dl->strides = ex->strides;
    dl->byte_offset = 0;
    for (int i = 0; i < b->ndim; i++) {
        ex->shape[i] = b->shape[i];
        ex->strides[i] = b->strides[i];
    }
    PyObject *cap;
    if (versioned) {
        ex->v.version.major = SYMNCCL_DLPACK_MAJOR;
        ex->v.version.minor = minor < SYMNCCL_DLPACK_MINOR
                                  ? (minor < 0 ? 0 : (uint32_t)minor)
                                  : SYMNCCL_DLPACK_MINOR;
        ex->v.manager_ctx = b;
        ex->v.deleter = deleter_versioned;
        ex->v.flags = 0;
        cap = PyCapsule_New(&ex->v, "dltensor_versioned",
                            capsule_destructor_versioned);
    }
    else {
        ex->l.manager_ctx = b;
        ex->l.deleter = deleter_legacy;
        cap = PyCapsule_New(&ex->l, "dltensor", capsule_destructor_legacy);
    }
    if (cap == NULL) {
        free(ex);
        return NULL;
    }
    /* The capsule (and whatever consumes it) keeps the buffer alive. */
    Py_INCREF((PyObject *)b);
    b->exports++;
    return cap;
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
    const sn_dtype *dt;
    if (sn_parse_shape(shape_obj, &ndim, shape) < 0 ||
        (dt = sn_parse_dtype(dtype_obj)) == NULL)
        return NULL;
    size_t nbytes;
    if (sn_shape_size("_host_buffer", ndim, shape, (size_t)dt->itemsize,
                      NULL, &nbytes) < 0)
        return NULL;
    BufferObject *b = buffer_alloc(st->DeviceArrayType, ndim, shape, dt,
                                   nbytes);
    if (b == NULL)
        return NULL;
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

static PyObject *get_dtype(BufferObject *s, void *c) { return PyUnicode_FromString(s->dtype->name); }
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
        shape, s->dtype->name, s->device,
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
     "__dlpack__($self, /, *, stream=None, max_version=None, "
     "dl_device=None, copy=None)\n--\n\nDLPack export, zero-copy. Returns a versioned capsule "
     "when max_version >= (1, 0), else a legacy one. The data is made ready "
     "on `stream` (the consumer's)."},
    {"__dlpack_device__", (PyCFunction)buffer_dlpack_device, METH_NOARGS,
     "(2, device): kDLCUDA."},
    {"copy_from_host", (PyCFunction)buffer_copy_from_host, METH_O,
     "copy_from_host($self, obj, /)\n--\n\nCopies a C-contiguous host object with the "
     "buffer protocol (numpy array, bytes) of exactly nbytes bytes into the "
     "buffer, and waits.\n\nExample:\n    buf.copy_from_host(np.ones(n, "
     "np.float32))"},
    {"to_bytes", (PyCFunction)buffer_to_bytes, METH_NOARGS,
     "to_bytes($self, /)\n--\n\n-> bytes: a host copy of the data (waits).\n\nExample:\n"
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
