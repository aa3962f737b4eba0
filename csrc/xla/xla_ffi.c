/* XLA FFI handlers "symnccl_all_reduce", "symnccl_reduce_scatter",
 * "symnccl_all_gather", "symnccl_all_to_all", "symnccl_all_to_all_v" and
 * "symnccl_all_reduce_rmsnorm": symnccl's collectives as custom calls
 * inside jax.jit / shard_map (symnccl/jax.py registers and calls them, and
 * gives them their gradients).
 *
 * Written against XLA's stable FFI C ABI, as symnccl declares it itself
 * (xla_ffi_abi.h), so every build has the handlers: jaxlib is needed only
 * where JAX runs them.
 *
 * The handler runs on XLA's threads without the GIL and never calls the
 * Python API. It
 *   - answers XLA's metadata query (call frame carrying the metadata
 *     extension, ctx NULL) with the API version whose layout it uses
 *     (SNX_API_*: 0.3, which jaxlib 0.11's XLA, at 0.4, accepts);
 *   - takes the stream from XLA's Stream_Get and the device from its
 *     DeviceOrdinal_Get, and picks the communicator registered for
 *     that device (symnccl.jax.communicator() registers them; the table is
 *     process-wide because the handler has no module to look in);
 *   - never initialises a communicator or talks to a key-value store;
 *   - all-reduce: runs the algorithm on XLA's buffer where it lies in a
 *     window: an XLA
 *     buffer inside a VMM allocation (XLA's collective-memory allocator
 *     under --xla_gpu_enable_nccl_user_buffers=true uses ncclMemAlloc) is
 *     registered once per allocation, collectively, in the same call on
 *     every rank, and cached; any other buffer goes through the
 *     communicator's staging window (or, for "ll", needs no window).
 */
#include "runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The communicator of each device, a strong reference (taken and dropped
 * with the GIL: _xla_register, the closing hook). A handler enters its
 * communicator under registry_lock (lock order: registry_lock, then
 * c->lock), so that a communicator leaves the registry either before (the
 * handler finds none) or after the handler is counted in c->life.busy, which
 * keeps every teardown from freeing anything under it and keeps the
 * object's memory (sn_comm_finalize) until the handler leaves: the
 * handler's own reference for the call, taken without the GIL. */
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static CommObject *registry[SN_XLA_MAX_DEVICES];

typedef struct {
    unsigned long long window_calls, staged_calls, registrations;
} sn_xla_stats;
static sn_xla_stats stats[SN_XLA_MAX_DEVICES];

/* Waits (without the GIL) until the non-blocking communicator has finished
 * the NCCL call that returned rc; ncclInProgress when it timed out. */
static ncclResult_t
nccl_finish(CommObject *c, ncclResult_t rc)
{
    if (rc != ncclSuccess && rc != ncclInProgress)
        return rc;
    int failed;
    ncclResult_t bad = ncclSuccess;
    switch (sn_wait_nccl(&c->comm, 1, sn_deadline(c->timeout), &c->life.stop,
                         &failed, &bad)) {
    case SN_WAIT_DONE: return ncclSuccess;
    case SN_WAIT_FAILED: return bad;
    default: return ncclInProgress;
    }
}

/* What nccl_finish's failure rc means. */
static const char *
nccl_why(const CommObject *c, ncclResult_t rc)
{
    if (rc != ncclInProgress)
        return ncclGetErrorString(rc);
    return c->life.stop ? "interrupted: the communicator is being aborted"
                   : "timed out";
}

/* For the closing hook (python/xla.c, GIL held): c leaves the registry,
 * so no handler enters c again; the number of the registry's references
 * to c, which the caller drops. */
int
sn_xla_unregister(CommObject *c)
{
    int held = 0;
    pthread_mutex_lock(&registry_lock);
    for (int i = 0; i < SN_XLA_MAX_DEVICES; i++)
        if (registry[i] == c) {
            registry[i] = NULL;
            held++;
        }
    pthread_mutex_unlock(&registry_lock);
    return held;
}

/* The close hook (sn_comm_on_close), once no caller is inside c, without
 * the GIL: the windows the handler registered on c's behalf go
 * (deregistered on close, and on abort once no kernel of c runs; else
 * forgotten). Called through lifecycle.c's sn_comm_closing_windows, by
 * close and abort, before the communicator's own windows. */
ncclResult_t
sn_xla_on_close(CommObject *c, int deregister)
{
    ncclResult_t first = ncclSuccess;
    sn_window *w = c->xla.windows;
    c->xla.windows = NULL;
    while (w != NULL) {
        sn_window *next = w->next;
        if (deregister && w->win != NULL && c->comm != NULL) {
            ncclResult_t rc = nccl_finish(
                c, ncclCommWindowDeregister(c->comm, w->win));
            if (rc != ncclSuccess && first == ncclSuccess)
                first = rc;
        }
        free(w);
        w = next;
    }
    return first;
}

/* The communicator registered for `device` becomes c (a reference the
 * caller took, GIL held); the one it replaces, whose reference the caller
 * drops. */
CommObject *
sn_xla_swap(int device, CommObject *c)
{
    pthread_mutex_lock(&registry_lock);
    CommObject *old = registry[device];
    registry[device] = c;
    pthread_mutex_unlock(&registry_lock);
    return old;
}

/* _xla_stats(device): window_calls, staged_calls, registrations. */
void
sn_xla_get_stats(int device, unsigned long long out[3])
{
    out[0] = stats[device].window_calls;
    out[1] = stats[device].staged_calls;
    out[2] = stats[device].registrations;
}

#include <cuda.h>

#include "xla_ffi_abi.h"

static snx_error *
ffi_error(const snx_api *api, snx_error_code code, const char *msg)
{
    snx_error_create_args a;
    memset(&a, 0, sizeof(a));
    a.struct_size = SNX_STRUCT_SIZE(snx_error_create_args, errc);
    a.message = msg;
    a.errc = code;
    return api->error_create(&a);
}

/* Integer attribute `name` (an int32 scalar), or dflt when absent. */
static int
attr_int(const snx_call_frame *call, const char *name, int dflt)
{
    size_t len = strlen(name);
    for (int64_t i = 0; i < call->attrs.size; i++) {
        const snx_bytes *n = call->attrs.names[i];
        if (n->len != len || memcmp(n->ptr, name, len) != 0)
            continue;
        if (call->attrs.types[i] != SNX_ATTR_SCALAR)
            return dflt;
        const snx_scalar *s = call->attrs.attrs[i];
        if (s->dtype == SNX_S32)
            return *(const int32_t *)s->value;
        if (s->dtype == SNX_S64)
            return (int)*(const int64_t *)s->value;
        return dflt;
    }
    return dflt;
}

typedef CUresult (*get_range_fn)(CUdeviceptr *, size_t *, CUdeviceptr);
typedef CUresult (*retain_fn)(CUmemGenericAllocationHandle *, void *);
typedef CUresult (*release_fn)(CUmemGenericAllocationHandle);

/* The VMM allocation holding p, if p is in one (only those can be NCCL
 * symmetric windows). */
static int
vmm_range(const void *p, char **base, size_t *size)
{
    static get_range_fn get_range;
    static retain_fn retain;
    static release_fn release;
    static int loaded;
    if (!loaded) {
        enum cudaDriverEntryPointQueryResult q;
        cudaGetDriverEntryPointByVersion("cuMemGetAddressRange",
                                         (void **)&get_range, 12000,
                                         cudaEnableDefault, &q);
        cudaGetDriverEntryPointByVersion("cuMemRetainAllocationHandle",
                                         (void **)&retain, 12000,
                                         cudaEnableDefault, &q);
        cudaGetDriverEntryPointByVersion("cuMemRelease", (void **)&release,
                                         12000, cudaEnableDefault, &q);
        loaded = 1;
    }
    if (get_range == NULL || retain == NULL || release == NULL)
        return 0;
    CUmemGenericAllocationHandle h;
    if (retain(&h, (void *)p) != CUDA_SUCCESS)
        return 0;   /* not VMM memory */
    release(h);
    CUdeviceptr b = 0;
    size_t s = 0;
    if (get_range(&b, &s, (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS)
        return 0;
    *base = (char *)(uintptr_t)b;
    *size = s;
    return 1;
}

/* The cached window holding [p, p + bytes), under c->lock: 1 and *out
 * (NULL: registering it failed before) when there is one, else 0. */
static int
xla_window_cached(CommObject *c, const char *p, size_t bytes,
                  const sn_window **out)
{
    for (sn_window *w = c->xla.windows; w != NULL; w = w->next)
        if (p >= w->base && p + bytes <= w->base + w->size) {
            *out = w->win != NULL ? w : NULL;
            return 1;
        }
    return 0;
}

/* The handler's window for [p, p + bytes): cached, or registered now
 * (collective: every rank reaches this in the same call, because XLA runs
 * the same program with the same allocator everywhere), or NULL. c
 * entered; c->lock is not held across the registration, which waits for
 * the peers (up to c's timeout, no longer once c is aborted): another XLA
 * thread of c waits for it (xla.registering) without the lock, the same
 * bound. A wait that outlasts it sets *refuse: the call fails rather than
 * run on the staging window, since whether a peer's thread found the
 * window by then is a matter of timing (the ranks would read different
 * windows). */
static const sn_window *
xla_window(CommObject *c, const char *p, size_t bytes, int device,
           char *err, size_t errlen, int *refuse)
{
    const sn_window *found = NULL;
    const double until = sn_deadline(c->timeout);
    for (;;) {
        sn_lock(c);
        const int cached = xla_window_cached(c, p, bytes, &found);
        const int mine = !cached && !c->xla.registering;
        if (mine)
            c->xla.registering = 1;
        sn_unlock(c);
        if (cached)
            return found;
        if (mine)
            break;
        if (c->life.stop || sn_now() >= until) {
            snprintf(err, errlen, "another XLA thread was still "
                     "registering a window of this communicator after "
                     "%.3g s (its timeout%s)", c->timeout,
                     c->life.stop ? ", or an abort" : "");
            *refuse = 1;
            return NULL;
        }
        struct timespec t = {0, 100000};
        nanosleep(&t, NULL);
    }
    char *base;
    size_t size;
    sn_window *w = NULL;
    if (vmm_range(p, &base, &size) && (w = calloc(1, sizeof(*w))) != NULL) {
        w->base = base;
        w->size = size;
        w->refs = 1;
        ncclResult_t rc = ncclCommWindowRegister(c->comm, base, size,
                                                 &w->win,
                                                 NCCL_WIN_COLL_SYMMETRIC);
        rc = nccl_finish(c, rc);
        if (rc != ncclSuccess) {
            /* Remember the failure (win NULL): the staging window from
             * now on. */
            snprintf(err, errlen, "ncclCommWindowRegister of XLA's buffer "
                     "failed (%s); using the staging window",
                     ncclGetErrorString(rc));
            w->win = NULL;
        }
    }
    sn_lock(c);
    if (w != NULL) {
        if (w->win != NULL)
            stats[device].registrations++;
        w->next = c->xla.windows;
        c->xla.windows = w;
    }
    c->xla.registering = 0;
    sn_unlock(c);
    return w != NULL && w->win != NULL ? w : NULL;
}

/* A handler's completion of an NCCL call (sn_nccl_done_fn): finished
 * without the GIL, then counted and watched; -1 with msg[] filled. */
typedef struct {
    CommObject *c;
    cudaStream_t stream;
    const char *name;          /* the handler's target, for messages */
    char *msg;
    size_t len;
} xla_done_ctx;

static int
xla_nccl_done(void *ctx, ncclResult_t rc, int collective, const char *what)
{
    xla_done_ctx *d = ctx;
    if ((rc = nccl_finish(d->c, rc)) == ncclSuccess) {
        sn_count_nccl(d->c);
        sn_watch_nccl(d->c, collective, d->stream);
        return 0;
    }
    snprintf(d->msg, d->len, "%s: NCCL: %s", d->name, nccl_why(d->c, rc));
    return -1;
}

/* sn_run (run.c) for a handler (c entered, its device current): 0, or -1
 * with msg[] filled, naming the handler (`name`). An NCCL call sees one of
 * the windows symnccl registered for XLA's buffers where the NCCL-window
 * policy allows; r->x_in_window and r->out_in_window are set here. */
static int
xla_run(sn_ar *r, const char *name, char *msg, size_t len)
{
    CommObject *c = r->c;
    size_t xb, yb;
    if (r->algo == SN_ALGO_NCCL && sn_nccl_sizes(r, &xb, &yb, NULL) == 0) {
        int xw = 0, yw = 0;
        sn_lock(c);
        for (sn_window *w = c->xla.windows; w != NULL; w = w->next)
            if (w->win != NULL) {
                xw |= r->x >= w->base && r->x + xb <= w->base + w->size;
                yw |= r->out >= w->base && r->out + yb <= w->base + w->size;
            }
        sn_unlock(c);
        r->x_in_window = xw;
        r->out_in_window = yw;
    }
    xla_done_ctx d = {
        .c = c, .stream = r->stream, .name = name, .msg = msg, .len = len,
    };
    sn_err err = {.cuda = cudaSuccess};
    const int rc = sn_run(r, xla_nccl_done, &d, &err);
    if (rc == -1)
        snprintf(msg, len, "%s: %.300s%s%s", name, err.msg,
                 err.cuda != cudaSuccess ? ": " : "",
                 err.cuda != cudaSuccess ? cudaGetErrorString(err.cuda) : "");
    return rc == 0 ? 0 : -1;
}

/* The algorithm of one call (sn_resolve, as for the Communicator
 * methods; no group on XLA's threads), or SN_ALGO_UNKNOWN with msg[]
 * naming the handler, what was asked and why it cannot run. */
static int
resolve(CommObject *c, int collective, int algo, size_t bytes,
        const sn_dtype *dt, const sn_op *op, int in_window, char *msg,
        size_t len)
{
    const sn_call_desc d = {
        .collective = collective,
        .algo = algo,
        .bytes = bytes,
        .dtype = dt,
        .op = op,
        .in_window = in_window,
    };
    char why[256];
    const int got = sn_run_resolve(c, &d, why, sizeof(why));
    if (got == SN_ALGO_UNKNOWN)
        snprintf(msg, len, "symnccl_%s: %s", sn_collective_name(collective),
                 why);
    return got;
}

/* The all-reduce of one call, on c (entered: c->life.busy counts it). */
static snx_error *
all_reduce(const snx_api *api, snx_call_frame *call, CommObject *c,
           int dev, const sn_dtype *dt, size_t count, const snx_buffer *x,
           const snx_buffer *y, cudaStream_t stream)
{
    char msg[320];
    /* op: an ncclRedOp_t (symnccl._C.OP_CODES); algo: SN_ALGO_* */
    const sn_op *op = sn_op_by_nccl(attr_int(call, "op", ncclSum));
    int algo = attr_int(call, "algo", SN_ALGO_AUTO);
    int may_register = attr_int(call, "register", 0);
    if (op == NULL || algo < SN_ALGO_AUTO || algo >= SN_ALGO_COUNT)
        return ffi_error(api, SNX_ERR_INVALID_ARGUMENT,
                         "symnccl_all_reduce: bad op or algo attribute");
    op = sn_run_op(c, op);
    const size_t is = (size_t)dt->itemsize;
    /* may_register: the same attribute on every rank */
    if ((algo = resolve(c, SYMNCCL_COLL_ALL_REDUCE, algo, count * is, dt, op,
                        may_register, msg, sizeof(msg))) == SN_ALGO_UNKNOWN)
        return ffi_error(api, SNX_ERR_INVALID_ARGUMENT, msg);

    int prev = -1;
    cudaGetDevice(&prev);
    if (prev != c->device)
        cudaSetDevice(c->device);
    int failed = 0;
    sn_ar r = {
        .c = c,
        .algo = algo,
        .x = x->data,
        .out = y->data,
        .count = count,
        .dtype = dt,
        .op = op,
        .stream = stream,
        .collective = SYMNCCL_COLL_ALL_REDUCE,
        .root = -1,
    };
    msg[0] = '\0';
    if (algo != SN_ALGO_NCCL) {
        /* the load kernels read x in a window, or stage it; the packet
         * kernels never use one; push stores into it when in place */
        const int plan = symnccl_kernel_row_of(
            sn_kernel_for(SYMNCCL_COLL_ALL_REDUCE, algo, SYMNCCL_SHOT_ONE))
                             .plan;
        int refuse = 0;
        if (plan != SYMNCCL_PLAN_PACKETS && may_register)
            r.win = xla_window(c, x->data, count * is, dev, msg,
                               sizeof(msg), &refuse);
        if (refuse) {
            char why[sizeof(msg)];
            snprintf(why, sizeof(why), "symnccl_all_reduce: %s", msg);
            snprintf(msg, sizeof(msg), "%s", why);
            failed = 1;
            goto done;
        }
        sn_lock(c);
        if (r.win != NULL)
            stats[dev].window_calls++;
        else if (plan == SYMNCCL_PLAN_LOADS)
            stats[dev].staged_calls++;
        sn_unlock(c);
    }
    failed = xla_run(&r, "symnccl_all_reduce", msg, sizeof(msg)) < 0;
done:
    if (prev >= 0 && prev != c->device)
        cudaSetDevice(prev);
    if (failed)
        return ffi_error(api, SNX_ERR_INTERNAL, msg);
    return NULL;
}

/* The handlers of NCCL's shape, one row each:
 *   X(name, COLL, reads an "op" attribute, reads a "root" attribute)
 * Each is the handler "symnccl_<name>" (handle_<name>, its line in
 * handlers[]) of one operand and one result, whose sizes follow run.c's
 * row of COLL (sn_nccl_blocks: equal, or one nranks times the other).
 * all_reduce runs all_reduce() (its windows); the others
 * slice_collective(). */
#define XLA_NCCL_HANDLERS(X)                                                \
    X(all_reduce, ALL_REDUCE, 1, 0)                                         \
    X(reduce_scatter, REDUCE_SCATTER, 1, 0)                                 \
    X(all_gather, ALL_GATHER, 0, 0)

typedef struct {
    int collective;
    unsigned char op, root;    /* reads the attribute */
} xla_row;

/* A collective of XLA_NCCL_HANDLERS other than all_reduce, one call, on c
 * (entered): on symnccl's kernels (straight from XLA's operand into its
 * result), else on NCCL; the algorithm as for the Communicator methods
 * (sn_resolve). */
static snx_error *
slice_collective(const snx_api *api, snx_call_frame *call,
                 CommObject *c, const xla_row *row, int x_blocks,
                 const sn_dtype *dt, size_t count, size_t ycount,
                 const snx_buffer *x, const snx_buffer *y,
                 cudaStream_t stream)
{
    char msg[320];
    const int collective = row->collective;
    const char *name = sn_collective_name(collective);
    const sn_op *op = NULL;
    if (row->op) {
        const int op_code = attr_int(call, "op", ncclSum);
        op = sn_op_by_nccl(op_code);
        if (op == NULL) {
            snprintf(msg, sizeof(msg), "symnccl_%s: bad op attribute %d",
                     name, op_code);
            return ffi_error(api, SNX_ERR_INVALID_ARGUMENT, msg);
        }
    }
    int root = -1;
    if (row->root) {
        root = attr_int(call, "root", 0);
        if (root < 0 || root >= c->nranks) {
            snprintf(msg, sizeof(msg), "symnccl_%s: bad root attribute %d "
                     "on %d ranks", name, root, c->nranks);
            return ffi_error(api, SNX_ERR_INVALID_ARGUMENT, msg);
        }
    }
    int algo = attr_int(call, "algo", SN_ALGO_AUTO);
    if (algo < SN_ALGO_AUTO || algo >= SN_ALGO_COUNT) {
        snprintf(msg, sizeof(msg), "symnccl_%s: bad algo attribute %d", name,
                 algo);
        return ffi_error(api, SNX_ERR_INVALID_ARGUMENT, msg);
    }
    if ((algo = resolve(c, collective, algo,
                        (count > ycount ? count : ycount) *
                            (size_t)dt->itemsize,
                        dt, op, 0, msg, sizeof(msg))) == SN_ALGO_UNKNOWN)
        return ffi_error(api, SNX_ERR_INVALID_ARGUMENT, msg);
    int prev = -1;
    cudaGetDevice(&prev);
    if (prev != c->device)
        cudaSetDevice(c->device);
    char target[48];
    snprintf(target, sizeof(target), "symnccl_%s", name);
    /* count: NCCL's, of one block where x holds nranks of them (of the
     * result: reduce_scatter), else of x */
    sn_ar r = {
        .c = c,
        .algo = algo,
        .x = x->data,
        .out = y->data,
        .count = x_blocks ? ycount : count,
        .dtype = dt,
        .op = op,
        .stream = stream,
        .collective = collective,
        .root = root,
    };
    const int failed = xla_run(&r, target, msg, sizeof(msg)) < 0;
    if (prev >= 0 && prev != c->device)
        cudaSetDevice(prev);
    if (failed)
        return ffi_error(api, SNX_ERR_INTERNAL, msg);
    return NULL;
}

/* ------------------------------------------------- every handler's entry */

typedef struct {
    CommObject *c;             /* entered: c->life.busy counts this call */
    int dev;
    cudaStream_t stream;
} xla_call;

static size_t
elems(const snx_buffer *b, int from)
{
    size_t e = 1;
    for (int64_t i = from; i < b->rank; i++)
        e *= (size_t)b->dims[i];
    return e;
}

/* What every handler does before its collective: answers the metadata
 * query, skips stages other than execute, finds the stream, the device
 * and the communicator registered for it, and enters it (a failed,
 * closing, closed or aborted communicator answers with why; else this
 * thread counts in c->life.busy until xla_leave: no teardown frees c under
 * it, and the watchdog leaves c alone). NULL with *run 0: nothing to
 * run; NULL with *run 1: x filled. */
static snx_error *
xla_enter(snx_call_frame *call, const char *name, xla_call *x, int *run)
{
    const snx_api *api = call->api;
    char msg[800];
    *run = 0;
    if (call->extension_start != NULL &&
        call->extension_start->type == SNX_EXTENSION_METADATA) {
        snx_metadata_extension *ext =
            (snx_metadata_extension *)call->extension_start;
        ext->metadata->api_version.major_version = SNX_API_MAJOR;
        ext->metadata->api_version.minor_version = SNX_API_MINOR;
        ext->metadata->traits = 0;
        return NULL;
    }
    if (call->ctx == NULL || call->stage != SNX_STAGE_EXECUTE)
        return NULL;
    snx_stream_get_args sa;
    memset(&sa, 0, sizeof(sa));
    sa.struct_size = SNX_STRUCT_SIZE(snx_stream_get_args, stream);
    sa.ctx = call->ctx;
    snx_error *e = api->stream_get(&sa);
    if (e != NULL)
        return e;
    if (api->struct_size < SNX_STRUCT_SIZE(snx_api, device_ordinal_get)) {
        snprintf(msg, sizeof(msg), "%s: this XLA's FFI API (%zu bytes) has "
                 "no DeviceOrdinal_Get: update jaxlib", name,
                 api->struct_size);
        return ffi_error(api, SNX_ERR_FAILED_PRECONDITION, msg);
    }
    snx_device_ordinal_get_args da;
    memset(&da, 0, sizeof(da));
    da.struct_size =
        SNX_STRUCT_SIZE(snx_device_ordinal_get_args, device_ordinal);
    da.ctx = call->ctx;
    if ((e = api->device_ordinal_get(&da)) != NULL)
        return e;
    const int dev = da.device_ordinal;
    /* entered under the registry's lock: c cannot leave the registry, be
     * torn down or be freed between the look-up and the count in busy
     * (the registry's comment) */
    char why[700];
    int found = 0, entered = 0;
    pthread_mutex_lock(&registry_lock);
    CommObject *c = dev >= 0 && dev < SN_XLA_MAX_DEVICES ? registry[dev]
                                                         : NULL;
    if (c != NULL) {
        found = 1;
        entered = sn_comm_pin(c, why, sizeof(why)) == 0;
    }
    pthread_mutex_unlock(&registry_lock);
    if (!found) {
        snprintf(msg, sizeof(msg), "%s: no open symnccl communicator is "
                 "registered for device %d: create it with "
                 "symnccl.jax.communicator() before running the "
                 "computation", name, dev);
        return ffi_error(api, SNX_ERR_FAILED_PRECONDITION, msg);
    }
    if (!entered) {
        snprintf(msg, sizeof(msg), "%s: %s", name, why);
        return ffi_error(api, SNX_ERR_ABORTED, msg);
    }
    x->c = c;
    x->dev = dev;
    x->stream = (cudaStream_t)sa.stream;
    *run = 1;
    return NULL;
}

/* Leaving: the last caller to leave finishes an abort that waited for it
 * (without the GIL: sn_comm_unpin). */
static void
xla_leave(xla_call *x)
{
    sn_comm_unpin(x->c);
}

static snx_error *
handle(snx_call_frame *call, const xla_row *row)
{
    const snx_api *api = call->api;
    const int collective = row->collective;
    char msg[320], target[48];
    const char *name = sn_collective_name(collective);
    snprintf(target, sizeof(target), "symnccl_%s", name);
    xla_call xc;
    int run;
    snx_error *e = xla_enter(call, target, &xc, &run);
    if (e != NULL || !run)
        return e;
    CommObject *c = xc.c;
    if (call->args.size != 1 || call->rets.size != 1 ||
        call->args.types[0] != SNX_ARG_BUFFER ||
        call->rets.types[0] != SNX_RET_BUFFER) {
        snprintf(msg, sizeof(msg), "%s: expected one buffer operand and one "
                 "buffer result", target);
        e = ffi_error(api, SNX_ERR_INVALID_ARGUMENT, msg);
        goto leave;
    }
    const snx_buffer *x = call->args.args[0];
    const snx_buffer *y = call->rets.rets[0];
    const sn_dtype *dt = sn_dtype_by_xla(x->dtype);
    if (dt == NULL || x->dtype != y->dtype) {
        snprintf(msg, sizeof(msg), "%s: XLA dtype %d is not supported (or "
                 "differs from the result's, %d)", target, (int)x->dtype,
                 (int)y->dtype);
        e = ffi_error(api, SNX_ERR_INVALID_ARGUMENT, msg);
        goto leave;
    }
    const size_t count = elems(x, 0), ycount = elems(y, 0);
    /* operand and result sizes: equal, or nranks times the other */
    const size_t n = (size_t)c->nranks;
    int xb, yb;
    if (sn_nccl_blocks(collective, &xb, &yb) < 0) {
        snprintf(msg, sizeof(msg), "%s: no NCCL collective", target);
        e = ffi_error(api, SNX_ERR_INTERNAL, msg);
        goto leave;
    }
    size_t want = xb ? ycount * n : yb ? ycount / n : ycount;
    if (count != want || (yb && ycount % n != 0)) {
        snprintf(msg, sizeof(msg), "%s: operand has %zu elements and result "
                 "%zu, expected %s on %zu ranks", target, count, ycount,
                 xb   ? "the operand nranks times the result"
                 : yb ? "the result nranks times the operand"
                      : "the same number", n);
        e = ffi_error(api, SNX_ERR_INVALID_ARGUMENT, msg);
        goto leave;
    }
    if (count == 0)
        e = NULL;
    else if (collective == SYMNCCL_COLL_ALL_REDUCE)
        e = all_reduce(api, call, c, xc.dev, dt, count, x, y, xc.stream);
    else
        e = slice_collective(api, call, c, row, xb, dt, count, ycount, x,
                             y, xc.stream);
leave:
    xla_leave(&xc);
    return e;
}

/* Each row's handler, handle_<name>: handle() with its row. */
#define XLA_HANDLE_FN(name, C, op_, root_)                                  \
    static snx_error *handle_##name(snx_call_frame *call)                   \
    {                                                                       \
        static const xla_row row = {.collective = SYMNCCL_COLL_##C,         \
                                    .op = op_, .root = root_};              \
        return handle(call, &row);                                          \
    }
XLA_NCCL_HANDLERS(XLA_HANDLE_FN)
#undef XLA_HANDLE_FN

/* ------------------------------------------------------------ all-to-all
 * "symnccl_all_to_all": x of nranks equal blocks of rows (its first
 * dimension) -> the same shape, block j to rank j, block i of the result
 * from rank i (Communicator.all_to_all). "symnccl_all_to_all_v": x and the
 * rows it sends to each rank (n int64, on the device) -> out, the rows of
 * ranks 0, 1, ... packed one after another (Communicator.all_to_all_v),
 * and the rows received from each rank (n int64). symnccl/jax.py builds
 * jax.lax.all_to_all and ragged_all_to_all from them (docs/FRAMEWORKS.md,
 * "JAX: all-to-all").
 *
 * The splits of _v never leave the device: it runs on symnccl's kernels
 * only (push, ll; "auto" by the result's bytes, as the method's, never
 * NCCL), since NCCL's path would read the counts on the host. A buffer of 8 x nranks bytes holds the n int64 whatever
 * XLA's element type says (JAX without x64 passes them as uint32 pairs). */

static snx_error *
handle_a2a(snx_call_frame *call, int ragged)
{
    const snx_api *api = call->api;
    const char *name = ragged ? "symnccl_all_to_all_v"
                              : "symnccl_all_to_all";
    char msg[400], why[320];
    xla_call x;
    int run;
    snx_error *e = xla_enter(call, name, &x, &run);
    if (e != NULL || !run)
        return e;
    CommObject *c = x.c;
    const size_t n = (size_t)c->nranks;
    const int nbuf = ragged ? 2 : 1;
    snx_error_code code = SNX_ERR_INVALID_ARGUMENT;
    msg[0] = '\0';
    int ok = call->args.size == nbuf && call->rets.size == nbuf;
    for (int i = 0; ok && i < nbuf; i++)
        ok = call->args.types[i] == SNX_ARG_BUFFER &&
             call->rets.types[i] == SNX_RET_BUFFER;
    if (!ok) {
        snprintf(msg, sizeof(msg), "%s: expected %d buffer operand(s) and "
                 "%d buffer result(s)", name, nbuf, nbuf);
        goto out;
    }
    const snx_buffer *xb = call->args.args[0];
    const snx_buffer *yb = call->rets.rets[0];
    const sn_dtype *dt = sn_dtype_by_xla(xb->dtype);
    if (dt == NULL || xb->dtype != yb->dtype) {
        snprintf(msg, sizeof(msg), "%s: XLA dtype %d is not supported (or "
                 "differs from the result's, %d)", name, (int)xb->dtype,
                 (int)yb->dtype);
        goto out;
    }
    const size_t is = (size_t)dt->itemsize;
    const size_t row = elems(xb, 1);
    if (xb->rank < 1 || yb->rank < 1 || elems(yb, 1) != row) {
        snprintf(msg, sizeof(msg), "%s: operand rows of %zu elements and "
                 "result rows of %zu, expected rows (a first dimension) of "
                 "the same size", name, row,
                 yb->rank < 1 ? 0 : elems(yb, 1));
        goto out;
    }
    const size_t rows = (size_t)xb->dims[0], out_rows = (size_t)yb->dims[0];
    int algo = attr_int(call, "algo", SN_ALGO_AUTO);
    const int asked = algo;
    size_t block = 0;
    if (algo < SN_ALGO_AUTO || algo >= SN_ALGO_COUNT) {
        snprintf(msg, sizeof(msg), "%s: bad algo attribute %d", name, algo);
        goto out;
    }
    const int64_t *splits = NULL;
    int64_t *got = NULL;
    if (ragged) {
        for (int i = 1; i < 3; i++) {
            const snx_buffer *b = i == 1 ? call->args.args[1]
                                         : call->rets.rets[1];
            const sn_dtype *t = sn_dtype_by_xla(b->dtype);
            if (t == NULL || elems(b, 0) * (size_t)t->itemsize != 8 * n) {
                snprintf(msg, sizeof(msg), "%s: the %s hold %zu bytes, "
                         "expected nranks (%zu) int64", name, i == 1
                         ? "splits" : "received counts", t == NULL ? 0
                         : elems(b, 0) * (size_t)t->itemsize, n);
                goto out;
            }
        }
        splits = ((const snx_buffer *)call->args.args[1])->data;
        got = ((const snx_buffer *)call->rets.rets[1])->data;
        if (algo == SN_ALGO_NCCL) {
            snprintf(msg, sizeof(msg), "%s: algo 'nccl' would read the "
                     "splits on the host; inside XLA they stay on the "
                     "device: use 'push', 'll' or 'auto' (push)", name);
            goto out;
        }
    }
    else if (rows % n != 0 || rows != out_rows) {
        snprintf(msg, sizeof(msg), "%s: operand has %zu rows and result "
                 "%zu, expected the same number, a multiple of nranks (%zu)",
                 name, rows, out_rows, n);
        goto out;
    }
    const size_t bytes = (ragged ? out_rows : rows) * row * is;
    if ((algo = resolve(c, SYMNCCL_COLL_ALL_TO_ALL, algo, bytes, dt, NULL, 0,
                        why, sizeof(why))) == SN_ALGO_UNKNOWN) {
        snprintf(msg, sizeof(msg), "%s", why);
        goto out;
    }
    /* _v's "auto" past the table's kernels: push (NCCL would read the
     * splits on the host), where push can run */
    if (ragged && asked == SN_ALGO_AUTO && algo == SN_ALGO_NCCL) {
        const sn_topology t = sn_topology_of(c);
        const char *no = sn_collective_unavailable(
            &t, SYMNCCL_COLL_ALL_TO_ALL, SN_ALGO_PUSH, dt, NULL);
        if (no != NULL) {
            snprintf(msg, sizeof(msg), "%s: the splits stay on the device "
                     "and only symnccl's kernels take them, which cannot "
                     "run here: %s", name, no);
            goto out;
        }
        algo = SN_ALGO_PUSH;
    }
    /* the one size check of every all-to-all (launch.c), from what every
     * rank agrees on */
    if (sn_a2a_plan(c, asked, &algo, ragged, rows, out_rows, row * is,
                    &block, why, sizeof(why)) < 0) {
        snprintf(msg, sizeof(msg), "%s: %s", name, why);
        goto out;
    }
    if (!ragged && rows * row == 0)   /* the same on every rank */
        goto out;
    if (ragged && algo == SN_ALGO_NCCL) {   /* sn_a2a_plan never gives it */
        snprintf(msg, sizeof(msg), "%s: no NCCL path keeps the splits on "
                 "the device", name);
        goto out;
    }
    code = SNX_ERR_INTERNAL;
    int prev = -1;
    cudaGetDevice(&prev);
    if (prev != c->device)
        cudaSetDevice(c->device);
    /* equal blocks: the rows each rank gets (the kernels' host splits, and
     * NCCL's grouped ncclSend/ncclRecv); _v: the device's splits */
    int64_t equal[SYMNCCL_MAX_RANKS];
    for (size_t q = 0; q < n; q++)
        equal[q] = (int64_t)(rows / n);
    sn_ar r = {
        .c = c,
        .algo = algo,
        .x = xb->data,
        .out = yb->data,
        .count = rows,
        .dtype = dt,
        .stream = x.stream,
        .collective = SYMNCCL_COLL_ALL_TO_ALL,
        .root = -1,
        .row_size = row * is,
        .out_rows = out_rows,
        .in_splits = splits,
        .host_splits = equal,
        .out_splits = got,
    };
    xla_run(&r, name, msg, sizeof(msg));
    if (prev >= 0 && prev != c->device)
        cudaSetDevice(prev);
out:
    xla_leave(&x);
    return msg[0] != '\0' ? ffi_error(api, code, msg) : NULL;
}

static snx_error *
handle_all_to_all(snx_call_frame *call)
{
    return handle_a2a(call, 0);
}

static snx_error *
handle_all_to_all_v(snx_call_frame *call)
{
    return handle_a2a(call, 1);
}
/* ------------------------------------------------------ end all-to-all */

/* ------------------------------------------------------------------ */
/* "symnccl_all_reduce_rmsnorm": Communicator.all_reduce_rmsnorm as a
 * custom call (symnccl.jax.all_reduce_rmsnorm). Operands x, residual,
 * weight (and a static FP8 scale), results y and h (and the dynamic FP8
 * row scales); attributes eps (float32) and algo (SN_ALGO_*). The
 * quantisation follows from the buffers: a fourth operand is the static
 * scale, a third result the row scales, and y is then float8_e4m3fn. The
 * fused kernels copy x into the staging window themselves (launch.c,
 * row_launches), so XLA's buffers are never registered as windows. The
 * algorithm is the resolver's (sn_resolve) and the launch, NCCL fallback
 * included, run.c's (sn_run), as for the method. */

/* Float attribute `name` (a float32 or float64 scalar), or dflt. */
static double
attr_float(const snx_call_frame *call, const char *name, double dflt)
{
    size_t len = strlen(name);
    for (int64_t i = 0; i < call->attrs.size; i++) {
        const snx_bytes *n = call->attrs.names[i];
        if (n->len != len || memcmp(n->ptr, name, len) != 0 ||
            call->attrs.types[i] != SNX_ATTR_SCALAR)
            continue;
        const snx_scalar *s = call->attrs.attrs[i];
        if (s->dtype == SNX_F32)
            return *(const float *)s->value;
        if (s->dtype == SNX_F64)
            return *(const double *)s->value;
    }
    return dflt;
}

/* The buffers of a call: b[] = x, residual, weight, y, h, scale (NULL
 * without quantisation), checked (symnccl.jax checks first, naming the
 * arrays; this guards the kernels); 0, or -1 with msg[] filled. */
static int
rmsnorm_buffers(const snx_call_frame *call, const snx_buffer *b[6],
                int *quant, size_t *H, const sn_dtype **dt, char *msg,
                size_t len)
{
    const int64_t na = call->args.size, nr = call->rets.size;
    int ok = (na == 3 || na == 4) && (nr == 2 || nr == 3) &&
             !(na == 4 && nr == 3);
    for (int64_t i = 0; ok && i < na; i++)
        ok = call->args.types[i] == SNX_ARG_BUFFER;
    for (int64_t i = 0; ok && i < nr; i++)
        ok = call->rets.types[i] == SNX_RET_BUFFER;
    if (!ok) {
        snprintf(msg, len, "symnccl_all_reduce_rmsnorm: %lld operands and "
                 "%lld results, expected buffers x, residual, weight (and "
                 "a static scale) and y, h (and the row scales)",
                 (long long)na, (long long)nr);
        return -1;
    }
    for (int i = 0; i < 3; i++)
        b[i] = call->args.args[i];
    b[3] = call->rets.rets[0];
    b[4] = call->rets.rets[1];
    b[5] = na == 4 ? call->args.args[3] : nr == 3 ? call->rets.rets[2]
                                                  : NULL;
    *quant = na == 4   ? SYMNCCL_QUANT_STATIC
             : nr == 3 ? SYMNCCL_QUANT_DYNAMIC
                       : SYMNCCL_QUANT_NONE;
    const snx_buffer *x = b[0];
    *dt = sn_dtype_by_xla(x->dtype);
    const int ydt = *quant != SYMNCCL_QUANT_NONE ? SNX_F8E4M3FN : x->dtype;
    if (*dt == NULL || !SYMNCCL_UNIT_FLOAT_TAKES((*dt)->kernel) ||
        b[1]->dtype != x->dtype || b[2]->dtype != x->dtype ||
        b[3]->dtype != ydt || b[4]->dtype != x->dtype ||
        (b[5] != NULL && b[5]->dtype != SNX_F32)) {
        snprintf(msg, len, "symnccl_all_reduce_rmsnorm: XLA dtypes x %d, "
                 "residual %d, weight %d, y %d, h %d: expected float32, "
                 "float16 or bfloat16 for all but y (x's, or "
                 "float8_e4m3fn when quantised) and the scales (float32)",
                 x->dtype, b[1]->dtype, b[2]->dtype, b[3]->dtype,
                 b[4]->dtype);
        return -1;
    }
    const size_t count = elems(x, 0);
    *H = x->rank >= 1 ? (size_t)x->dims[x->rank - 1] : 0;
    if (*H == 0 || *H % 8 != 0 || elems(b[1], 0) != count ||
        elems(b[2], 0) != *H || elems(b[3], 0) != count ||
        elems(b[4], 0) != count ||
        (b[5] != NULL &&
         elems(b[5], 0) !=
             (*quant == SYMNCCL_QUANT_STATIC ? 1 : count / *H))) {
        snprintf(msg, len, "symnccl_all_reduce_rmsnorm: x has %zu elements "
                 "in rows of H %zu: expected H a positive multiple of 8, "
                 "residual, y and h of x's size, weight of H elements, "
                 "and a scale per tensor (static) or per row (dynamic)",
                 count, *H);
        return -1;
    }
    return 0;
}

static snx_error *
all_reduce_rmsnorm(snx_call_frame *call, CommObject *c, const sn_dtype *dt,
                   int quant, size_t H, const snx_buffer *const *b,
                   cudaStream_t stream)
{
    const snx_api *api = call->api;
    char msg[320];
    const size_t count = elems(b[0], 0);
    int algo = attr_int(call, "algo", SN_ALGO_AUTO);
    const double eps = attr_float(call, "eps", -1.0);
    if (algo < SN_ALGO_AUTO || algo >= SN_ALGO_COUNT || !(eps >= 0.0))
        return ffi_error(api, SNX_ERR_INVALID_ARGUMENT,
                         "symnccl_all_reduce_rmsnorm: bad algo or eps "
                         "attribute");
    if (count == 0)
        return NULL;
    const char *no = NULL;
    const int asked = algo;
    if ((algo = resolve(c, SYMNCCL_COLL_ALL_REDUCE_RMSNORM, algo,
                        count * (size_t)dt->itemsize, dt, NULL, 0, msg,
                        sizeof(msg))) == SN_ALGO_UNKNOWN ||
        (no = sn_rmsnorm_unavailable(algo, quant)) != NULL)
        return ffi_error(api, SNX_ERR_INVALID_ARGUMENT,
                         no != NULL ? no : msg);
    int prev = -1;
    cudaGetDevice(&prev);
    if (prev != c->device)
        cudaSetDevice(c->device);
    sn_ar r = {
        .c = c,
        .algo = algo,
        .x = b[0]->data,
        .out = b[3]->data,
        .count = count,
        .dtype = dt,
        .op = sn_op_by_name("sum"),
        .stream = stream,
        .collective = SYMNCCL_COLL_ALL_REDUCE_RMSNORM,
        .root = -1,
        .residual = b[1]->data,
        .out_h = b[4]->data,
        .weight = b[2]->data,
        .row_len = H,
        .eps = (float)eps,
        .quant = quant,
        .scale = b[5] != NULL ? b[5]->data : NULL,
        .ar_algo = sn_rmsnorm_ar_algo(c, asked, algo, dt,
                                      count * (size_t)dt->itemsize),
    };
    const int rc = xla_run(&r, "symnccl_all_reduce_rmsnorm", msg,
                           sizeof(msg));
    if (prev >= 0 && prev != c->device)
        cudaSetDevice(prev);
    return rc != 0 ? ffi_error(api, SNX_ERR_INTERNAL, msg) : NULL;
}

static snx_error *
handle_all_reduce_rmsnorm(snx_call_frame *call)
{
    /* the prologue the all-to-all handlers share: metadata, stage, stream,
     * device, the communicator entered */
    xla_call x;
    int run;
    snx_error *e = xla_enter(call, "symnccl_all_reduce_rmsnorm", &x, &run);
    if (e != NULL || !run)
        return e;
    char msg[320];
    const snx_buffer *b[6];
    int quant;
    size_t H;
    const sn_dtype *dt;
    if (rmsnorm_buffers(call, b, &quant, &H, &dt, msg, sizeof(msg)) < 0)
        e = ffi_error(call->api, SNX_ERR_INVALID_ARGUMENT, msg);
    else
        e = all_reduce_rmsnorm(call, x.c, dt, quant, H, b, x.stream);
    xla_leave(&x);
    return e;
}

/* Every handler, by the name symnccl/jax.py registers it under (its target
 * is "symnccl_" + name; _C.XLA_HANDLERS lists them). */
static const struct {
    const char *name;
    snx_error *(*fn)(snx_call_frame *);
} handlers[] = {
#define XLA_HANDLER_ENTRY(nm, C, op_, root_)                                \
    {.name = #nm, .fn = handle_##nm},
    XLA_NCCL_HANDLERS(XLA_HANDLER_ENTRY)
#undef XLA_HANDLER_ENTRY
    {"all_to_all", handle_all_to_all},
    {"all_to_all_v", handle_all_to_all_v},
    {"all_reduce_rmsnorm", handle_all_reduce_rmsnorm},
};
#define N_HANDLERS (sizeof(handlers) / sizeof(handlers[0]))

size_t
sn_xla_n_handlers(void)
{
    return N_HANDLERS;
}

const char *
sn_xla_handler_name(size_t i)
{
    return handlers[i].name;
}

void *
sn_xla_handler_fn(size_t i)
{
    return (void *)handlers[i].fn;
}
