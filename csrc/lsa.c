/* all_reduce on symnccl's own kernels (csrc/kernels/): which algorithm, and
 * how a call is cut into launches. Free of the Python API, so that both the
 * Python methods (collectives.c) and the XLA FFI handler (xla_ffi.c, which
 * runs on XLA's threads without the GIL) use it.
 */
#include "symnccl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const sn_algo_names[SN_ALGO_COUNT] = {
    "nccl", "one_shot", "two_shot", "ll", "multimem", "push", "ll128"};

_Static_assert(SYMNCCL_PUSH_MAX_CTAS <= SN_MAX_CTAS,
               "push epochs live in the scratch's SN_MAX_CTAS slots");
_Static_assert(SN_LL128_EPOCHS_OFFSET + 8 * SN_MAX_CTAS <= SN_SCRATCH_BYTES,
               "the epoch arrays fit in the scratch");

int
sn_algo_from_name(const char *s)
{
    if (strcmp(s, "auto") == 0)
        return SN_ALGO_AUTO;
    for (int i = 0; i < SN_ALGO_COUNT; i++)
        if (strcmp(s, sn_algo_names[i]) == 0)
            return i;
    return -2;
}

int
sn_lsa_op(ncclRedOp_t op)
{
    switch (op) {
    case ncclSum: return SYMNCCL_OP_SUM;
    case ncclMax: return SYMNCCL_OP_MAX;
    case ncclMin: return SYMNCCL_OP_MIN;
    case ncclAvg: return SYMNCCL_OP_AVG;
    default: return -1;
    }
}

const char *
sn_lsa_unavailable(const CommObject *c, int algo, ncclDataType_t dt,
                   ncclRedOp_t op)
{
    if (!c->symmetric)
        return "the NCCL device API is not usable on this communicator";
    if (c->lsa_size != c->nranks)
        return "not every rank is reachable by NVLink load/store";
    if (c->staging == NULL)
        return "the communicator has no staging window";
    if (sn_lsa_op(op) < 0)
        return "op 'prod' has no LSA kernel";
    if (algo == SN_ALGO_PUSH && c->push_slot_bytes == 0)
        return "the communicator has no push region";
    if (algo == SN_ALGO_MULTIMEM) {
        if (!c->multicast)
            return c->multicast_reason != NULL
                       ? c->multicast_reason
                       : "multicast was not granted on this communicator";
        if (!symnccl_multimem_supported(dt, sn_lsa_op(op)))
            return "this dtype/op has no multimem reduction in PTX";
        return NULL;
    }
    if (!symnccl_lsa_supported(dt, sn_lsa_op(op), c->nranks))
        return "this dtype has no LSA kernel";
    return NULL;
}

/* algo="auto": crossovers measured with benchmarks/bench_allreduce.py on
 * 2x, 3x and 4x H200, bf16, CUDA-graph replay (benchmarks/NOTES.md,
 * sections 10-14 and 17). x in a window (in_window) or a plain tensor:
 *
 *   ranks   ll          ll128         two_shot                     push
 *   2       <= 64 KiB   <= 1 MiB      <= 4 MiB (tensor: none)      above
 *   3       -           <= 1.5 MiB    -                            above
 *   4..7    -           <= 1.5 MiB    <= 4 MiB (tensor: <= 2 MiB)  above
 *   >= 8    NCCL at every size (measured at 8 before ll, ll128 and push)
 *
 * On 3+ ranks ll128 is its two-shot from 512 KiB (SYMNCCL_LL128_TWO_SHOT_KIB):
 * 4x 1 MiB 10.1-11.2 us vs two_shot 12.6-14.1, 3x 1 MiB 8.9 vs push 13.5;
 * below that its one-shot beats ll (4x 256 KiB 6.4-7.2 vs 7.7-8.7). 5-7
 * ranks follow the 4-rank row without having been measured. one_shot won
 * at no size (it reads n-1 whole copies where two_shot reads one);
 * multimem is never chosen automatically.
 * SYMNCCL_ALGO=nccl|one_shot|two_shot|ll|ll128|push overrides the table where
 * that algorithm can run. in_window must be the same on every rank (as the
 * kind of input must be). */
int
sn_auto_algo(const CommObject *c, size_t bytes, ncclDataType_t dt,
             ncclRedOp_t op, int in_window)
{
    const int a = c->algo_env;
    if (a >= 0 && (a == SN_ALGO_NCCL || !sn_lsa_unavailable(c, a, dt, op)))
        return a;
    if (sn_lsa_unavailable(c, SN_ALGO_PUSH, dt, op) != NULL)
        return SN_ALGO_NCCL;
    if (c->nranks >= 8)
        return SN_ALGO_NCCL;
    if (c->nranks <= 2) {
        if (bytes <= (64u << 10))
            return SN_ALGO_LL;
        if (bytes <= (1u << 20))
            return SN_ALGO_LL128;
        return in_window && bytes <= (4u << 20) ? SN_ALGO_TWO_SHOT
                                                : SN_ALGO_PUSH;
    }
    if (bytes <= (1536u << 10))
        return SN_ALGO_LL128;
    if (c->nranks == 3)
        return SN_ALGO_PUSH;
    return bytes <= (in_window ? (4u << 20) : (2u << 20)) ? SN_ALGO_TWO_SHOT
                                                          : SN_ALGO_PUSH;
}

static int
fail(sn_ar *r, cudaError_t e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err, sizeof(r->err), fmt, ap);
    va_end(ap);
    r->cuda_error = e;
    return -1;
}

/* ------------------------------------------------------------------ */
/* Ordering of LSA kernels across streams.                              */

static cudaError_t
capture_id(cudaStream_t s, unsigned long long *id)
{
    enum cudaStreamCaptureStatus cs;
    unsigned long long i = 0;
    cudaError_t e = cudaStreamGetCaptureInfo(s, &cs, &i, NULL, NULL, NULL,
                                             NULL);
    *id = e == cudaSuccess && cs == cudaStreamCaptureStatusActive ? i : 0;
    return e;
}

/* The LSA kernels of a communicator share its barrier slots, LL buffers and
 * epoch counters: two of them in flight at once would corrupt each other or
 * deadlock. Launches on one stream are ordered by the stream; a launch on
 * another stream first waits for the event recorded after the previous
 * launch. That is possible when both are eager or both are in the same
 * graph capture; a graph replay is ordered by the stream it is launched on,
 * and must not overlap other symnccl calls on the same communicator
 * (README: Streams). Called with c->lock held. */
static int
order_begin(sn_ar *r)
{
    CommObject *c = r->c;
    if (!c->lsa_used || r->stream == c->lsa_stream)
        return 0;
    unsigned long long id;
    cudaError_t e = capture_id(r->stream, &id);
    if (e == cudaSuccess && id == c->lsa_capture)
        e = cudaStreamWaitEvent(r->stream, c->lsa_event, 0);
    if (e != cudaSuccess)
        return fail(r, e, "ordering after the previous LSA launch");
    return 0;
}

static int
order_end(sn_ar *r)
{
    CommObject *c = r->c;
    unsigned long long id;
    cudaError_t e = capture_id(r->stream, &id);
    if (e == cudaSuccess)
        e = cudaEventRecord(c->lsa_event, r->stream);
    if (e != cudaSuccess)
        return fail(r, e, "recording the LSA launch");
    c->lsa_stream = r->stream;
    c->lsa_capture = id;
    c->lsa_used = 1;
    return 0;
}

/* ------------------------------------------------------------------ */
/* Launches.                                                            */

/* ll and ll128: push from wherever x is (no staging copy). ll: launches of
 * at most ll_max_bytes (one-shot), or nranks * ll_max_bytes / 2 with the
 * two-shot packet kernel (3+ ranks, from ll_two_shot_min bytes: every rank
 * decides alike, from the size of the whole call); ll128: as many elements
 * as a row (two-shot, from ll128_two_shot_min: n half rows) holds in
 * 128-byte lines. */
static int
ll_launches(sn_ar *r)
{
    CommObject *c = r->c;
    const size_t is = (size_t)r->itemsize;
    const int ll128 = r->algo == SN_ALGO_LL128;
    const int two_shot =
        c->nranks >= 3 && r->count * is >= (ll128 ? c->ll128_two_shot_min
                                                  : c->ll_two_shot_min);
    const size_t chunk =
        ll128 ? symnccl_ll128_max_count(c->ll128_row_bytes, is, c->nranks,
                                        two_shot)
        : two_shot ? (size_t)c->nranks * (c->ll_max_bytes / 2) / is
                   : c->ll_max_bytes / is;
    for (size_t done = 0; done < r->count; done += chunk) {
        size_t len = r->count - done < chunk ? r->count - done : chunk;
        symnccl_ll_args a;
        memset(&a, 0, sizeof(a));
        a.dc = c->devcomm;
        a.win = c->staging_win->win;
        a.ll_offset = ll128 ? c->ll128_offset : c->ll_offset;
        a.row_bytes = ll128 ? c->ll128_row_bytes : 2 * c->ll_max_bytes;
        a.epochs = (uint64_t *)((char *)c->scratch +
                                (ll128 ? SN_LL128_EPOCHS_OFFSET
                                       : SN_EPOCHS_OFFSET));
        a.src = r->x + done * is;
        a.out = r->out + done * is;
        a.count = len;
        a.dtype = r->dtype;
        a.op = sn_lsa_op(r->op);
        a.ctas = c->ll_ctas;
        a.threads = c->ll_threads;
        a.timeout_ns = (uint64_t)(c->timeout * 1e9);
        a.two_shot = two_shot;
        cudaError_t e = ll128 ? symnccl_ll128_allreduce(&a, r->stream)
                              : symnccl_ll_allreduce(&a, r->stream);
        if (e != cudaSuccess)
            return fail(r, e, "%s all_reduce launch", sn_algo_names[r->algo]);
    }
    return 0;
}

/* push: one launch for any size (the kernel walks the chunks itself),
 * straight from wherever x is; results are stored into the peers' output
 * when the call is in place on a window at a 16-byte aligned offset, else
 * into their result slots. */
static int
push_launch(sn_ar *r)
{
    CommObject *c = r->c;
    symnccl_push_args a;
    memset(&a, 0, sizeof(a));
    a.dc = c->devcomm;
    a.win = c->staging_win->win;
    a.flags_offset = c->push_offset;
    a.data_offset = c->push_data;
    a.slot_bytes = c->push_slot_bytes;
    a.epochs = (uint64_t *)((char *)c->scratch + SN_PUSH_EPOCHS_OFFSET);
    a.src = r->x;
    a.out = r->out;
    if (r->win != NULL && r->out == r->x &&
        (size_t)(r->x - r->win->base) % 16 == 0) {
        a.out_win = r->win->win;
        a.out_offset = (size_t)(r->x - r->win->base);
    }
    a.count = r->count;
    a.dtype = r->dtype;
    a.op = sn_lsa_op(r->op);
    a.ctas = c->push_ctas;
    a.threads = c->push_threads;
    a.timeout_ns = (uint64_t)(c->timeout * 1e9);
    cudaError_t e = symnccl_push_allreduce(&a, r->stream);
    if (e != cudaSuccess)
        return fail(r, e, "push all_reduce launch");
    return 0;
}

/* one_shot, two_shot and multimem: peers load from (or multimem reduces
 * over) the window holding x (r->win), or the staging window x is copied
 * into. */
static int
load_launches(sn_ar *r)
{
    CommObject *c = r->c;
    const int algo = r->algo;
    const size_t is = (size_t)r->itemsize;
    const size_t count = r->count;
    const sn_window *w = r->win;
    int in_place = r->out == r->x;
    int staged = w == NULL;
    /* multimem writes the result into the input's window: it works in place
     * on 16-byte aligned window memory, and on a staged copy otherwise. */
    if (algo == SN_ALGO_MULTIMEM &&
        (!in_place || (w != NULL && (r->x - w->base) % 16 != 0)))
        staged = 1;
    int mid_staging = algo == SN_ALGO_TWO_SHOT && !in_place;
    /* one_shot in place reduces into the local staging memory first. */
    int scratch = algo == SN_ALGO_ONE_SHOT && in_place && !staged;
    /* Chunk = the staging area, in whole 16-byte vectors per rank. */
    size_t quantum = 16 * (size_t)c->nranks;
    size_t chunk = count;
    if (staged || mid_staging || scratch)
        chunk = c->staging_bytes / quantum * quantum / is;
    const int threads = c->lsa_threads;
    const int max_ctas = algo == SN_ALGO_ONE_SHOT ? c->one_shot_ctas
                                                  : c->two_shot_ctas;
    for (size_t done = 0; done < count; done += chunk) {
        size_t len = count - done < chunk ? count - done : chunk;
        symnccl_lsa_args a;
        memset(&a, 0, sizeof(a));
        a.algo = algo;
        a.dc = c->devcomm;
        if (staged) {
            a.win = c->staging_win->win;
            a.win_offset = 0;
            a.src = r->x + done * is;
        }
        else {
            a.win = w->win;
            a.win_offset = (size_t)(r->x - w->base) + done * is;
        }
        if (mid_staging || staged) {
            a.mid_win = c->staging_win->win;
            a.mid_offset = 0;
        }
        else {
            a.mid_win = a.win;
            a.mid_offset = a.win_offset;
        }
        a.out = r->out + done * is;
        a.scratch = c->staging;
        a.count = len;
        a.dtype = r->dtype;
        a.op = sn_lsa_op(r->op);
        a.in_place = in_place && !staged;
        /* The grid depends on len and nranks only: equal on all ranks. */
        size_t vecs = (len * is + 15) / 16;
        if (algo != SN_ALGO_ONE_SHOT)
            vecs = (vecs + c->nranks - 1) / c->nranks;
        size_t ctas = (vecs + (size_t)threads - 1) / (size_t)threads;
        if (ctas > (size_t)max_ctas)
            ctas = (size_t)max_ctas;
        a.ctas = ctas < 1 ? 1 : (int)ctas;
        a.threads = threads;
        cudaError_t e = algo == SN_ALGO_MULTIMEM
                            ? symnccl_multimem_allreduce(&a, r->stream)
                            : symnccl_lsa_allreduce(&a, r->stream);
        if (e != cudaSuccess)
            return fail(r, e, "%s all_reduce launch", sn_algo_names[algo]);
    }
    return 0;
}

int
sn_lsa_all_reduce(sn_ar *r)
{
    r->err[0] = '\0';
    r->cuda_error = cudaSuccess;
    if (r->count == 0)
        return 0;
    CommObject *c = r->c;
    if (c->devcomm == NULL || c->staging_win == NULL)
        return fail(r, cudaErrorInvalidValue, "the communicator has no "
                    "device communicator or staging window (closed?)");
    sn_lock(c);
    int rc = order_begin(r);
    if (rc == 0)
        rc = r->algo == SN_ALGO_LL || r->algo == SN_ALGO_LL128
                 ? ll_launches(r)
             : r->algo == SN_ALGO_PUSH ? push_launch(r)
                                       : load_launches(r);
    if (rc == 0)
        rc = order_end(r);
    sn_unlock(c);
    return rc;
}
