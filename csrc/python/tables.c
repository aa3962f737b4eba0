/* The registry (runtime/registry.c) as Python sees it: its tables as
 * symnccl._C's attributes (DTYPES, OPS, ALGORITHMS, KERNEL_TABLE,
 * AUTO_TABLE, KNOBS, ...), a communicator's knobs as a dict, _exit_timeout,
 * and the lookups by name that raise ValueError.
 */
#include "symnccl.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

int
sn_registry_lookup(const char *algo, const char *dtype, const char *op,
                   int *a, const sn_dtype **dt, const sn_op **o)
{
    *a = sn_algo_by_name(algo);
    *dt = sn_dtype_by_name(dtype);
    *o = sn_op_by_name(op);
    if (*a == SN_ALGO_UNKNOWN || *dt == NULL || *o == NULL) {
        PyErr_Format(PyExc_ValueError, "unknown algo %s, dtype %s or op %s: "
                     "expected names from symnccl.ALGORITHMS, DTYPES, OPS",
                     algo, dtype, op);
        return -1;
    }
    return 0;
}

int
sn_collective_by_name(const char *cname)
{
    const int coll = sn_collective_index(cname);
    if (coll < 0)
        PyErr_Format(PyExc_ValueError, "unknown collective '%s': expected %s",
                     cname, sn_collective_choices());
    return coll;
}

int
sn_call_unavailable(const sn_topology *t, const char *cname, int algo,
                    const sn_dtype *dt, const sn_op *op, const char **why)
{
    const int coll = sn_collective_by_name(cname);
    if (coll < 0)
        return -1;
    *why = algo == SN_ALGO_AUTO
               ? NULL
               : sn_collective_unavailable(t, coll, algo, dt, op);
    return 0;
}

PyObject *
sn_py_exit_timeout(PyObject *module, PyObject *unused)
{
    const char *env, *doc;
    int dflt;
    sn_exit_knob(&env, &dflt, &doc);
    const char *s = getenv(env);
    if (s == NULL)
        return PyFloat_FromDouble(dflt);
    PyObject *text = PyUnicode_DecodeFSDefault(s);
    if (text == NULL)
        return NULL;
    PyObject *f = PyFloat_FromString(text);
    const double v = f != NULL ? PyFloat_AsDouble(f) : -1.0;
    Py_XDECREF(f);
    if (f != NULL && sn_check_timeout(v, "timeout") == 0) {
        Py_DECREF(text);
        return PyFloat_FromDouble(v);
    }
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    const int rc = PyErr_WarnFormat(PyExc_RuntimeWarning, 1, "%s=%R: %S; "
                                    "using %d s", env, text,
                                    value != NULL ? value : Py_None, dflt);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    Py_DECREF(text);
    return rc < 0 ? NULL : PyFloat_FromDouble(dflt);
}

PyObject *
sn_knobs_dict(const sn_knobs *k)
{
    PyObject *d = PyDict_New();
    if (d == NULL)
        return NULL;
    PyObject *v = PyUnicode_FromString(k->algo >= 0 ? sn_algos[k->algo].name
                                                    : "auto");
    int rc = v != NULL ? PyDict_SetItemString(d, "SYMNCCL_ALGO", v) : -1;
    Py_XDECREF(v);
    const char *env, *doc;
    int dflt, lo, hi;
    for (int i = 0; rc == 0 && sn_knob_row(i, &env, &dflt, &lo, &hi, &doc);
         i++) {
        v = PyLong_FromLong(sn_knob_value(k, i));
        rc = v != NULL ? PyDict_SetItemString(d, env, v) : -1;
        Py_XDECREF(v);
    }
    if (rc < 0)
        Py_CLEAR(d);
    return d;
}

/* _settings_differ(sets) -> None, or the first setting whose value
 * differs among the ranks' sets, as a communicator's creation names it
 * (sn_agreed_differ; testing). Each set is a dict like comm.knobs, plus
 * "staging_bytes"; what one leaves out has its default. */
static int
int_of(PyObject *d, const char *key, long long dflt, long long lo,
       long long hi, long long *out)
{
    PyObject *v = PyDict_GetItemString(d, key);   /* borrowed */
    long long x = v != NULL ? PyLong_AsLongLong(v) : dflt;
    if (x == -1 && PyErr_Occurred())
        return -1;
    if (x < lo || x > hi) {
        PyErr_Format(PyExc_ValueError, "%s must be %lld..%lld, got %lld",
                     key, lo, hi, x);
        return -1;
    }
    *out = x;
    return 0;
}

static int
record_from_dict(PyObject *d, int rank, int nranks, sn_agreed *r)
{
    const char *env, *doc;
    int dflt, lo, hi;
    long long x;
    memset(r, 0, sizeof(*r));
    r->rank = rank;
    r->nranks = nranks;
    if (int_of(d, "staging_bytes", SN_DEFAULT_STAGING, 0, LLONG_MAX, &x) < 0)
        return -1;
    r->staging_bytes = (uint64_t)x;
    r->knobs.algo = SN_ALGO_AUTO;
    for (int i = 0; sn_knob_row(i, &env, &dflt, &lo, &hi, &doc); i++) {
        if (int_of(d, env, dflt, INT_MIN, INT_MAX, &x) < 0)
            return -1;
        sn_knob_set(&r->knobs, i, (int)x);
    }
    PyObject *a = PyDict_GetItemString(d, "SYMNCCL_ALGO");
    if (a != NULL) {
        const char *name = PyUnicode_AsUTF8AndSize(a, NULL);
        if (name == NULL)
            return -1;
        if (strcmp(name, "auto") != 0) {
            r->knobs.algo = sn_algo_by_name(name);
            if (r->knobs.algo == SN_ALGO_UNKNOWN) {
                PyErr_Format(PyExc_ValueError, "SYMNCCL_ALGO %s is not an "
                             "algorithm", name);
                return -1;
            }
        }
    }
    sn_agreed_seal(r);
    return 0;
}

PyObject *
sn_py_settings_differ(PyObject *module, PyObject *sets)
{
    Py_ssize_t n = PySequence_Size(sets);
    if (n < 0)
        return NULL;
    if (n < 1 || n > SYMNCCL_MAX_RANKS)
        return PyErr_Format(PyExc_ValueError, "_settings_differ: 1 to %d "
                            "sets, got %zd", SYMNCCL_MAX_RANKS, n);
    sn_agreed all[SYMNCCL_MAX_RANKS];
    for (Py_ssize_t r = 0; r < n; r++) {
        PyObject *d = PySequence_GetItem(sets, r);
        if (d == NULL)
            return NULL;
        int rc = PyDict_Check(d) ? record_from_dict(d, (int)r, (int)n,
                                                    &all[r])
                                 : -2;
        Py_DECREF(d);
        if (rc == -2)
            return PyErr_Format(PyExc_TypeError, "_settings_differ: set %zd "
                                "is not a dict", r);
        if (rc < 0)
            return NULL;
    }
    char why[512];
    if (!sn_agreed_differ(all, (int)n, why, sizeof(why)))
        Py_RETURN_NONE;
    return PyUnicode_FromString(why);
}

static int
add(PyObject *module, const char *name, PyObject *value)
{
    if (value == NULL)
        return -1;
    int rc = PyModule_AddObjectRef(module, name, value);
    Py_DECREF(value);
    return rc;
}

static PyObject *
op_names(unsigned mask)
{
    PyObject *t = PyList_New(0);
    for (int i = 0; t != NULL && i < sn_n_ops; i++)
        if (sn_ops[i].kernel >= 0 && (mask & 1u << sn_ops[i].kernel)) {
            PyObject *s = PyUnicode_FromString(sn_ops[i].name);
            if (s == NULL || PyList_Append(t, s) < 0)
                Py_CLEAR(t);
            Py_XDECREF(s);
        }
    if (t == NULL)
        return NULL;
    PyObject *r = PyList_AsTuple(t);
    Py_DECREF(t);
    return r;
}

/* KERNEL_TABLE: one dict per kernel, the table's columns by name. */
static PyObject *
kernel_table(void)
{
    static const char *const shots[] = {"one", "two"};
#define NAME_(id, name) name,
    static const char *const families[] = {SYMNCCL_FAMILIES(NAME_)};
    static const char *const plans[] = {SYMNCCL_PLANS(NAME_)};
    static const char *const units[] = {SYMNCCL_UNITS(NAME_)};
#undef NAME_
    PyObject *t = PyTuple_New(SYMNCCL_K_COUNT);
    for (int k = 0; t != NULL && k < SYMNCCL_K_COUNT; k++) {
        const symnccl_kernel_row r = symnccl_kernel_row_of(k);
        PyObject *d = Py_BuildValue(
            "{s:i,s:s,s:s,s:s,s:s,s:s,s:s,s:O,s:s}", "id", k, "name", r.name,
            "collective", sn_collective_name(r.collective), "algo",
            sn_algos[sn_kernel_algo(k)].name, "shot", shots[r.shot], "family",
            families[r.family], "plan", plans[r.plan], "bytes",
            r.bytes ? Py_True : Py_False, "unit", units[r.unit]);
        if (d == NULL)
            Py_CLEAR(t);
        else
            PyTuple_SetItem(t, k, d);
    }
    return t;
}

/* ALGO_KERNELS: {algo: all_reduce's kernels of it (the one-shot, then the
 * two-shot where there is one)}; () for nccl. */
static PyObject *
algo_kernels(void)
{
    PyObject *d = PyDict_New();
    for (int a = 0; d != NULL && a < SN_ALGO_COUNT; a++) {
        const int k1 = sn_kernel_for(SYMNCCL_COLL_ALL_REDUCE, a, 0);
        /* sn_kernel_for gives the one-shot where there is no two-shot */
        const int k2 = sn_kernel_for(SYMNCCL_COLL_ALL_REDUCE, a, 1);
        PyObject *ks = k1 < 0    ? PyTuple_New(0)
                       : k2 == k1 ? Py_BuildValue("(s)", sn_kernel_name(k1))
                                  : Py_BuildValue("(ss)", sn_kernel_name(k1),
                                                  sn_kernel_name(k2));
        if (ks == NULL || PyDict_SetItemString(d, sn_algos[a].name, ks) < 0)
            Py_CLEAR(d);
        Py_XDECREF(ks);
    }
    return d;
}

/* COLLECTIVE_KERNELS: {collective: {algo: kernel}} for every collective
 * with kernels other than all_reduce (ALGO_KERNELS has its). */
static PyObject *
collective_kernels(void)
{
    PyObject *all = PyDict_New();
    for (int coll = 0; all != NULL && coll < SYMNCCL_COLL_COUNT; coll++) {
        if (!sn_collective_has_kernels(coll) ||
            coll == SYMNCCL_COLL_ALL_REDUCE)
            continue;
        PyObject *d = PyDict_New();
        for (int a = 0; d != NULL && a < SN_ALGO_COUNT; a++) {
            const int k = sn_kernel_for(coll, a, 0);
            if (k < 0)
                continue;
            PyObject *kn = PyUnicode_FromString(sn_kernel_name(k));
            if (kn == NULL || PyDict_SetItemString(d, sn_algos[a].name,
                                                   kn) < 0)
                Py_CLEAR(d);
            Py_XDECREF(kn);
        }
        if (d == NULL ||
            PyDict_SetItemString(all, sn_collective_name(coll), d) < 0)
            Py_CLEAR(all);
        Py_XDECREF(d);
    }
    return all;
}

int
sn_registry_export(PyObject *module)
{
    sn_err err;
    if (sn_registry_init(&err) < 0)
        return sn_raise((SNState *)PyModule_GetState(module), &err);
    PyObject *dtypes = PyTuple_New(sn_n_dtypes);
    PyObject *kdtypes = PyList_New(0);
    PyObject *fdtypes = PyList_New(0);
    if (dtypes == NULL || kdtypes == NULL || fdtypes == NULL)
        goto error;
    for (int i = 0; i < sn_n_dtypes; i++) {
        PyTuple_SetItem(dtypes, i, PyUnicode_FromString(sn_dtypes[i].name));
        if (sn_dtypes[i].kernel >= 0 &&
            PyList_Append(kdtypes, PyTuple_GetItem(dtypes, i)) < 0)
            goto error;
        /* all_reduce_rmsnorm's: the dtypes of the FLOAT units */
        if (sn_dtypes[i].kernel >= 0 &&
            SYMNCCL_UNIT_FLOAT_TAKES(sn_dtypes[i].kernel) &&
            PyList_Append(fdtypes, PyTuple_GetItem(dtypes, i)) < 0)
            goto error;
    }
    if (add(module, "DTYPES", Py_NewRef(dtypes)) < 0 ||
        add(module, "KERNEL_DTYPES", PyList_AsTuple(kdtypes)) < 0 ||
        add(module, "RMSNORM_DTYPES", PyList_AsTuple(fdtypes)) < 0)
        goto error;
    Py_CLEAR(dtypes);
    Py_CLEAR(kdtypes);
    Py_CLEAR(fdtypes);

    PyObject *ops = PyTuple_New(sn_n_ops);
    PyObject *codes = PyDict_New();
    if (ops == NULL || codes == NULL) {
        Py_XDECREF(ops);
        Py_XDECREF(codes);
        return -1;
    }
    for (int i = 0; i < sn_n_ops; i++) {
        PyTuple_SetItem(ops, i, PyUnicode_FromString(sn_ops[i].name));
        PyObject *v = PyLong_FromLong((long)sn_ops[i].nccl);
        int bad = v == NULL || PyDict_SetItemString(codes, sn_ops[i].name,
                                                    v) < 0;
        Py_XDECREF(v);
        if (bad) {
            Py_DECREF(ops);
            Py_DECREF(codes);
            return -1;
        }
    }
    if (add(module, "OPS", ops) < 0 || add(module, "OP_CODES", codes) < 0 ||
        add(module, "KERNEL_OPS", op_names(~0u)) < 0)
        return -1;

    PyObject *algos = PyTuple_New(SN_ALGO_COUNT);
    PyObject *acodes = Py_BuildValue("{s:i}", "auto", SN_ALGO_AUTO);
    PyObject *summary = PyDict_New();
    if (algos == NULL || acodes == NULL || summary == NULL)
        goto algo_error;
    for (int i = 0; i < SN_ALGO_COUNT; i++) {
        const sn_algo *a = &sn_algos[i];
        PyTuple_SetItem(algos, i, PyUnicode_FromString(a->name));
        PyObject *code = PyLong_FromLong(i);
        PyObject *sum = PyUnicode_FromString(a->summary);
        int bad = code == NULL || sum == NULL ||
                  PyDict_SetItemString(acodes, a->name, code) < 0 ||
                  PyDict_SetItemString(summary, a->name, sum) < 0;
        Py_XDECREF(code);
        Py_XDECREF(sum);
        if (bad)
            goto algo_error;
    }
    if (add(module, "ALGORITHMS", algos) < 0 ||
        add(module, "ALGO_CODES", acodes) < 0 ||
        add(module, "ALGO_SUMMARY", summary) < 0)
        return -1;
    if (add(module, "KERNEL_TABLE", kernel_table()) < 0 ||
        add(module, "ALGO_KERNELS", algo_kernels()) < 0 ||
        add(module, "COLLECTIVE_KERNELS", collective_kernels()) < 0)
        return -1;

    PyObject *kern = PyTuple_New(SYMNCCL_K_COUNT);
    for (int i = 0; kern != NULL && i < SYMNCCL_K_COUNT; i++)
        PyTuple_SetItem(kern, i, PyUnicode_FromString(sn_kernel_name(i)));
    if (add(module, "KERNELS", kern) < 0)
        return -1;

    PyObject *mm = PyDict_New();
    int mm_dtype;
    unsigned mm_ops;
    for (int i = 0; mm != NULL && sn_multimem_row(i, &mm_dtype, &mm_ops);
         i++) {
        PyObject *o = op_names(mm_ops);
        if (o == NULL ||
            PyDict_SetItemString(mm, sn_kernel_dtype_name(mm_dtype), o) < 0)
            Py_CLEAR(mm);
        Py_XDECREF(o);
    }
    if (add(module, "MULTIMEM_OPS", mm) < 0)
        return -1;

    Py_ssize_t n_auto = 0;
    while (sn_auto_table_row((int)n_auto) != NULL)
        n_auto++;
    PyObject *rows = PyTuple_New(n_auto);
    for (Py_ssize_t i = 0; rows != NULL && i < n_auto; i++) {
        const sn_auto_row *r = sn_auto_table_row((int)i);
        PyObject *d = Py_BuildValue(
            "{s:s,s:i,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:s}", "collective",
            sn_collective_name(r->collective), "max_ranks", r->max_ranks, "ll",
            (Py_ssize_t)r->ll, "ll128", (Py_ssize_t)r->ll128, "lamport",
            (Py_ssize_t)r->lamport, "one_shot",
            (Py_ssize_t)r->one_shot, "two_shot_window",
            (Py_ssize_t)r->two_shot_window, "two_shot_tensor",
            (Py_ssize_t)r->two_shot_tensor, "push", (Py_ssize_t)r->push,
            "above", sn_algos[r->above].name);
        if (d == NULL)
            Py_CLEAR(rows);
        else
            PyTuple_SetItem(rows, i, d);
    }
    if (add(module, "AUTO_TABLE", rows) < 0)
        return -1;

    PyObject *kn = PyDict_New();
    const char *env, *doc;
    int dflt, lo, hi;
    for (int i = 0; kn != NULL && sn_knob_row(i, &env, &dflt, &lo, &hi, &doc);
         i++) {
        PyObject *v = Py_BuildValue("(iiis)", dflt, lo, hi, doc);
        if (v == NULL || PyDict_SetItemString(kn, env, v) < 0)
            Py_CLEAR(kn);
        Py_XDECREF(v);
    }
    sn_exit_knob(&env, &dflt, &doc);
    PyObject *exit_v = Py_BuildValue("(iiis)", dflt, 0, (int)SN_MAX_TIMEOUT,
                                     doc);
    if (kn != NULL &&
        (exit_v == NULL || PyDict_SetItemString(kn, env, exit_v) < 0))
        Py_CLEAR(kn);
    Py_XDECREF(exit_v);
    PyObject *algo_knob = Py_BuildValue("(ssss)", "auto", "", "",
                                        "overrides algo='auto' of every "
                                        "collective where that algorithm "
                                        "can run the call");
    if (kn != NULL &&
        (algo_knob == NULL ||
         PyDict_SetItemString(kn, "SYMNCCL_ALGO", algo_knob) < 0))
        Py_CLEAR(kn);
    Py_XDECREF(algo_knob);
    return add(module, "KNOBS", kn);

algo_error:
    Py_XDECREF(algos);
    Py_XDECREF(acodes);
    Py_XDECREF(summary);
    return -1;
error:
    Py_XDECREF(dtypes);
    Py_XDECREF(kdtypes);
    Py_XDECREF(fdtypes);
    return -1;
}
