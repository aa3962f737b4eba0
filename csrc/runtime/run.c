/* One launch path per collective, without the Python API: every face (the
 * Communicator methods of collectives.c, fused.c and alltoall.c, which the
 * torch ops call too, and the XLA handlers of xla_ffi.c) converts its own
 * arguments into one sn_ar and calls sn_run; what follows is the same for
 * all of them: symnccl's kernels (launch.c), or NCCL's call on the same
 * stream, on the buffers as they are where the NCCL-window policy allows
 * (nccl_policy.c), else through stream-ordered plain memory; the fused
 * all-reduce + RMSNorm's NCCL composition; all-to-all's grouped
 * ncclSend/ncclRecv. A face completes an NCCL call its own way (the
 * callback `done`: the methods count, watch and wait with the GIL
 * released; the XLA handlers wait without the GIL) and turns sn_err into
 * its own error (an exception, or an XLA error).
 */
#include "runtime.h"

#include <stdio.h>
#include <string.h>

int
sn_run_resolve(const CommObject *c, const sn_call_desc *d, char *why,
               size_t len)
{
    const sn_topology topo = sn_topology_of(c);
    return sn_resolve(&topo, &c->knobs, d, why, len);
}

const sn_op *
sn_run_op(const CommObject *c, const sn_op *op)
{
    /* One rank: avg is sum. NCCL 2.28.9's single-rank ncclAvg left the last
     * float64 element of a 4099-element output unwritten (seen on H200). */
    if (op != NULL && op->nccl == ncclAvg && c->nranks == 1)
        return sn_op_by_name("sum");
    return op;
}

/* ------------------------------------------------------------------ */
/* NCCL's collectives. */

/* One row per NCCL collective:
 *   X(COLL, NCCL's function, x holds nranks blocks, out holds nranks
 *     blocks, the call)
 * r->count is NCCL's count: of one block where x or out holds nranks of
 * them (reduce_scatter: of out, all_gather: of x), else of x and out. The
 * call runs on x and out (the buffers given), with t the dtype and comm
 * the communicator. */
#define SN_NCCL_COLLECTIVES(X)                                               \
    X(ALL_REDUCE, ncclAllReduce, 0, 0,                                       \
      ncclAllReduce(x, out, r->count, t, r->op->nccl, comm, r->stream))      \
    X(REDUCE_SCATTER, ncclReduceScatter, 1, 0,                               \
      ncclReduceScatter(x, out, r->count, t, r->op->nccl, comm, r->stream))  \
    X(ALL_GATHER, ncclAllGather, 0, 1,                                       \
      ncclAllGather(x, out, r->count, t, comm, r->stream))                   \
    X(BROADCAST, ncclBroadcast, 0, 0,                                        \
      ncclBroadcast(x, out, r->count, t, r->root, comm, r->stream))          \
    X(REDUCE, ncclReduce, 0, 0,                                              \
      ncclReduce(x, out, r->count, t, r->op->nccl, r->root, comm, r->stream))

static const struct {
    const char *name;
    unsigned char x_blocks, out_blocks;   /* holds nranks blocks */
} nccl_rows[SYMNCCL_COLL_COUNT] = {
#define SN_NCCL_ROW(C, fn, xb, ob, call)                                     \
    [SYMNCCL_COLL_##C] = {.name = #fn, .x_blocks = xb, .out_blocks = ob},
    SN_NCCL_COLLECTIVES(SN_NCCL_ROW)
#undef SN_NCCL_ROW
};

/* The NCCL call itself, on the buffers given. */
static ncclResult_t
nccl_enqueue(const sn_ar *r, const void *x, void *out)
{
    const ncclDataType_t t = r->dtype->nccl;
    ncclComm_t comm = r->c->comm;
    switch (r->collective) {
#define SN_NCCL_CASE(C, fn, xb, ob, call)                                    \
    case SYMNCCL_COLL_##C:                                                   \
        return call;
        SN_NCCL_COLLECTIVES(SN_NCCL_CASE)
#undef SN_NCCL_CASE
    default:
        return ncclInvalidArgument;
    }
}

int
sn_nccl_blocks(int collective, int *x_blocks, int *out_blocks)
{
    if (collective < 0 || collective >= SYMNCCL_COLL_COUNT ||
        nccl_rows[collective].name == NULL)
        return -1;
    *x_blocks = nccl_rows[collective].x_blocks;
    *out_blocks = nccl_rows[collective].out_blocks;
    return 0;
}

int
sn_nccl_sizes(const sn_ar *r, size_t *xbytes, size_t *outbytes,
              size_t *block)
{
    int xb, ob;
    if (sn_nccl_blocks(r->collective, &xb, &ob) < 0)
        return -1;
    const size_t b = r->count * (size_t)r->dtype->itemsize;
    const size_t n = (size_t)r->c->nranks;
    *xbytes = b * (xb ? n : 1);
    *outbytes = b * (ob ? n : 1);
    if (block != NULL)
        *block = xb || ob ? b : 0;
    return 0;
}

/* A collective on NCCL. NCCL's own symmetric-window kernels see a window
 * only where the NCCL-window policy allows (nccl_policy.c: the calls the
 * loaded NCCL's kernels get wrong, SYMNCCL_NCCL_WINDOWS); otherwise the
 * call runs on stream-ordered plain memory, which NCCL reduces with its
 * regular kernels: copy in, the collective, copy out. */
static int
nccl_call(const sn_ar *r, sn_nccl_done_fn done, void *ctx, sn_err *err)
{
    const CommObject *c = r->c;
    const int coll = r->collective;
    size_t xbytes, obytes, block;
    if (sn_nccl_sizes(r, &xbytes, &obytes, &block) < 0)
        return sn_fail(err, cudaSuccess, ncclInvalidArgument, "%s has no "
                       "NCCL collective", sn_collective_name(coll));
    const char *what = nccl_rows[coll].name;
    const char *why = sn_nccl_plain_reason(
        sn_abi_runtime(), c->knobs.nccl_windows, coll, r->x, xbytes, r->out,
        obytes, block, r->x_in_window, r->out_in_window);
    if (why == NULL)
        return done(ctx, nccl_enqueue(r, r->x, r->out), coll, what) == 0
                   ? 0 : -2;
    if (r->in_group) {
        /* a group launches at its end: the copy out could not follow */
        sn_fail(err, cudaSuccess, ncclSuccess, "%s on a symmetric window "
                "cannot run inside symnccl.group(): %s (call it outside the "
                "group, or set SYMNCCL_NCCL_WINDOWS=1 to give NCCL the window "
                "anyway)", sn_collective_name(coll), why);
        err->kind = SN_ERR_NOT_IMPLEMENTED;
        return -1;
    }
    const int in_place = r->x == r->out;
    char *tmp = NULL;
    const size_t total = in_place ? obytes : xbytes + obytes;
    cudaError_t e = cudaMallocAsync((void **)&tmp, total ? total : 1,
                                    r->stream);
    if (e != cudaSuccess)
        return sn_fail(err, e, ncclSuccess, "cudaMallocAsync (NCCL on plain "
                       "memory)");
    char *tx = tmp, *tout = in_place ? tmp : tmp + xbytes;
    int rc = 0;
    e = cudaMemcpyAsync(tx, r->x, xbytes, cudaMemcpyDeviceToDevice,
                        r->stream);
    if (e == cudaSuccess) {
        rc = done(ctx, nccl_enqueue(r, tx, tout), coll, what) == 0 ? 0 : -2;
        if (rc == 0)
            e = cudaMemcpyAsync(r->out, tout, obytes,
                                cudaMemcpyDeviceToDevice, r->stream);
    }
    cudaError_t e2 = cudaFreeAsync(tmp, r->stream);
    if (rc == 0 && (e != cudaSuccess || e2 != cudaSuccess))
        rc = sn_fail(err, e != cudaSuccess ? e : e2, ncclSuccess,
                     "copy through plain memory (NCCL-window policy)");
    return rc;
}

int
sn_run_exchange(const sn_ar *r, const int64_t *send, const int64_t *send_off,
                const int64_t *recv, const int64_t *recv_off,
                sn_nccl_done_fn done, void *ctx, sn_err *err)
{
    const CommObject *c = r->c;
    const size_t is = (size_t)r->dtype->itemsize;
    const size_t elems = r->row_size / is;
    ncclResult_t rc = ncclGroupStart(), bad = ncclSuccess;
    size_t so = 0, ro = 0;
    for (int q = 0; rc == ncclSuccess && q < c->nranks; q++) {
        if (send_off != NULL)
            so = (size_t)send_off[q];
        if (recv_off != NULL)
            ro = (size_t)recv_off[q];
        if (send[q] > 0) {
            rc = ncclSend(r->x + so * r->row_size, (size_t)send[q] * elems,
                          r->dtype->nccl, q, c->comm, r->stream);
            so += (size_t)send[q];
        }
        if (rc == ncclSuccess && recv[q] > 0) {
            rc = ncclRecv(r->out + ro * r->row_size,
                          (size_t)recv[q] * elems, r->dtype->nccl, q,
                          c->comm, r->stream);
            ro += (size_t)recv[q];
        }
    }
    if (rc != ncclSuccess && rc != ncclInProgress)
        bad = rc;
    rc = ncclGroupEnd();
    if (bad != ncclSuccess)
        return sn_fail(err, cudaSuccess, bad, "ncclSend/ncclRecv "
                       "(all_to_all)");
    return done(ctx, rc, SYMNCCL_COLL_ALL_TO_ALL,
                "ncclSend/ncclRecv (all_to_all)") == 0 ? 0 : -2;
}

/* ------------------------------------------------------------------ */
/* all_reduce_rmsnorm. */

const char *
sn_rmsnorm_unavailable(int algo, int quant)
{
    if (algo == SN_ALGO_TWO_SHOT && quant != SYMNCCL_QUANT_NONE)
        return "all_reduce_rmsnorm: algo 'two_shot' has no FP8 output "
               "(quant=); use 'one_shot' or 'nccl'";
    return NULL;
}

int
sn_rmsnorm_ar_algo(CommObject *c, int asked, int algo, const sn_dtype *dt,
                   size_t bytes)
{
    if (algo != SN_ALGO_NCCL)
        return -1;
    const sn_topology topo = sn_topology_of(c);
    return sn_then_norm_algo(&topo, &c->knobs, asked, dt, bytes);
}

/* The all-reduce of x (NCCL's, or symnccl's kernel of r->ar_algo:
 * sn_then_norm_algo) into y's buffer, then the add and the norm by
 * symnccl's kernel with no peer (r->local), on the same stream, reading
 * the sums where it writes y (each row's reads come before its stores).
 * A temporary where y's buffer cannot hold them: an FP8 y, or y written
 * over the residual (which the sums would overwrite before the add). */
static int
all_reduce_then_norm(const sn_ar *r, sn_nccl_done_fn done, void *ctx,
                     sn_err *err)
{
    CommObject *c = r->c;
    const sn_topology t = sn_topology_of(c);
    if (!t.symmetric || !t.staging)
        return sn_fail(err, cudaSuccess, ncclSuccess,
                       "all_reduce_rmsnorm: symnccl's add+norm kernel "
                       "needs the NCCL device API on this communicator, "
                       "which it does not have (%s)",
                       c->symmetric_reason != NULL ? c->symmetric_reason
                                                   : "no staging window");
    const size_t bytes = r->count * (size_t)r->dtype->itemsize;
    const int own_tmp = r->quant != SYMNCCL_QUANT_NONE ||
                        r->out == r->residual;
    char *tmp = r->out;
    cudaError_t e = cudaSuccess;
    if (own_tmp &&
        (e = cudaMallocAsync((void **)&tmp, bytes, r->stream)) != cudaSuccess)
        return sn_fail(err, e, ncclSuccess, "cudaMallocAsync");
    int rc;
    if (r->ar_algo != SN_ALGO_NCCL) {
        const sn_ar ar = {
            .c = c,
            .algo = r->ar_algo,
            .x = r->x,
            .out = tmp,
            .count = r->count,
            .dtype = r->dtype,
            .op = sn_op_by_name("sum"),
            .stream = r->stream,
            .collective = SYMNCCL_COLL_ALL_REDUCE,
            .root = -1,
        };
        rc = sn_launch_kernels(&ar, err);
    }
    else   /* done() failed: -2, its own error set */
        rc = done(ctx, ncclAllReduce(r->x, tmp, r->count, r->dtype->nccl,
                                     ncclSum, c->comm, r->stream),
                  SYMNCCL_COLL_ALL_REDUCE_RMSNORM,
                  "ncclAllReduce (all_reduce_rmsnorm)") == 0
                 ? 0 : -2;
    if (rc == 0) {
        sn_ar local = *r;
        local.algo = SN_ALGO_ONE_SHOT;
        local.x = tmp;
        local.local = 1;
        rc = sn_launch_kernels(&local, err);
    }
    if (own_tmp && (e = cudaFreeAsync(tmp, r->stream)) != cudaSuccess &&
        rc == 0)
        rc = sn_fail(err, e, ncclSuccess, "cudaFreeAsync");
    return rc;
}

/* ------------------------------------------------------------------ */

int
sn_run(const sn_ar *r, sn_nccl_done_fn done, void *ctx, sn_err *err)
{
    if (r->collective == SYMNCCL_COLL_ALL_REDUCE_RMSNORM) {
        if (r->count == 0)
            return 0;
        if (r->algo == SN_ALGO_NCCL)
            return all_reduce_then_norm(r, done, ctx, err);
        return sn_launch_kernels(r, err);
    }
    if (r->algo != SN_ALGO_NCCL)
        return sn_launch_kernels(r, err);
    if (r->collective == SYMNCCL_COLL_ALL_TO_ALL)   /* equal blocks */
        return sn_run_exchange(r, r->host_splits, NULL, r->host_splits, NULL,
                               done, ctx, err);
    return nccl_call(r, done, ctx, err);
}
