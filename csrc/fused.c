/* Collectives fused with the computation around them: Communicator.
 * all_reduce_rmsnorm, the tensor-parallel all-reduce followed by the
 * residual add and RMSNorm of a transformer layer, as one kernel
 * (kernels/rmsnorm.cuh) or, where that cannot run, NCCL's all-reduce then
 * symnccl's own add+norm (the same kernel with no peer).
 */
#include "symnccl.h"

#include <string.h>

/* One call's state (collectives.c keeps its own for the plain
 * collectives). */
typedef struct {
    SNState *st;
    CommObject *c;
    cudaStream_t stream;
    int torch_current;         /* stream is torch's current one, read here */
    int prev, pushed, entered;
    SNTensor x, res, w, y, h, scale;
    PyObject *y_obj, *h_obj;   /* new references */
} fcall;

static void
fcall_release(fcall *k)
{
    sn_tensor_release(&k->x);
    sn_tensor_release(&k->res);
    sn_tensor_release(&k->w);
    sn_tensor_release(&k->y);
    sn_tensor_release(&k->h);
    sn_tensor_release(&k->scale);
    if (k->pushed)
        sn_device_pop(k->prev);
    if (k->entered)
        sn_comm_leave(k->st, k->c);
}

static PyObject *
fcall_end(fcall *k, int ok)
{
    if (ok && k->y.own != NULL)
        sn_buffer_mark_written(k->y.own, k->stream);
    if (ok && k->h.own != NULL)
        sn_buffer_mark_written(k->h.own, k->stream);
    if (ok && k->scale.own != NULL)   /* fp8_dynamic's row scales */
        sn_buffer_mark_written(k->scale.own, k->stream);
    fcall_release(k);
    PyObject *r = ok ? PyTuple_Pack(2, k->y_obj, k->h_obj) : NULL;
    Py_XDECREF(k->y_obj);
    Py_XDECREF(k->h_obj);
    return r;
}

/* An output: `given` (None: a new tensor like `like`), imported into *t
 * and checked against x's count and `dt` (NULL: x's dtype); *obj takes the
 * new reference. */
static int
output(fcall *k, PyObject *given, PyObject *like, const SNTensor *shape_of,
       const char *name, const sn_dtype *dt, SNTensor *t, PyObject **obj)
{
    if (dt == NULL)
        dt = k->x.dtype;
    if (given == NULL || given == Py_None) {
        if ((*obj = sn_new_output(k->st, k->c, like, shape_of->ndim,
                                  shape_of->shape, shape_of->dtype,
                                  k->stream)) == NULL)
            return -1;
    }
    else
        *obj = Py_NewRef(given);
    if (sn_tensor_import(k->st, *obj, k->stream, k->c->device,
                         k->torch_current, name, t) < 0)
        return -1;
    if (t->readonly) {
        PyErr_Format(PyExc_BufferError, "all_reduce_rmsnorm: %s is "
                     "read-only", name);
        return -1;
    }
    if (t->dtype != dt) {
        PyErr_Format(PyExc_TypeError, "all_reduce_rmsnorm: %s has dtype "
                     "%s, expected %s", name, t->dtype->name, dt->name);
        return -1;
    }
    if (t->count != k->x.count) {
        PyErr_Format(PyExc_ValueError, "all_reduce_rmsnorm: %s has %zu "
                     "elements, expected %zu (x's)", name, t->count,
                     k->x.count);
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
check_inputs(fcall *k, size_t *H)
{
    const sn_dtype *dt = k->x.dtype;
    if (!SYMNCCL_UNIT_FLOAT_TAKES(dt->kernel)) {   /* the kernels' units */
        PyErr_Format(PyExc_TypeError, "all_reduce_rmsnorm: x has dtype %s, "
                     "expected float32, float16 or bfloat16", dt->name);
        return -1;
    }
    if (k->res.dtype != dt || k->w.dtype != dt) {
        PyErr_Format(PyExc_TypeError, "all_reduce_rmsnorm: residual has "
                     "dtype %s and weight %s, expected %s (x's)",
                     k->res.dtype->name, k->w.dtype->name, dt->name);
        return -1;
    }
    if (k->x.ndim < 1) {
        PyErr_SetString(PyExc_ValueError, "all_reduce_rmsnorm: x is a "
                        "scalar, expected (T, H) (or (..., H))");
        return -1;
    }
    *H = (size_t)k->x.shape[k->x.ndim - 1];
    if (*H == 0 || *H % 8 != 0) {
        PyErr_Format(PyExc_ValueError, "all_reduce_rmsnorm: H (x's last "
                     "dimension) is %zu, expected a positive multiple of 8",
                     *H);
        return -1;
    }
    int same = k->res.ndim == k->x.ndim;
    for (int i = 0; same && i < k->x.ndim; i++)
        same = k->res.shape[i] == k->x.shape[i];
    if (!same) {
        PyErr_Format(PyExc_ValueError, "all_reduce_rmsnorm: residual has "
                     "%zu elements (%d dimensions), expected x's shape "
                     "(%zu elements, %d dimensions)", k->res.count,
                     k->res.ndim, k->x.count, k->x.ndim);
        return -1;
    }
    if (k->w.count != *H) {
        PyErr_Format(PyExc_ValueError, "all_reduce_rmsnorm: weight has %zu "
                     "elements, expected %zu (H, x's last dimension)",
                     k->w.count, *H);
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
check_scale(fcall *k, PyObject *obj, int quant, size_t rows)
{
    if (sn_tensor_import(k->st, obj, k->stream, k->c->device,
                         k->torch_current, "scale", &k->scale) < 0)
        return -1;
    const size_t want = quant == SYMNCCL_QUANT_STATIC ? 1 : rows;
    if (k->scale.dtype != sn_dtype_by_name("float32") ||
        k->scale.count != want) {
        PyErr_Format(PyExc_ValueError, "all_reduce_rmsnorm: scale has "
                     "dtype %s and %zu elements, expected float32 and %zu "
                     "(%s)", k->scale.dtype->name, k->scale.count, want,
                     quant == SYMNCCL_QUANT_STATIC ? "one per tensor"
                                                   : "one per row of x");
        return -1;
    }
    if (quant == SYMNCCL_QUANT_DYNAMIC && k->scale.readonly) {
        PyErr_SetString(PyExc_BufferError, "all_reduce_rmsnorm: scale is "
                        "read-only (fp8_dynamic writes the row scales)");
        return -1;
    }
    return 0;
}

/* NCCL's all-reduce of x into a temporary, then the add and the norm by
 * symnccl's kernel with no peer (a.local), on the same stream. */
static int
nccl_then_norm(fcall *k, sn_ar *r)
{
    CommObject *c = k->c;
    if (k->st->group_depth > 0) {
        PyErr_SetString(PyExc_NotImplementedError, "all_reduce_rmsnorm on "
                        "NCCL cannot run inside symnccl.group() (the norm "
                        "would be enqueued before the group's all-reduce)");
        return -1;
    }
    const sn_topology t = sn_topology_of(c);
    if (!t.symmetric || !t.staging) {
        PyErr_Format(PyExc_RuntimeError, "all_reduce_rmsnorm: symnccl's "
                     "add+norm kernel needs the NCCL device API on this "
                     "communicator, which it does not have (%s)",
                     c->symmetric_reason != NULL ? c->symmetric_reason
                                                 : "no staging window");
        return -1;
    }
    const size_t bytes = k->x.count * (size_t)k->x.dtype->itemsize;
    char *tmp = NULL;
    cudaError_t e = cudaMallocAsync((void **)&tmp, bytes, k->stream);
    if (e != cudaSuccess)
        return sn_set_cuda_error(k->st, e, "cudaMallocAsync");
    int ok = 0;
    ncclResult_t rc = ncclAllReduce(k->x.ptr, tmp, k->x.count,
                                    k->x.dtype->nccl, ncclSum, c->comm,
                                    k->stream);
    if (rc == ncclSuccess || rc == ncclInProgress) {
        sn_count_nccl(c);
        sn_watch_nccl(c, SYMNCCL_COLL_ALL_REDUCE_RMSNORM, k->stream);
    }
    if (sn_nccl_complete(k->st, c, rc, "ncclAllReduce "
                         "(all_reduce_rmsnorm)") == 0) {
        sn_err err = {cudaSuccess, ncclSuccess, ""};
        r->algo = SN_ALGO_ONE_SHOT;
        r->x = tmp;
        r->local = 1;
        ok = sn_launch_kernels(r, &err) == 0;
        if (!ok && sn_fault_check(k->st, c) == 0)
            sn_raise(k->st, &err);
    }
    e = cudaFreeAsync(tmp, k->stream);
    if (ok && e != cudaSuccess) {
        sn_set_cuda_error(k->st, e, "cudaFreeAsync");
        ok = 0;
    }
    return ok ? 0 : -1;
}

PyObject *
sn_all_reduce_rmsnorm(CommObject *c, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"x", "residual", "weight", "eps", "out",
                             "residual_out", "quant", "scale", "algo",
                             "stream", NULL};
    PyObject *x, *res, *w, *out = Py_None, *res_out = Py_None;
    PyObject *quant_obj = Py_None, *scale_obj = Py_None;
    PyObject *algo_obj = NULL, *stream_obj = Py_None;
    double eps;
    if (!PyArg_ParseTupleAndKeywords(args, kw,
                                     "OOOd|$OOOOOO:all_reduce_rmsnorm",
                                     kwlist, &x, &res, &w, &eps, &out,
                                     &res_out, &quant_obj, &scale_obj,
                                     &algo_obj, &stream_obj))
        return NULL;
    int quant;
    if (parse_quant(quant_obj, out, scale_obj, &quant) < 0)
        return NULL;
    int algo = SN_ALGO_AUTO, asked;
    if (algo_obj != NULL) {
        const char *s = PyUnicode_Check(algo_obj)
                            ? PyUnicode_AsUTF8AndSize(algo_obj, NULL) : NULL;
        algo = s != NULL ? sn_algo_by_name(s) : SN_ALGO_UNKNOWN;
        if (algo == SN_ALGO_UNKNOWN) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "algo %R is not available: "
                         "expected one of %s", algo_obj, sn_algo_choices());
            return NULL;
        }
    }
    if (!(eps >= 0.0)) {
        PyObject *e = PyFloat_FromDouble(eps);
        if (e != NULL)
            PyErr_Format(PyExc_ValueError, "all_reduce_rmsnorm: eps is %R, "
                         "expected a number >= 0", e);
        Py_XDECREF(e);
        return NULL;
    }
    fcall k;
    memset(&k, 0, sizeof(k));
    k.c = c;
    k.st = sn_state_from_type(Py_TYPE((PyObject *)c));
    if (sn_comm_enter(k.st, c) < 0)
        return NULL;
    k.entered = 1;
    if (stream_obj != Py_None) {
        if (sn_parse_stream(stream_obj, &k.stream) < 0)
            return fcall_end(&k, 0);
    }
    else if (sn_default_stream(k.st, x, c->device, &k.stream,
                               &k.torch_current) < 0)
        return fcall_end(&k, 0);
    if (sn_device_push(k.st, c->device, &k.prev) < 0)
        return fcall_end(&k, 0);
    k.pushed = 1;
    size_t H = 0;
    const int tc = k.torch_current;
    if (sn_tensor_import(k.st, x, k.stream, c->device, tc, "x", &k.x) < 0 ||
        sn_tensor_import(k.st, res, k.stream, c->device, tc, "residual",
                         &k.res) < 0 ||
        sn_tensor_import(k.st, w, k.stream, c->device, tc, "weight",
                         &k.w) < 0 ||
        check_inputs(&k, &H) < 0 ||
        output(&k, out, x, &k.x, "out",
               quant ? sn_dtype_by_name("float8_e4m3fn") : NULL, &k.y,
               &k.y_obj) < 0 ||
        output(&k, res_out, res, &k.x, "residual_out", NULL, &k.h,
               &k.h_obj) < 0 ||
        (quant && check_scale(&k, scale_obj, quant, k.x.count / H) < 0))
        return fcall_end(&k, 0);
    if (check_overlap(&k.y, "out", &k.h, "residual_out", 0) < 0 ||
        check_overlap(&k.y, "out", &k.w, "weight", 0) < 0 ||
        check_overlap(&k.h, "residual_out", &k.w, "weight", 0) < 0 ||
        check_overlap(&k.y, "out", &k.x, "x", 1) < 0 ||
        check_overlap(&k.y, "out", &k.res, "residual", 1) < 0 ||
        check_overlap(&k.h, "residual_out", &k.x, "x", 1) < 0 ||
        check_overlap(&k.h, "residual_out", &k.res, "residual", 1) < 0)
        return fcall_end(&k, 0);
    if (quant == SYMNCCL_QUANT_DYNAMIC) {
        const SNTensor *others[] = {&k.x, &k.res, &k.w, &k.y, &k.h};
        static const char *const names[] = {"x", "residual", "weight",
                                            "out", "residual_out"};
        for (int i = 0; i < 5; i++)
            if (check_overlap(&k.scale, "scale", others[i], names[i], 0) < 0)
                return fcall_end(&k, 0);
    }
    const size_t bytes = k.x.count * (size_t)k.x.dtype->itemsize;
    const sn_topology topo = sn_topology_of(c);
    asked = algo;
    const sn_call_desc d = {SYMNCCL_COLL_ALL_REDUCE_RMSNORM, algo, bytes,
                            k.x.dtype, sn_op_by_name("sum"), 0,
                            k.st->group_depth > 0};
    char why[320];
    algo = sn_resolve(&topo, &c->knobs, &d, why, sizeof(why));
    if (algo == SN_ALGO_UNKNOWN) {
        PyErr_SetString(asked == SN_ALGO_AUTO || asked == SN_ALGO_NCCL
                            ? PyExc_RuntimeError
                            : PyExc_ValueError,
                        why);
        return fcall_end(&k, 0);
    }
    if (algo == SN_ALGO_TWO_SHOT && quant != SYMNCCL_QUANT_NONE) {
        PyErr_SetString(PyExc_ValueError, "all_reduce_rmsnorm: algo "
                        "'two_shot' has no FP8 output (quant=); use "
                        "'one_shot' or 'nccl'");
        return fcall_end(&k, 0);
    }
    if (k.x.count == 0)
        return fcall_end(&k, 1);
    sn_ar r = {c, algo, k.x.ptr, k.y.ptr, NULL, k.x.count, k.x.dtype,
               sn_op_by_name("sum"), k.stream,
               SYMNCCL_COLL_ALL_REDUCE_RMSNORM, -1, k.res.ptr, k.h.ptr,
               k.w.ptr, H, (float)eps, 0, quant, (float *)k.scale.ptr};
    if (algo == SN_ALGO_NCCL)
        return fcall_end(&k, nccl_then_norm(&k, &r) == 0);
    sn_err err = {cudaSuccess, ncclSuccess, ""};
    if (sn_launch_kernels(&r, &err) < 0) {
        if (sn_fault_check(k.st, c) == 0)
            sn_raise(k.st, &err);
        return fcall_end(&k, 0);
    }
    return fcall_end(&k, 1);
}
