/* all_to_all and all_to_all_v, the exchange of mixture-of-experts layers
 * (issue 32): rank r's block q goes to rank q, which places the blocks of
 * ranks 0..n-1 one after another. Rows are x's first dimension; a row is
 * everything after it, moved as bytes (every dtype).
 *
 * symnccl's kernels (algo='push' for any size, 'll' for an x that fits
 * one row of LL packets; kernels/alltoall.cuh) take the splits
 * from the host (copied into the launch's arguments: nothing waits) or
 * from a device tensor (read by the kernel: nothing synchronises, and the
 * call can be captured in a CUDA graph whose replays see new splits); the
 * ranks exchange the counts in the kernel, which writes out_splits. NCCL
 * (algo='nccl', and 'auto' where the auto table has no row) runs grouped
 * ncclSend/ncclRecv; for all_to_all_v it first exchanges the counts and
 * reads them back to the host: that path waits for the caller's stream
 * (nccl_all_to_all_v), and allocates nothing per call.
 */
#include "symnccl.h"

#include <string.h>

/* Rows per destination as the call gave them. */
typedef struct {
    int64_t host[SYMNCCL_MAX_RANKS];
    SNTensor dev;              /* dev.ptr != NULL: a device tensor */
} sn_splits;

static size_t
row_elems(const SNTensor *t)
{
    size_t e = 1;
    for (int i = 1; i < t->ndim; i++)
        e *= (size_t)t->shape[i];
    return e;
}

/* The splits travel in arrays of SYMNCCL_MAX_RANKS (sn_splits, the
 * kernels' launch arguments, the NCCL path's counts): a larger
 * communicator is refused, never overrun. */
static int
check_ranks(const CommObject *c, const char *name)
{
    if (c->nranks <= SYMNCCL_MAX_RANKS)
        return 0;
    PyErr_Format(PyExc_ValueError, "%s: this communicator has %d ranks, "
                 "expected at most %d (all-to-all's limit for now)", name,
                 c->nranks, SYMNCCL_MAX_RANKS);
    return -1;
}

/* 1 if [a, a + an) and [b, b + bn) overlap. */
static int
overlap(const char *a, size_t an, const char *b, size_t bn)
{
    return an != 0 && bn != 0 && a < b + bn && b < a + an;
}

static int
check_not_in_place(const sn_call *k, size_t bytes_out)
{
    const size_t bx = k->x.count * (size_t)k->x.dtype->itemsize;
    if (overlap(k->x.ptr, bx, k->out.ptr, bytes_out)) {
        PyErr_SetString(PyExc_ValueError, "out overlaps x: all_to_all "
                        "cannot run in place (expected separate memory)");
        return -1;
    }
    return 0;
}

/* all_to_all_v's kernels read x and the device in_splits on every CTA,
 * while CTA 0 writes out_splits and out_offsets and every CTA writes out,
 * with no order among the CTAs: a tensor written sharing memory with
 * another would be read changed by a late CTA (a send row, a chunk count
 * that differs from CTA 0's). Refused, as out overlapping x is (that pair
 * is refused before, by check_not_in_place); absent tensors have ptr
 * NULL. */
static int
check_distinct(const sn_call *k, const SNTensor *in_splits,
               const SNTensor *out_splits, const SNTensor *out_offsets)
{
    const struct {
        const char *name;
        const SNTensor *t;
        int written;
    } ts[] = {{"x", &k->x, 0},
              {"out", &k->out, 1},
              {"in_splits", in_splits, 0},
              {"out_splits", out_splits, 1},
              {"out_offsets", out_offsets, 1}};
    const int n = (int)(sizeof(ts) / sizeof(ts[0]));
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) {
            const SNTensor *a = ts[i].t, *b = ts[j].t;
            if (a->ptr == NULL || b->ptr == NULL ||
                !(ts[i].written || ts[j].written))
                continue;
            if (overlap(a->ptr, a->count * (size_t)a->dtype->itemsize,
                        b->ptr, b->count * (size_t)b->dtype->itemsize)) {
                PyErr_Format(PyExc_ValueError, "all_to_all_v: %s shares "
                             "memory with %s (expected out, out_splits and "
                             "out_offsets each in memory of its own: the "
                             "kernels write them while other CTAs still "
                             "read the inputs)", ts[j].name, ts[i].name);
                return -1;
            }
        }
    return 0;
}

/* A device tensor (DLPack device CUDA) or anything else, read as a
 * sequence of nranks Python ints. */
static int
is_device_tensor(PyObject *obj)
{
    if (!PyObject_HasAttrString(obj, "__dlpack_device__"))
        return 0;
    PyObject *d = PyObject_CallMethod(obj, "__dlpack_device__", NULL);
    if (d == NULL) {
        PyErr_Clear();
        return 0;
    }
    long kind = PyTuple_Check(d) && PyTuple_Size(d) >= 1
                    ? PyLong_AsLong(PyTuple_GetItem(d, 0)) : -1;
    Py_DECREF(d);
    PyErr_Clear();
    return kind == 2 || kind == 13;   /* kDLCUDA, kDLCUDAManaged */
}

/* A device int64 tensor of nranks elements, borrowed for the call. */
static int
import_counts(sn_call *k, PyObject *obj, const char *name, SNTensor *t)
{
    if (sn_tensor_import(k->st, obj, k->stream, k->c->device,
                         k->torch_current, name, t) < 0)
        return -1;
    if (t->dtype->nccl != ncclInt64) {
        PyErr_Format(PyExc_TypeError, "%s has dtype %s, expected int64",
                     name, t->dtype->name);
        return -1;
    }
    if (t->count != (size_t)k->c->nranks) {
        PyErr_Format(PyExc_ValueError, "%s has %zu elements, expected "
                     "nranks (%d)", name, t->count, k->c->nranks);
        return -1;
    }
    if (strcmp(name, "in_splits") != 0 &&
        sn_tensor_check_output(t, name) < 0)
        return -1;
    return 0;
}

static int
parse_splits(sn_call *k, PyObject *obj, int64_t x_rows, sn_splits *s)
{
    const int n = k->c->nranks;
    if (is_device_tensor(obj))
        return import_counts(k, obj, "in_splits", &s->dev);
    const Py_ssize_t len = PySequence_Check(obj) ? PySequence_Size(obj) : -1;
    if (len < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "in_splits is %R, expected a sequence "
                     "of nranks ints or a device int64 tensor", obj);
        return -1;
    }
    int64_t sum = 0;
    int rc = 0;
    if (len != n) {
        PyErr_Format(PyExc_ValueError, "in_splits has %zd entries, expected "
                     "nranks (%d)", len, n);
        rc = -1;
    }
    for (Py_ssize_t i = 0; rc == 0 && i < len; i++) {
        PyObject *item = PySequence_GetItem(obj, i);
        long long v = item != NULL ? PyLong_AsLongLong(item) : -1;
        Py_XDECREF(item);
        if (v == -1 && PyErr_Occurred())
            rc = -1;
        else if (v < 0) {
            PyErr_Format(PyExc_ValueError, "in_splits[%zd] is %lld, "
                         "expected a count of rows >= 0", i, v);
            rc = -1;
        }
        else {
            s->host[i] = v;
            sum += v;
        }
    }
    if (rc == 0 && sum > x_rows) {
        PyErr_Format(PyExc_ValueError, "in_splits sum to %lld rows, but x "
                     "has %lld (its first dimension)", (long long)sum,
                     (long long)x_rows);
        rc = -1;
    }
    return rc;
}

/* The algorithm and the rows an ll block carries (sn_a2a_plan, launch.c:
 * decided from what every rank agrees on); -1 with ValueError. */
static int
plan(sn_call *k, const char *name, int asked, int *algo, int ragged,
     size_t rows, size_t out_rows, size_t row_size, size_t *block)
{
    char why[240];
    if (sn_a2a_plan(k->c, asked, algo, ragged, rows, out_rows, row_size,
                    block, why, sizeof(why)) == 0)
        return 0;
    PyErr_Format(PyExc_ValueError, "%s: %s", name, why);
    return -1;
}

/* The call's sn_ar: `rows` of x, of row_size bytes, into out_rows of out,
 * the splits as the call gave them (s). */
static sn_ar
a2a_ar(const sn_call *k, int algo, size_t rows, size_t row_size,
       size_t out_rows, const sn_splits *s, int64_t *out_splits,
       int64_t *out_offsets)
{
    return (sn_ar){
        .c = k->c,
        .algo = algo,
        .x = k->x.ptr,
        .out = k->out.ptr,
        .count = rows,
        .dtype = k->x.dtype,
        .stream = k->stream,
        .collective = SYMNCCL_COLL_ALL_TO_ALL,
        .root = -1,
        .row_size = row_size,
        .out_rows = out_rows,
        .in_splits = (const int64_t *)s->dev.ptr,
        .host_splits = s->host,
        .out_splits = out_splits,
        .out_offsets = out_offsets,
        .in_group = k->st->group_depth > 0,
    };
}

/* all_to_all_v on NCCL: every rank's counts, x's rows and out's rows
 * all-gathered (ncclAllGather of n + 2 int64 per rank) and read back to the
 * host, bounded by the timeout; then the data. Reading the counts on the
 * host is what NCCL's path needs (it posts one ncclRecv per peer, sized by
 * the count): it waits for the caller's stream up to the counts, whether
 * the splits came from the host or the device, and for nothing else (no
 * other stream, no device-wide synchronisation).
 *
 * Every rank sees the whole matrix and every rank's x and out rows, so it
 * computes what every pair moves exactly as the kernels do
 * (kernels/alltoall.cuh): a sender's counts clamped to x's rows (negative
 * -> 0, rows past x's end dropped), a receiver's rows past out's end
 * dropped; out_splits reports what each rank sent. Nothing is refused
 * after the exchange: a verdict from one rank's values would leave its
 * peers' sends waiting (docs/FAILURES.md, "Refusals every rank agrees
 * on"), and here every rank reaches the same plan from the same numbers.
 *
 * The counts' memory is the communicator's (a2a.dev, a2a.host: room for
 * A2A_WORDS int64, allocated at its first such call and freed with its
 * scratch, staging.c; a failed call's are kept apart until then), not a
 * call's: a cudaMallocHost / cudaFreeHost per call cost ~1 ms,
 * cudaFreeHost synchronising the whole device. Reusing it is safe by
 * construction: every copy that reads or writes it (this rank's row in,
 * the matrix out) is enqueued before the watch event that this call waits
 * for, and nothing enqueued after that wait touches it (out_splits and
 * out_offsets are copied from this function's stack through pageable
 * memory, which cudaMemcpyAsync has staged by the time it returns), so a
 * call returns with nothing in flight on that memory, on any stream.
 * a2a.busy refuses a second thread while one waits without the GIL (NCCL
 * communicators are not for concurrent use anyway). */
#define A2A_ROW (SYMNCCL_MAX_RANKS + 2)

/* a + b for counts >= 0, at most INT64_MAX (peers' counts are anything) */
static int64_t
sat_add(int64_t a, int64_t b)
{
    int64_t r;
    return __builtin_add_overflow(a, b, &r) ? INT64_MAX : r;
}
#define A2A_WORDS ((SYMNCCL_MAX_RANKS + 1) * A2A_ROW)

static int
nccl_all_to_all_v(sn_call *k, const sn_splits *s, size_t row_size,
                  size_t x_rows, size_t out_rows, int64_t *out_splits,
                  int64_t *out_offsets)
{
    CommObject *c = k->c;
    const int n = c->nranks, me = c->rank;
    const size_t w = (size_t)n + 2;          /* int64 per rank's row */
    const size_t mine = (size_t)n * w;       /* this rank's row, staged */
    const size_t room = A2A_WORDS * sizeof(int64_t);
    unsigned long long capture = 0;
    cudaError_t e = sn_capture_id(k->stream, &capture);
    if (e != cudaSuccess)
        return sn_set_cuda_error(k->st, e, "cudaStreamGetCaptureInfo");
    if (k->st->group_depth > 0 || capture != 0) {
        PyErr_SetString(PyExc_NotImplementedError, "all_to_all_v with "
                        "algo='nccl' reads the counts back to the host: it "
                        "cannot run inside symnccl.group() or a CUDA graph "
                        "capture (algo='push' can)");
        return -1;
    }
    if (c->a2a.busy) {
        PyErr_Format(PyExc_RuntimeError, "all_to_all_v with algo='nccl' is "
                     "already running on rank %d's communicator in another "
                     "thread (expected one call at a time)", c->rank);
        return -1;
    }
    if (c->a2a.dev == NULL)
        SN_CUDA_GOTO(k->st, cudaMalloc((void **)&c->a2a.dev, room),
                     "cudaMalloc (all_to_all_v counts)", error);
    if (c->a2a.host == NULL)
        SN_CUDA_GOTO(k->st, cudaMallocHost((void **)&c->a2a.host, room),
                     "cudaMallocHost (all_to_all_v counts)", error);
    int64_t *dev = c->a2a.dev, *host = c->a2a.host;
    c->a2a.busy = 1;
    int ok = 0, in_flight = 1;
    /* this rank's row at dev[mine]: its n counts (from the device or the
     * host), then x's rows and out's rows */
    host[mine + (size_t)n] = (int64_t)x_rows;
    host[mine + (size_t)n + 1] = (int64_t)out_rows;
    if (s->dev.ptr != NULL) {
        e = cudaMemcpyAsync(dev + mine, s->dev.ptr, (size_t)n * 8,
                            cudaMemcpyDeviceToDevice, k->stream);
        if (e == cudaSuccess)
            e = cudaMemcpyAsync(dev + mine + n, host + mine + n, 2 * 8,
                                cudaMemcpyHostToDevice, k->stream);
    }
    else {
        memcpy(host + mine, s->host, (size_t)n * 8);
        e = cudaMemcpyAsync(dev + mine, host + mine, w * 8,
                            cudaMemcpyHostToDevice, k->stream);
    }
    SN_CUDA_GOTO(k->st, e, "all_to_all_v counts copy", done);
    ncclResult_t rc = ncclAllGather(dev + mine, dev, w, ncclInt64, c->comm,
                                    k->stream);
    if (rc != ncclSuccess && rc != ncclInProgress) {
        sn_set_nccl_error(k->st, rc, c->comm, "all_to_all_v counts "
                          "(ncclAllGather)");
        goto done;
    }
    if (sn_nccl_complete(k->st, c, rc, "all_to_all_v counts") < 0)
        goto done;
    sn_count_nccl(c);
    SN_CUDA_GOTO(k->st, cudaMemcpyAsync(host, dev, mine * 8,
                                        cudaMemcpyDeviceToHost, k->stream),
                 "all_to_all_v counts copy", done);
    /* the watch event follows every use of dev and host: after this wait
     * nothing of this call reads or writes them */
    if (!sn_watch_nccl(c, SYMNCCL_COLL_ALL_TO_ALL, k->stream)) {
        PyErr_SetString(PyExc_RuntimeError, "all_to_all_v: the event its "
                        "counts are read after could not be recorded (a "
                        "CUDA error is pending)");
        goto done;
    }
    if (sn_fault_wait_nccl(k->st, c, SYMNCCL_COLL_ALL_TO_ALL) < 0)
        goto done;
    in_flight = 0;
    /* the plan, the same on every rank (kernels/alltoall.cuh's): v[r][q]
     * the rows r sends q, its counts clamped to its x's rows; q places
     * them after those of ranks before r and keeps what fits its out */
    int64_t v[SYMNCCL_MAX_RANKS][SYMNCCL_MAX_RANKS];
    for (int r = 0; r < n; r++) {
        const int64_t *row = host + (size_t)r * w;
        int64_t left = row[n] < 0 ? 0 : row[n];
        for (int q = 0; q < n; q++) {
            v[r][q] = row[q] < 0 ? 0 : row[q] > left ? left : row[q];
            left -= v[r][q];
        }
    }
    /* this rank's sends: block q starts after its blocks for ranks < q,
     * and q keeps what fits past the rows of ranks < me */
    int64_t send[SYMNCCL_MAX_RANKS], send_off[SYMNCCL_MAX_RANKS];
    int64_t recv[SYMNCCL_MAX_RANKS], got[SYMNCCL_MAX_RANKS];
    int64_t offs[SYMNCCL_MAX_RANKS], at = 0;
    for (int q = 0; q < n; q++) {
        int64_t before = 0;
        for (int r = 0; r < me; r++)
            before = sat_add(before, v[r][q]);
        const int64_t fits = host[(size_t)q * w + (size_t)n + 1] - before;
        send[q] = fits <= 0 ? 0 : v[me][q] < fits ? v[me][q] : fits;
        send_off[q] = at;
        at += v[me][q];          /* <= x's rows: no overflow */
    }
    /* its receives: rank r's rows at offs[r], what fits its out */
    at = 0;
    for (int r = 0; r < n; r++) {
        const int64_t fits = (int64_t)out_rows - at;
        got[r] = v[r][me];
        offs[r] = at;
        recv[r] = fits <= 0 ? 0 : v[r][me] < fits ? v[r][me] : fits;
        at = sat_add(at, v[r][me]);
    }
    /* pageable sources: staged by the time the calls return, so the arrays
     * may go (CUDA's "API synchronization behavior"); the stream is
     * drained up to here, so this waits for nothing */
    if (out_splits != NULL)
        SN_CUDA_GOTO(k->st, cudaMemcpyAsync(out_splits, got, (size_t)n * 8,
                                            cudaMemcpyHostToDevice,
                                            k->stream),
                     "out_splits copy", done);
    if (out_offsets != NULL)
        SN_CUDA_GOTO(k->st, cudaMemcpyAsync(out_offsets, offs,
                                            (size_t)n * 8,
                                            cudaMemcpyHostToDevice,
                                            k->stream),
                     "out_offsets copy", done);
    const sn_ar r = a2a_ar(k, SN_ALGO_NCCL, x_rows, row_size, out_rows, s,
                           NULL, NULL);
    sn_err err = {.cuda = cudaSuccess};
    const int ran = sn_run_exchange(&r, send, send_off, recv, offs,
                                    sn_call_nccl_done, k, &err);
    if (ran == -1)
        sn_raise(k->st, &err);
    ok = ran == 0;
done:
    if (in_flight) {
        /* a copy of this call may still be queued (it failed before the
         * wait): the memory is left to it, freed once the communicator's
         * work has drained (sn_scratch_free), and the next call allocates
         * its own; a second failed call's stays allocated (a communicator
         * that failed is aborted, and 9 KiB is the cost) */
        if (c->a2a.lost_dev == NULL && c->a2a.lost_host == NULL) {
            c->a2a.lost_dev = c->a2a.dev;
            c->a2a.lost_host = c->a2a.host;
        }
        c->a2a.dev = NULL;
        c->a2a.host = NULL;
    }
    c->a2a.busy = 0;
    return ok ? 0 : -1;
error:
    return -1;
}

PyObject *
sn_all_to_all(CommObject *c, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = SN_KW_all_to_all;
    PyObject *x, *out = Py_None, *stream = Py_None, *algo_obj = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, SN_FMT_all_to_all, kwlist,
                                     &x, &out, &algo_obj, &stream))
        return NULL;
    int algo = SN_ALGO_AUTO;
    if ((algo_obj != NULL &&
         (algo = sn_parse_algo(algo_obj)) == SN_ALGO_UNKNOWN) ||
        check_ranks(c, "all_to_all") < 0)
        return NULL;
    const int asked = algo;
    size_t block;
    sn_call k;
    if (sn_call_begin(&k, c, x, stream) < 0)
        return sn_call_end(&k, 0);
    const int n = c->nranks;
    if (k.x.ndim == 0 || k.x.shape[0] % n != 0) {
        if (k.x.ndim == 0)
            PyErr_SetString(PyExc_ValueError, "all_to_all: x is a scalar, "
                            "expected rows (a first dimension) to split");
        else
            PyErr_Format(PyExc_ValueError, "all_to_all: x has %lld rows "
                         "(its first dimension), expected a multiple of "
                         "nranks (%d)", (long long)k.x.shape[0], n);
        return sn_call_end(&k, 0);
    }
    const size_t is = (size_t)k.x.dtype->itemsize;
    const size_t rows = (size_t)k.x.shape[0];
    const size_t row_size = row_elems(&k.x) * is;
    if (sn_call_output(&k, x, out, k.x.count, k.x.ndim, k.x.shape) < 0 ||
        check_not_in_place(&k, k.x.count * is) < 0 ||
        (algo = sn_call_algo(&k, SYMNCCL_COLL_ALL_TO_ALL, algo,
                             k.x.count * is)) == SN_ALGO_UNKNOWN ||
        plan(&k, "all_to_all", asked, &algo, 0, rows, rows, row_size,
             &block) < 0 ||
        sn_call_check(&k, SYMNCCL_COLL_ALL_TO_ALL, k.x.count, algo, -1) < 0)
        return sn_call_end(&k, 0);
    if (k.x.count == 0)   /* the same on every rank */
        return sn_call_end(&k, 1);
    sn_splits s;
    memset(&s, 0, sizeof(s));
    for (int q = 0; q < n; q++)
        s.host[q] = (int64_t)(rows / (size_t)n);
    const sn_ar r = a2a_ar(&k, algo, rows, row_size, rows, &s, NULL, NULL);
    return sn_call_end(&k, sn_call_run(&k, &r) == 0);
}

PyObject *
sn_all_to_all_v(CommObject *c, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = SN_KW_all_to_all_v;
    PyObject *x, *out, *in_obj, *osp_obj = Py_None, *stream = Py_None;
    PyObject *algo_obj = NULL, *off_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, SN_FMT_all_to_all_v,
                                     kwlist, &x, &out, &in_obj, &osp_obj,
                                     &algo_obj, &stream, &off_obj))
        return NULL;
    int algo = SN_ALGO_AUTO;
    if ((algo_obj != NULL &&
         (algo = sn_parse_algo(algo_obj)) == SN_ALGO_UNKNOWN) ||
        check_ranks(c, "all_to_all_v") < 0)
        return NULL;
    const int asked = algo;
    size_t block = 0;
    if (out == Py_None) {
        PyErr_SetString(PyExc_TypeError, "all_to_all_v: out is None, "
                        "expected a tensor sized for the most rows this "
                        "rank can receive");
        return NULL;
    }
    sn_call k;
    sn_splits s;
    SNTensor osp, off;
    memset(&s, 0, sizeof(s));
    memset(&osp, 0, sizeof(osp));
    memset(&off, 0, sizeof(off));
    int ok = 0;
    if (sn_call_begin(&k, c, x, stream) < 0)
        goto end;
    if (k.x.ndim == 0) {
        PyErr_SetString(PyExc_ValueError, "all_to_all_v: x is a scalar, "
                        "expected rows (a first dimension) to split");
        goto end;
    }
    k.result = Py_NewRef(out);
    if (sn_tensor_import(k.st, out, k.stream, c->device, k.torch_current,
                         "out", &k.out) < 0)
        goto end;
    if (sn_tensor_check_output(&k.out, "out") < 0)
        goto end;
    if (k.out.dtype != k.x.dtype) {
        PyErr_Format(PyExc_TypeError, "out has dtype %s, expected %s (x's)",
                     k.out.dtype->name, k.x.dtype->name);
        goto end;
    }
    const size_t is = (size_t)k.x.dtype->itemsize;
    const size_t elems = row_elems(&k.x);
    if (k.out.ndim == 0 || row_elems(&k.out) != elems) {
        PyErr_Format(PyExc_ValueError, "out has rows of %zu elements, "
                     "expected %zu (x's rows: everything after the first "
                     "dimension)", k.out.ndim ? row_elems(&k.out) : 0,
                     elems);
        goto end;
    }
    const size_t x_rows = (size_t)k.x.shape[0];
    const size_t out_rows = (size_t)k.out.shape[0];
    if (check_not_in_place(&k, k.out.count * is) < 0 ||
        parse_splits(&k, in_obj, (int64_t)x_rows, &s) < 0)
        goto end;
    if (osp_obj != Py_None &&
        import_counts(&k, osp_obj, "out_splits", &osp) < 0)
        goto end;
    if (off_obj != Py_None &&
        import_counts(&k, off_obj, "out_offsets", &off) < 0)
        goto end;
    if (check_distinct(&k, &s.dev, &osp, &off) < 0)
        goto end;
    /* every rank must pick the same algorithm: "auto" by out's bytes,
     * which the call's contract makes the same on every rank (sized for
     * the most rows a rank can receive); x's rows differ by rank and are
     * not read (sn_a2a_plan) */
    if ((algo = sn_call_algo(&k, SYMNCCL_COLL_ALL_TO_ALL, algo,
                             k.out.count * is)) == SN_ALGO_UNKNOWN ||
        plan(&k, "all_to_all_v", asked, &algo, 1, x_rows, out_rows,
             elems * is, &block) < 0 ||
        sn_call_check(&k, SYMNCCL_COLL_ALL_TO_ALL, elems * is, algo,
                      -1) < 0)
        goto end;
    if (algo != SN_ALGO_NCCL) {
        const sn_ar r = a2a_ar(&k, algo, x_rows, elems * is, out_rows, &s,
                               (int64_t *)osp.ptr, (int64_t *)off.ptr);
        ok = sn_call_run(&k, &r) == 0;
        /* told after the launch, so that a warning turned into an error
         * never leaves the peers waiting */
        for (int q = 0; ok && s.dev.ptr == NULL && q < c->nranks; q++)
            if (q != c->rank && s.host[q] > 0 && (size_t)s.host[q] > block &&
                PyErr_WarnFormat(PyExc_RuntimeWarning, 1, "all_to_all_v: "
                                 "algo 'll' carries blocks of %zu rows of "
                                 "this size, in_splits[%d] sends %lld: the "
                                 "rows past %zu were not sent; use "
                                 "algo='push'", block, q,
                                 (long long)s.host[q], block) < 0)
                ok = 0;
    }
    else
        ok = nccl_all_to_all_v(&k, &s, elems * is, x_rows, out_rows,
                               (int64_t *)osp.ptr, (int64_t *)off.ptr) == 0;
end:
    sn_tensor_release(&s.dev);
    sn_tensor_release(&osp);
    sn_tensor_release(&off);
    return sn_call_end(&k, ok);
}
