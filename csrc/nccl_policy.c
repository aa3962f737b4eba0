/* What symnccl knows of NCCL's versions, declared once: which library a
 * build of the kernels may run on, which calls NCCL's own symmetric-window
 * kernels get wrong (and so may only see plain memory), and which NCCL
 * kernels may start before the kernel ahead of them on the stream has
 * ended. Pure functions of a version code and the call: the host code
 * asks them, the CPU tests ask them through _C (tests/test_nccl_policy.py),
 * and the table is exported as _C.NCCL_WINDOW_POLICY for the docs.
 */
#include "symnccl.h"

#include <stdio.h>
#include <string.h>

#define V(major, minor, patch) ((major) * 10000 + (minor) * 100 + (patch))

static int
v_major(int code)
{
    return code / 10000;
}

static int
v_minor(int code)
{
    return code % 10000 / 100;
}

static int
v_patch(int code)
{
    return code % 100;
}

/* ------------------------------------------------------------------ */
/* The library a build of the kernels may run on. */

const char *
sn_nccl_version_verdict(int runtime, int headers, char *buf, size_t size)
{
    const int cu = CUDART_VERSION / 1000;
    if (v_major(runtime) != v_major(headers) ||
        v_minor(runtime) != v_minor(headers)) {
        snprintf(buf, size, "the loaded libnccl is NCCL %d.%d.%d, but these "
                 "kernels were built against NCCL %d.%d.%d's headers: the "
                 "NCCL device API needs the same major.minor. Install "
                 "'nvidia-nccl-cu%d>=%d.%d.%d,<%d.%d'", v_major(runtime),
                 v_minor(runtime), v_patch(runtime), v_major(headers),
                 v_minor(headers), v_patch(headers), cu, v_major(headers),
                 v_minor(headers), v_patch(headers), v_major(headers),
                 v_minor(headers) + 1);
        return buf;
    }
    /* NCCL refuses its device API to code built against newer headers
     * than the library (dev_runtime.cc: "NCCL library is too old";
     * ncclDevCommCreate and ncclCommQueryProperties return
     * ncclInvalidUsage): symnccl would run without its kernels. */
    if (runtime < headers) {
        snprintf(buf, size, "the loaded libnccl is NCCL %d.%d.%d, older than "
                 "the NCCL %d.%d.%d headers symnccl's kernels for %d.%d were "
                 "built with, and NCCL refuses its device API to code built "
                 "against newer headers than the library. Install a newer "
                 "library: pip install 'nvidia-nccl-cu%d>=%d.%d.%d,<%d.%d' "
                 "(or rebuild symnccl against NCCL %d.%d.%d's headers: "
                 "SYMNCCL_NCCL_INCLUDE_2_%d)", v_major(runtime),
                 v_minor(runtime), v_patch(runtime), v_major(headers),
                 v_minor(headers), v_patch(headers), v_major(headers),
                 v_minor(headers), cu, v_major(headers), v_minor(headers),
                 v_patch(headers), v_major(headers), v_minor(headers) + 1,
                 v_major(runtime), v_minor(runtime), v_patch(runtime),
                 v_minor(headers));
        return buf;
    }
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Programmatic dependent launch. NCCL launches its symmetric kernels as
 * programmatic dependent launches (enqueue.cc, isSymColl), and only from
 * 2.30.7 on do they wait at entry for the kernel before them
 * (cudaGridDependencySynchronize, src/device/symmetric/generate.py). */

#define PDL_WAITING_NCCL V(2, 30, 7)

int
sn_nccl_pdl_early(int runtime)
{
    return runtime >= PDL_WAITING_NCCL;
}

/* ------------------------------------------------------------------ */
/* NCCL's symmetric-window kernels: the calls they get wrong, one row per
 * NCCL version range and case (the first row that matches a call gives
 * the reason). A call whose buffers are all plain memory never meets
 * them on the versions below (2.29 runs its symmetric LL kernels on plain
 * buffers only under NCCL_SYM_NOWIN_ENABLE=1 or NCCL_SYM_KERNEL, and
 * symnccl sets neither). */

enum {
    CASE_UNVERIFIED,      /* every call that involves a window */
    CASE_VIEW_UNALIGNED,  /* a window buffer's address % align != 0 */
    CASE_BLOCK_UNALIGNED, /* out in a window, block_bytes % align != 0 */
    CASE_MIXED,           /* one buffer in a window, the other not */
    CASE_UNALIGNED,       /* any buffer's address or size % align != 0 */
    CASE_COUNT
};

static const char *const case_names[CASE_COUNT] = {
    "unverified", "view_unaligned", "block_unaligned", "mixed", "unaligned"};

#define ALL_REDUCE (1 << SYMNCCL_COLL_ALL_REDUCE)
#define REDUCE_SCATTER (1 << SYMNCCL_COLL_REDUCE_SCATTER)
#define ALL_GATHER (1 << SYMNCCL_COLL_ALL_GATHER)
/* the collectives NCCL has symmetric kernels for */
#define SYMMETRIC (ALL_REDUCE | REDUCE_SCATTER | ALL_GATHER)

typedef struct {
    int lo, hi;           /* NCCL_VERSION_CODE range, inclusive */
    int collectives;      /* mask of 1 << SYMNCCL_COLL_* */
    int what;             /* CASE_* */
    size_t align;         /* bytes, for the alignment cases */
    const char *reason;   /* what was seen, for messages and docs */
} nccl_case;

static const nccl_case cases[] = {
    /* seen on 2x H200, NCCL 2.28.9: bf16 window offsets of 1..8 elements,
     * in place (float32 at the same offsets was right) */
    {V(2, 28, 0), V(2, 28, 99), ALL_REDUCE, CASE_VIEW_UNALIGNED, 16,
     "NCCL 2.28's symmetric all_reduce gives wrong results on a window "
     "view that does not start on a 16-byte boundary"},
    /* seen on 2x H200, NCCL 2.28.9: bf16, 1031 and 4099 elements per
     * rank */
    {V(2, 28, 0), V(2, 28, 99), REDUCE_SCATTER, CASE_BLOCK_UNALIGNED, 16,
     "NCCL 2.28's symmetric reduce_scatter writes zeros into every 4th "
     "16-bit element of a window output whose per-rank block is not a "
     "multiple of 16 bytes"},
    /* 2.29 and 2.30 have not passed symnccl's self-check on two GPUs:
     * 2.29.7 gave 5122 wrong elements in 2876 checks (every 4th element of
     * five 4099-element blocks, the pattern of the reduce_scatter row
     * above), 2.30.7's first ncclAllReduce failed ("invalid device
     * function"). Until a multi-GPU run passes, NCCL gets plain memory. */
    {V(2, 29, 0), V(2, 30, 99), SYMMETRIC, CASE_UNVERIFIED, 0,
     "NCCL 2.29 and 2.30's symmetric kernels have not passed symnccl's "
     "self-check on two GPUs"},
    /* 2.29 runs its symmetric LL kernels when only one buffer is a window
     * (sym_kernels.cc, scheduler/symmetric_sched.cc); the 2.30 notes:
     * "Fix data corruption in symmetric LL kernels with unaligned
     * buffers" */
    {V(2, 29, 0), V(2, 29, 99), SYMMETRIC, CASE_MIXED, 0,
     "NCCL 2.29 runs its symmetric LL kernels on mixed window and plain "
     "buffers, which corrupt data (fixed in 2.30)"},
    {V(2, 29, 0), V(2, 29, 99), SYMMETRIC, CASE_UNALIGNED, 16,
     "NCCL 2.29's symmetric LL kernels corrupt data on buffers that are "
     "not 16-byte aligned (fixed in 2.30)"},
};

#define N_CASES (sizeof(cases) / sizeof(cases[0]))

static int
misaligned(const char *p, size_t align)
{
    return align != 0 && (uintptr_t)p % align != 0;
}

static int
case_applies(const nccl_case *k, const char *x, size_t xbytes,
             const char *out, size_t outbytes, size_t block_bytes,
             int x_in_window, int out_in_window)
{
    switch (k->what) {
    case CASE_UNVERIFIED:
        return 1;
    case CASE_VIEW_UNALIGNED:
        return (x_in_window && misaligned(x, k->align)) ||
               (out_in_window && misaligned(out, k->align));
    case CASE_BLOCK_UNALIGNED:
        return out_in_window && block_bytes % k->align != 0;
    case CASE_MIXED:
        return x_in_window != out_in_window && x != out;
    case CASE_UNALIGNED:
        return misaligned(x, k->align) || misaligned(out, k->align) ||
               xbytes % k->align != 0 || outbytes % k->align != 0 ||
               block_bytes % k->align != 0;
    default:
        return 0;
    }
}

const char *
sn_nccl_plain_reason(int nccl_version, int windows, int collective,
                     const char *x, size_t xbytes, const char *out,
                     size_t outbytes, size_t block_bytes, int x_in_window,
                     int out_in_window)
{
    if (!x_in_window && !out_in_window)
        return NULL;   /* plain already */
    if (windows == SN_NCCL_WINDOWS_ON)
        return NULL;
    if (windows == SN_NCCL_WINDOWS_PLAIN)
        return "SYMNCCL_NCCL_WINDOWS=0: NCCL gets plain memory";
    for (size_t i = 0; i < N_CASES; i++) {
        const nccl_case *k = &cases[i];
        if (nccl_version >= k->lo && nccl_version <= k->hi &&
            collective >= 0 && collective < SYMNCCL_COLL_COUNT &&
            (k->collectives >> collective & 1) &&
            case_applies(k, x, xbytes, out, outbytes, block_bytes,
                         x_in_window, out_in_window))
            return k->reason;
    }
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Python: the table (docs, tests) and the decisions (tests). */

static PyObject *
version_string(int code)
{
    return PyUnicode_FromFormat("%d.%d.%d", v_major(code), v_minor(code),
                                v_patch(code));
}

/* The collectives' names (launch.h's list; registry.c, a later layer,
 * has the same view). */
#define COLL_NAME_(id, name) name,
static const char *const coll_names[SYMNCCL_COLL_COUNT] = {
    SYMNCCL_COLLECTIVES(COLL_NAME_)};
#undef COLL_NAME_

static PyObject *
policy_table(void)
{
    PyObject *rows = PyTuple_New((Py_ssize_t)N_CASES);
    for (size_t i = 0; rows != NULL && i < N_CASES; i++) {
        const nccl_case *k = &cases[i];
        PyObject *colls = PyList_New(0);
        for (int c = 0; colls != NULL && c < SYMNCCL_COLL_COUNT; c++) {
            if (!(k->collectives >> c & 1))
                continue;
            PyObject *name = PyUnicode_FromString(coll_names[c]);
            if (name == NULL || PyList_Append(colls, name) < 0)
                Py_CLEAR(colls);
            Py_XDECREF(name);
        }
        PyObject *ct = colls != NULL ? PyList_AsTuple(colls) : NULL;
        Py_XDECREF(colls);
        PyObject *row = ct == NULL ? NULL : Py_BuildValue(
            "{s:N,s:N,s:N,s:s,s:n,s:s}", "lo", version_string(k->lo),
            "hi", version_string(k->hi), "collectives", ct, "case",
            case_names[k->what], "align", (Py_ssize_t)k->align, "reason",
            k->reason);
        if (row == NULL) {
            Py_CLEAR(rows);
            break;
        }
        if (PyTuple_SetItem(rows, (Py_ssize_t)i, row) < 0)
            Py_CLEAR(rows);
    }
    return rows;
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
        if (strcmp(coll_names[c], cname) == 0)
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

/* _nccl_version_verdict(runtime, headers) -> None or the ImportError's
 * message. */
static PyObject *
py_version_verdict(PyObject *module, PyObject *args)
{
    int runtime, headers;
    char buf[600];
    if (!PyArg_ParseTuple(args, "ii:_nccl_version_verdict", &runtime,
                          &headers))
        return NULL;
    const char *why = sn_nccl_version_verdict(runtime, headers, buf,
                                              sizeof(buf));
    return why == NULL ? Py_NewRef(Py_None) : PyUnicode_FromString(why);
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
     "buffers may go as they are); csrc/nccl_policy.c."},
    {"_nccl_version_verdict", py_version_verdict, METH_VARARGS,
     "_nccl_version_verdict(runtime, headers)\n--\n\n"
     "Testing: why a kernel build against NCCL `headers` may not run on "
     "libnccl `runtime` (the import's ImportError), or None."},
    {"_nccl_pdl_early", py_pdl_early, METH_O,
     "_nccl_pdl_early(version)\n--\n\n"
     "Testing: whether symnccl's kernels let the next kernel launch at "
     "their entry beside libnccl `version`."},
    {NULL, NULL, 0, NULL},
};

int
sn_nccl_policy_export(PyObject *module)
{
    PyObject *t = policy_table();
    int rc = t == NULL ? -1
                       : PyModule_AddObjectRef(module, "NCCL_WINDOW_POLICY", t);
    Py_XDECREF(t);
    if (rc < 0)
        return -1;
    if (PyModule_AddIntConstant(module, "NCCL_PDL_WAITS_FROM",
                                PDL_WAITING_NCCL) < 0)
        return -1;
    return PyModule_AddFunctions(module, policy_methods);
}
