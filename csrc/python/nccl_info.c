/* What symnccl knows of NCCL's versions, as Python sees it: the tables of
 * runtime/nccl_policy.c (NCCL_WINDOW_POLICY, NCCL_SUPPORT,
 * NCCL_PDL_WAITS_FROM, NCCL_NEWEST_MINOR) and the builds of
 * runtime/abi.c (NCCL_DEVICE_API_HEADERS, NCCL_DEVICE_API_BUILDS) as
 * symnccl._C's attributes, and nccl_policy.c's decisions as the _nccl_*
 * testing functions (tests/test_nccl_policy.py, tests/test_nccl_abi.py).
 */
#include "symnccl.h"

#include <string.h>

/* "2.28.9" of an NCCL_VERSION_CODE. */
static PyObject *
version_string(int code)
{
    return PyUnicode_FromFormat("%d.%d.%d", code / 10000, code / 100 % 100,
                                code % 100);
}

/* NCCL_WINDOW_POLICY: nccl_policy.c's cases, one dict per row. */
static PyObject *
policy_table(void)
{
    int lo, hi, collectives;
    const char *case_name, *reason;
    size_t align;
    Py_ssize_t n = 0;
    while (sn_nccl_case_row((int)n, &lo, &hi, &collectives, &case_name,
                            &align, &reason))
        n++;
    PyObject *rows = PyTuple_New(n);
    for (Py_ssize_t i = 0; rows != NULL && i < n; i++) {
        sn_nccl_case_row((int)i, &lo, &hi, &collectives, &case_name, &align,
                         &reason);
        PyObject *colls = PyList_New(0);
        for (int c = 0; colls != NULL && c < SYMNCCL_COLL_COUNT; c++) {
            if (!(collectives >> c & 1))
                continue;
            PyObject *name = PyUnicode_FromString(sn_collective_name(c));
            if (name == NULL || PyList_Append(colls, name) < 0)
                Py_CLEAR(colls);
            Py_XDECREF(name);
        }
        PyObject *ct = colls != NULL ? PyList_AsTuple(colls) : NULL;
        Py_XDECREF(colls);
        PyObject *row = ct == NULL ? NULL : Py_BuildValue(
            "{s:N,s:N,s:N,s:s,s:n,s:s}", "lo", version_string(lo),
            "hi", version_string(hi), "collectives", ct, "case",
            case_name, "align", (Py_ssize_t)align, "reason", reason);
        if (row == NULL) {
            Py_CLEAR(rows);
            break;
        }
        if (PyTuple_SetItem(rows, i, row) < 0)
            Py_CLEAR(rows);
    }
    return rows;
}

/* NCCL_SUPPORT: {"conversions": ({"headers": (lo, hi), "libraries": (lo,
 * hi), "evidence": str}, ...), "proven": ({"library", "headers", "where"},
 * ...)}, versions as strings. */
static PyObject *
support_tables(void)
{
    int hlo, hhi, llo, lhi, lib, heads;
    const char *text;
    Py_ssize_t nconv = 0, nproofs = 0;
    while (sn_nccl_conversion_row((int)nconv, &hlo, &hhi, &llo, &lhi, &text))
        nconv++;
    while (sn_nccl_proof_row((int)nproofs, &lib, &heads, &text))
        nproofs++;
    PyObject *conv = PyTuple_New(nconv);
    for (Py_ssize_t i = 0; conv != NULL && i < nconv; i++) {
        sn_nccl_conversion_row((int)i, &hlo, &hhi, &llo, &lhi, &text);
        PyObject *row = Py_BuildValue(
            "{s:(NN),s:(NN),s:s}", "headers", version_string(hlo),
            version_string(hhi), "libraries", version_string(llo),
            version_string(lhi), "evidence", text);
        if (row == NULL || PyTuple_SetItem(conv, i, row) < 0)
            Py_CLEAR(conv);
    }
    PyObject *proven = conv == NULL ? NULL : PyTuple_New(nproofs);
    for (Py_ssize_t i = 0; proven != NULL && i < nproofs; i++) {
        sn_nccl_proof_row((int)i, &lib, &heads, &text);
        PyObject *row = Py_BuildValue(
            "{s:N,s:N,s:s}", "library", version_string(lib), "headers",
            version_string(heads), "where", text);
        if (row == NULL || PyTuple_SetItem(proven, i, row) < 0)
            Py_CLEAR(proven);
    }
    PyObject *d = proven == NULL ? NULL : Py_BuildValue(
        "{s:N,s:N}", "conversions", conv, "proven", proven);
    if (proven == NULL)
        Py_XDECREF(conv);
    return d;
}

/* _nccl_plain_reason(version, windows, collective, x, xbytes, out,
 * outbytes, block_bytes, x_in_window, out_in_window) -> None or str;
 * collective by name, x and out as integer addresses. */
static PyObject *
py_plain_reason(PyObject *module, PyObject *args)
{
    int version, windows, xw, ow;
    const char *cname;
    unsigned long long x, out;
    Py_ssize_t xbytes, outbytes, block;
    if (!PyArg_ParseTuple(args, "iisKnKnnpp:_nccl_plain_reason", &version,
                          &windows, &cname, &x, &xbytes, &out, &outbytes,
                          &block, &xw, &ow))
        return NULL;
    int coll = -1;
    for (int c = 0; c < SYMNCCL_COLL_COUNT; c++)
        if (strcmp(sn_collective_name(c), cname) == 0)
            coll = c;
    if (coll < 0 || xbytes < 0 || outbytes < 0 || block < 0) {
        PyErr_Format(PyExc_ValueError, "_nccl_plain_reason: collective "
                     "'%s' and sizes >= 0 expected", cname);
        return NULL;
    }
    const char *why = sn_nccl_plain_reason(
        version, windows, coll, (const char *)(uintptr_t)x, (size_t)xbytes,
        (const char *)(uintptr_t)out, (size_t)outbytes, (size_t)block, xw,
        ow);
    return why == NULL ? Py_NewRef(Py_None) : PyUnicode_FromString(why);
}

/* _nccl_pick_build(runtime, (headers, ...)) -> the index of the build the
 * import would use beside libnccl `runtime`, or the ImportError's message
 * (str) when none may run on it. */
static PyObject *
py_pick_build(PyObject *module, PyObject *args)
{
    int runtime;
    PyObject *seq;
    if (!PyArg_ParseTuple(args, "iO!:_nccl_pick_build", &runtime,
                          &PyTuple_Type, &seq))
        return NULL;
    int heads[16];
    const Py_ssize_t n = PyTuple_Size(seq);
    if (n > 16) {
        PyErr_Format(PyExc_ValueError, "_nccl_pick_build: at most 16 "
                     "builds, got %zd", n);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        heads[i] = (int)PyLong_AsLong(PyTuple_GetItem(seq, i));
        if (heads[i] == -1 && PyErr_Occurred())
            return NULL;
    }
    char buf[600];
    const int i = sn_nccl_pick_build(runtime, heads, (int)n, buf,
                                     sizeof(buf));
    return i >= 0 ? PyLong_FromLong(i) : PyUnicode_FromString(buf);
}

/* A verdict of nccl_policy.c on (runtime, headers) as Python sees it:
 * None, or its message. `fmt`: the argument format with the name. */
static PyObject *
verdict(PyObject *args, const char *fmt,
        const char *(*of)(int, int, char *, size_t))
{
    int runtime, headers;
    char buf[600];
    if (!PyArg_ParseTuple(args, fmt, &runtime, &headers))
        return NULL;
    const char *why = of(runtime, headers, buf, sizeof(buf));
    return why == NULL ? Py_NewRef(Py_None) : PyUnicode_FromString(why);
}

/* _nccl_multi_gpu_caveat(runtime, headers) -> None or the warning. */
static PyObject *
py_multi_gpu_caveat(PyObject *module, PyObject *args)
{
    return verdict(args, "ii:_nccl_multi_gpu_caveat",
                   sn_nccl_multi_gpu_caveat);
}

/* _nccl_version_verdict(runtime, headers) -> None or the ImportError's
 * message. */
static PyObject *
py_version_verdict(PyObject *module, PyObject *args)
{
    return verdict(args, "ii:_nccl_version_verdict",
                   sn_nccl_version_verdict);
}

static PyObject *
py_pdl_early(PyObject *module, PyObject *arg)
{
    const long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred())
        return NULL;
    return PyBool_FromLong(sn_nccl_pdl_early((int)v));
}

static PyMethodDef policy_methods[] = {
    {"_nccl_plain_reason", py_plain_reason, METH_VARARGS,
     "_nccl_plain_reason(version, windows, collective, x, xbytes, out, "
     "outbytes, block_bytes, x_in_window, out_in_window)\n--\n\n"
     "Testing: why NCCL must get plain memory for this call (None: the "
     "buffers may go as they are); csrc/runtime/nccl_policy.c."},
    {"_nccl_version_verdict", py_version_verdict, METH_VARARGS,
     "_nccl_version_verdict(runtime, headers)\n--\n\n"
     "Testing: why a kernel build against NCCL `headers` may not run on "
     "libnccl `runtime` (the import's ImportError), or None."},
    {"_nccl_pick_build", py_pick_build, METH_VARARGS,
     "_nccl_pick_build(runtime, headers)\n--\n\n"
     "Testing: the index in `headers` (a tuple of NCCL_VERSION_CODEs, one "
     "per kernel build) of the build the import uses beside libnccl "
     "`runtime`, or the ImportError's message when none may run on it."},
    {"_nccl_multi_gpu_caveat", py_multi_gpu_caveat, METH_VARARGS,
     "_nccl_multi_gpu_caveat(runtime, headers)\n--\n\n"
     "Testing: None when libnccl `runtime` with the kernel build against "
     "NCCL `headers` has passed `python -m symnccl` on two GPUs, else the "
     "warning a communicator of 2+ ranks gives."},
    {"_nccl_pdl_early", py_pdl_early, METH_O,
     "_nccl_pdl_early(version)\n--\n\n"
     "Testing: whether symnccl's kernels let the next kernel launch at "
     "their entry beside libnccl `version`."},
    {NULL, NULL, 0, NULL},
};

/* NCCL_DEVICE_API_HEADERS: {minor: NCCL_VERSION_CODE of its headers};
 * NCCL_DEVICE_API_BUILDS: ((2, minor), ...), the builds of abi.c. */
static int
add_builds(PyObject *module)
{
    PyObject *d = PyDict_New();
    PyObject *t = d != NULL ? PyList_New(0) : NULL;
    int minor, headers;
    for (int i = 0; t != NULL && sn_abi_build(i, &minor, &headers); i++) {
        PyObject *k = PyLong_FromLong(minor);
        PyObject *v = PyLong_FromLong(headers);
        if (k == NULL || v == NULL || PyDict_SetItem(d, k, v) < 0)
            Py_CLEAR(t);
        Py_XDECREF(k);
        Py_XDECREF(v);
        PyObject *b = t != NULL ? Py_BuildValue("(ii)", 2, minor) : NULL;
        if (b == NULL || PyList_Append(t, b) < 0)
            Py_CLEAR(t);
        Py_XDECREF(b);
    }
    PyObject *builds = t != NULL ? PyList_AsTuple(t) : NULL;
    Py_XDECREF(t);
    int rc = builds == NULL ? -1
             : PyModule_AddObjectRef(module, "NCCL_DEVICE_API_HEADERS", d);
    if (rc == 0)
        rc = PyModule_AddObjectRef(module, "NCCL_DEVICE_API_BUILDS", builds);
    Py_XDECREF(d);
    Py_XDECREF(builds);
    return rc;
}

int
sn_nccl_info_export(PyObject *module)
{
    if (add_builds(module) < 0)
        return -1;
    PyObject *t = policy_table();
    int rc = t == NULL ? -1
                       : PyModule_AddObjectRef(module, "NCCL_WINDOW_POLICY", t);
    Py_XDECREF(t);
    if (rc < 0)
        return -1;
    if (PyModule_AddIntConstant(module, "NCCL_PDL_WAITS_FROM",
                                sn_nccl_pdl_waits_from()) < 0 ||
        PyModule_AddIntConstant(module, "NCCL_NEWEST_MINOR",
                                sn_nccl_newest_minor()) < 0)
        return -1;
    t = support_tables();
    rc = t == NULL ? -1 : PyModule_AddObjectRef(module, "NCCL_SUPPORT", t);
    Py_XDECREF(t);
    if (rc < 0)
        return -1;
    return PyModule_AddFunctions(module, policy_methods);
}
