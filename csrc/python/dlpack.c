/* DLPack import: borrow any producer's tensor (torch, jax, cupy, numpy,
 * ours) for the span of one call, zero-copy. (The export of symnccl's own
 * buffers is buffer.c's __dlpack__.)
 */
#include "symnccl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int
sn_is_immutable(PyObject *obj)
{
    PyObject *mod = PyObject_GetAttrString((PyObject *)Py_TYPE(obj),
                                           "__module__");
    if (mod == NULL) {
        PyErr_Clear();
        return 0;
    }
    int r = 0;
    const char *m = PyUnicode_Check(mod) ? PyUnicode_AsUTF8AndSize(mod, NULL)
                                         : NULL;
    if (m != NULL)
        r = strncmp(m, "jax", 3) == 0;
    else
        PyErr_Clear();
    Py_DECREF(mod);
    return r;
}

static const char *
device_type_name(int t)
{
    switch (t) {
    case SN_kDLCPU: return "a CPU";
    case SN_kDLCUDA: return "a CUDA";
    case SN_kDLCUDAHost: return "a CUDA host (pinned) memory";
    case SN_kDLCUDAManaged: return "a CUDA managed memory";
    case SN_kDLROCM: return "a ROCm";
    default: return "a non-CUDA";
    }
}

/* device == -1: accept CPU tensors (the testing hook only). */
static int
check_device(int type, int id, int device, const char *argname)
{
    if (device == -1 && type == SN_kDLCPU)
        return 0;
    if (type != SN_kDLCUDA) {
        PyErr_Format(PyExc_ValueError, "%s: expected a CUDA tensor on "
                     "cuda:%d, got %s tensor (DLPack device type %d)",
                     argname, device < 0 ? 0 : device,
                     device_type_name(type), type);
        return -1;
    }
    if (id != device) {
        PyErr_Format(PyExc_ValueError, "%s: tensor is on cuda:%d, "
                     "communicator is on cuda:%d", argname, id, device);
        return -1;
    }
    return 0;
}

static void
release_managed(void *managed, int versioned)
{
    if (managed == NULL)
        return;
    if (versioned) {
        SN_DLManagedTensorVersioned *m = managed;
        if (m->deleter)
            m->deleter(m);
    }
    else {
        SN_DLManagedTensor *m = managed;
        if (m->deleter)
            m->deleter(m);
    }
}

int
sn_tensor_check_output(const SNTensor *t, const char *what)
{
    if (t->readonly) {
        PyErr_Format(PyExc_BufferError, "%s is read-only", what);
        return -1;
    }
    if (t->copied) {
        PyErr_Format(PyExc_BufferError, "%s is a copy its producer made "
                     "(DLPack flag IS_COPIED): a result written into it "
                     "would never reach the tensor passed; expected a tensor "
                     "whose memory is its own (on the communicator's device)",
                     what);
        return -1;
    }
    return 0;
}

void
sn_tensor_release(SNTensor *t)
{
    release_managed(t->managed, t->versioned);
    t->managed = NULL;
    Py_CLEAR(t->capsule);
}

static int
fill_from_dltensor(SNTensor *t, const SN_DLTensor *dl, int device,
                   const char *argname)
{
    if (check_device(dl->device.device_type, dl->device.device_id, device,
                     argname) < 0)
        return -1;
    const sn_dtype *dt = sn_dtype_by_dlpack(dl->dtype);
    if (dt == NULL) {
        char seen[64], prefix[64];
        snprintf(seen, sizeof(seen), "(DLPack code %d, %d bits, %d lanes)",
                 dl->dtype.code, dl->dtype.bits, dl->dtype.lanes);
        snprintf(prefix, sizeof(prefix), "%s: ", argname);
        return sn_raise_bad_dtype(prefix, seen);
    }
    if (dl->ndim < 0 || dl->ndim > SN_MAX_NDIM) {
        PyErr_Format(PyExc_ValueError, "%s: %d dimensions, at most %d are "
                     "supported", argname, dl->ndim, SN_MAX_NDIM);
        return -1;
    }
    if (dl->ndim > 0 && dl->shape == NULL) {
        PyErr_Format(PyExc_BufferError, "%s: DLPack tensor of %d "
                     "dimensions has no shape", argname, dl->ndim);
        return -1;
    }
    /* negative or overflowing dimensions are refused before anything reads
     * the memory (the strides are checked against this extent below) */
    size_t count, nbytes;
    if (sn_shape_size(argname, dl->ndim, dl->shape, (size_t)dt->itemsize,
                      &count, &nbytes) < 0)
        return -1;
    const uintptr_t base = (uintptr_t)dl->data;
    if (count != 0 &&
        (base == 0 || dl->byte_offset > SN_MAX_BYTES ||
         base + dl->byte_offset < base ||
         base + dl->byte_offset + nbytes < base + dl->byte_offset)) {
        PyErr_Format(PyExc_BufferError, "%s: DLPack tensor at %p + byte "
                     "offset %llu, %zu bytes: expected memory inside the "
                     "address space", argname, dl->data,
                     (unsigned long long)dl->byte_offset, nbytes);
        return -1;
    }
    if (dl->strides != NULL && count > 1) {
        int64_t expect = 1;
        for (int i = dl->ndim - 1; i >= 0; i--) {
            if (dl->shape[i] != 1 && dl->strides[i] != expect) {
                PyErr_Format(PyExc_ValueError,
                             "%s: tensor is not contiguous (dimension %d has "
                             "stride %lld, expected %lld for a compact "
                             "row-major layout); pass x.contiguous()",
                             argname, i, (long long)dl->strides[i],
                             (long long)expect);
                return -1;
            }
            expect *= dl->shape[i];
        }
    }
    t->ptr = (char *)dl->data + dl->byte_offset;
    t->device = dl->device.device_id;
    t->dtype = dt;
    t->ndim = dl->ndim;
    for (int i = 0; i < dl->ndim; i++)
        t->shape[i] = dl->shape[i];
    t->count = count;
    return 0;
}

static int
import_own(SNState *st, BufferObject *b, cudaStream_t stream, int device,
           const char *argname, SNTensor *t)
{
    if (b->pending) {
        PyErr_Format(PyExc_RuntimeError, "%s: buffer is not ready until the "
                     "enclosing symnccl.group() exits", argname);
        return -1;
    }
    int host = b->alloc_kind == SN_ALLOC_HOST;
    if (check_device(host ? SN_kDLCPU : SN_kDLCUDA, b->device, device,
                     argname) < 0)
        return -1;
    t->own = b;
    t->ptr = b->ptr;
    t->device = b->device;
    t->dtype = b->dtype;
    t->ndim = b->ndim;
    t->count = 1;
    for (int i = 0; i < b->ndim; i++) {
        t->shape[i] = b->shape[i];
        t->count *= (size_t)b->shape[i];
    }
    /* The last op that wrote the buffer ran on last_stream: order it. */
    return sn_buffer_order(st, b, stream);
}

/* The stream argument is for CUDA producers; CPU ones take None. */
static PyObject *
call_dlpack(SNState *st, PyObject *obj, cudaStream_t stream, int cuda)
{
    PyObject *meth = PyObject_GetAttr(obj, st->str_dlpack);
    if (meth == NULL)
        return NULL;
    PyObject *kw = cuda ? Py_BuildValue("{s:n,s:(ii)}", "stream",
                                        (Py_ssize_t)sn_stream_to_dlpack(stream),
                                        "max_version", SYMNCCL_DLPACK_MAJOR,
                                        SYMNCCL_DLPACK_MINOR)
                        : Py_BuildValue("{s:(ii)}", "max_version",
                                        SYMNCCL_DLPACK_MAJOR,
                                        SYMNCCL_DLPACK_MINOR);
    PyObject *empty = PyTuple_New(0);
    PyObject *cap = NULL;
    if (kw != NULL && empty != NULL) {
        cap = PyObject_Call(meth, empty, kw);
        if (cap == NULL && PyErr_ExceptionMatches(PyExc_TypeError)) {
            /* A pre-2023 producer without max_version. */
            PyErr_Clear();
            PyDict_DelItemString(kw, "max_version");
            cap = PyObject_Call(meth, empty, kw);
        }
    }
    Py_XDECREF(kw);
    Py_XDECREF(empty);
    Py_DECREF(meth);
    return cap;
}

/* ------------------------------------------------------------------ */
/* torch fast path. torch's __dlpack__ costs ~22 us per call (measured on
 * H100, torch 2.11), more than a small all-reduce: a torch.Tensor that is
 * already on the right device, contiguous, without conj/neg bits, and used
 * on torch's current stream (so DLPack's stream handshake would be
 * a no-op) is read directly: data_ptr(), dtype, shape. Anything else takes
 * the DLPack path, which also produces the error messages. */

/* 1 / 0 for a method returning a bool, -1 on error. */
static int
call_bool(PyObject *obj, PyObject *method)
{
    PyObject *r = PyObject_CallMethodObjArgs(obj, method, NULL);
    if (r == NULL)
        return -1;
    int v = PyObject_IsTrue(r);
    Py_DECREF(r);
    return v;
}

/* The registry's dtype of a torch tensor, or NULL. */
static const sn_dtype *
torch_dtype(SNState *st, PyObject *obj)
{
    PyObject *dt = PyObject_GetAttr(obj, st->torch_names[SN_TORCH_DTYPE]);
    if (dt == NULL)
        return NULL;
    for (int i = 0; i < st->n_torch_dtypes; i++)
        if (st->torch_dtypes[i].obj == dt) {
            Py_DECREF(dt);
            return st->torch_dtypes[i].dt;
        }
    PyObject *str = PyObject_Str(dt);   /* "torch.bfloat16" */
    const char *name = str ? PyUnicode_AsUTF8AndSize(str, NULL) : NULL;
    const sn_dtype *r = NULL;
    if (name != NULL && strncmp(name, "torch.", 6) == 0)
        r = sn_dtype_by_name(name + 6);
    if (r != NULL && st->n_torch_dtypes < 16) {
        st->torch_dtypes[st->n_torch_dtypes].obj = Py_NewRef(dt);
        st->torch_dtypes[st->n_torch_dtypes].dt = r;
        st->n_torch_dtypes++;
    }
    Py_XDECREF(str);
    Py_DECREF(dt);
    return r;
}

/* 1: t filled; 0: not applicable (take the DLPack path). Never raises.
 * torch_current: `stream` was read as torch's current stream in this call
 * (sn_default_stream), so it need not be read again. */
static int
torch_fast_import(SNState *st, PyObject *obj, cudaStream_t stream,
                  int device, int torch_current, SNTensor *t)
{
    if (!sn_is_torch_tensor(st, obj))
        return 0;
    PyObject *const *name = st->torch_names;
    int ok = 0;
    PyObject *shape = NULL, *r = NULL;
    if (!torch_current) {
        PyObject *dev = PyLong_FromLong(device);
        r = dev != NULL ? PyObject_CallFunctionObjArgs(st->torch_raw_stream,
                                                       dev, NULL)
                        : NULL;
        Py_XDECREF(dev);
        if (r == NULL || PyLong_AsVoidPtr(r) != (void *)stream)
            goto done;
        Py_CLEAR(r);
    }
    r = PyObject_CallMethodObjArgs(obj, name[SN_TORCH_GET_DEVICE], NULL);
    if (r == NULL || PyLong_AsLong(r) != device)
        goto done;
    if (call_bool(obj, name[SN_TORCH_IS_CONJ]) != 0 ||
        call_bool(obj, name[SN_TORCH_IS_NEG]) != 0 ||
        call_bool(obj, name[SN_TORCH_IS_CONTIGUOUS]) != 1)
        goto done;
    const sn_dtype *dt = torch_dtype(st, obj);
    if (dt == NULL)
        goto done;
    shape = PyObject_GetAttr(obj, name[SN_TORCH_SHAPE]);
    Py_ssize_t nd = shape ? PySequence_Size(shape) : -1;
    if (nd < 0 || nd > SN_MAX_NDIM)
        goto done;
    size_t count;
    for (Py_ssize_t i = 0; i < nd; i++) {
        PyObject *d = PySequence_GetItem(shape, i);
        long long v = d ? PyLong_AsLongLong(d) : -1;
        Py_XDECREF(d);
        if (v < 0)
            goto done;
        t->shape[i] = v;
    }
    /* a size past the limit: the DLPack path raises it */
    if (sn_shape_size("x", (int)nd, t->shape, (size_t)dt->itemsize, &count,
                      NULL) < 0)
        goto done;
    Py_CLEAR(r);
    r = PyObject_CallMethodObjArgs(obj, name[SN_TORCH_DATA_PTR], NULL);
    void *ptr = r ? PyLong_AsVoidPtr(r) : NULL;
    if (PyErr_Occurred())
        goto done;
    t->ptr = ptr;
    t->device = device;
    t->dtype = dt;
    t->ndim = (int)nd;
    t->count = count;
    t->capsule = Py_NewRef(obj);   /* keeps the tensor alive for the call */
    ok = 1;
done:
    if (!ok)
        PyErr_Clear();
    Py_XDECREF(r);
    Py_XDECREF(shape);
    return ok;
}

/* obj.detach() for a torch tensor that requires grad, else obj (a new
 * reference either way); NULL with an exception set. */
static PyObject *
torch_detached(SNState *st, PyObject *obj)
{
    if (!sn_is_torch_tensor(st, obj))
        return Py_NewRef(obj);
    PyObject *r = PyObject_GetAttrString(obj, "requires_grad");
    if (r == NULL)
        return NULL;
    int grad = PyObject_IsTrue(r);
    Py_DECREF(r);
    if (grad < 0)
        return NULL;
    return grad ? PyObject_CallMethod(obj, "detach", NULL) : Py_NewRef(obj);
}

static int import_dlpack(SNState *st, PyObject *obj, cudaStream_t stream,
                         int device, const char *argname, SNTensor *t);

int
sn_tensor_import(SNState *st, PyObject *obj, cudaStream_t stream, int device,
                 int torch_current, const char *argname, SNTensor *t)
{
    memset(t, 0, sizeof(*t));
    if (sn_is_buffer(st, obj))
        return import_own(st, (BufferObject *)obj, stream, device, argname,
                          t);
    if (torch_fast_import(st, obj, stream, device, torch_current, t))
        return 0;
    memset(t, 0, sizeof(*t));
    /* A torch tensor that requires grad is read as torch.distributed reads
     * it, outside autograd: through its detached view (same memory), since
     * its own __dlpack__ refuses it. */
    PyObject *detached = torch_detached(st, obj);
    if (detached == NULL)
        return -1;
    int rc = import_dlpack(st, detached, stream, device, argname, t);
    Py_DECREF(detached);
    return rc;
}

static int
import_dlpack(SNState *st, PyObject *obj, cudaStream_t stream, int device,
              const char *argname, SNTensor *t)
{
    if (!PyObject_HasAttr(obj, st->str_dlpack)) {
        PyErr_Format(PyExc_TypeError, "%s: expected a tensor that supports "
                     "DLPack (__dlpack__), got %R", argname, Py_TYPE(obj));
        return -1;
    }
    /* Ask where it lives first: a CPU producer gets a clean message and no
     * stream argument it could reject. */
    int type = SN_kDLCUDA, id = -1;
    if (PyObject_HasAttr(obj, st->str_dlpack_device)) {
        PyObject *d = PyObject_CallMethodObjArgs(obj, st->str_dlpack_device,
                                                 NULL);
        if (d == NULL)
            return -1;
        int ok = PyArg_ParseTuple(d, "ii", &type, &id);
        Py_DECREF(d);
        if (!ok)
            return -1;
        if (check_device(type, id, device, argname) < 0)
            return -1;
    }
    PyObject *cap = call_dlpack(st, obj, stream, type == SN_kDLCUDA);
    if (cap == NULL)
        return -1;
    if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        SN_DLManagedTensorVersioned *m =
            PyCapsule_GetPointer(cap, "dltensor_versioned");
        if (m->version.major != SYMNCCL_DLPACK_MAJOR) {
            PyErr_Format(PyExc_BufferError, "%s: DLPack major version %u is "
                         "not supported, expected %d", argname,
                         m->version.major, SYMNCCL_DLPACK_MAJOR);
            Py_DECREF(cap);
            return -1;
        }
        if (fill_from_dltensor(t, &m->dl_tensor, device, argname) < 0) {
            Py_DECREF(cap);   /* unconsumed: the capsule destructor frees */
            return -1;
        }
        t->readonly = (m->flags & SN_DLPACK_FLAG_BITMASK_READ_ONLY) != 0;
        t->copied = (m->flags & SN_DLPACK_FLAG_BITMASK_IS_COPIED) != 0;
        t->versioned = 1;
        t->managed = m;
        PyCapsule_SetName(cap, "used_dltensor_versioned");
    }
    else if (PyCapsule_IsValid(cap, "dltensor")) {
        SN_DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
        if (fill_from_dltensor(t, &m->dl_tensor, device, argname) < 0) {
            Py_DECREF(cap);
            return -1;
        }
        t->managed = m;
        PyCapsule_SetName(cap, "used_dltensor");
    }
    else {
        PyErr_Format(PyExc_BufferError, "%s: __dlpack__ returned %R, expected "
                     "a PyCapsule named 'dltensor' or 'dltensor_versioned'",
                     argname, Py_TYPE(cap));
        Py_DECREF(cap);
        return -1;
    }
    t->capsule = cap;
    return 0;
}

/* ------------------------------------------------------------------ */
/* Testing hooks: exercise import and export without a GPU.             */

PyObject *
sn_py_import_info(PyObject *module, PyObject *args)
{
    SNState *st = PyModule_GetState(module);
    PyObject *obj;
    int device;
    if (!PyArg_ParseTuple(args, "Oi", &obj, &device))
        return NULL;
    SNTensor t;
    if (sn_tensor_import(st, obj, NULL, device, 0, "x", &t) < 0)
        return NULL;
    PyObject *shape = PyTuple_New(t.ndim);
    for (int i = 0; shape != NULL && i < t.ndim; i++)
        PyTuple_SetItem(shape, i, PyLong_FromLongLong(t.shape[i]));
    PyObject *r = shape == NULL ? NULL : Py_BuildValue(
        "{s:N,s:i,s:s,s:N,s:n,s:O,s:O,s:O}", "ptr",
        PyLong_FromVoidPtr(t.ptr), "device", t.device, "dtype",
        t.dtype->name, "shape", shape, "count", (Py_ssize_t)t.count,
        "versioned", t.versioned ? Py_True : Py_False, "readonly",
        t.readonly ? Py_True : Py_False, "copied",
        t.copied ? Py_True : Py_False);
    sn_tensor_release(&t);
    return r;
}
