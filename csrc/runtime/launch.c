/* Collectives on symnccl's kernels (csrc/kernels/): how a call becomes
 * launches. Free of the Python API, so that both the Python methods
 * (collectives.c) and the XLA FFI handler (xla_ffi.c, on XLA's threads
 * without the GIL) use it. The kernel table (kernels/table.h) gives each
 * kernel its plan, one function below:
 *
 *   LOADS    one_shot, two_shot, multimem (all_reduce): peers load from
 *            the window holding x, or from the staging window x is copied
 *            into first, one staging area per launch
 *   PACKETS  ll, ll128, lamport (all_reduce): one launch per row's
 *            worth of elements (ll's and ll128's two-shot kernel on 3+
 *            ranks from the knob's size, decided on the size of the whole
 *            call so every rank decides alike), straight from wherever x
 *            is
 *   SLICES   ll, ll128 (reduce_scatter, all_gather): one launch per row's
 *            worth of each slice, straight from x into out
 *   ROOTED   one_shot (reduce, broadcast): one launch per staging area, x
 *            copied into the staging window first
 *   ROWS     one_shot_rmsnorm, two_shot_rmsnorm, ll_rmsnorm, ll128_rmsnorm,
 *            lamport_rmsnorm (all_reduce_rmsnorm): whole rows of x, as
 *            many per launch as the staging area (the packet kernels: a
 *            row of their family's region) holds
 *            (x read in place, one launch, on one rank and after NCCL's
 *            all-reduce)
 *   PUSH     push (every collective it runs): one launch for any size
 *            (the kernel walks every slice in chunks of a slot, or of
 *            SYMNCCL_PUSH_CHUNK_KIB when smaller), straight from x; an
 *            all_reduce in place on a window at a 16-byte aligned offset
 *            stores its results into the peers' output, else into their
 *            result slots
 *   ALL_TO_ALL  push, ll (all_to_all): one launch with the splits, on
 *            push's region (and the splits' packet area) or in LL packets
 *            (kernels/alltoall.cuh)
 *
 * A kernel that moves bytes (the table's `bytes`: all_gather, broadcast,
 * all_to_all) runs in the unit of SYMNCCL_DT_BYTES with counts in bytes
 * (all_to_all: in rows of row_size bytes).
 */
#include "runtime.h"

#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* Order across streams.                                                */

/* The kernels of a communicator share its barrier slots, packet regions
 * and epoch counters: two of them in flight at once would corrupt each
 * other or deadlock. Launches on one stream are ordered by the stream; a
 * launch on another stream first waits for the event recorded after the
 * previous launch. That is possible when both are eager or both are in the
 * same graph capture; a graph replay is ordered by the stream it is
 * launched on, and must not overlap other symnccl calls on the same
 * communicator (README: Streams). Called with c->lock held. */
static int
order_begin(const sn_ar *r, sn_err *err)
{
    CommObject *c = r->c;
    if (!c->order.used || r->stream == c->order.stream)
        return 0;
    unsigned long long id;
    cudaError_t e = sn_capture_id(r->stream, &id);
    if (e == cudaSuccess && id == c->order.capture)
        e = cudaStreamWaitEvent(r->stream, c->order.event, 0);
    if (e != cudaSuccess)
        return sn_fail(err, e, ncclSuccess, "ordering after the previous "
                       "symnccl launch");
    return 0;
}

static int
order_end(const sn_ar *r, sn_err *err)
{
    CommObject *c = r->c;
    unsigned long long id;
    cudaError_t e = sn_capture_id(r->stream, &id);
    if (e == cudaSuccess)
        e = cudaEventRecord(c->order.event, r->stream);
    if (e != cudaSuccess)
        return sn_fail(err, e, ncclSuccess, "recording the symnccl launch");
    c->order.stream = r->stream;
    c->order.capture = id;
    c->order.used = 1;
    return 0;
}

/* ------------------------------------------------------------------ */
/* Launches.                                                            */

static symnccl_kargs
kargs(const sn_ar *r, int kernel)
{
    CommObject *c = r->c;
    symnccl_kargs a;
    memset(&a, 0, sizeof(a));
    a.kernel = kernel;
    a.dc = c->devcomm;
    a.dtype = r->dtype->kernel;
    a.op = r->op != NULL ? r->op->kernel : 0;   /* all_gather: none */
    a.epochs = sn_epochs(c, kernel);
    /* failures (docs/ARCHITECTURE.md, "Failures") */
    /* in range by construction: sn_check_timeout admitted it (at most
     * SN_MAX_TIMEOUT, so the product is far below 2^64) */
    a.timeout_ns = (uint64_t)(c->timeout * 1e9);
    a.collective = r->collective;
    a.fault = c->fail.fault_dev;
    a.claim = sn_claim_word(c);
    a.fault_word = (uint64_t *)(c->mem.staging + c->mem.layout.ctl_offset);
    a.ctl_win = c->mem.staging_win->win;
    a.ctl_offset = c->mem.layout.ctl_offset;
    a.pdl = c->knobs.pdl;
    a.pdl_early = c->pdl_early;
    return a;
}

static int
launch(const sn_ar *r, symnccl_kargs *a, sn_err *err)
{
    CommObject *c = r->c;
    /* testing (Communicator._inject_fault): this kernel's next launch */
    a->inject = (c->count.inject >> a->kernel) & 1;
    cudaError_t e = symnccl_launch(a, r->stream);
    a->inject = 0;
    if (e != cudaSuccess)
        return sn_fail(err, e, ncclSuccess, "%s %s launch",
                       sn_algos[r->algo].name,
                       sn_collective_name(r->collective));
    c->count.inject &= ~(1 << a->kernel);
    c->count.launches[a->kernel]++;
    return 0;
}

/* A packet kernel's arguments: its family's region of the staging window,
 * and its family's fixed grid (every kernel of a family shares its slots
 * and call counters, one per CTA): all_reduce's lamport its own, the
 * others the packet grid. */
static symnccl_kargs
packet_kargs(const sn_ar *r, int kernel)
{
    CommObject *c = r->c;
    const int family = symnccl_kernel_row_of(kernel).family;
    symnccl_kargs a = kargs(r, kernel);
    a.region_win = c->mem.staging_win->win;
    sn_packet_region(&c->mem.layout, family, &a.region_offset, &a.row_bytes);
    const int own = family == SYMNCCL_FAMILY_LAMPORT_AR;
    a.ctas = own ? c->knobs.lamport_ctas : c->knobs.ll_ctas;
    a.threads = own ? c->knobs.lamport_threads : c->knobs.ll_threads;
    return a;
}

/* A push-family kernel's arguments: the push region's slots and flags,
 * chunks of a slot (or of SYMNCCL_PUSH_CHUNK_KIB when smaller: push.cuh),
 * and the communicator's fixed push grid (every push kernel shares its
 * slots, flags and call counters). */
static symnccl_kargs
push_kargs(const sn_ar *r, int kernel)
{
    CommObject *c = r->c;
    symnccl_kargs a = kargs(r, kernel);
    a.region_win = c->mem.staging_win->win;
    a.region_offset = c->mem.layout.push_offset;
    a.data_offset = c->mem.layout.push_data;
    a.row_bytes = c->mem.layout.push_slot;
    const size_t kib = (size_t)c->knobs.push_chunk_kib << 10;
    a.chunk_bytes = kib == 0 || kib > a.row_bytes ? a.row_bytes : kib;
    a.ctas = c->knobs.push_ctas;
    a.threads = c->knobs.push_threads;
    return a;
}

/* all_reduce's packet kernels: one launch per row's worth. */
static int
packet_launches(const sn_ar *r, sn_err *err)
{
    CommObject *c = r->c;
    const size_t is = (size_t)r->dtype->itemsize;
    const int ll128 = r->algo == SN_ALGO_LL128;
    const size_t two_shot_min =
        (size_t)(ll128 ? c->knobs.ll128_two_shot_kib
                       : c->knobs.ll_two_shot_kib) << 10;
    /* 3+ ranks from the knob's size; the knob at 0 forces the two-shot at
     * every size on 2 ranks too (the tests reach it on 2 GPUs so); an
     * algorithm without a two-shot kernel (lamport) runs its one-shot
     * (sn_kernel_for) */
    const int two_shot = (c->nranks >= 3 || (two_shot_min == 0 &&
                                             c->nranks == 2)) &&
                         r->count * is >= two_shot_min;
    symnccl_kargs a =
        packet_kargs(r, sn_kernel_for(r->collective, r->algo, two_shot));
    const size_t chunk =
        symnccl_packet_max_count(a.kernel, a.row_bytes, is, c->nranks);
    for (size_t done = 0; done < r->count; done += chunk) {
        a.src = r->x + done * is;
        a.out = r->out + done * is;
        a.count = r->count - done < chunk ? r->count - done : chunk;
        if (launch(r, &a, err) < 0)
            return -1;
    }
    return 0;
}

/* reduce_scatter and all_gather: chunk k of every slice in launch k. */
static int
slice_launches(const sn_ar *r, int kernel, sn_err *err)
{
    CommObject *c = r->c;
    const int bytes = symnccl_kernel_row_of(kernel).bytes;
    /* a kernel that moves bytes runs in the unit of SYMNCCL_DT_BYTES */
    const size_t is = bytes ? 1 : (size_t)r->dtype->itemsize;
    const size_t per_slice = bytes ? r->count * r->dtype->itemsize
                                   : r->count;
    symnccl_kargs a = packet_kargs(r, kernel);
    if (bytes)
        a.dtype = SYMNCCL_DT_BYTES;
    a.slice_stride = per_slice;
    /* a slice's chunk takes one row, as the one-shot's whole message */
    const size_t chunk =
        symnccl_packet_max_count(kernel, a.row_bytes, is, c->nranks);
    for (size_t done = 0; done < per_slice; done += chunk) {
        a.src = r->x + done * is;
        a.out = r->out + done * is;
        a.count = per_slice - done < chunk ? per_slice - done : chunk;
        if (launch(r, &a, err) < 0)
            return -1;
    }
    return 0;
}

/* reduce and broadcast: one_shot's staging chunks and grid. */
static int
rooted_launches(const sn_ar *r, int kernel, sn_err *err)
{
    CommObject *c = r->c;
    const int bytes = symnccl_kernel_row_of(kernel).bytes;
    /* a kernel that moves bytes runs in the unit of SYMNCCL_DT_BYTES */
    const size_t is = bytes ? 1 : (size_t)r->dtype->itemsize;
    const size_t total = bytes ? r->count * r->dtype->itemsize : r->count;
    const int threads = c->knobs.lsa_threads;
    symnccl_kargs a = kargs(r, kernel);
    if (bytes)
        a.dtype = SYMNCCL_DT_BYTES;
    a.root = r->root;
    a.threads = threads;
    a.win = c->mem.staging_win->win;
    a.win_offset = 0;
    const size_t chunk = c->mem.layout.staging / 16 * 16 / is;
    for (size_t done = 0; done < total; done += chunk) {
        const size_t len = total - done < chunk ? total - done : chunk;
        a.src = r->x + done * is;
        a.out = r->out + done * is;
        a.count = len;
        /* the grid depends on len only: equal on all ranks */
        const size_t ctas = ((len * is + 15) / 16 + (size_t)threads - 1) /
                            (size_t)threads;
        a.ctas = ctas < 1 ? 1
                 : ctas > (size_t)c->knobs.one_shot_ctas
                     ? c->knobs.one_shot_ctas
                     : (int)ctas;
        if (launch(r, &a, err) < 0)
            return -1;
    }
    return 0;
}

/* push: one launch for any size (the kernel walks the chunks). all_reduce
 * stores its results into the peers' output when in place on a window at a
 * 16-byte aligned offset; reduce_scatter and all_gather whole slices
 * (all_gather on bytes). */
static int
push_launch(const sn_ar *r, int kernel, sn_err *err)
{
    symnccl_kargs a = push_kargs(r, kernel);
    a.src = r->x;
    a.out = r->out;
    a.count = r->count;
    if (symnccl_kernel_row_of(kernel).bytes) {
        a.dtype = SYMNCCL_DT_BYTES;
        a.count = r->count * r->dtype->itemsize;
    }
    a.slice_stride = a.count;
    if (r->collective == SYMNCCL_COLL_ALL_REDUCE && r->win != NULL &&
        r->out == r->x && (size_t)(r->x - r->win->base) % 16 == 0) {
        a.out_win = r->win->win;
        a.out_offset = (size_t)(r->x - r->win->base);
    }
    return launch(r, &a, err);
}

/* all_reduce_rmsnorm: whole rows. The kernel copies x into the staging
 * window itself, so a launch takes as many rows as the staging area holds;
 * on one rank, or with r->local (x holds an all-reduce's sum), x is read
 * in place, one launch takes every row, and the kernel is the add+norm
 * with no peer (kargs.local). The block: a thread per 16-byte vector of a
 * row, at most SYMNCCL_THREADS; it depends on H and the dtype only, so
 * every rank (and the local launch) reduces a row in the same order. The
 * grid: a CTA per row, at most SYMNCCL_RMSNORM_CTAS with peers (a team's
 * grids must be resident at once); ll_rmsnorm's, ll128_rmsnorm's and
 * lamport_rmsnorm's is their packet family's fixed grid (SYMNCCL_LL_CTAS),
 * their rows in chunks of what a packet row carries (no staging copy);
 * without a peer, SYMNCCL_RMSNORM_LOCAL_CTAS, by default as many as are
 * resident at once (SYMNCCL_LOCAL_THREADS_PER_SM of add_rmsnorm's threads
 * on each SM). A dynamic FP8 output's scales: one per row. */
static int
row_launches(const sn_ar *r, int kernel, sn_err *err)
{
    CommObject *c = r->c;
    const size_t is = (size_t)r->dtype->itemsize;
    const size_t row_bytes = r->row_len * is;
    const size_t rows = r->count / r->row_len;
    /* two_shot: the staging area holds the launch's x, then its y and h
     * rows (every rank's results) */
    const int two = kernel == SYMNCCL_K_TWO_SHOT_RMSNORM;
    const int peers = !r->local && c->nranks > 1;
    /* ll, ll128, lamport: the rows travel as packets in a row of their
     * family's region, on the family's slots, counters and fixed grid */
    const int packets =
        peers && sn_packet_region(&c->mem.layout,
                                  symnccl_kernel_row_of(kernel).family,
                                  NULL, NULL);
    symnccl_kargs a = packets ? packet_kargs(r, kernel) : kargs(r, kernel);
    size_t chunk = rows;
    if (packets)
        chunk = symnccl_packet_max_count(kernel, a.row_bytes, row_bytes,
                                         c->nranks);
    else if (peers)
        chunk = c->mem.layout.staging / (row_bytes * (two ? 3 : 1));
    if (chunk == 0)
        return sn_fail(err, cudaErrorInvalidValue, ncclSuccess, "a row of "
                       "%zu bytes is larger than %s%s (%zu bytes%s)",
                       row_bytes, packets ? "a packet row of " : "",
                       packets ? symnccl_kernel_row_of(kernel).name
                               : "the staging area",
                       packets ? a.row_bytes : c->mem.layout.staging,
                       packets ? "" : ", staging_bytes=");
    a.win = c->mem.staging_win->win;
    a.win_offset = 0;
    a.weight = r->weight;
    a.row_len = r->row_len;
    a.eps = r->eps;
    a.local = !peers;
    a.quant = r->quant;
    a.scale = r->scale;
    /* a quantised y is float8_e4m3fn: a byte per element */
    const size_t out_is = r->quant != SYMNCCL_QUANT_NONE ? 1 : is;
    /* one_shot_rmsnorm's block: a thread per vector of a row, whole warps,
     * at most the knob's; the rows' arithmetic is this block's in every
     * kernel (rmsnorm.cuh) */
    const size_t whole = (row_bytes / 16 + 31) / 32 * 32;
    a.row_block = whole > (size_t)c->knobs.lsa_threads ? c->knobs.lsa_threads
                                                       : (int)whole;
    a.threads = a.row_block;
    /* row groups (ll_rmsnorm, lamport_rmsnorm): where a row is one pass
     * (a vector a thread), a CTA holds as many rows at once as the launch
     * gives it, up to SYMNCCL_WIDE_MAX_THREADS threads */
    const int groups = symnccl_kernel_row_groups(kernel, !peers) &&
                       row_bytes / 16 <= (size_t)a.row_block;
    for (size_t done = 0; done < rows; done += chunk) {
        const size_t len = rows - done < chunk ? rows - done : chunk;
        const size_t off = done * row_bytes;
        a.src = r->x + off;
        a.out = r->out + done * r->row_len * out_is;
        if (r->quant == SYMNCCL_QUANT_DYNAMIC)
            a.scale = r->scale + done;
        a.residual = r->residual + off;
        a.out_h = r->out_h + off;
        a.count = len * r->row_len;
        /* two_shot: each rank normalises ceil(len / n) rows */
        const size_t grid_rows = two && peers
            ? (len + (size_t)c->nranks - 1) / (size_t)c->nranks : len;
        int cap = peers ? c->knobs.rmsnorm_ctas : c->knobs.rmsnorm_local_ctas;
        if (!peers && cap == 0) {   /* the no-peer knob's default */
            const size_t resident = (size_t)c->sms *
                                    (SYMNCCL_LOCAL_THREADS_PER_SM / a.threads);
            cap = resident < SYMNCCL_LOCAL_MAX_CTAS ? (int)resident
                                                    : SYMNCCL_LOCAL_MAX_CTAS;
        }
        if (!packets)   /* the packet families' is fixed */
            a.ctas = grid_rows > (size_t)cap ? cap : (int)grid_rows;
        if (groups) {
            const size_t per_cta = (len + (size_t)a.ctas - 1) / (size_t)a.ctas;
            const size_t fit = SYMNCCL_WIDE_MAX_THREADS / (size_t)a.row_block;
            a.threads = a.row_block * (int)(per_cta < fit ? per_cta : fit);
        }
        a.mid_win = a.win;
        a.mid_offset = len * row_bytes;
        if (launch(r, &a, err) < 0)
            return -1;
    }
    return 0;
}

/* all_to_all, one launch, bytes whatever the dtype: push on its slots and
 * flags, in chunks of a slot (or SYMNCCL_PUSH_CHUNK_KIB); ll in one row of
 * the LL region per source (a block past it cut there: sn_a2a_plan). */
static int
all_to_all_launch(const sn_ar *r, int kernel, sn_err *err)
{
    CommObject *c = r->c;
    symnccl_kargs a;
    if (symnccl_kernel_row_of(kernel).family == SYMNCCL_FAMILY_LL)
        a = packet_kargs(r, kernel);
    else
        a = push_kargs(r, kernel);
    a.dtype = SYMNCCL_DT_BYTES;
    a.splits_offset = c->mem.layout.splits_offset;
    a.src = r->x;
    a.out = r->out;
    a.count = r->count;
    a.row_size = r->row_size;
    a.out_rows = r->out_rows;
    a.in_splits = r->in_splits;
    a.out_splits = r->out_splits;
    a.out_offsets = r->out_offsets;
    if (r->in_splits == NULL && r->host_splits != NULL)
        memcpy(a.host_splits, r->host_splits,
               (size_t)c->nranks * sizeof(int64_t));
    return launch(r, &a, err);
}

/* one_shot, two_shot, multimem: peers load from a window. */
static int
load_launches(const sn_ar *r, int kernel, sn_err *err)
{
    CommObject *c = r->c;
    const int algo = r->algo;
    const size_t is = (size_t)r->dtype->itemsize;
    const sn_window *w = r->win;
    const int in_place = r->out == r->x;
    int staged = w == NULL;
    /* multimem writes the result into the input's window: it works in place
     * on 16-byte aligned window memory, and on a staged copy otherwise. */
    if (algo == SN_ALGO_MULTIMEM &&
        (!in_place || (w != NULL && (r->x - w->base) % 16 != 0)))
        staged = 1;
    const int mid_staging = algo == SN_ALGO_TWO_SHOT && !in_place;
    /* one_shot in place reduces into the local staging memory first. */
    const int scratch = algo == SN_ALGO_ONE_SHOT && in_place && !staged;
    /* Chunk = the staging area, in whole 16-byte vectors per rank. */
    const size_t quantum = 16 * (size_t)c->nranks;
    size_t chunk = r->count;
    if (staged || mid_staging || scratch)
        chunk = c->mem.layout.staging / quantum * quantum / is;
    const int threads = c->knobs.lsa_threads;
    const int max_ctas = algo == SN_ALGO_ONE_SHOT ? c->knobs.one_shot_ctas
                                                  : c->knobs.two_shot_ctas;
    symnccl_kargs a = kargs(r, kernel);
    a.scratch = c->mem.staging;
    a.in_place = in_place && !staged;
    a.threads = threads;
    for (size_t done = 0; done < r->count; done += chunk) {
        size_t len = r->count - done < chunk ? r->count - done : chunk;
        if (staged) {
            a.win = c->mem.staging_win->win;
            a.win_offset = 0;
            a.src = r->x + done * is;
        }
        else {
            a.win = w->win;
            a.win_offset = (size_t)(r->x - w->base) + done * is;
        }
        a.mid_win = mid_staging || staged ? c->mem.staging_win->win : a.win;
        a.mid_offset = mid_staging || staged ? 0 : a.win_offset;
        a.out = r->out + done * is;
        a.count = len;
        /* The grid depends on len and nranks only: equal on all ranks. */
        size_t vecs = (len * is + 15) / 16;
        if (algo != SN_ALGO_ONE_SHOT)
            vecs = (vecs + c->nranks - 1) / c->nranks;
        size_t ctas = (vecs + (size_t)threads - 1) / (size_t)threads;
        a.ctas = ctas < 1 ? 1 : ctas > (size_t)max_ctas ? max_ctas : (int)ctas;
        if (launch(r, &a, err) < 0)
            return -1;
    }
    return 0;
}

int
sn_launch_kernels(const sn_ar *r, sn_err *err)
{
    /* an all_to_all rank with nothing to send may still receive */
    if (r->count == 0 && r->collective != SYMNCCL_COLL_ALL_TO_ALL)
        return 0;
    CommObject *c = r->c;
    sn_lock(c);
    int rc = 0;
    if (c->devcomm == NULL || c->mem.staging_win == NULL)
        rc = sn_fail(err, cudaErrorInvalidValue, ncclSuccess,
                     "the communicator has no device communicator or "
                     "staging window (closed?)");
    else if (c->life.stop)   /* entered before an abort began */
        rc = sn_fail(err, cudaErrorInvalidValue, ncclSuccess,
                     "the communicator is being aborted");
    else if (sn_fault_poll(c))   /* a kernel or the watchdog was quicker */
        rc = sn_fail(err, cudaErrorInvalidValue, ncclSuccess,
                     "the communicator has failed (comm.check() raises "
                     "why)");
    const int kernel =
        sn_kernel_for(r->collective, r->algo, SYMNCCL_SHOT_ONE);
    if (rc == 0 && kernel < 0)
        rc = sn_fail(err, cudaErrorInvalidValue, ncclSuccess, "no %s kernel "
                     "of algorithm %s", sn_collective_name(r->collective),
                     sn_algos[r->algo].name);
    if (rc == 0)
        rc = order_begin(r, err);
    if (rc == 0) {
        /* the plan is the kernel's (kernels/table.h) */
        switch (symnccl_kernel_row_of(kernel).plan) {
        case SYMNCCL_PLAN_PACKETS: rc = packet_launches(r, err); break;
        case SYMNCCL_PLAN_SLICES: rc = slice_launches(r, kernel, err); break;
        case SYMNCCL_PLAN_ROOTED: rc = rooted_launches(r, kernel, err); break;
        case SYMNCCL_PLAN_PUSH: rc = push_launch(r, kernel, err); break;
        case SYMNCCL_PLAN_ROWS: rc = row_launches(r, kernel, err); break;
        case SYMNCCL_PLAN_ALL_TO_ALL:
            rc = all_to_all_launch(r, kernel, err);
            break;
        default: rc = load_launches(r, kernel, err);
        }
    }
    if (rc == 0)
        rc = order_end(r, err);
    sn_unlock(c);
    return rc;
}

void
sn_count_nccl(CommObject *c)
{
    sn_lock(c);
    c->count.launches[SYMNCCL_K_COUNT]++;
    sn_unlock(c);
}

int
sn_a2a_plan(const CommObject *c, int asked, int *algo, int ragged,
            size_t rows, size_t out_rows, size_t row_size, size_t *block,
            char *why, size_t len)
{
    *block = SIZE_MAX;
    if (*algo != SN_ALGO_LL)
        return 0;
    /* one row of LL packets per source: the count, then the rows of the
     * block (kernels/alltoall.cuh, a2a_ll_rows); a function of the
     * communicator and the row size alone */
    const int kernel = sn_kernel_for(SYMNCCL_COLL_ALL_TO_ALL, SN_ALGO_LL,
                                     SYMNCCL_SHOT_ONE);
    const size_t room = symnccl_packet_max_count(kernel,
                                                 c->mem.layout.ll_row, 1,
                                                 c->nranks);
    const size_t cap = room > 8 && row_size ? (room - 8) / row_size : 0;
    /* the largest block a receiver keeps: out's rows (all_to_all_v; the
     * same on every rank by the call's contract), or x's rows / n */
    const size_t most = ragged ? out_rows : rows / (size_t)c->nranks;
    /* push carries any size (and "auto" never refuses for ll's rows) */
    if (asked == SN_ALGO_AUTO && (most > cap || cap == 0)) {
        const sn_topology t = sn_topology_of(c);
        *algo = sn_collective_unavailable(&t, SYMNCCL_COLL_ALL_TO_ALL,
                                          SN_ALGO_PUSH, NULL, NULL) == NULL
                    ? SN_ALGO_PUSH
                    : SN_ALGO_NCCL;
        return 0;
    }
    if (cap == 0) {
        snprintf(why, len, "algo 'll' carries rows of at most %zu bytes (one "
                 "row of LL packets after its count), x's rows have %zu: "
                 "use algo='push'", room > 8 ? room - 8 : 0, row_size);
        return -1;
    }
    if (!ragged && most > cap) {
        snprintf(why, len, "algo 'll' carries blocks of at most %zu bytes, "
                 "x's blocks have %zu: use algo='push'", cap * row_size,
                 most * row_size);
        return -1;
    }
    *block = cap;
    return 0;
}
