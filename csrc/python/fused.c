/* Collectives fused with the computation around them: Communicator.
 * all_reduce_rmsnorm, the tensor-parallel all-reduce followed by the
 * residual add and RMSNorm of a transformer layer, as one kernel
 * (kernels/rmsnorm.cuh) or, where that does not run, an all-reduce then
 * symnccl's own add+norm (the same kernel with no peer): under "auto"
 * (past the fused rows of AUTO_TABLE: 32 MiB at 2 ranks, every size at 3+)
 * the all-reduce all_reduce's own "auto" picks
 * (registry.c, sn_then_norm_algo), with algo="nccl" NCCL's. This file
 * is the method's face (its arguments); the launch is run.c's (sn_run),
 * which the XLA handler calls too.
 */
#include "symnccl.h"

#include <stdio.h>
#include <string.h>

/* One call's state: the shared call (collectives.c's sn_call: the entry,
 * the stream, the device, x, and y as its `out`) and what the fused call
 * borrows beyond it. */
typedef struct {
    sn_call k;
    SNTensor res, w, h, scale;
    PyObject *y_obj, *h_obj;   /* new references */
} fcall;

static PyObject *
fcall_end(fcall *f, int ok)
{
    if (ok && f->h.own != NULL)
        sn_buffer_mark_written(f->h.own, f->k.stream);
    if (ok && f->scale.own != NULL)   /* fp8_dynamic's row scales */
        sn_buffer_mark_written(f->scale.own, f->k.stream);
    sn_tensor_release(&f->res);
    sn_tensor_release(&f->w);
    sn_tensor_release(&f->h);
    sn_tensor_release(&f->scale);
    if (ok && (f->k.result = PyTuple_Pack(2, f->y_obj, f->h_obj)) == NULL)
        ok = 0;
    Py_XDECREF(f->y_obj);
    Py_XDECREF(f->h_obj);
    /* marks y (k.out) written, releases x and y, leaves c */
    return sn_call_end(&f->k, ok);
}

/* An output: `given` (None: a new tensor like `like`), imported into *t
 * and checked against x's count and `dt` (NULL: x's dtype); *obj takes the
 * new reference. */
static int
output(fcall *f, PyObject *given, PyObject *like, const SNTensor *shape_of,
       const char *name, const sn_dtype *dt, SNTensor *t, PyObject **obj)
{
    if (dt == NULL)
        dt = f->k.x.dtype;
    if (given == NULL || given == Py_None) {
        if ((*obj = sn_new_output(f->k.st, f->k.c, like, shape_of->ndim,
                                  shape_of->shape, shape_of->dtype,
                                  f->k.stream)) == NULL)
            return -1;
    }
    else
        *obj = Py_NewRef(given);
    if (sn_tensor_import(f->k.st, *obj, f->k.stream, f->k.c->device,
                         f->k.torch_current, name, t) < 0)
        return -1;
    char what[64];
    snprintf(what, sizeof(what), "all_reduce_rmsnorm: %s", name);
    if (sn_tensor_check_output(t, what) < 0)
        return -1;
    if (t->dtype != dt) {
        PyErr_Format(PyExc_TypeError, "all_reduce_rmsnorm: %s has dtype "
                     "%s, expected %s", name, t->dtype->name, dt->name);
        return -1;
    }
    if (t->count != f->k.x.count) {
        PyErr_Format(PyExc_ValueError, "all_reduce_rmsnorm: %s has %zu "
                     "elements, expected %zu (x's)", name, t->count,
                     f->k.x.count);
        return -1;
    }
    return 0;
}

/* An output that overlaps an input it is not exactly (or overlaps weight,
 * which every row reads) would be read by one row while another writes
 * it. */
static int
check_overlap(const SNTensor *out, const char *oname, const SNTensor *in,
              const char *iname, int exact_ok)
{
    const size_t ob = out->count * (size_t)out->dtype->itemsize;
    const size_t ib = in->count * (size_t)in->dtype->itemsize;
    const int overlap = ob && ib && out->ptr < in->ptr + ib &&
                        in->ptr < out->ptr + ob;
    if (!overlap || (exact_ok && out->ptr == in->ptr && ob == ib))
        return 0;
    PyErr_Format(PyExc_ValueError, "all_reduce_rmsnorm: %s overlaps %s%s",
                 oname, iname, exact_ok ? " without being the same tensor"
                                        : "");
    return -1;
}

/* The arguments: dtypes, shapes, H % 8, weight's length. */
static int
check_inputs(fcall *f, size_t *H)
{
    const sn_dtype *dt = f->k.x.dtype;
    if (!SYMNCCL_UNIT_FLOAT_TAKES(dt->kernel)) {   /* the kernels' units */
        PyErr_Format(PyExc_TypeError, "all_reduce_rmsnorm: x has dtype %s, "
                     "expected float32, float16 or bfloat16", dt->name);
        return -1;
    }
    if (f->res.dtype != dt || f->w.dtype != dt) {
        PyErr_Format(PyExc_TypeError, "all_reduce_rmsnorm: residual has "
                     "dtype %s and weight %s, expected %s (x's)",
                     f->res.dtype->name, f->w.dtype->name, dt->name);
        return -1;
    }
    if (f->k.x.ndim < 1) {
        PyErr_SetString(PyExc_ValueError, "all_reduce_rmsnorm: x is a "
                        "scalar, expected (T, H) (or (..., H))");
        return -1;
    }
    *H = (size_t)f->k.x.shape[f->k.x.ndim - 1];
    if (*H == 0 || *H % 8 != 0) {
        PyErr_Format(PyExc_ValueError, "all_reduce_rmsnorm: H (x's last "
                     "dimension) is %zu, expected a positive multiple of 8",
                     *H);
        return -1;
    }
    int same = f->res.ndim == f->k.x.ndim;
    for (int i = 0; same && i < f->k.x.ndim; i++)
        same = f->res.shape[i] == f->k.x.shape[i];
    if (!same) {
        PyErr_Format(PyExc_ValueError, "all_reduce_rmsnorm: residual has "
                     "%zu elements (%d dimensions), expected x's shape "
                     "(%zu elements, %d dimensions)", f->res.count,
                     f->res.ndim, f->k.x.count, f->k.x.ndim);
        return -1;
    }
    if (f->w.count != *H) {
        PyErr_Format(PyExc_ValueError, "all_reduce_rmsnorm: weight has %zu "
                     "elements, expected %zu (H, x's last dimension)",
                     f->w.count, *H);
        return -1;
    }
    return 0;
}

/* quant= (None, 'fp8_static', 'fp8_dynamic') and what it needs: out=, a
 * float8_e4m3fn tensor (the method allocates none), and scale=. */
static int
parse_quant(PyObject *q, PyObject *out, PyObject *scale, int *quant)
{
    const char *s = PyUnicode_Check(q) ? PyUnicode_AsUTF8AndSize(q, NULL)
                                       : NULL;
    *quant = q == Py_None ? SYMNCCL_QUANT_NONE
             : s == NULL ? -1
             : strcmp(s, "fp8_static") == 0  ? SYMNCCL_QUANT_STATIC
             : strcmp(s, "fp8_dynamic") == 0 ? SYMNCCL_QUANT_DYNAMIC
                                             : -1;
    if (*quant < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "all_reduce_rmsnorm: quant=%R, "
                     "expected None, 'fp8_static' or 'fp8_dynamic'", q);
        return -1;
    }
    if (*quant == SYMNCCL_QUANT_NONE && scale != Py_None) {
        PyErr_SetString(PyExc_ValueError, "all_reduce_rmsnorm: scale= is "
                        "given without quant=");
        return -1;
    }
    if (*quant != SYMNCCL_QUANT_NONE && (out == Py_None || scale == Py_None)) {
        PyErr_Format(PyExc_ValueError, "all_reduce_rmsnorm: quant=%R needs "
                     "out= (a float8_e4m3fn tensor of x's shape) and scale= "
                     "(float32: %s)", q,
                     *quant == SYMNCCL_QUANT_STATIC
                         ? "one element, y is divided by it"
                         : "one element per row of x, written");
        return -1;
    }
    return 0;
}

/* scale=: float32, one element (static) or one per row (dynamic, which
 * writes it). */
static int
check_scale(fcall *f, PyObject *obj, int quant, size_t rows)
{
    if (sn_tensor_import(f->k.st, obj, f->k.stream, f->k.c->device,
                         f->k.torch_current, "scale", &f->scale) < 0)
        return -1;
    const size_t want = quant == SYMNCCL_QUANT_STATIC ? 1 : rows;
    if (f->scale.dtype != sn_dtype_by_name("float32") ||
        f->scale.count != want) {
        PyErr_Format(PyExc_ValueError, "all_reduce_rmsnorm: scale has "
                     "dtype %s and %zu elements, expected float32 and %zu "
                     "(%s)", f->scale.dtype->name, f->scale.count, want,
                     quant == SYMNCCL_QUANT_STATIC ? "one per tensor"
                                                   : "one per row of x");
        return -1;
    }
    if (quant == SYMNCCL_QUANT_DYNAMIC &&
        sn_tensor_check_output(&f->scale, "all_reduce_rmsnorm: scale "
                               "(fp8_dynamic writes the row scales)") < 0)
        return -1;
    return 0;
}

/* ------------------------------------------------------------------ */

PyObject *
sn_all_reduce_rmsnorm(CommObject *c, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = SN_KW_all_reduce_rmsnorm;
    PyObject *x, *res, *w, *out = Py_None, *res_out = Py_None;
    PyObject *quant_obj = Py_None, *scale_obj = Py_None;
    PyObject *algo_obj = NULL, *stream_obj = Py_None;
    double eps;
    if (!PyArg_ParseTupleAndKeywords(args, kw, SN_FMT_all_reduce_rmsnorm,
                                     kwlist, &x, &res, &w, &eps, &out,
                                     &res_out, &quant_obj, &scale_obj,
                                     &algo_obj, &stream_obj))
        return NULL;
    int quant;
    if (parse_quant(quant_obj, out, scale_obj, &quant) < 0)
        return NULL;
    int algo = SN_ALGO_AUTO;
    if (algo_obj != NULL &&
        (algo = sn_parse_algo(algo_obj)) == SN_ALGO_UNKNOWN)
        return NULL;
    if (!(eps >= 0.0)) {
        PyObject *e = PyFloat_FromDouble(eps);
        if (e != NULL)
            PyErr_Format(PyExc_ValueError, "all_reduce_rmsnorm: eps is %R, "
                         "expected a number >= 0", e);
        Py_XDECREF(e);
        return NULL;
    }
    fcall f;
    memset(&f, 0, sizeof(f));
    sn_call *k = &f.k;
    if (sn_call_begin(k, c, x, stream_obj) < 0)
        return fcall_end(&f, 0);
    size_t H = 0;
    const int tc = k->torch_current;
    if (sn_tensor_import(k->st, res, k->stream, c->device, tc, "residual",
                         &f.res) < 0 ||
        sn_tensor_import(k->st, w, k->stream, c->device, tc, "weight",
                         &f.w) < 0 ||
        check_inputs(&f, &H) < 0 ||
        output(&f, out, x, &k->x, "out",
               quant ? sn_dtype_by_name("float8_e4m3fn") : NULL, &k->out,
               &f.y_obj) < 0 ||
        output(&f, res_out, res, &k->x, "residual_out", NULL, &f.h,
               &f.h_obj) < 0 ||
        (quant && check_scale(&f, scale_obj, quant, k->x.count / H) < 0))
        return fcall_end(&f, 0);
    const SNTensor *y = &k->out, *xt = &k->x;
    if (check_overlap(y, "out", &f.h, "residual_out", 0) < 0 ||
        check_overlap(y, "out", &f.w, "weight", 0) < 0 ||
        check_overlap(&f.h, "residual_out", &f.w, "weight", 0) < 0 ||
        check_overlap(y, "out", xt, "x", 1) < 0 ||
        check_overlap(y, "out", &f.res, "residual", 1) < 0 ||
        check_overlap(&f.h, "residual_out", xt, "x", 1) < 0 ||
        check_overlap(&f.h, "residual_out", &f.res, "residual", 1) < 0)
        return fcall_end(&f, 0);
    if (quant == SYMNCCL_QUANT_DYNAMIC) {
        const SNTensor *others[] = {xt, &f.res, &f.w, y, &f.h};
        static const char *const names[] = {"x", "residual", "weight",
                                            "out", "residual_out"};
        for (int i = 0; i < 5; i++)
            if (check_overlap(&f.scale, "scale", others[i], names[i], 0) < 0)
                return fcall_end(&f, 0);
    }
    const size_t bytes = xt->count * (size_t)xt->dtype->itemsize;
    const int asked = algo;
    if ((algo = sn_call_algo(k, SYMNCCL_COLL_ALL_REDUCE_RMSNORM, algo,
                             bytes)) == SN_ALGO_UNKNOWN)
        return fcall_end(&f, 0);
    const char *no = sn_rmsnorm_unavailable(algo, quant);
    if (no != NULL) {
        PyErr_SetString(PyExc_ValueError, no);
        return fcall_end(&f, 0);
    }
    if (algo == SN_ALGO_NCCL && k->st->group_depth > 0 && xt->count > 0) {
        PyErr_SetString(PyExc_NotImplementedError, "all_reduce_rmsnorm on "
                        "NCCL cannot run inside symnccl.group() (the norm "
                        "would be enqueued before the group's all-reduce)");
        return fcall_end(&f, 0);
    }
    /* SYMNCCL_CHECK=1: the ranks compare the call first (collectives.c),
     * the all-reduce before the add+norm included */
    const int then = sn_rmsnorm_ar_algo(c, asked, algo, xt->dtype, bytes);
    if (sn_call_check(k, SYMNCCL_COLL_ALL_REDUCE_RMSNORM, xt->count, algo,
                      then) < 0)
        return fcall_end(&f, 0);
    const sn_ar r = {
        .c = c,
        .algo = algo,
        .x = xt->ptr,
        .out = y->ptr,
        .count = xt->count,
        .dtype = xt->dtype,
        .op = sn_op_by_name("sum"),
        .stream = k->stream,
        .collective = SYMNCCL_COLL_ALL_REDUCE_RMSNORM,
        .root = -1,
        .residual = f.res.ptr,
        .out_h = f.h.ptr,
        .weight = f.w.ptr,
        .row_len = H,
        .eps = (float)eps,
        .quant = quant,
        .scale = (float *)f.scale.ptr,
        .ar_algo = then,
    };
    sn_err err = {.cuda = cudaSuccess};
    const int rc = sn_run(&r, sn_call_nccl_done, k, &err);
    if (rc == -1 && sn_fault_check(k->st, c) == 0)
        sn_raise(k->st, &err);
    return fcall_end(&f, rc == 0);
}
