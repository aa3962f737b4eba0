/* DLPack: import any producer's tensor (torch, jax, cupy, numpy, ours),
 * export SymmetricBuffer/DeviceArray, and the dtype/shape/stream parsing the
 * rest of the module shares.
 */
#include "symnccl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* dtypes                                                               */

typedef struct {
    const char *name;
    uint8_t code, bits;
    ncclDataType_t nccl;
} sn_dtype_entry;

static const sn_dtype_entry dtype_table[] = {
    {"float32", SN_kDLFloat, 32, ncclFloat32},
    {"bfloat16", SN_kDLBfloat, 16, ncclBfloat16},
    {"float16", SN_kDLFloat, 16, ncclFloat16},
    {"float64", SN_kDLFloat, 64, ncclFloat64},
    {"float8_e4m3fn", SN_kDLFloat8_e4m3fn, 8, ncclFloat8e4m3},
    {"float8_e5m2", SN_kDLFloat8_e5m2, 8, ncclFloat8e5m2},
    {"int8", SN_kDLInt, 8, ncclInt8},
    {"uint8", SN_kDLUInt, 8, ncclUint8},
    {"int32", SN_kDLInt, 32, ncclInt32},
    {"uint32", SN_kDLUInt, 32, ncclUint32},
    {"int64", SN_kDLInt, 64, ncclInt64},
    {"uint64", SN_kDLUInt, 64, ncclUint64},
};
#define N_DTYPES (sizeof(dtype_table) / sizeof(dtype_table[0]))

static const struct { const char *alias, *name; } dtype_aliases[] = {
    {"float", "float32"}, {"fp32", "float32"}, {"f32", "float32"},
    {"half", "float16"}, {"fp16", "float16"}, {"f16", "float16"},
    {"bf16", "bfloat16"}, {"double", "float64"}, {"fp64", "float64"},
    {"f64", "float64"}, {"float8_e4m3", "float8_e4m3fn"},
    {"fp8_e4m3", "float8_e4m3fn"}, {"fp8_e5m2", "float8_e5m2"},
};

static const sn_dtype_entry *
dtype_lookup(SN_DLDataType dt)
{
    if (dt.lanes != 1)
        return NULL;
    for (size_t i = 0; i < N_DTYPES; i++)
        if (dtype_table[i].code == dt.code && dtype_table[i].bits == dt.bits)
            return &dtype_table[i];
    return NULL;
}

int
sn_dtype_from_name(const char *name, SN_DLDataType *out)
{
    for (size_t i = 0; i < sizeof(dtype_aliases) / sizeof(dtype_aliases[0]);
         i++)
        if (strcmp(name, dtype_aliases[i].alias) == 0)
            name = dtype_aliases[i].name;
    for (size_t i = 0; i < N_DTYPES; i++)
        if (strcmp(name, dtype_table[i].name) == 0) {
            out->code = dtype_table[i].code;
            out->bits = dtype_table[i].bits;
            out->lanes = 1;
            return 0;
        }
    return -1;
}

const char *
sn_dtype_name(SN_DLDataType dt)
{
    const sn_dtype_entry *e = dtype_lookup(dt);
    return e ? e->name : "unsupported";
}

int
sn_dtype_itemsize(SN_DLDataType dt)
{
    return (dt.bits * dt.lanes + 7) / 8;
}

int
sn_dtype_to_nccl(SN_DLDataType dt, ncclDataType_t *out)
{
    const sn_dtype_entry *e = dtype_lookup(dt);
    if (e == NULL)
        return -1;
    *out = e->nccl;
    return 0;
}

static PyObject *
supported_list(void)
{
    PyObject *s = PyUnicode_FromString("");
    for (size_t i = 0; s != NULL && i < N_DTYPES; i++) {
        PyObject *t = PyUnicode_FromFormat("%U%s%s", s, i ? ", " : "",
                                           dtype_table[i].name);
        Py_DECREF(s);
        s = t;
    }
    return s;
}

static int
raise_bad_dtype(const char *prefix, const char *seen)
{
    PyObject *lst = supported_list();
    if (lst == NULL)
        return -1;
    PyErr_Format(PyExc_TypeError, "%sunsupported dtype %s: expected one of %U",
                 prefix, seen, lst);
    Py_DECREF(lst);
    return -1;
}

/* Accepts "bfloat16", numpy dtypes and scalar types, torch.bfloat16,
 * jnp.bfloat16, ml_dtypes types. */
int
sn_parse_dtype(PyObject *obj, SN_DLDataType *out)
{
    PyObject *s = NULL;
    if (PyUnicode_Check(obj))
        s = Py_NewRef(obj);
    else if (PyType_Check(obj))
        s = PyObject_GetAttrString(obj, "__name__");
    else
        s = PyObject_Str(obj);
    if (s == NULL)
        return -1;
    const char *name = PyUnicode_AsUTF8AndSize(s, NULL);
    if (name == NULL) {
        Py_DECREF(s);
        return -1;
    }
    if (strncmp(name, "torch.", 6) == 0)
        name += 6;
    int rc = sn_dtype_from_name(name, out);
    if (rc < 0)
        raise_bad_dtype("", name);
    Py_DECREF(s);
    return rc;
}

int
sn_parse_shape(PyObject *obj, int *ndim, int64_t *shape)
{
    if (PyLong_Check(obj)) {
        long long v = PyLong_AsLongLong(obj);
        if (v == -1 && PyErr_Occurred())
            return -1;
        if (v < 0) {
            PyErr_Format(PyExc_ValueError, "shape must be >= 0, got %lld", v);
            return -1;
        }
        *ndim = 1;
        shape[0] = v;
        return 0;
    }
    if (!PySequence_Check(obj) || PyUnicode_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "shape must be an int or a sequence of "
                     "ints, got %R", Py_TYPE(obj));
        return -1;
    }
    Py_ssize_t n = PySequence_Size(obj);
    if (n < 0)
        return -1;
    if (n > SN_MAX_NDIM) {
        PyErr_Format(PyExc_ValueError, "shape has %zd dimensions, at most %d "
                     "are supported", n, SN_MAX_NDIM);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_GetItem(obj, i);
        if (item == NULL)
            return -1;
        long long v = PyLong_AsLongLong(item);
        Py_DECREF(item);
        if (v == -1 && PyErr_Occurred())
            return -1;
        if (v < 0) {
            PyErr_Format(PyExc_ValueError, "shape must be >= 0 in every "
                         "dimension, got %R", obj);
            return -1;
        }
        shape[i] = v;
    }
    *ndim = (int)n;
    return 0;
}

/* ------------------------------------------------------------------ */
/* Streams. Internally a cudaStream_t, NULL being the legacy default.
 * DLPack's numbering (1 legacy, 2 per-thread) equals cudaStreamLegacy and
 * cudaStreamPerThread. */

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

/* ------------------------------------------------------------------ */
/* Import                                                               */

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
    const sn_dtype_entry *e = dtype_lookup(dl->dtype);
    if (e == NULL) {
        char seen[64], prefix[64];
        snprintf(seen, sizeof(seen), "(DLPack code %d, %d bits, %d lanes)",
                 dl->dtype.code, dl->dtype.bits, dl->dtype.lanes);
        snprintf(prefix, sizeof(prefix), "%s: ", argname);
        return raise_bad_dtype(prefix, seen);
    }
    if (dl->ndim < 0 || dl->ndim > SN_MAX_NDIM) {
        PyErr_Format(PyExc_ValueError, "%s: %d dimensions, at most %d are "
                     "supported", argname, dl->ndim, SN_MAX_NDIM);
        return -1;
    }
    size_t count = 1;
    for (int i = 0; i < dl->ndim; i++)
        count *= (size_t)dl->shape[i];
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
    t->dtype = dl->dtype;
    t->nccl_dtype = e->nccl;
    t->itemsize = sn_dtype_itemsize(dl->dtype);
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
    sn_dtype_to_nccl(b->dtype, &t->nccl_dtype);
    t->itemsize = sn_dtype_itemsize(b->dtype);
    t->ndim = b->ndim;
    t->count = 1;
    for (int i = 0; i < b->ndim; i++) {
        t->shape[i] = b->shape[i];
        t->count *= (size_t)b->shape[i];
    }
    /* The last op that wrote the buffer ran on last_stream: order it. */
    if (!host && b->has_last_stream && b->last_stream != stream) {
        if (b->event == NULL)
            SN_CUDA_GOTO(st, cudaEventCreateWithFlags(
                             &b->event, cudaEventDisableTiming),
                         "cudaEventCreate", error);
        SN_CUDA_GOTO(st, cudaEventRecord(b->event, b->last_stream),
                     "cudaEventRecord", error);
        SN_CUDA_GOTO(st, cudaStreamWaitEvent(stream, b->event, 0),
                     "cudaStreamWaitEvent", error);
    }
    return 0;
error:
    return -1;
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
 * already on the right device, contiguous, without autograd/conj/neg bits,
 * and used on torch's current stream (so DLPack's stream handshake would be
 * a no-op) is read directly: data_ptr(), dtype, shape. Anything else takes
 * the DLPack path, which also produces the error messages. */

static int
torch_lookup(SNState *st)
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

/* 1 / 0 for a method returning a bool, -1 on error. */
static int
call_bool(PyObject *obj, const char *method)
{
    PyObject *r = PyObject_CallMethod(obj, method, NULL);
    if (r == NULL)
        return -1;
    int v = PyObject_IsTrue(r);
    Py_DECREF(r);
    return v;
}

static int
torch_dtype(SNState *st, PyObject *obj, SN_DLDataType *out)
{
    PyObject *dt = PyObject_GetAttrString(obj, "dtype");
    if (dt == NULL)
        return -1;
    for (int i = 0; i < st->n_torch_dtypes; i++)
        if (st->torch_dtypes[i].obj == dt) {
            *out = st->torch_dtypes[i].dt;
            Py_DECREF(dt);
            return 0;
        }
    PyObject *str = PyObject_Str(dt);   /* "torch.bfloat16" */
    const char *name = str ? PyUnicode_AsUTF8AndSize(str, NULL) : NULL;
    int rc = -1;
    if (name != NULL && strncmp(name, "torch.", 6) == 0 &&
        sn_dtype_from_name(name + 6, out) == 0) {
        rc = 0;
        if (st->n_torch_dtypes < 16) {
            st->torch_dtypes[st->n_torch_dtypes].obj = Py_NewRef(dt);
            st->torch_dtypes[st->n_torch_dtypes].dt = *out;
            st->n_torch_dtypes++;
        }
    }
    Py_XDECREF(str);
    Py_DECREF(dt);
    return rc;
}

/* 1: t filled; 0: not applicable (take the DLPack path). Never raises. */
static int
torch_fast_import(SNState *st, PyObject *obj, cudaStream_t stream,
                  int device, SNTensor *t)
{
    if (!torch_lookup(st) ||
        !PyObject_TypeCheck(obj, (PyTypeObject *)st->torch_tensor))
        return 0;
    int ok = 0;
    PyObject *shape = NULL, *r = NULL;
    r = PyObject_CallFunction(st->torch_raw_stream, "i", device);
    if (r == NULL || PyLong_AsVoidPtr(r) != (void *)stream)
        goto done;
    Py_CLEAR(r);
    r = PyObject_CallMethod(obj, "get_device", NULL);
    if (r == NULL || PyLong_AsLong(r) != device)
        goto done;
    Py_CLEAR(r);
    r = PyObject_GetAttrString(obj, "requires_grad");
    if (r == NULL || PyObject_IsTrue(r) != 0)
        goto done;
    if (call_bool(obj, "is_conj") != 0 || call_bool(obj, "is_neg") != 0 ||
        call_bool(obj, "is_contiguous") != 1)
        goto done;
    SN_DLDataType dt;
    if (torch_dtype(st, obj, &dt) < 0 ||
        sn_dtype_to_nccl(dt, &t->nccl_dtype) < 0)
        goto done;
    shape = PyObject_GetAttrString(obj, "shape");
    Py_ssize_t nd = shape ? PySequence_Size(shape) : -1;
    if (nd < 0 || nd > SN_MAX_NDIM)
        goto done;
    size_t count = 1;
    for (Py_ssize_t i = 0; i < nd; i++) {
        PyObject *d = PySequence_GetItem(shape, i);
        long long v = d ? PyLong_AsLongLong(d) : -1;
        Py_XDECREF(d);
        if (v < 0)
            goto done;
        t->shape[i] = v;
        count *= (size_t)v;
    }
    Py_CLEAR(r);
    r = PyObject_CallMethod(obj, "data_ptr", NULL);
    void *ptr = r ? PyLong_AsVoidPtr(r) : NULL;
    if (PyErr_Occurred())
        goto done;
    t->ptr = ptr;
    t->device = device;
    t->dtype = dt;
    t->itemsize = sn_dtype_itemsize(dt);
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

int
sn_tensor_import(SNState *st, PyObject *obj, cudaStream_t stream, int device,
                 const char *argname, SNTensor *t)
{
    memset(t, 0, sizeof(*t));
    if (sn_is_buffer(st, obj))
        return import_own(st, (BufferObject *)obj, stream, device, argname,
                          t);
    if (torch_fast_import(st, obj, stream, device, t))
        return 0;
    memset(t, 0, sizeof(*t));
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

PyObject *
sn_buffer_dlpack(BufferObject *b, PyObject *args, PyObject *kw)
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
    if (sync && b->has_last_stream && b->last_stream != consumer) {
        int prev;
        if (sn_device_push(st, b->device, &prev) < 0)
            return NULL;
        cudaError_t e = cudaSuccess;
        if (b->event == NULL)
            e = cudaEventCreateWithFlags(&b->event, cudaEventDisableTiming);
        if (e == cudaSuccess)
            e = cudaEventRecord(b->event, b->last_stream);
        if (e == cudaSuccess)
            e = cudaStreamWaitEvent(consumer, b->event, 0);
        sn_device_pop(prev);
        if (e != cudaSuccess)
            return (sn_set_cuda_error(st, e, "__dlpack__ stream sync"), NULL);
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
    dl->dtype = b->dtype;
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
    if (sn_tensor_import(st, obj, NULL, device, "x", &t) < 0)
        return NULL;
    PyObject *shape = PyTuple_New(t.ndim);
    for (int i = 0; shape != NULL && i < t.ndim; i++)
        PyTuple_SetItem(shape, i, PyLong_FromLongLong(t.shape[i]));
    PyObject *r = shape == NULL ? NULL : Py_BuildValue(
        "{s:N,s:i,s:s,s:N,s:n,s:O,s:O}", "ptr", PyLong_FromVoidPtr(t.ptr),
        "device", t.device, "dtype", sn_dtype_name(t.dtype), "shape", shape,
        "count", (Py_ssize_t)t.count, "versioned",
        t.versioned ? Py_True : Py_False, "readonly",
        t.readonly ? Py_True : Py_False);
    sn_tensor_release(&t);
    return r;
}
