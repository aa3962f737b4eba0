/* Communicators' lifecycle without the Python API: the multicast gate, a
 * new communicator's fields, the steps of its creation, the state machine
 * every entry point enters through, and the steps of its teardown.
 * python/lifetime.c composes them for Python callers (the GIL released
 * around every NCCL group and every wait, failures raised, warnings); the
 * XLA handlers enter and leave through sn_comm_pin and sn_comm_unpin, and
 * the last caller to leave an abort that waited for it finishes it here.
 *
 * One creation path serves Communicator() (one communicator) and
 * Communicator.init_all() (one per device, all driven by this thread): each
 * collective step is one NCCL group over all of them. Communicators are
 * non-blocking (ncclConfig_t.blocking = 0) so that every wait for peers is
 * bounded by `timeout` and interruptible by Ctrl-C (wait.c); one that times
 * out can still be aborted.
 *
 * Teardown follows NCCL's order: wait for the device -> ncclDevCommDestroy
 * -> ncclCommWindowDeregister -> (ncclMemFree, by each buffer when its last
 * view dies) -> ncclCommFinalize -> ncclCommDestroy.
 */
#include "runtime.h"

#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------ */
/* Teardown steps with nobody to raise to (abort, a window's release, the
 * end of a teardown): a failed CUDA or NCCL call is written to stderr,
 * naming the rank, and the teardown goes on. */

static void
teardown_cuda(const CommObject *c, cudaError_t e, const char *what)
{
    if (e != cudaSuccess) {
        fprintf(stderr, "symnccl: rank %d (cuda:%d): %s during teardown: "
                "%s\n", c->rank, c->device, what, cudaGetErrorString(e));
        (void)cudaGetLastError();
    }
}

static void
teardown_nccl(const CommObject *c, ncclResult_t rc, const char *what)
{
    if (rc != ncclSuccess && rc != ncclInProgress)
        fprintf(stderr, "symnccl: rank %d (cuda:%d): %s during teardown: "
                "%s\n", c->rank, c->device, what, ncclGetErrorString(rc));
}

/* ------------------------------------------------------------------ */
/* Multicast gate. Multicast is never requested while any of the three
 * switches that turn NVLink multicast off is set: NCCL_NVLS_ENABLE=0,
 * TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1. */

static int
env_true(const char *v)
{
    return v != NULL && v[0] != '\0' && strcmp(v, "0") != 0 &&
           strcasecmp(v, "false") != 0 && strcasecmp(v, "no") != 0 &&
           strcasecmp(v, "off") != 0;
}

const char *
sn_multicast_gate(int mode, const char *nvls_enable,
                  const char *torch_disable, const char *nvshmem_disable)
{
    if (nvls_enable != NULL && nvls_enable[0] != '\0' && !env_true(nvls_enable))
        return "disabled by NCCL_NVLS_ENABLE=0";
    if (env_true(torch_disable))
        return "disabled by TORCH_SYMM_MEM_DISABLE_MULTICAST";
    if (env_true(nvshmem_disable))
        return "disabled by NVSHMEM_DISABLE_NVLS";
    if (mode == SN_MC_OFF)
        return "not requested (multicast=False)";
    return NULL;
}

/* CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED through the driver entry point
 * (an attribute query: no multicast object is created). -1 if unknown. */
static int
device_has_multicast(int device)
{
    typedef CUresult (*attr_fn)(int *, CUdevice_attribute, CUdevice);
    static attr_fn get_attr;
    static int loaded;
    if (!loaded) {
        enum cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuDeviceGetAttribute",
                                             (void **)&get_attr, 12000,
                                             cudaEnableDefault, &q)
            != cudaSuccess)
            get_attr = NULL;
        loaded = 1;
    }
    int v = 0;
    if (get_attr == NULL ||
        get_attr(&v, CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, device)
            != CUDA_SUCCESS)
        return -1;
    return v != 0;
}

static const char *
decide_multicast(int mode, int nranks, int device)
{
    const char *why = sn_multicast_gate(
        mode, getenv("NCCL_NVLS_ENABLE"),
        getenv("TORCH_SYMM_MEM_DISABLE_MULTICAST"),
        getenv("NVSHMEM_DISABLE_NVLS"));
    if (why != NULL)
        return why;
    /* NCCL 2.28.9 accepts lsaMultimem on a system without NVLS and then
     * fails every window registration ("Multicast support requested for
     * team but none available on system", seen on a single H100, with
     * multicast=True too). So: never for one rank, and auto only where the
     * GPU reports switch multicast. */
    if (nranks < 2)
        return "not requested (a single rank has no peers)";
    if (mode == SN_MC_AUTO && device_has_multicast(device) != 1)
        return "not requested (auto: the GPU reports no switch multicast)";
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Creation. */

void
sn_comm_link(CommObject **live, CommObject *c)
{
    c->life.prev = NULL;
    c->life.next = *live;
    if (*live != NULL)
        (*live)->life.prev = c;
    *live = c;
}

void
sn_comm_unlink(CommObject **live, CommObject *c)
{
    if (c->life.prev != NULL)
        c->life.prev->life.next = c->life.next;
    else if (*live == c)
        *live = c->life.next;
    if (c->life.next != NULL)
        c->life.next->life.prev = c->life.prev;
    c->life.next = c->life.prev = NULL;
}

int
sn_comm_init(CommObject *c, CommObject **live, int rank, int nranks,
             int device, double timeout, int multicast, size_t staging_bytes,
             sn_err *err)
{
    c->rank = rank;
    c->nranks = nranks;
    c->device = device;
    c->timeout = timeout;
    c->lsa_size = 1;
    c->symmetric_reason = "not initialised";
    /* symnccl's kernels let the next kernel launch at their entry only
     * beside an NCCL whose kernels wait for them (primitives.cuh,
     * pdl_wait) */
    c->pdl_early = sn_nccl_pdl_early(sn_abi_runtime());
    c->life.state = SN_OPEN;
    pthread_mutex_init(&c->lock, NULL);
    const char *why = decide_multicast(multicast, nranks, device);
    c->multicast_requested = why == NULL;
    c->multicast_reason = why != NULL ? why
                          : multicast == SN_MC_AUTO ? "requested (auto)"
                                                    : "requested";
    sn_comm_link(live, c);
    if (sn_knobs_read(&c->knobs, err) < 0)
        return -1;
    SN_CUDA_ERR_GOTO(err, cudaDeviceGetAttribute(
                              &c->sms, cudaDevAttrMultiProcessorCount,
                              device),
                     "cudaDeviceGetAttribute(MultiProcessorCount)", error);
    sn_layout_compute(c, staging_bytes);
    return 0;
error:
    return -1;
}

static void
nccl_config(ncclConfig_t *cfg, const sn_knobs *k)
{
    ncclConfig_t init = NCCL_CONFIG_INITIALIZER;
    *cfg = init;
    cfg->blocking = k->nccl_blocking;
}

/* NCCL calls inside a group return ncclInProgress on non-blocking
 * communicators: that is success here (the wait completes them). */
static ncclResult_t
started(ncclResult_t rc)
{
    return rc == ncclInProgress ? ncclSuccess : rc;
}

/* Ends a group; the first failure (rc, then the group's) is returned. */
static ncclResult_t
group_end(ncclResult_t rc)
{
    ncclResult_t end = started(ncclGroupEnd());
    return rc != ncclSuccess ? rc : end;
}

ncclResult_t
sn_connect_nccl(CommObject **cs, int n, const ncclUniqueId *id)
{
    ncclResult_t rc = ncclGroupStart();
    for (int i = 0; i < n && rc == ncclSuccess; i++) {
        ncclConfig_t cfg;
        nccl_config(&cfg, &cs[i]->knobs);
        if (cudaSetDevice(cs[i]->device) != cudaSuccess) {
            rc = ncclUnhandledCudaError;
            break;
        }
        rc = started(ncclCommInitRankConfig(&cs[i]->comm, cs[i]->nranks, *id,
                                            cs[i]->rank, &cfg));
    }
    return group_end(rc);
}

/* What ncclDevCommCreate made, checked before any kernel reads it: a
 * device communicator laid out by another NCCL than this build's headers
 * (NCCL 2.30+: magic and version), or an LSA rank outside its team, would
 * have the kernels address the wrong memory. -1 with err (RuntimeError)
 * naming the values. */
static int
read_devcomm(CommObject *c, sn_err *err)
{
    int has_mc = 0, size = 0, rank = 0;
    symnccl_devcomm_info(c->devcomm, &size, &rank, &has_mc);
    if (size == -1)
        return sn_fail(err, cudaSuccess, ncclSuccess, "ncclDevCommCreate on "
                       "rank %d of %d (cuda:%d) returned a device "
                       "communicator with magic 0x%x and version %d, but "
                       "symnccl's kernels for NCCL 2.%d were built for "
                       "magic 0x%x (NCCL_API_MAGIC) and version %d (their "
                       "headers): the loaded libnccl (NCCL %d) lays it out "
                       "differently", c->rank, c->nranks, c->device,
                       (unsigned)rank, has_mc, sn_abi_minor(),
                       SN_NCCL_API_MAGIC, sn_abi_headers(), sn_abi_runtime());
    if (size < 1 || size > c->nranks || rank < 0 || rank >= size)
        return sn_fail(err, cudaSuccess, ncclSuccess, "ncclDevCommCreate on "
                       "rank %d of %d (cuda:%d) returned lsaRank %d and "
                       "lsaSize %d; expected 0 <= lsaRank < lsaSize <= %d",
                       c->rank, c->nranks, c->device, rank, size, c->nranks);
    c->lsa_size = size;
    c->lsa_rank = rank;
    c->symmetric = 1;
    c->symmetric_reason = "ncclDevCommCreate succeeded";
    c->multicast = has_mc;
    if (c->multicast_requested)
        c->multicast_reason = has_mc ? "granted by NCCL"
                                     : "requested, but NCCL granted none";
    return 0;
}

/* c without the device API, and why: symnccl's kernels never run on it
 * (Communicator.device_api_reason; sn_comms_connect warns). */
static void
no_device_api(CommObject *c, const char *why)
{
    c->symmetric = 0;
    c->symmetric_reason = why;
    c->lsa_size = 1;
    c->lsa_rank = 0;
}

/* The same with NCCL's own words for a failed call (rc, ncclGetLastError). */
static void
no_device_api_nccl(CommObject *c, const char *call, ncclResult_t rc)
{
    const char *last = c->comm != NULL ? ncclGetLastError(c->comm) : NULL;
    snprintf(c->device_api_why, sizeof(c->device_api_why), "%s failed (%s%s%s)"
             ": the NCCL device API is not usable on this communicator", call,
             ncclGetErrorString(rc), last != NULL && last[0] ? ": " : "",
             last != NULL ? last : "");
    no_device_api(c, c->device_api_why);
}

/* Multicast is not requested again on any of cs, and why. */
static void
no_multicast(CommObject **cs, int n, const char *why)
{
    for (int i = 0; i < n; i++) {
        cs[i]->multicast_requested = 0;
        cs[i]->multicast_reason = why;
    }
}

int
sn_connect_devcomms_wanted(CommObject **cs, int n, int *mc)
{
    *mc = cs[0]->multicast_requested;
    /* NCCL 2.29+ says beforehand what it supports (the same on every rank:
     * NCCL agrees on it at init); 2.28 cannot, and is asked by trying */
    int api = 1, mm = 1;
    for (int i = 0; i < n; i++) {
        int a = 1, m = 1;
        if (symnccl_comm_properties(cs[i]->comm, &a, &m) == ncclSuccess) {
            api &= a;
            mm &= m;
        }
    }
    if (!api) {
        for (int i = 0; i < n; i++) {
            no_device_api(cs[i], "NCCL reports no device API support on "
                                 "this communicator "
                                 "(ncclCommQueryProperties)");
            cs[i]->multicast_requested = 0;
        }
        return 0;
    }
    if (*mc && !mm) {
        *mc = 0;
        no_multicast(cs, n, "requested, but NCCL reports no multimem "
                            "support (ncclCommQueryProperties)");
    }
    return 1;
}

ncclResult_t
sn_connect_devcomms(CommObject **cs, int n, int mc)
{
    ncclResult_t rc = ncclGroupStart();
    for (int i = 0; i < n && rc == ncclSuccess; i++) {
        if (cudaSetDevice(cs[i]->device) != cudaSuccess) {
            rc = ncclUnhandledCudaError;
            break;
        }
        /* no LSA barriers: symnccl's kernels bring their own, with a
         * bounded wait (kernels/primitives.cuh, Barrier) */
        rc = started(symnccl_devcomm_create(cs[i]->comm, 0, mc,
                                            &cs[i]->devcomm));
    }
    return group_end(rc);
}

int
sn_connect_devcomms_retry(CommObject **cs, int n, ncclResult_t rc, int *mc)
{
    if (rc == ncclSuccess)
        return 0;
    for (int i = 0; i < n; i++) {   /* never created */
        symnccl_devcomm_free(cs[i]->devcomm);
        cs[i]->devcomm = NULL;
    }
    if (!(*mc && rc == ncclInvalidArgument))
        return 0;
    *mc = 0;
    no_multicast(cs, n, "requested, but NCCL refused it "
                        "(ncclInvalidArgument): NVLS unavailable");
    return 1;
}

int
sn_connect_devcomms_read(CommObject **cs, int n, ncclResult_t rc,
                         sn_err *err)
{
    for (int i = 0; i < n; i++) {
        if (cs[i]->devcomm == NULL)
            no_device_api_nccl(cs[i], "ncclDevCommCreate", rc);
        else if (read_devcomm(cs[i], err) < 0)
            return -1;
    }
    return 0;
}

int
sn_connect_memory(CommObject *c, sn_err *err)
{
    SN_CUDA_ERR_GOTO(err, cudaSetDevice(c->device), "cudaSetDevice", error);
    if (sn_scratch_alloc(c, err) < 0 || sn_fault_alloc(c, err) < 0)
        goto error;
    return 0;
error:
    return -1;
}

ncclResult_t
sn_connect_staging(CommObject **cs, int n, int *any)
{
    *any = 0;
    ncclResult_t rc = ncclGroupStart();
    for (int i = 0; i < n && rc == ncclSuccess; i++) {
        CommObject *c = cs[i];
        if (c->mem.staging == NULL)
            continue;
        c->mem.staging_win = sn_window_node(c, c->mem.staging,
                                            c->mem.layout.bytes);
        if (c->mem.staging_win == NULL) {
            rc = ncclSystemError;
            break;
        }
        *any = 1;
        if (cudaSetDevice(c->device) != cudaSuccess) {
            rc = ncclUnhandledCudaError;
            break;
        }
        rc = started(ncclCommWindowRegister(c->comm, c->mem.staging,
                                            c->mem.layout.bytes,
                                            &c->mem.staging_win->win,
                                            NCCL_WIN_COLL_SYMMETRIC));
    }
    return group_end(rc);
}

int
sn_connect_staging_check(CommObject **cs, int n, sn_err *err)
{
    /* The kernels address peers as evenly spaced copies of a window (as
     * NCCL maps them); where that would not hold, they must not run. */
    for (int i = 0; i < n; i++) {
        CommObject *c = cs[i];
        int ok = 0;
        if (c->mem.staging_win == NULL)
            continue;
        SN_CUDA_ERR_GOTO(err, cudaSetDevice(c->device), "cudaSetDevice",
                         error);
        SN_CUDA_ERR_GOTO(err, symnccl_lsa_layout_ok(c->mem.staging_win->win,
                                                    c->nranks, &ok),
                         "checking the LSA layout", error);
        if (!ok)
            no_device_api(c, "NCCL's LSA addresses of a window are not "
                             "evenly spaced: symnccl's kernels cannot "
                             "address the peers");
    }
    return 0;
error:
    return -1;
}

/* What every rank of a communicator must share (sn_agreed): the
 * SYMNCCL_* knobs (docs/BUILD.md, 'Run-time knobs': the kernels' grids,
 * chunks and thresholds, and what "auto" picks, follow them) and
 * staging_bytes (the staging layout follows it). Ranks that differ would
 * run different protocols on the same flags: hangs, or a wait satisfied by
 * another call's flag, and wrong data. Each rank writes its record at
 * offset 0 of its staging window (the same on every rank, whatever the
 * layout) before it registers the window, and reads every peer's through
 * the peer's LSA address once its registration completed, which no rank
 * completes before every rank entered it, that is after every rank wrote
 * its record. Offset 0 is the staging data area (one_shot's and
 * two_shot's copy of their input, which a call writes before any peer
 * reads it), so the record's bytes are never read as a flag. A rank's
 * first staged call overwrites its record: a peer that had not read it by
 * then finds no whole record (sn_agreed_whole) and does not judge, while
 * the ranks that read every record judge alike; a record of another
 * symnccl is likewise no record (the record and its verdict:
 * registry.c). */
#define AGREED_OFFSET 0

static int
agree_wanted(const CommObject *c)
{
    return c->mem.staging != NULL &&
           c->mem.layout.staging >= sizeof(sn_agreed);
}

int
sn_connect_agree_write(CommObject *c, sn_err *err)
{
    if (!agree_wanted(c))
        return 0;
    sn_agreed a;
    memset(&a, 0, sizeof(a));
    a.staging_bytes = c->mem.layout.staging;
    a.rank = c->rank;
    a.nranks = c->nranks;
    a.knobs = c->knobs;
    sn_agreed_seal(&a);
    SN_CUDA_ERR_GOTO(err, cudaSetDevice(c->device), "cudaSetDevice", error);
    /* from pageable memory, cudaMemcpy may return before the copy lands:
     * the synchronisation makes it land before the registration */
    SN_CUDA_ERR_GOTO(err, cudaMemcpy(c->mem.staging + AGREED_OFFSET, &a,
                                     sizeof(a), cudaMemcpyHostToDevice),
                     "writing the creation record", error);
    SN_CUDA_ERR_GOTO(err, cudaDeviceSynchronize(),
                     "writing the creation record", error);
    return 0;
error:
    return -1;
}

/* Every rank's record through c's staging window, by rank: 1 when every
 * one was whole, 0 when one was not (not judged), -1 with err. */
static int
read_records(CommObject *c, sn_agreed *all, sn_err *err)
{
    memset(all, 0, (size_t)c->nranks * sizeof(*all));
    for (int p = 0; p < c->lsa_size; p++) {
        void *ptr = NULL;
        sn_agreed a;
        SN_CUDA_ERR_GOTO(err, symnccl_lsa_pointer(c->mem.staging_win->win,
                                                  AGREED_OFFSET, p, &ptr),
                         "reading a peer's LSA address", error);
        SN_CUDA_ERR_GOTO(err, cudaMemcpy(&a, ptr, sizeof(a),
                                         cudaMemcpyDefault),
                         "reading a peer's creation record", error);
        if (!sn_agreed_whole(&a) || a.nranks != c->nranks || a.rank < 0 ||
            a.rank >= c->nranks || all[a.rank].magic != 0)
            return 0;
        all[a.rank] = a;
    }
    return 1;
error:
    return -1;
}

/* cs are this process's ranks of one communicator: every rank's record
 * reads the same through any of them, so the first that has a staging
 * window reads them (once, not once per local rank). */
int
sn_connect_agree_check(CommObject **cs, int n, sn_err *err)
{
    sn_agreed all[SYMNCCL_MAX_RANKS];
    for (int i = 0; i < n; i++) {
        CommObject *c = cs[i];
        if (!agree_wanted(c) || c->mem.staging_win == NULL ||
            !c->symmetric || c->nranks < 2 || c->lsa_size != c->nranks ||
            c->nranks > SYMNCCL_MAX_RANKS)
            continue;
        SN_CUDA_ERR_GOTO(err, cudaSetDevice(c->device), "cudaSetDevice",
                         error);
        int got = read_records(c, all, err);
        if (got < 0)
            return -1;
        char why[512];
        if (got == 0 || !sn_agreed_differ(all, c->nranks, why, sizeof(why)))
            return 0;
        /* the rank list last: a long one is what a cut loses */
        sn_fail(err, cudaSuccess, ncclSuccess, "the %d ranks were created "
                "with different settings (every rank must pass the same "
                "staging_bytes and SYMNCCL_* knobs: docs/BUILD.md, "
                "'Run-time knobs'): %s", c->nranks, why);
        err->kind = SN_ERR_VALUE;
        return -1;
    }
    return 0;
error:
    return -1;
}

/* ------------------------------------------------------------------ */
/* The lifecycle (docs/FAILURES.md, "Lifecycle").
 *
 *   OPEN --close()--> CLOSING(close) --> CLOSED
 *     |                  | abort() meanwhile, or a step failed
 *     |                  v
 *     +--abort()-----> CLOSING(abort) --> ABORTED
 *        (watchdog)
 *
 * The state, the count of callers inside (busy) and the teardown's kind
 * change under c->lock only. Every entry point enters OPEN communicators
 * only, counted in busy (methods: sn_comm_enter; the XLA handler:
 * sn_comm_pin; a group's end and a buffer's deallocation likewise), so
 * the thread that moves c to CLOSING (the owner of the teardown: one
 * thread) knows that no caller comes after it, and frees nothing while
 * busy > 0:
 *   - close waits for the callers inside, at most c's timeout (their own
 *     waits end by then); past it, or on any failure, it aborts instead;
 *   - abort first ends every wait on c (c->life.stop) and c's kernels
 *     (abort flag and fault word), so callers leave within milliseconds,
 *     waits SN_ABORT_LEAVE_SECONDS for them, and if one is still inside,
 *     leaves the rest to the last caller to leave (abort_pending):
 *     nothing is freed under a caller, and abort() returns within its
 *     bounds;
 *   - abort() while another thread closes c sets c->life.stop; that close
 *     sees it in its waits and turns into the abort.
 * The GIL is released wherever a teardown waits (python/lifetime.c); no
 * lock is held then. */

/* Teardowns look at busy and the state this often. */
#define POLL_SECONDS 0.001

void
sn_comm_nap(void)
{
    struct timespec t = {0, (long)(POLL_SECONDS * 1e9)};
    nanosleep(&t, NULL);
}

static const char *
state_name(int state, int teardown)
{
    switch (state) {
    case SN_OPEN: return "open";
    case SN_CLOSING:
        return teardown == SN_TEAR_ABORT ? "being aborted" : "being closed";
    case SN_CLOSED: return "closed";
    default: return "aborted";
    }
}

const char *
sn_comm_state_name(CommObject *c)
{
    sn_lock(c);
    const char *name = state_name(c->life.state, c->life.teardown);
    sn_unlock(c);
    return name;
}

/* Under the lock: whether a caller may enter c (OPEN, not failed). The
 * failure record is read only while OPEN (its memory goes with the
 * teardown); *failed: c has failed. */
static int
may_enter(CommObject *c, int *failed)
{
    *failed = c->life.state == SN_OPEN ? sn_fault_poll(c)
                                  : c->fail.failure.reason != 0;
    return c->life.state == SN_OPEN && !*failed;
}

int
sn_comm_pin(CommObject *c, char *why, size_t len)
{
    sn_lock(c);
    int failed;
    const int ok = may_enter(c, &failed);
    /* a failure is the answer until the user aborts */
    const int failure = failed && !c->life.user_aborted;
    if (ok)
        c->life.busy++;
    else if (failure)
        sn_fault_describe(c, why, len);
    else
        snprintf(why, len, "communicator (rank %d of %d, cuda:%d) is %s: "
                 "no call may start on it%s", c->rank, c->nranks,
                 c->device, state_name(c->life.state, c->life.teardown),
                 c->life.state == SN_CLOSING ? " (another thread is "
                                               "closing or aborting it)"
                                             : "");
    sn_unlock(c);
    return ok ? 0 : failure ? SN_PIN_FAILED : -1;
}

int
sn_comm_leaving(CommObject *c)
{
    sn_lock(c);
    const int last = --c->life.busy == 0 && c->life.abort_pending;
    if (last)
        c->life.abort_pending = 0;
    sn_unlock(c);
    return last;
}

void
sn_comm_unpin(CommObject *c)
{
    if (sn_comm_leaving(c))
        sn_comm_abort_finish(c);
}

int
sn_comm_callers_left(CommObject *c, int stoppable, double until)
{
    sn_lock(c);
    const int busy = c->life.busy;
    sn_unlock(c);
    if (busy == 0)
        return 0;
    if (stoppable && c->life.stop)
        return 1;
    if (sn_now() >= until)
        return 2;
    return -1;
}

int
sn_comm_teardown_ended(CommObject *c, double until, int *state)
{
    sn_lock(c);
    *state = c->life.state;
    const int pending = c->life.abort_pending;
    sn_unlock(c);
    return *state != SN_CLOSING || pending || sn_now() >= until;
}

int
sn_comm_look(CommObject *c, int *failed)
{
    sn_lock(c);
    const int state = c->life.state;
    (void)may_enter(c, failed);
    sn_unlock(c);
    return state;
}

int
sn_comm_take_teardown(CommObject *c, int kind)
{
    sn_lock(c);
    const int mine = c->life.state == SN_OPEN;
    if (mine) {
        c->life.state = SN_CLOSING;
        c->life.teardown = kind;
    }
    sn_unlock(c);
    return mine;
}

int
sn_comm_take_close(CommObject *c, int in_group, int *state, int *failed)
{
    sn_lock(c);
    *state = c->life.state;
    (void)may_enter(c, failed);
    const int mine = *state == SN_OPEN && !*failed && !in_group;
    if (mine) {
        c->life.state = SN_CLOSING;
        c->life.teardown = SN_TEAR_CLOSE;
    }
    sn_unlock(c);
    return mine;
}

int
sn_comm_abort_look(CommObject *c, int *was)
{
    sn_lock(c);
    const int state = c->life.state;
    *was = c->life.teardown;
    if (state == SN_CLOSING)
        c->life.teardown = SN_TEAR_ABORT;
    sn_unlock(c);
    return state;
}

void
sn_comm_stop(CommObject *c)
{
    c->life.stop = 1;
}

void
sn_comm_abort_begin(CommObject *c)
{
    sn_lock(c);
    c->life.teardown = SN_TEAR_ABORT;
    sn_unlock(c);
    c->life.stop = 1;
}

int
sn_comm_abort_defer(CommObject *c)
{
    sn_lock(c);
    const int defer = c->life.busy > 0;
    c->life.abort_pending = defer;
    sn_unlock(c);
    return defer;
}

/* Unlinks the windows whose buffers left their release to c
 * (sn_comm_release_window) and ends the teardown in `state`, in one step
 * under the lock, so that a release comes either before (its memory is
 * in the list returned, through ->next) or after (it frees its own). */
static sn_window *
end_teardown(CommObject *c, int state)
{
    sn_window *dead = NULL;
    sn_lock(c);
    sn_window **pp = &c->windows;
    while (*pp != NULL) {
        sn_window *w = *pp;
        if (w->dead == NULL) {
            pp = &w->next;
            continue;
        }
        *pp = w->next;
        w->next = dead;
        dead = w;
    }
    c->life.state = state;
    c->life.teardown = SN_TEAR_NONE;
    sn_unlock(c);
    return dead;
}

void
sn_comm_end_teardown(CommObject *c, int state, int free_dead)
{
    /* the memory of those windows (no longer registered), and their
     * nodes; with free_dead 0 (a kernel of c may still run on it) it
     * stays allocated */
    sn_window *dead = end_teardown(c, state);
    while (dead != NULL) {
        sn_window *next = dead->next;
        if (free_dead)
            teardown_nccl(c, ncclMemFree(dead->dead), "ncclMemFree");
        free(dead);
        dead = next;
    }
}

void
sn_comm_keep_if_busy(CommObject *c)
{
    sn_lock(c);
    c->life.leak_object = c->life.busy > 0 || c->life.state == SN_CLOSING;
    const int busy = c->life.busy;
    sn_unlock(c);
    if (c->life.leak_object)
        fprintf(stderr, "symnccl: communicator (rank %d of %d, cuda:%d) "
                "was deallocated while %d call(s) were still inside it: "
                "its object is left allocated so that they leave safely\n",
                c->rank, c->nranks, c->device, busy);
}

/* ------------------------------------------------------------------ */
/* Windows that buffers left to c. */

int
sn_comm_take_window(CommObject *c, sn_window *w, void *mem, int enter,
                    int *entered)
{
    sn_lock(c);
    const int state = c->life.state;
    *entered = state == SN_OPEN && enter;
    if (*entered)
        c->life.busy++;
    if (state == SN_OPEN || state == SN_CLOSING)
        w->dead = mem;   /* c frees it: now, later, or at teardown */
    sn_unlock(c);
    return state;
}

int
sn_comm_reap_window(CommObject *c, sn_window *w, int *drained)
{
    void *mem = w->dead;
    if (*drained < 0)
        *drained = sn_fault_drain(c, SN_RELEASE_PROMPT_SECONDS, 1);
    const int ok = *drained && sn_window_deregister_now(c, w) == 0;
    if (ok) {
        int prev = -1;
        teardown_cuda(c, cudaGetDevice(&prev), "cudaGetDevice");
        teardown_cuda(c, cudaSetDevice(c->device), "cudaSetDevice");
        teardown_nccl(c, ncclMemFree(mem), "ncclMemFree");
        (void)cudaGetLastError();
        if (prev >= 0)
            teardown_cuda(c, cudaSetDevice(prev), "cudaSetDevice");
    }
    return ok;
}

/* ------------------------------------------------------------------ */
/* The close hook. */

static sn_close_hook close_hook;

void
sn_comm_on_close(sn_close_hook hook)
{
    close_hook = hook;
}

ncclResult_t
sn_comm_closing_windows(CommObject *c, int deregister)
{
    return close_hook != NULL ? close_hook(c, deregister) : ncclSuccess;
}

/* ------------------------------------------------------------------ */
/* Abort. */

void
sn_comm_free_memory(CommObject *c)
{
    sn_loopback_leave(c);
    sn_staging_free(c);
    sn_scratch_free(c);
    sn_fault_free(c);
}

/* Frees c's memory, or leaves it (a kernel still runs on it). */
static void
free_memory(CommObject *c, int drained)
{
    if (!drained) {
        fprintf(stderr, "symnccl: abort() of rank %d (cuda:%d): kernels of "
                "the communicator still ran after %.0f s; its device memory "
                "is left allocated\n", c->rank, c->device,
                SN_ABORT_KERNELS_SECONDS + SN_ABORT_DRAIN_SECONDS);
        c->mem.staging = NULL;
        c->mem.scratch = NULL;
        c->mem.check_dev = c->mem.check_host = NULL;
        c->a2a.dev = c->a2a.host = NULL;
        c->a2a.lost_dev = c->a2a.lost_host = NULL;
        c->order.event = NULL;
        c->fail.fault = c->fail.fault_dev = NULL;
        c->fail.fault_src = NULL;
        c->fail.ctl_stream = NULL;
        c->watch.event = NULL;
        return;
    }
    sn_comm_free_memory(c);
}

void
sn_comm_abort_finish(CommObject *c)
{
    int prev = -1;
    teardown_cuda(c, cudaGetDevice(&prev), "cudaGetDevice");
    teardown_cuda(c, cudaSetDevice(c->device), "cudaSetDevice");
    sn_watch_forget(c);
    /* c's kernels end before NCCL unmaps the windows they address (those
     * queued behind a hung NCCL kernel cannot: they start after
     * ncclCommAbort ended it, and leave at entry) */
    const int left = sn_fault_drain(c, SN_ABORT_KERNELS_SECONDS, 0);
    /* revoked by the watchdog (faults.c, revoke_expired): NCCL's own
     * cleanup runs until its kernels have left; the windows are
     * deregistered after it */
    if (c->watch.revoked && c->comm != NULL) {
        int failed;
        ncclResult_t bad;
        (void)sn_wait_nccl(&c->comm, 1,
                           sn_deadline(SN_ABORT_KERNELS_SECONDS), NULL,
                           &failed, &bad);
    }
    /* once they have, the device communicator and the windows (the XLA
     * handler's too) go first, local steps: ncclCommAbort alone would keep
     * the windows' memory (errors do not matter here: c is being aborted) */
    (void)sn_comm_closing_windows(c, left);
    if (left && c->comm != NULL && c->devcomm != NULL)
        (void)symnccl_devcomm_destroy(c->comm, c->devcomm);
    else
        symnccl_devcomm_free(c->devcomm);
    c->devcomm = NULL;
    sn_windows_detach(c, left);
    if (c->comm != NULL) {
        teardown_nccl(c, ncclCommAbort(c->comm), "ncclCommAbort");
        c->comm = NULL;
    }
    /* the memory, once nothing of c runs any more */
    const int drained = sn_fault_drain(c, SN_ABORT_DRAIN_SECONDS, 1);
    free_memory(c, drained);
    sn_comm_end_teardown(c, SN_ABORTED, drained);
    (void)cudaGetLastError();
    if (prev >= 0)
        teardown_cuda(c, cudaSetDevice(prev), "cudaSetDevice");
}

/* ------------------------------------------------------------------ */
/* Close. */

int
sn_comm_drain_or_stop(CommObject *c, double seconds)
{
    const double until = sn_deadline(seconds);
    for (;;) {
        if (sn_fault_drain(c, 0.05, 1))
            return 1;
        if (c->life.stop)
            return -1;
        if (sn_now() >= until)
            return 0;
    }
}
