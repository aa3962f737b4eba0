/* dtype and shape arguments: what Python callers may pass for them. */
#include "symnccl.h"

#include <stdio.h>
#include <string.h>

int
sn_raise_bad_dtype(const char *prefix, const char *seen)
{
    PyObject *names = PyUnicode_FromString("");
    for (int i = 0; names != NULL && i < sn_n_dtypes; i++) {
        PyObject *t = PyUnicode_FromFormat("%U%s%s", names, i ? ", " : "",
                                           sn_dtypes[i].name);
        Py_DECREF(names);
        names = t;
    }
    if (names == NULL)
        return -1;
    PyErr_Format(PyExc_TypeError, "%sunsupported dtype %s: expected one of "
                 "%U", prefix, seen, names);
    Py_DECREF(names);
    return -1;
}

const sn_dtype *
sn_parse_dtype(PyObject *obj)
{
    PyObject *s;
    if (PyUnicode_Check(obj))
        s = Py_NewRef(obj);
    else if (PyType_Check(obj))   /* np.float32, ml_dtypes.bfloat16 */
        s = PyObject_GetAttrString(obj, "__name__");
    else                          /* np.dtype, torch.bfloat16, jnp dtypes */
        s = PyObject_Str(obj);
    if (s == NULL)
        return NULL;
    const char *name = PyUnicode_AsUTF8AndSize(s, NULL);
    const sn_dtype *dt = NULL;
    if (name != NULL) {
        if (strncmp(name, "torch.", 6) == 0)
            name += 6;
        dt = sn_dtype_by_name(name);
        if (dt == NULL)
            sn_raise_bad_dtype("", name);
    }
    Py_DECREF(s);
    return dt;
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

/* "(2147483648, 8589934592)" into buf. */
static void
shape_str(int ndim, const int64_t *shape, char *buf, size_t size)
{
    size_t at = (size_t)snprintf(buf, size, "(");
    for (int i = 0; i < ndim && at < size; i++)
        at += (size_t)snprintf(buf + at, size - at, "%s%lld", i ? ", " : "",
                               (long long)shape[i]);
    if (at < size)
        snprintf(buf + at, size - at, ndim == 1 ? ",)" : ")");
}

int
sn_shape_size(const char *what, int ndim, const int64_t *shape,
              size_t itemsize, size_t *count, size_t *nbytes)
{
    char seen[SN_MAX_NDIM * 22 + 4];
    /* the extent: every dimension at least 1, so that the strides of a
     * shape with a zero in it fit too */
    size_t n = 1, extent = itemsize ? itemsize : 1;
    int bad = 0;
    for (int i = 0; i < ndim && !bad; i++) {
        if (shape[i] < 0) {
            shape_str(ndim, shape, seen, sizeof(seen));
            PyErr_Format(PyExc_ValueError, "%s: shape %s has a negative "
                         "dimension (%lld at %d), expected sizes >= 0", what,
                         seen, (long long)shape[i], i);
            return -1;
        }
        const size_t d = (size_t)shape[i];
        bad = __builtin_mul_overflow(n, d, &n) ||
              __builtin_mul_overflow(extent, d ? d : 1, &extent) ||
              extent > SN_MAX_BYTES;
    }
    if (bad) {
        shape_str(ndim, shape, seen, sizeof(seen));
        PyErr_Format(PyExc_ValueError, "%s: shape %s of %zu-byte elements "
                     "spans more than %lld bytes (2**63 - 1), the most a "
                     "tensor may span", what, seen, itemsize,
                     (long long)SN_MAX_BYTES);
        return -1;
    }
    if (count != NULL)
        *count = n;
    if (nbytes != NULL)
        *nbytes = n * itemsize;
    return 0;
}
