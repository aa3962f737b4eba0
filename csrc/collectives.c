/* The collective methods of Communicator: argument handling shared by
 * every op, the choice of algorithm (sn_resolve, registry.c), symnccl's
 * kernels (launch.c) or NCCL (ncclAllReduce & co. on the caller's stream;
 * NCCL's own symmetric-window kernels see a window only where the
 * NCCL-window policy of nccl_policy.c allows).
 */
#include "symnccl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int
call_begin(sn_call *k, CommObject *c, PyObject *x, PyObject *stream_obj)
{
    memset(k, 0, sizeof(*k));
    k->c = c;
    k->st = sn_state_from_type(Py_TYPE((PyObject *)c));
    if (sn_comm_enter(k->st, c) < 0)
        return -1;
    k->entered = 1;
    if (stream_obj != NULL && stream_obj != Py_None) {
        if (sn_parse_stream(stream_obj, &k->stream) < 0)
            return -1;
    }
    else if (sn_default_stream(k->st, x != NULL ? x : Py_None, c->device,
                               &k->stream, &k->torch_current) < 0)
        return -1;
    if (sn_device_push(k->st, c->device, &k->prev) < 0)
        return -1;
    k->pushed = 1;
    if (x != NULL &&
        sn_tensor_import(k->st, x, k->stream, c->device, k->torch_current,
                         "x", &k->x) < 0)
        return -1;
    return 0;
}

static PyObject *
call_end(sn_call *k, int ok)
{
    if (ok && k->out.own != NULL)
        sn_buffer_mark_written(k->out.own, k->stream);
    sn_tensor_release(&k->x);
    sn_tensor_release(&k->out);
    if (k->pushed)
        sn_device_pop(k->prev);
    if (k->entered)
        sn_comm_leave(k->st, k->c);
    if (!ok) {
        Py_CLEAR(k->result);
        return NULL;
    }
    return k->result;
}

PyObject *
sn_new_output(SNState *st, CommObject *c, PyObject *like, int ndim,
              const int64_t *shape, const sn_dtype *dt, cudaStream_t stream)
{
    PyObject *shp = PyTuple_New(ndim);
    if (shp == NULL)
        return NULL;
    for (int i = 0; i < ndim; i++)
        PyTuple_SetItem(shp, i, PyLong_FromLongLong(shape[i]));
    /* a torch tensor's: like.new_empty(shape) (dtype and device kept), the
     * cheapest allocation torch offers, called here rather than through
     * the frameworks module's Python frame */
    if (sn_is_torch_tensor(st, like)) {
        PyObject *r = PyObject_CallMethodObjArgs(
            like, st->torch_names[SN_TORCH_NEW_EMPTY], shp, NULL);
        Py_DECREF(shp);
        return r;
    }
    PyObject *r = Py_NewRef(Py_None);
    if (st->frameworks != NULL && !sn_is_immutable(like) &&
        !sn_is_buffer(st, like)) {
        Py_DECREF(r);
        r = PyObject_CallMethod(st->frameworks, "alloc", "OOi", like, shp,
                                c->device);
    }
    Py_DECREF(shp);
    if (r != Py_None)
        return r;
    Py_DECREF(r);
    PyObject *arr = sn_buffer_new(st, c, st->DeviceArrayType, ndim, shape,
                                  dt, 0, stream);
    if (arr == NULL || st->frameworks == NULL || sn_is_buffer(st, like))
        return arr;
    r = PyObject_CallMethod(st->frameworks, "wrap", "OO", like, arr);
    Py_DECREF(arr);
    return r;
}

static PyObject *
new_output(sn_call *k, PyObject *like, int ndim, const int64_t *shape)
{
    return sn_new_output(k->st, k->c, like, ndim, shape, k->x.dtype,
                         k->stream);
}

/* Chooses where the result goes: out=, else in place when allowed and x is
 * mutable, else a new tensor of x's framework. */
static int
call_output(sn_call *k, PyObject *x, PyObject *out_obj, size_t count,
            int ndim, const int64_t *shape, int inplace_ok)
{
    if (out_obj == NULL || out_obj == Py_None) {
        if (inplace_ok && !sn_is_immutable(x)) {
            if (k->x.readonly || k->x.copied) {
                PyErr_Format(PyExc_BufferError, "x is %s and cannot be "
                             "reduced in place: pass out=", k->x.readonly
                             ? "read-only" : "a copy its producer made "
                             "(DLPack flag IS_COPIED: the result would be "
                             "lost with it)");
                return -1;
            }
            k->result = Py_NewRef(x);
            k->out = k->x;
            k->out.capsule = NULL;
            k->out.managed = NULL;
            return 0;
        }
        out_obj = new_output(k, x, ndim, shape);
        if (out_obj == NULL)
            return -1;
        k->result = out_obj;
    }
    else
        k->result = Py_NewRef(out_obj);
    if (sn_tensor_import(k->st, out_obj, k->stream, k->c->device,
                         k->torch_current, "out", &k->out) < 0)
        return -1;
    if (sn_tensor_check_output(&k->out, "out") < 0)
        return -1;
    if (k->out.dtype != k->x.dtype) {
        PyErr_Format(PyExc_TypeError, "out has dtype %s, expected %s (x's)",
                     k->out.dtype->name, k->x.dtype->name);
        return -1;
    }
    if (k->out.count != count) {
        PyErr_Format(PyExc_ValueError, "out has %zu elements, expected %zu",
                     k->out.count, count);
        return -1;
    }
    return 0;
}

static const sn_op *
parse_op(PyObject *obj)
{
    const char *s = PyUnicode_Check(obj) ? PyUnicode_AsUTF8AndSize(obj, NULL)
                                         : NULL;
    const sn_op *op = s != NULL ? sn_op_by_name(s) : NULL;
    if (op == NULL) {
        PyErr_Clear();
        PyObject *names = PyUnicode_FromString("");
        for (int i = 0; names != NULL && i < sn_n_ops; i++) {
            PyObject *t = PyUnicode_FromFormat("%U%s'%s'", names,
                                               i ? ", " : "",
                                               sn_ops[i].name);
            Py_DECREF(names);
            names = t;
        }
        if (names != NULL) {
            PyErr_Format(PyExc_ValueError, "op %R is not supported: "
                         "expected one of %U", obj, names);
            Py_DECREF(names);
        }
    }
    return op;
}

/* algo= argument: an algorithm's name or "auto"; symnccl's kernels only
 * where `kernels` (all_reduce). Returns SN_ALGO_*, or SN_ALGO_UNKNOWN with
 * ValueError set. */
static int
parse_algo(PyObject *obj)
{
    const char *s = PyUnicode_Check(obj) ? PyUnicode_AsUTF8AndSize(obj, NULL)
                                         : NULL;
    int a = s != NULL ? sn_algo_by_name(s) : SN_ALGO_UNKNOWN;
    if (a == SN_ALGO_UNKNOWN) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "algo %R is not available: expected "
                     "one of %s", obj, sn_algo_choices());
        return SN_ALGO_UNKNOWN;
    }
    return a;
}

/* The call on symnccl's kernels (launch.c): `count` elements of out for
 * reduce_scatter, of x for the others. */
static int
kernel_call(sn_call *k, int collective, int algo, const sn_op *op,
            const sn_window *win, size_t count, int root)
{
    sn_ar r = {k->c, algo, k->x.ptr, k->out.ptr, win, count, k->x.dtype,
               op, k->stream, collective, root};
    sn_err err = {cudaSuccess, ncclSuccess, ""};
    if (sn_launch_kernels(&r, &err) < 0)
        return sn_fault_check(k->st, k->c) < 0 ? -1 : sn_raise(k->st, &err);
    return 0;
}

/* After enqueueing an NCCL collective (SYMNCCL_COLL_*): counted,
 * completed, then watched (watchdog.c). The watch event is recorded only
 * once the call has completed: a non-blocking communicator may put NCCL's
 * kernel on the stream after the call returned ncclInProgress, and an
 * event recorded before it completes at once, so the watchdog never saw
 * the kernel hang (2x H100: the survivor of a peer that left waited
 * forever in torch.cuda.synchronize()). */
static int
enqueue_done(sn_call *k, ncclResult_t rc, int collective, const char *what)
{
    if (rc == ncclSuccess || rc == ncclInProgress)
        sn_count_nccl(k->c);
    if (sn_nccl_complete(k->st, k->c, rc, what) < 0)
        return -1;
    if (k->st->group_depth == 0)   /* a group launches at its end */
        sn_watch_nccl(k->c, collective, k->stream);
    return 0;
}

/* ------------------------------------------------------------------ */
/* SYMNCCL_CHECK=1: before an eager call runs, every rank's signature of it
 * is all-gathered (NCCL) and compared; a difference fails the communicator
 * with CallMismatchError on every rank, naming this rank's call and the
 * first one that differs. Calls inside a graph capture or a group are not
 * compared (nothing can be read back there). */

typedef struct {
    int32_t collective, dtype, op, algo, root;
    int32_t then;              /* all_reduce_rmsnorm on "nccl": the
                                  all-reduce before the add+norm; else -1 */
    uint64_t count;
} sn_sig;

static void
format_sig(const sn_sig *g, char *buf, size_t size)
{
    const int known = g->collective >= 0 &&
                      g->collective < SYMNCCL_COLL_COUNT &&
                      g->dtype >= 0 && g->dtype < sn_n_dtypes &&
                      g->op >= 0 && g->op < sn_n_ops &&
                      g->algo >= 0 && g->algo < SN_ALGO_COUNT &&
                      g->then >= -1 && g->then < SN_ALGO_COUNT;
    if (!known)
        snprintf(buf, size, "(unreadable signature)");
    else
        snprintf(buf, size, "%s(%s, count %llu, op %s, algo %s%s%s, root "
                 "%d)", sn_collective_name(g->collective),
                 sn_dtypes[g->dtype].name, (unsigned long long)g->count,
                 sn_ops[g->op].name, sn_algos[g->algo].name,
                 g->then >= 0 ? " after an all-reduce on " : "",
                 g->then >= 0 ? sn_algos[g->then].name : "", g->root);
}

/* A loopback rank (loopback.c) has no NCCL communicator. */
static int
no_nccl(sn_call *k, int collective)
{
    if (k->c->comm != NULL)
        return 0;
    PyErr_Format(PyExc_RuntimeError, "%s: this call needs NCCL, and a "
                 "loopback communicator (Communicator._loopback) runs "
                 "symnccl's kernels only", sn_collective_name(collective));
    return -1;
}

static int
check_call(sn_call *k, int collective, size_t count, const sn_op *op,
           int algo, int root, int then)
{
    CommObject *c = k->c;
    unsigned long long capture = 0;
    /* the check itself runs on NCCL (the resolver refused NCCL calls on
     * loopback ranks already) */
    if (c->knobs.check && no_nccl(k, collective) < 0)
        return -1;
    if (!c->knobs.check || k->st->group_depth > 0 ||
        sn_capture_id(k->stream, &capture) != cudaSuccess || capture != 0)
        return 0;
    sn_sig mine = {collective, (int32_t)(k->x.dtype - sn_dtypes),
                   op != NULL ? (int32_t)(op - sn_ops) : 0, algo, root, then,
                   count};
    char *dev;
    sn_sig *all;
    if (sn_check_buffers(k->st, c, sizeof(sn_sig), (void **)&dev,
                         (void **)&all) < 0)
        return -1;
    const size_t n = (size_t)c->nranks, sz = sizeof(sn_sig);
    /* from pinned memory: a pageable copy would first wait for the stream,
     * without a bound */
    all[n] = mine;
    cudaError_t e = cudaMemcpyAsync(dev + n * sz, &all[n], sz,
                                    cudaMemcpyHostToDevice, k->stream);
    if (e != cudaSuccess)
        return sn_set_cuda_error(k->st, e, "SYMNCCL_CHECK copy");
    ncclResult_t rc = ncclAllGather(dev + n * sz, dev, sz, ncclUint8,
                                    c->comm, k->stream);
    if (rc != ncclSuccess && rc != ncclInProgress)
        return sn_set_nccl_error(k->st, rc, c->comm, "SYMNCCL_CHECK "
                                 "(ncclAllGather)");
    if (sn_nccl_complete(k->st, c, rc, "SYMNCCL_CHECK (ncclAllGather)") < 0)
        return -1;
    sn_count_nccl(c);
    e = cudaMemcpyAsync(all, dev, n * sz, cudaMemcpyDeviceToHost, k->stream);
    if (e != cudaSuccess)
        return sn_set_cuda_error(k->st, e, "SYMNCCL_CHECK copy");
    if (!sn_watch_nccl(c, SYMNCCL_COLL_CHECK, k->stream)) {
        PyErr_SetString(PyExc_RuntimeError, "SYMNCCL_CHECK: the event its "
                        "signatures are read after could not be recorded "
                        "(a CUDA error is pending)");
        return -1;
    }
    if (sn_fault_wait_nccl(k->st, c, SYMNCCL_COLL_CHECK) < 0)
        return -1;
    for (size_t q = 0; q < n; q++) {
        if (memcmp(&all[q], &mine, sz) == 0)
            continue;
        char a[160], b[160], msg[400];
        format_sig(&mine, a, sizeof(a));
        format_sig(&all[q], b, sizeof(b));
        snprintf(msg, sizeof(msg), "SYMNCCL_CHECK: rank %d called %s, but "
                 "rank %zu called %s", c->rank, a, q, b);
        sn_fault_record(c, SYMNCCL_FAULT_MISMATCH, SYMNCCL_K_COUNT,
                        collective, (int)q, SYMNCCL_WAIT_NONE, 0.0, msg);
        return sn_fault_raise(k->st, c);
    }
    return 0;
}

/* ------------------------------------------------------------------ */

/* The algorithm of a call (sn_resolve), or SN_ALGO_UNKNOWN with the
 * exception set. `bytes`: the call's larger buffer (an all-gather's
 * output, else x); in_window: x lies in one of c's windows. */
static int
call_algo(sn_call *k, int collective, int algo, const sn_op *op,
          size_t bytes, int in_window)
{
    const sn_topology topo = sn_topology_of(k->c);
    const sn_call_desc d = {collective, algo, bytes, k->x.dtype, op,
                            in_window, k->st->group_depth > 0};
    char why[320];
    const int got = sn_resolve(&topo, &k->c->knobs, &d, why, sizeof(why));
    if (got == SN_ALGO_UNKNOWN)
        PyErr_SetString(algo == SN_ALGO_AUTO || algo == SN_ALGO_NCCL
                            ? PyExc_RuntimeError
                            : PyExc_ValueError,
                        why);
    return got;
}

/* The NCCL call itself, on the buffers given. */
static ncclResult_t
nccl_enqueue(sn_call *k, int collective, const sn_op *op, int root,
             const void *x, void *out)
{
    const ncclDataType_t t = k->x.dtype->nccl;
    ncclComm_t comm = k->c->comm;
    switch (collective) {
    case SYMNCCL_COLL_ALL_REDUCE:
        return ncclAllReduce(x, out, k->x.count, t, op->nccl, comm,
                             k->stream);
    case SYMNCCL_COLL_REDUCE_SCATTER:
        return ncclReduceScatter(x, out, k->out.count, t, op->nccl, comm,
                                 k->stream);
    case SYMNCCL_COLL_ALL_GATHER:
        return ncclAllGather(x, out, k->x.count, t, comm, k->stream);
    case SYMNCCL_COLL_BROADCAST:
        return ncclBroadcast(x, out, k->x.count, t, root, comm, k->stream);
    case SYMNCCL_COLL_REDUCE:
        return ncclReduce(x, out, k->x.count, t, op->nccl, root, comm,
                          k->stream);
    default:
        return ncclInvalidArgument;
    }
}

/* A collective on NCCL. NCCL's own symmetric-window kernels see a window
 * only where the NCCL-window policy allows (nccl_policy.c: the calls the
 * loaded NCCL's kernels get wrong, SYMNCCL_NCCL_WINDOWS); otherwise the
 * call runs on stream-ordered plain memory, which NCCL reduces with its
 * regular kernels: copy in, the collective, copy out. */
static int
nccl_call(sn_call *k, int collective, const sn_op *op, int root)
{
    static const char *const names[SYMNCCL_COLL_COUNT] = {
        [SYMNCCL_COLL_ALL_REDUCE] = "ncclAllReduce",
        [SYMNCCL_COLL_REDUCE_SCATTER] = "ncclReduceScatter",
        [SYMNCCL_COLL_ALL_GATHER] = "ncclAllGather",
        [SYMNCCL_COLL_BROADCAST] = "ncclBroadcast",
        [SYMNCCL_COLL_REDUCE] = "ncclReduce"};
    CommObject *c = k->c;
    const char *what = names[collective];
    const size_t is = (size_t)k->x.dtype->itemsize;
    const size_t xbytes = k->x.count * is, obytes = k->out.count * is;
    const size_t block = collective == SYMNCCL_COLL_REDUCE_SCATTER ? obytes
                         : collective == SYMNCCL_COLL_ALL_GATHER  ? xbytes
                                                                  : 0;
    const char *why = sn_nccl_plain_reason(
        sn_abi_runtime(), c->knobs.nccl_windows, collective, k->x.ptr,
        xbytes, k->out.ptr, obytes, block,
        sn_window_find(c, k->x.ptr, xbytes ? xbytes : 1) != NULL,
        sn_window_find(c, k->out.ptr, obytes ? obytes : 1) != NULL);
    if (why == NULL)
        return enqueue_done(k, nccl_enqueue(k, collective, op, root,
                                            k->x.ptr, k->out.ptr),
                            collective, what);
    if (k->st->group_depth > 0) {
        /* a group launches at its end: the copy out could not follow */
        PyErr_Format(PyExc_NotImplementedError, "%s on a symmetric window "
                     "cannot run inside symnccl.group(): %s (call it outside "
                     "the group, or set SYMNCCL_NCCL_WINDOWS=1 to give NCCL "
                     "the window anyway)", sn_collective_name(collective),
                     why);
        return -1;
    }
    const int in_place = k->x.ptr == k->out.ptr;
    char *tmp = NULL;
    const size_t total = in_place ? obytes : xbytes + obytes;
    cudaError_t e = cudaMallocAsync((void **)&tmp, total ? total : 1,
                                    k->stream);
    if (e != cudaSuccess)
        return sn_set_cuda_error(k->st, e, "cudaMallocAsync (NCCL on plain "
                                 "memory)");
    char *tx = tmp, *tout = in_place ? tmp : tmp + xbytes;
    int ok = 0;
    e = cudaMemcpyAsync(tx, k->x.ptr, xbytes, cudaMemcpyDeviceToDevice,
                        k->stream);
    if (e == cudaSuccess) {
        ok = enqueue_done(k, nccl_enqueue(k, collective, op, root, tx, tout),
                          collective, what) == 0;
        if (ok)
            e = cudaMemcpyAsync(k->out.ptr, tout, obytes,
                                cudaMemcpyDeviceToDevice, k->stream);
    }
    cudaError_t e2 = cudaFreeAsync(tmp, k->stream);
    if (!PyErr_Occurred() && (e != cudaSuccess || e2 != cudaSuccess)) {
        sn_set_cuda_error(k->st, e != cudaSuccess ? e : e2,
                          "copy through plain memory (NCCL-window policy)");
        ok = 0;
    }
    return ok ? 0 : -1;
}

PyObject *
sn_all_reduce(CommObject *c, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"x", "out", "op", "algo", "stream", NULL};
    PyObject *x, *out = Py_None, *stream = Py_None;
    PyObject *op_obj = NULL, *algo_obj = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OOOO:all_reduce", kwlist,
                                     &x, &out, &op_obj, &algo_obj, &stream))
        return NULL;
    const sn_op *op = op_obj != NULL ? parse_op(op_obj) : sn_op_by_name("sum");
    if (op == NULL)
        return NULL;
    int algo = SN_ALGO_AUTO;
    if (algo_obj != NULL &&
        (algo = parse_algo(algo_obj)) == SN_ALGO_UNKNOWN)
        return NULL;
    /* One rank: avg is sum. NCCL 2.28.9's single-rank ncclAvg left the last
     * float64 element of a 4099-element output unwritten (seen on H200). */
    if (op->nccl == ncclAvg && c->nranks == 1)
        op = sn_op_by_name("sum");
    sn_call k;
    if (call_begin(&k, c, x, stream) < 0 ||
        call_output(&k, x, out, k.x.count, k.x.ndim, k.x.shape, 1) < 0)
        return call_end(&k, 0);
    const size_t bytes = k.x.count * (size_t)k.x.dtype->itemsize;
    const sn_window *win = sn_window_find(c, k.x.ptr, bytes);
    if ((algo = call_algo(&k, SYMNCCL_COLL_ALL_REDUCE, algo, op, bytes,
                          win != NULL)) == SN_ALGO_UNKNOWN)
        return call_end(&k, 0);
    if (check_call(&k, SYMNCCL_COLL_ALL_REDUCE, k.x.count, op, algo, -1,
                   -1) < 0)
        return call_end(&k, 0);
    if (algo != SN_ALGO_NCCL)
        return call_end(&k, kernel_call(&k, SYMNCCL_COLL_ALL_REDUCE, algo, op,
                                        win, k.x.count, -1) == 0);
    return call_end(&k, nccl_call(&k, SYMNCCL_COLL_ALL_REDUCE, op, -1) == 0);
}

PyObject *
sn_reduce_scatter(CommObject *c, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"x", "out", "op", "algo", "stream", NULL};
    PyObject *x, *out = Py_None, *stream = Py_None;
    PyObject *op_obj = NULL, *algo_obj = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OOOO:reduce_scatter",
                                     kwlist, &x, &out, &op_obj, &algo_obj,
                                     &stream))
        return NULL;
    const sn_op *op = op_obj != NULL ? parse_op(op_obj) : sn_op_by_name("sum");
    int algo = SN_ALGO_AUTO;
    if (op == NULL || (algo_obj != NULL &&
                       (algo = parse_algo(algo_obj)) == SN_ALGO_UNKNOWN))
        return NULL;
    sn_call k;
    if (call_begin(&k, c, x, stream) < 0)
        return call_end(&k, 0);
    size_t n = (size_t)c->nranks;
    if (k.x.count % n != 0) {
        PyErr_Format(PyExc_ValueError, "reduce_scatter: x has %zu elements, "
                     "expected a multiple of nranks (%d)", k.x.count,
                     c->nranks);
        return call_end(&k, 0);
    }
    int64_t shape[SN_MAX_NDIM];
    int ndim = k.x.ndim;
    memcpy(shape, k.x.shape, sizeof(shape));
    if (ndim >= 1 && shape[0] % (int64_t)n == 0)
        shape[0] /= (int64_t)n;
    else {
        ndim = 1;
        shape[0] = (int64_t)(k.x.count / n);
    }
    if (call_output(&k, x, out, k.x.count / n, ndim, shape, 0) < 0 ||
        (algo = call_algo(&k, SYMNCCL_COLL_REDUCE_SCATTER, algo, op,
                          k.x.count * (size_t)k.x.dtype->itemsize, 0)) ==
            SN_ALGO_UNKNOWN ||
        check_call(&k, SYMNCCL_COLL_REDUCE_SCATTER, k.x.count, op, algo,
                   -1, -1) < 0)
        return call_end(&k, 0);
    if (algo != SN_ALGO_NCCL)
        return call_end(&k, kernel_call(&k, SYMNCCL_COLL_REDUCE_SCATTER, algo,
                                        op, NULL, k.x.count / n, -1) == 0);
    return call_end(&k, nccl_call(&k, SYMNCCL_COLL_REDUCE_SCATTER, op,
                                  -1) == 0);
}

PyObject *
sn_all_gather(CommObject *c, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"x", "out", "algo", "stream", NULL};
    PyObject *x, *out = Py_None, *stream = Py_None, *algo_obj = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OOO:all_gather", kwlist,
                                     &x, &out, &algo_obj, &stream))
        return NULL;
    int algo = SN_ALGO_AUTO;
    if (algo_obj != NULL &&
        (algo = parse_algo(algo_obj)) == SN_ALGO_UNKNOWN)
        return NULL;
    sn_call k;
    if (call_begin(&k, c, x, stream) < 0)
        return call_end(&k, 0);
    int64_t shape[SN_MAX_NDIM];
    int ndim = k.x.ndim;
    memcpy(shape, k.x.shape, sizeof(shape));
    if (ndim == 0) {
        ndim = 1;
        shape[0] = c->nranks;
    }
    else
        shape[0] *= c->nranks;
    if (call_output(&k, x, out, k.x.count * (size_t)c->nranks, ndim, shape,
                    0) < 0 ||
        (algo = call_algo(&k, SYMNCCL_COLL_ALL_GATHER, algo, NULL,
                          k.out.count * (size_t)k.x.dtype->itemsize, 0)) ==
            SN_ALGO_UNKNOWN ||
        check_call(&k, SYMNCCL_COLL_ALL_GATHER, k.x.count, NULL, algo,
                   -1, -1) < 0)
        return call_end(&k, 0);
    if (algo != SN_ALGO_NCCL)
        return call_end(&k, kernel_call(&k, SYMNCCL_COLL_ALL_GATHER, algo,
                                        NULL, NULL, k.x.count, -1) == 0);
    return call_end(&k, nccl_call(&k, SYMNCCL_COLL_ALL_GATHER, NULL, -1) ==
                            0);
}

/* broadcast and reduce: root's x to every rank, or every rank's x reduced
 * on root; in place unless out= is given. */
static PyObject *
rooted(CommObject *c, PyObject *args, PyObject *kw, int collective)
{
    static char *bkw[] = {"x", "root", "out", "algo", "stream", NULL};
    static char *rkw[] = {"x", "root", "out", "op", "algo", "stream", NULL};
    PyObject *x, *out = Py_None, *stream = Py_None, *op_obj = NULL;
    PyObject *algo_obj = NULL;
    int root = 0;
    int ok = collective == SYMNCCL_COLL_BROADCAST
        ? PyArg_ParseTupleAndKeywords(args, kw, "O|iOOO:broadcast", bkw, &x,
                                      &root, &out, &algo_obj, &stream)
        : PyArg_ParseTupleAndKeywords(args, kw, "O|iOOOO:reduce", rkw, &x,
                                      &root, &out, &op_obj, &algo_obj,
                                      &stream);
    if (!ok)
        return NULL;
    const sn_op *op = op_obj != NULL ? parse_op(op_obj) : sn_op_by_name("sum");
    int algo = SN_ALGO_AUTO;
    if (op == NULL || (algo_obj != NULL &&
                       (algo = parse_algo(algo_obj)) == SN_ALGO_UNKNOWN))
        return NULL;
    if (root < 0 || root >= c->nranks) {
        PyErr_Format(PyExc_ValueError, "root %d is out of range: expected "
                     "0 <= root < %d", root, c->nranks);
        return NULL;
    }
    const sn_op *rop = collective == SYMNCCL_COLL_REDUCE ? op : NULL;
    sn_call k;
    if (call_begin(&k, c, x, stream) < 0 ||
        call_output(&k, x, out, k.x.count, k.x.ndim, k.x.shape, 1) < 0 ||
        (algo = call_algo(&k, collective, algo, rop,
                          k.x.count * (size_t)k.x.dtype->itemsize, 0)) ==
            SN_ALGO_UNKNOWN ||
        check_call(&k, collective, k.x.count, rop, algo, root, -1) < 0)
        return call_end(&k, 0);
    if (algo != SN_ALGO_NCCL)
        return call_end(&k, kernel_call(&k, collective, algo, rop, NULL,
                                        k.x.count, root) == 0);
    return call_end(&k, nccl_call(&k, collective, op, root) == 0);
}

PyObject *
sn_broadcast(CommObject *c, PyObject *args, PyObject *kw)
{
    return rooted(c, args, kw, SYMNCCL_COLL_BROADCAST);
}

PyObject *
sn_reduce(CommObject *c, PyObject *args, PyObject *kw)
{
    return rooted(c, args, kw, SYMNCCL_COLL_REDUCE);
}

PyObject *
sn_barrier(CommObject *c, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"stream", "blocking", NULL};
    PyObject *stream = Py_None;
    int blocking = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O$p:barrier", kwlist,
                                     &stream, &blocking))
        return NULL;
    sn_call k;
    if (call_begin(&k, c, NULL, stream) < 0 ||
        no_nccl(&k, SYMNCCL_COLL_BARRIER) < 0)
        return call_end(&k, 0);
    int *word = sn_barrier_word(c);
    ncclResult_t rc = ncclAllReduce(word, word, 1, ncclInt32, ncclSum,
                                    c->comm, k.stream);
    if (enqueue_done(&k, rc, SYMNCCL_COLL_BARRIER,
                     "barrier (ncclAllReduce)") < 0)
        return call_end(&k, 0);
    /* blocking: until the barrier completed, for at most the timeout */
    if (blocking && k.st->group_depth == 0 &&
        sn_fault_wait_nccl(k.st, c, SYMNCCL_COLL_BARRIER) < 0)
        return call_end(&k, 0);
    k.result = Py_NewRef(Py_None);
    return call_end(&k, 1);
}

/* ------------------------------------------------------------------ */
/* For the collectives of later layers (alltoall.c). */

int
sn_call_begin(sn_call *k, CommObject *c, PyObject *x, PyObject *stream)
{
    return call_begin(k, c, x, stream);
}

PyObject *
sn_call_end(sn_call *k, int ok)
{
    return call_end(k, ok);
}

int
sn_call_output(sn_call *k, PyObject *x, PyObject *out, size_t count,
               int ndim, const int64_t *shape)
{
    return call_output(k, x, out, count, ndim, shape, 0);
}

int
sn_parse_algo(PyObject *obj)
{
    return parse_algo(obj);
}

int
sn_call_algo(sn_call *k, int collective, int algo, size_t bytes)
{
    return call_algo(k, collective, algo, NULL, bytes, 0);
}

int
sn_call_check(sn_call *k, int collective, size_t count, int algo, int then)
{
    return check_call(k, collective, count, NULL, algo, -1, then);
}

int
sn_call_enqueued(sn_call *k, ncclResult_t rc, int collective,
                 const char *what)
{
    return enqueue_done(k, rc, collective, what);
}
