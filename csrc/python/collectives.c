/* The collective methods of Communicator: argument handling shared by
 * every op (the call's entry, stream, borrowed tensors and output), the
 * choice of algorithm (sn_resolve, registry.c) and SYMNCCL_CHECK; the
 * launch is run.c's (sn_run, for the methods and the XLA handlers alike),
 * with NCCL's calls completed the methods' way (sn_call_nccl_done).
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

/* The method's completion of an NCCL call (sn_nccl_done_fn): counted,
 * completed, then watched (watchdog.c); -1 with the exception set. The
 * watch event is recorded only once the call has completed: a
 * non-blocking communicator may put NCCL's kernel on the stream after the
 * call returned ncclInProgress, and an event recorded before it completes
 * at once, so the watchdog never saw the kernel hang (2x H100: the
 * survivor of a peer that left waited forever in torch.cuda.synchronize()). */
int
sn_call_nccl_done(void *ctx, ncclResult_t rc, int collective,
                  const char *what)
{
    sn_call *k = ctx;
    if (rc == ncclSuccess || rc == ncclInProgress)
        sn_count_nccl(k->c);
    if (sn_nccl_complete(k->st, k->c, rc, what) < 0)
        return -1;
    if (k->st->group_depth == 0)   /* a group launches at its end */
        sn_watch_nccl(k->c, collective, k->stream);
    return 0;
}

int
sn_call_run(sn_call *k, const sn_ar *r)
{
    sn_err err = {.cuda = cudaSuccess};
    const int rc = sn_run(r, sn_call_nccl_done, k, &err);
    if (rc != -1)
        return rc == 0 ? 0 : -1;
    /* where a kernel was launched, its failure may be the communicator's
     * (faults.c): that one is raised */
    const int kernel = r->algo != SN_ALGO_NCCL ||
                       r->collective == SYMNCCL_COLL_ALL_REDUCE_RMSNORM;
    if (kernel && sn_fault_check(k->st, k->c) < 0)
        return -1;
    return sn_raise(k->st, &err);
}

/* The sn_ar of a call on x and out (k), resolved to `algo`: `count`
 * elements of out for reduce_scatter, of x for the others. NCCL's
 * window policy reads whether x and out lie in c's windows. */
static int
run(sn_call *k, int collective, int algo, const sn_op *op,
    const sn_window *win, size_t count, int root)
{
    CommObject *c = k->c;
    sn_ar r = {
        .c = c,
        .algo = algo,
        .x = k->x.ptr,
        .out = k->out.ptr,
        .win = win,
        .count = count,
        .dtype = k->x.dtype,
        .op = op,
        .stream = k->stream,
        .collective = collective,
        .root = root,
        .in_group = k->st->group_depth > 0,
    };
    if (algo == SN_ALGO_NCCL) {
        const size_t is = (size_t)k->x.dtype->itemsize;
        const size_t xbytes = k->x.count * is, obytes = k->out.count * is;
        r.x_in_window =
            sn_window_find(c, k->x.ptr, xbytes ? xbytes : 1) != NULL;
        r.out_in_window =
            sn_window_find(c, k->out.ptr, obytes ? obytes : 1) != NULL;
    }
    return sn_call_run(k, &r);
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
    sn_sig mine = {
        .collective = collective,
        .dtype = (int32_t)(k->x.dtype - sn_dtypes),
        .op = op != NULL ? (int32_t)(op - sn_ops) : 0,
        .algo = algo,
        .root = root,
        .then = then,
        .count = count,
    };
    char *dev;
    sn_sig *all;
    sn_err err;
    if (sn_check_buffers(c, sizeof(sn_sig), (void **)&dev, (void **)&all,
                         &err) < 0)
        return sn_raise(k->st, &err);
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
    const sn_call_desc d = {
        .collective = collective,
        .algo = algo,
        .bytes = bytes,
        .dtype = k->x.dtype,
        .op = op,
        .in_window = in_window,
        .in_group = k->st->group_depth > 0,
    };
    char why[320];
    const int got = sn_run_resolve(k->c, &d, why, sizeof(why));
    if (got == SN_ALGO_UNKNOWN)
        PyErr_SetString(algo == SN_ALGO_AUTO || algo == SN_ALGO_NCCL
                            ? PyExc_RuntimeError
                            : PyExc_ValueError,
                        why);
    return got;
}

PyObject *
sn_all_reduce(CommObject *c, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = SN_KW_all_reduce;
    PyObject *x, *out = Py_None, *stream = Py_None;
    PyObject *op_obj = NULL, *algo_obj = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, SN_FMT_all_reduce, kwlist,
                                     &x, &out, &op_obj, &algo_obj, &stream))
        return NULL;
    const sn_op *op = op_obj != NULL ? parse_op(op_obj) : sn_op_by_name("sum");
    if (op == NULL)
        return NULL;
    int algo = SN_ALGO_AUTO;
    if (algo_obj != NULL &&
        (algo = parse_algo(algo_obj)) == SN_ALGO_UNKNOWN)
        return NULL;
    op = sn_run_op(c, op);
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
    return call_end(&k, run(&k, SYMNCCL_COLL_ALL_REDUCE, algo, op,
                            algo != SN_ALGO_NCCL ? win : NULL, k.x.count,
                            -1) == 0);
}

/* reduce_scatter and all_gather once x is borrowed (k) and out's shape
 * is known: out (out=, or a new tensor of ndim/shape) of out_count
 * elements, the algorithm (the resolver sees the larger buffer, nranks
 * blocks), SYMNCCL_CHECK's comparison, then the run on one rank's block
 * (NCCL's count: reduce_scatter's out, all_gather's x). */
static PyObject *
run_blocks(sn_call *k, PyObject *x, PyObject *out, int collective, int algo,
           const sn_op *op, size_t out_count, int ndim, const int64_t *shape)
{
    const size_t larger = out_count > k->x.count ? out_count : k->x.count;
    const size_t block = out_count < k->x.count ? out_count : k->x.count;
    if (call_output(k, x, out, out_count, ndim, shape, 0) < 0 ||
        (algo = call_algo(k, collective, algo, op,
                          larger * (size_t)k->x.dtype->itemsize, 0)) ==
            SN_ALGO_UNKNOWN ||
        check_call(k, collective, k->x.count, op, algo, -1, -1) < 0)
        return call_end(k, 0);
    return call_end(k, run(k, collective, algo, op, NULL, block, -1) == 0);
}

PyObject *
sn_reduce_scatter(CommObject *c, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = SN_KW_reduce_scatter;
    PyObject *x, *out = Py_None, *stream = Py_None;
    PyObject *op_obj = NULL, *algo_obj = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, SN_FMT_reduce_scatter,
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
    return run_blocks(&k, x, out, SYMNCCL_COLL_REDUCE_SCATTER, algo, op,
                      k.x.count / n, ndim, shape);
}

PyObject *
sn_all_gather(CommObject *c, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = SN_KW_all_gather;
    PyObject *x, *out = Py_None, *stream = Py_None, *algo_obj = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, SN_FMT_all_gather, kwlist,
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
    return run_blocks(&k, x, out, SYMNCCL_COLL_ALL_GATHER, algo, NULL,
                      k.x.count * (size_t)c->nranks, ndim, shape);
}

/* broadcast and reduce: root's x to every rank, or every rank's x reduced
 * on root; in place unless out= is given. */
static PyObject *
rooted(CommObject *c, PyObject *args, PyObject *kw, int collective)
{
    static char *bkw[] = SN_KW_broadcast;
    static char *rkw[] = SN_KW_reduce;
    PyObject *x, *out = Py_None, *stream = Py_None, *op_obj = NULL;
    PyObject *algo_obj = NULL;
    int root = 0;
    int ok = collective == SYMNCCL_COLL_BROADCAST
        ? PyArg_ParseTupleAndKeywords(args, kw, SN_FMT_broadcast, bkw, &x,
                                      &root, &out, &algo_obj, &stream)
        : PyArg_ParseTupleAndKeywords(args, kw, SN_FMT_reduce, rkw, &x,
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
    /* NCCL's reduce takes op; its broadcast reads none */
    return call_end(&k, run(&k, collective, algo,
                            algo == SN_ALGO_NCCL ? op : rop, NULL,
                            k.x.count, root) == 0);
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
    static char *kwlist[] = SN_KW_barrier;
    PyObject *stream = Py_None;
    int blocking = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, SN_FMT_barrier, kwlist,
                                     &stream, &blocking))
        return NULL;
    sn_call k;
    if (call_begin(&k, c, NULL, stream) < 0 ||
        no_nccl(&k, SYMNCCL_COLL_BARRIER) < 0)
        return call_end(&k, 0);
    int *word = sn_barrier_word(c);
    ncclResult_t rc = ncclAllReduce(word, word, 1, ncclInt32, ncclSum,
                                    c->comm, k.stream);
    if (sn_call_nccl_done(&k, rc, SYMNCCL_COLL_BARRIER,
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
