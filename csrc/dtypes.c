/* dtype and shape arguments: what Python callers may pass for them. */
#include "symnccl.h"

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
