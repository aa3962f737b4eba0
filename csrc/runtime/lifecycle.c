/* Communicators: creation, close, abort and exit.
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
#include "symnccl.h"

#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

int
sn_parse_multicast(PyObject *obj, int *mode)
{
    if (obj == NULL || obj == Py_None) {
        *mode = SN_MC_AUTO;
        return 0;
    }
    int t = PyObject_IsTrue(obj);
    if (t < 0)
        return -1;
    *mode = t ? SN_MC_ON : SN_MC_OFF;
    return 0;
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

static void
live_add(SNState *st, CommObject *c)
{
    c->life.prev = NULL;
    c->life.next = st->live;
    if (st->live != NULL)
        st->live->life.prev = c;
    st->live = c;
}

static void
live_remove(SNState *st, CommObject *c)
{
    if (c->life.prev != NULL)
        c->life.prev->life.next = c->life.next;
    else if (st->live == c)
        st->live = c->life.next;
    if (c->life.next != NULL)
        c->life.next->life.prev = c->life.prev;
    c->life.next = c->life.prev = NULL;
}

CommObject *
sn_comm_new(PyTypeObject *tp, int rank, int nranks, int device,
            double timeout, int multicast, size_t staging_bytes)
{
    allocfunc alloc = (allocfunc)PyType_GetSlot(tp, Py_tp_alloc);
    CommObject *c = (CommObject *)alloc(tp, 0);
    if (c == NULL)
        return NULL;
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
    c->st = sn_state_from_type(tp);
    c->life.state = SN_OPEN;
    pthread_mutex_init(&c->lock, NULL);
    const char *why = decide_multicast(multicast, nranks, device);
    c->multicast_requested = why == NULL;
    c->multicast_reason = why != NULL ? why
                          : multicast == SN_MC_AUTO ? "requested (auto)"
                                                    : "requested";
    live_add(sn_state_from_type(tp), c);
    sn_err err;
    if (sn_knobs_read(&c->knobs, &err) < 0) {
        sn_raise(sn_state_from_type(tp), &err);
        Py_DECREF(c);
        return NULL;
    }
    const cudaError_t e = cudaDeviceGetAttribute(
        &c->sms, cudaDevAttrMultiProcessorCount, device);
    if (e != cudaSuccess) {
        sn_set_cuda_error(sn_state_from_type(tp), e,
                          "cudaDeviceGetAttribute(MultiProcessorCount)");
        Py_DECREF(c);
        return NULL;
    }
    sn_layout_compute(c, staging_bytes);
    return c;
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

/* What ncclDevCommCreate made, checked before any kernel reads it: a
 * device communicator laid out by another NCCL than this build's headers
 * (NCCL 2.30+: magic and version), or an LSA rank outside its team, would
 * have the kernels address the wrong memory. -1 with RuntimeError naming
 * the values. */
static int
read_devcomm(CommObject *c)
{
    int has_mc = 0, size = 0, rank = 0;
    symnccl_devcomm_info(c->devcomm, &size, &rank, &has_mc);
    if (size == -1) {
        PyErr_Format(PyExc_RuntimeError, "ncclDevCommCreate on rank %d of "
                     "%d (cuda:%d) returned a device communicator with magic "
                     "0x%x and version %d, but symnccl's kernels for NCCL "
                     "2.%d were built for magic 0x%x (NCCL_API_MAGIC) and "
                     "version %d (their headers): the loaded libnccl (NCCL "
                     "%d) lays it out differently", c->rank, c->nranks,
                     c->device, (unsigned)rank, has_mc, sn_abi_minor(),
                     SN_NCCL_API_MAGIC, sn_abi_headers(), sn_abi_runtime());
        return -1;
    }
    if (size < 1 || size > c->nranks || rank < 0 || rank >= size) {
        PyErr_Format(PyExc_RuntimeError, "ncclDevCommCreate on rank %d of "
                     "%d (cuda:%d) returned lsaRank %d and lsaSize %d; "
                     "expected 0 <= lsaRank < lsaSize <= %d", c->rank,
                     c->nranks, c->device, rank, size, c->nranks);
        return -1;
    }
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

/* Device communicators for all of cs, in one group. NCCL reports an
 * unusable multicast request with ncclInvalidArgument on every rank: that
 * one failure is retried without multicast (every rank retries alike). Any
 * other failure leaves the communicators without the device API. -1 only
 * for a timeout or an interrupt (exception set). */
static int
connect_devcomms(SNState *st, CommObject **cs, int n, ncclComm_t *raw)
{
    int mc = cs[0]->multicast_requested;
    ncclResult_t rc = ncclSuccess;
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
    if (mc && !mm) {
        mc = 0;
        no_multicast(cs, n, "requested, but NCCL reports no multimem "
                            "support (ncclCommQueryProperties)");
    }
    for (int attempt = 0; attempt < 2; attempt++) {
        Py_BEGIN_ALLOW_THREADS
        rc = ncclGroupStart();
        for (int i = 0; i < n && rc == ncclSuccess; i++) {
            cudaSetDevice(cs[i]->device);
            /* no LSA barriers: symnccl's kernels bring their own, with a
             * bounded wait (kernels/primitives.cuh, Barrier) */
            rc = started(symnccl_devcomm_create(cs[i]->comm, 0, mc,
                                                &cs[i]->devcomm));
        }
        rc = group_end(rc);
        Py_END_ALLOW_THREADS
        if (rc == ncclSuccess &&
            sn_wait_comms(st, raw, n, cs[0]->timeout, NULL,
                          "ncclDevCommCreate")
                < 0) {
            if (!PyErr_ExceptionMatches(st->NcclError))
                return -1;
            PyErr_Clear();
            rc = ncclInternalError;
        }
        if (rc == ncclSuccess)
            break;
        for (int i = 0; i < n; i++) {   /* never created */
            symnccl_devcomm_free(cs[i]->devcomm);
            cs[i]->devcomm = NULL;
        }
        if (!(mc && rc == ncclInvalidArgument))
            break;
        mc = 0;
        no_multicast(cs, n, "requested, but NCCL refused it "
                            "(ncclInvalidArgument): NVLS unavailable");
    }
    for (int i = 0; i < n; i++) {
        if (cs[i]->devcomm == NULL)
            no_device_api_nccl(cs[i], "ncclDevCommCreate", rc);
        else if (read_devcomm(cs[i]) < 0)
            return -1;
    }
    return 0;
}

/* Staging windows for all of cs (allocated by the caller), in one group. */
static int
register_staging(SNState *st, CommObject **cs, int n, ncclComm_t *raw)
{
    int any = 0;
    ncclResult_t rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ncclGroupStart();
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
        any = 1;
        cudaSetDevice(c->device);
        rc = started(ncclCommWindowRegister(c->comm, c->mem.staging,
                                            c->mem.layout.bytes,
                                            &c->mem.staging_win->win,
                                            NCCL_WIN_COLL_SYMMETRIC));
    }
    rc = group_end(rc);
    Py_END_ALLOW_THREADS
    if (rc != ncclSuccess)
        return sn_set_nccl_error(st, rc, NULL,
                                 "ncclCommWindowRegister (staging)");
    if (!any)
        return 0;
    if (sn_wait_comms(st, raw, n, cs[0]->timeout, NULL, "staging windows") < 0)
        return -1;
    /* The kernels address peers as evenly spaced copies of a window (as
     * NCCL maps them); where that would not hold, they must not run. */
    for (int i = 0; i < n; i++) {
        CommObject *c = cs[i];
        int ok = 0;
        if (c->mem.staging_win == NULL)
            continue;
        SN_CUDA_GOTO(st, cudaSetDevice(c->device), "cudaSetDevice", error);
        SN_CUDA_GOTO(st, symnccl_lsa_layout_ok(c->mem.staging_win->win,
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

/* Never a silent downgrade: the first communicator of 2+ ranks in this
 * process that runs without the device API says so (its
 * device_api_reason says why); -1 if the warning was turned into an
 * error. */
static int
warn_no_device_api(CommObject **cs, int n)
{
    static int warned;
    for (int i = 0; i < n && !warned; i++) {
        CommObject *c = cs[i];
        if (c->nranks < 2 || c->symmetric)
            continue;
        warned = 1;
        return PyErr_WarnFormat(PyExc_RuntimeWarning, 1, "symnccl: rank %d "
                                "of %d (cuda:%d) runs without the NCCL device "
                                "API, so every collective goes through NCCL's "
                                "own kernels: %s (Communicator."
                                "device_api_reason; warned once per process)",
                                c->rank, c->nranks, c->device,
                                c->symmetric_reason);
    }
    return 0;
}

int
sn_comms_connect(SNState *st, CommObject **cs, int n, const ncclUniqueId *id)
{
    /* once per process: a minor that has not passed on two GPUs */
    static int warned;
    const char *caveat = sn_abi_multi_gpu_caveat(sn_abi_minor());
    if (caveat != NULL && cs[0]->nranks > 1 && !warned) {
        warned = 1;
        if (PyErr_WarnEx(PyExc_RuntimeWarning, caveat, 1) < 0)
            return -1;
    }
    ncclComm_t *raw = PyMem_Calloc((size_t)n, sizeof(ncclComm_t));
    if (raw == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    int prev;
    if (sn_device_push(st, cs[0]->device, &prev) < 0) {
        PyMem_Free(raw);
        return -1;
    }
    ncclResult_t rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ncclGroupStart();
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
    rc = group_end(rc);
    Py_END_ALLOW_THREADS
    SN_NCCL_GOTO(st, rc, NULL, "ncclCommInitRankConfig", error);
    for (int i = 0; i < n; i++)
        raw[i] = cs[i]->comm;
    if (sn_wait_comms(st, raw, n, cs[0]->timeout, NULL,
                      "ncclCommInitRankConfig") < 0 ||
        connect_devcomms(st, cs, n, raw) < 0)
        goto error;
    for (int i = 0; i < n; i++) {
        SN_CUDA_GOTO(st, cudaSetDevice(cs[i]->device), "cudaSetDevice",
                     error);
        sn_err err;
        if (sn_scratch_alloc(cs[i], &err) < 0) {
            sn_raise(st, &err);
            goto error;
        }
        if (sn_fault_alloc(cs[i], &err) < 0) {
            sn_raise(st, &err);
            goto error;
        }
        if (sn_staging_wanted(cs[i])) {
            Py_BEGIN_ALLOW_THREADS
            rc = sn_staging_reserve(cs[i]);
            Py_END_ALLOW_THREADS
            if (rc != ncclSuccess) {
                sn_set_nccl_error(st, rc, cs[i]->comm,
                                  "ncclMemAlloc (staging)");
                goto error;
            }
            if (sn_staging_clear(cs[i], &err) < 0) {
                sn_raise(st, &err);
                goto error;
            }
        }
    }
    if (register_staging(st, cs, n, raw) < 0)
        goto error;
    if (warn_no_device_api(cs, n) < 0)
        goto error;
    sn_device_pop(prev);
    PyMem_Free(raw);
    return 0;

error:
    /* no kernel has run: the abort frees everything at once */
    for (int i = 0; i < n; i++)
        sn_comm_abort(st, cs[i]);
    sn_device_pop(prev);
    PyMem_Free(raw);
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
 *   - abort first ends every wait on c (c->life.stop) and c's kernels (abort
 *     flag and fault word), so callers leave within milliseconds, waits
 *     ABORT_LEAVE_SECONDS for them, and if one is still inside, leaves
 *     the rest to the last caller to leave (abort_pending): nothing is
 *     freed under a caller, and abort() returns within its bounds;
 *   - abort() while another thread closes c sets c->life.stop; that close sees
 *     it in its waits and turns into the abort.
 * The GIL is released wherever a teardown waits; no lock is held then. */

/* Seconds abort() waits for another thread to leave a method of c (its
 * waits end within 50 ms of c->life.stop), for c's kernels to leave once told
 * to (their waits poll the fault word and the abort flag every few
 * milliseconds; NCCL's, revoked by the watchdog, as long), and for
 * everything of c to end after ncclCommAbort. */
#define ABORT_LEAVE_SECONDS 2.0
#define ABORT_KERNELS_SECONDS 1.0
#define ABORT_DRAIN_SECONDS 5.0
/* How long an abort() that found another thread's close waits for it
 * to turn into the abort and end. */
#define ABORT_ALL_SECONDS                                                 \
    (ABORT_LEAVE_SECONDS + 2 * ABORT_KERNELS_SECONDS +                    \
     ABORT_DRAIN_SECONDS + 1.0)
/* Teardowns look at busy and the state this often. */
#define POLL_SECONDS 0.001

static void
nap(void)
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

/* Why a caller may not enter, without Python. */
static void
refusal(const CommObject *c, int state, int teardown, int failed,
        char *why, size_t len)
{
    if (failed && !c->life.user_aborted)
        sn_fault_describe(c, why, len);
    else
        snprintf(why, len, "communicator (rank %d of %d, cuda:%d) is %s: "
                 "no call may start on it%s", c->rank, c->nranks,
                 c->device, state_name(state, teardown),
                 state == SN_CLOSING ? " (another thread is closing or "
                                       "aborting it)" : "");
}

/* The same as a Python exception: the failure (PeerTimeoutError,
 * CallMismatchError; c->fail.failure holds it), else RuntimeError. */
static int
refuse(SNState *st, CommObject *c, int state, int teardown, int failed)
{
    if (failed && !c->life.user_aborted)
        return sn_fault_raise(st, c);
    char why[240];
    refusal(c, state, teardown, 0, why, sizeof(why));
    PyErr_SetString(PyExc_RuntimeError, why);
    return -1;
}

int
sn_comm_enter(SNState *st, CommObject *c)
{
    sn_lock(c);
    int failed;
    const int ok = may_enter(c, &failed);
    const int state = c->life.state, teardown = c->life.teardown;
    if (ok)
        c->life.busy++;
    sn_unlock(c);
    return ok ? 0 : refuse(st, c, state, teardown, failed);
}

int
sn_comm_pin(CommObject *c, char *why, size_t len)
{
    sn_lock(c);
    int failed;
    const int ok = may_enter(c, &failed);
    if (ok)
        c->life.busy++;
    else
        refusal(c, c->life.state, c->life.teardown, failed, why, len);
    sn_unlock(c);
    return ok ? 0 : -1;
}

static void abort_finish(CommObject *c);

/* 1 when this caller was the last inside c and an abort waits for it:
 * the caller finishes the abort. */
static int
unpin(CommObject *c)
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
    if (unpin(c))
        abort_finish(c);
}

void
sn_comm_leave(SNState *st, CommObject *c)
{
    if (unpin(c)) {   /* abort() came while this thread was inside */
        Py_BEGIN_ALLOW_THREADS
        abort_finish(c);
        Py_END_ALLOW_THREADS
    }
}

/* Waits, GIL released, until no caller is inside c (0), c->life.stop is set
 * while `stoppable` (1), or `seconds` have passed (2). */
static int
wait_callers(CommObject *c, double seconds, int stoppable)
{
    const double until = sn_deadline(seconds);
    for (;;) {
        sn_lock(c);
        const int busy = c->life.busy;
        sn_unlock(c);
        if (busy == 0)
            return 0;
        if (stoppable && c->life.stop)
            return 1;
        if (sn_now() >= until)
            return 2;
        Py_BEGIN_ALLOW_THREADS
        nap();
        Py_END_ALLOW_THREADS
    }
}

/* Waits, GIL released, at most `seconds` for another thread's teardown
 * to end (CLOSED, ABORTED) or to be left to the callers inside
 * (abort_pending); the state then. */
static int
wait_teardown(CommObject *c, double seconds)
{
    const double until = sn_deadline(seconds);
    for (;;) {
        sn_lock(c);
        const int state = c->life.state, pending = c->life.abort_pending;
        sn_unlock(c);
        if (state != SN_CLOSING || pending || sn_now() >= until)
            return state;
        Py_BEGIN_ALLOW_THREADS
        nap();
        Py_END_ALLOW_THREADS
    }
}

/* OPEN -> CLOSING(kind): 1 when this thread now owns the teardown. */
static int
take_teardown(CommObject *c, int kind)
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

/* The memory of those windows (no longer registered), and their nodes;
 * with `free_them` 0 (a kernel of c may still run on it) it stays
 * allocated. No GIL needed. */
static void
free_dead(sn_window *dead, int free_them)
{
    while (dead != NULL) {
        sn_window *next = dead->next;
        if (free_them)
            ncclMemFree(dead->dead);
        free(dead);
        dead = next;
    }
}

/* The windows left to c by buffers that are gone: deregistered and their
 * memory freed once c's kernels have drained (at most
 * SN_RELEASE_PROMPT_SECONDS, GIL released), else left to the next
 * release or the teardown. c entered, GIL held (the list is the GIL's;
 * it is walked again after each wait). */
static void
reap_windows(CommObject *c)
{
    int drained = -1;
    for (;;) {
        sn_window *w = c->windows;
        while (w != NULL && (w->refs != 0 || w->dead == NULL))
            w = w->next;
        if (w == NULL)
            return;
        int ok;
        void *mem = w->dead;
        Py_BEGIN_ALLOW_THREADS
        if (drained < 0)
            drained = sn_fault_drain(c, SN_RELEASE_PROMPT_SECONDS, 1);
        ok = drained && sn_window_deregister_now(c, w) == 0;
        if (ok) {
            int prev = -1;
            cudaGetDevice(&prev);
            cudaSetDevice(c->device);
            ncclMemFree(mem);
            (void)cudaGetLastError();
            if (prev >= 0)
                cudaSetDevice(prev);
        }
        Py_END_ALLOW_THREADS
        if (!ok)
            return;
        sn_window_forget(c, w);
    }
}

int
sn_comm_release_window(CommObject *c, sn_window *w, void *mem)
{
    if (w == NULL || --w->refs > 0)
        return 1;
    sn_lock(c);
    const int state = c->life.state;
    const int enter = state == SN_OPEN && c->st->group_depth == 0;
    if (enter)
        c->life.busy++;
    if (state == SN_OPEN || state == SN_CLOSING)
        w->dead = mem;   /* c frees it: now (below), later, or at teardown */
    sn_unlock(c);
    if (state == SN_CLOSED || state == SN_ABORTED) {
        /* deregistered by close, forgotten by abort */
        sn_window_forget(c, w);
        return 1;
    }
    if (enter) {
        reap_windows(c);
        sn_comm_leave(c->st, c);
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Abort. */

/* Frees c's memory, or leaves it (a kernel still runs on it). */
static void
free_memory(CommObject *c, int drained)
{
    if (!drained) {
        fprintf(stderr, "symnccl: abort() of rank %d (cuda:%d): kernels of "
                "the communicator still ran after %.0f s; its device memory "
                "is left allocated\n", c->rank, c->device,
                ABORT_KERNELS_SECONDS + ABORT_DRAIN_SECONDS);
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
    sn_loopback_leave(c);
    sn_staging_free(c);
    sn_scratch_free(c);
    sn_fault_free(c);
}

/* The rest of an abort once no caller is inside c, by the one thread
 * that owns it: no GIL needed and no Python (the last caller to leave may
 * be one of XLA's threads). */
static void
abort_finish(CommObject *c)
{
    int prev = -1;
    cudaGetDevice(&prev);
    cudaSetDevice(c->device);
    sn_watch_forget(c);
    /* c's kernels end before NCCL unmaps the windows they address (those
     * queued behind a hung NCCL kernel cannot: they start after
     * ncclCommAbort ended it, and leave at entry) */
    const int left = sn_fault_drain(c, ABORT_KERNELS_SECONDS, 0);
    /* revoked by the watchdog (faults.c, revoke_expired): NCCL's own
     * cleanup runs until its kernels have left; the windows are
     * deregistered after it */
    if (c->watch.revoked && c->comm != NULL) {
        int failed;
        ncclResult_t bad;
        (void)sn_wait_nccl(&c->comm, 1, sn_deadline(ABORT_KERNELS_SECONDS),
                           NULL, &failed, &bad);
    }
    /* once they have, the device communicator and the windows (the XLA
     * handler's too) go first, local steps: ncclCommAbort alone would keep
     * the windows' memory (errors do not matter here: c is being aborted) */
    if (c->st->on_close != NULL)
        (void)c->st->on_close(c, left);
    if (left && c->comm != NULL && c->devcomm != NULL)
        (void)symnccl_devcomm_destroy(c->comm, c->devcomm);
    else
        symnccl_devcomm_free(c->devcomm);
    c->devcomm = NULL;
    sn_windows_detach(c, left);
    if (c->comm != NULL) {
        ncclCommAbort(c->comm);
        c->comm = NULL;
    }
    /* the memory, once nothing of c runs any more */
    const int drained = sn_fault_drain(c, ABORT_DRAIN_SECONDS, 1);
    free_memory(c, drained);
    free_dead(end_teardown(c, SN_ABORTED), drained);
    (void)cudaGetLastError();
    if (prev >= 0)
        cudaSetDevice(prev);
}

/* The abort, by the thread that owns the teardown (GIL held): every wait
 * on c ends, c's kernels are told to stop, the callers inside get
 * ABORT_LEAVE_SECONDS to leave; the last of them finishes it if they do
 * not. */
static void
abort_owned(CommObject *c)
{
    sn_lock(c);
    c->life.teardown = SN_TEAR_ABORT;
    sn_unlock(c);
    c->life.stop = 1;
    Py_BEGIN_ALLOW_THREADS
    sn_fault_stop_kernels(c, SYMNCCL_FAULT_ABORT, 1.0);
    Py_END_ALLOW_THREADS
    if (wait_callers(c, ABORT_LEAVE_SECONDS, 0) != 0) {
        sn_lock(c);
        const int defer = c->life.busy > 0;
        c->life.abort_pending = defer;
        sn_unlock(c);
        if (defer)
            return;
    }
    Py_BEGIN_ALLOW_THREADS
    abort_finish(c);
    Py_END_ALLOW_THREADS
}

void
sn_comm_abort_owned(SNState *st, CommObject *c)
{
    c->life.stop = 1;
    if (st->on_closing != NULL)
        st->on_closing(c);
    abort_owned(c);
}

void
sn_comm_abort(SNState *st, CommObject *c)
{
    sn_lock(c);
    const int state = c->life.state, was = c->life.teardown;
    if (state == SN_CLOSING)
        c->life.teardown = SN_TEAR_ABORT;
    sn_unlock(c);
    if (state == SN_OPEN) {
        if (take_teardown(c, SN_TEAR_ABORT))
            sn_comm_abort_owned(st, c);
        else   /* another thread was quicker: as below */
            sn_comm_abort(st, c);
        return;
    }
    /* closed, aborted, or an abort under way (or left to its callers) */
    if (state != SN_CLOSING || was == SN_TEAR_ABORT)
        return;
    /* another thread's close: it sees c->life.stop in its waits and turns into
     * the abort; this thread touches nothing of c's and waits, bounded */
    c->life.stop = 1;
    (void)wait_teardown(c, ABORT_ALL_SECONDS);
}

/* ------------------------------------------------------------------ */
/* Close. */

static int close_entered(SNState *st, CommObject *c, double timeout);

/* Deregisters every window of c (windows.c's list), the GIL released
 * while NCCL runs; the nodes stay for their buffers. */
static int
deregister_windows(SNState *st, CommObject *c)
{
    for (sn_window *w = c->windows; w != NULL; w = w->next) {
        if (w->win == NULL)
            continue;
        if (c->comm == NULL) {   /* a loopback rank's: its team's */
            w->win = NULL;
            continue;
        }
        ncclResult_t rc;
        Py_BEGIN_ALLOW_THREADS
        rc = ncclCommWindowDeregister(c->comm, w->win);
        Py_END_ALLOW_THREADS
        w->win = NULL;
        if (sn_nccl_complete(st, c, rc, "ncclCommWindowDeregister") < 0)
            return -1;
    }
    return 0;
}

/* close() waiting at most `timeout` for c's callers and c's work
 * (sn_comm_close: c's own timeout; exit: SYMNCCL_EXIT_TIMEOUT when
 * shorter). */
static int
close_within(SNState *st, CommObject *c, double timeout)
{
    sn_lock(c);
    const int state = c->life.state;
    int failed;
    (void)may_enter(c, &failed);
    const int mine = state == SN_OPEN && !failed && st->group_depth == 0;
    if (mine) {
        c->life.state = SN_CLOSING;
        c->life.teardown = SN_TEAR_CLOSE;
    }
    sn_unlock(c);
    if (!mine) {
        /* a failure is the answer until the user aborts */
        if (failed && !c->life.user_aborted)
            return sn_fault_raise(st, c);
        if (state == SN_OPEN) {
            PyErr_SetString(PyExc_RuntimeError, "close() cannot be called "
                            "inside symnccl.group()");
            return -1;
        }
        /* closed, or aborted: nothing to do; being closed or aborted by
         * another thread: its outcome, once it has one */
        const int end = state == SN_CLOSING
                            ? wait_teardown(c, timeout + ABORT_ALL_SECONDS)
                            : state;
        if (end != SN_CLOSING)
            return 0;
        sn_lock(c);
        const int pending = c->life.abort_pending;
        sn_unlock(c);
        if (pending)
            PyErr_SetString(PyExc_RuntimeError, "close(): the communicator "
                            "is being aborted; the abort ends when the last "
                            "call inside it returns");
        else
            PyErr_Format(PyExc_TimeoutError, "close(): another thread was "
                         "still closing or aborting this communicator "
                         "after %.1f s", timeout + ABORT_ALL_SECONDS);
        return -1;
    }
    /* no XLA call enters c from now on, no method either (CLOSING) */
    if (st->on_closing != NULL)
        st->on_closing(c);
    int rc;
    switch (wait_callers(c, timeout, 1)) {
    case 0:
        rc = close_entered(st, c, timeout);
        break;
    case 1:
        PyErr_SetString(PyExc_RuntimeError, "close() was interrupted by "
                        "abort() from another thread");
        rc = -1;
        break;
    default:
        sn_lock(c);
        const int busy = c->life.busy;
        sn_unlock(c);
        PyErr_Format(PyExc_TimeoutError, "close(): %d call(s) from other "
                     "threads were still inside the communicator after "
                     "%.1f s; it was aborted instead", busy, timeout);
        rc = -1;
    }
    if (rc < 0) {
        /* A close that cannot complete must not leave peers waiting on a
         * half-closed communicator, nor callers inside it: abort. */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        abort_owned(c);
        PyErr_Restore(et, ev, tb);
    }
    return rc;
}

int
sn_comm_close(SNState *st, CommObject *c)
{
    return close_within(st, c, c->timeout);
}

/* sn_nccl_complete for close, bounded by its own timeout (close refuses
 * to run inside symnccl.group(), so the call completes here). */
static int
complete_within(SNState *st, CommObject *c, ncclResult_t rc,
                const char *what, double timeout)
{
    if (rc != ncclSuccess && rc != ncclInProgress)
        return sn_set_nccl_error(st, rc, c->comm, what);
    return sn_wait_comms(st, &c->comm, 1, timeout, &c->life.stop, what);
}

/* c's symnccl and (watched) NCCL work has completed: 1; `seconds`
 * passed: 0; c->life.stop was set meanwhile: -1. No GIL needed. */
static int
drain_or_stop(CommObject *c, double seconds)
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

/* close() by the owner of the teardown, no caller inside. */
static int
close_entered(SNState *st, CommObject *c, double timeout)
{
    int prev;
    if (sn_device_push(st, c->device, &prev) < 0)
        return -1;
    ncclResult_t rc;
    cudaError_t ce;
    /* symnccl's and NCCL's work on c, for at most the timeout (a kernel
     * gives up after it, the watchdog ends NCCL's), then the device */
    int drained;
    Py_BEGIN_ALLOW_THREADS
    drained = drain_or_stop(c, timeout + ABORT_DRAIN_SECONDS);
    Py_END_ALLOW_THREADS
    if (sn_fault_check(st, c) < 0)
        goto fail;
    if (drained < 0) {
        PyErr_SetString(PyExc_RuntimeError, "close() was interrupted by "
                        "abort() from another thread");
        goto fail;
    }
    if (!drained) {
        PyErr_Format(PyExc_TimeoutError, "close(): the communicator's work "
                     "did not complete within %.1f s", timeout);
        goto fail;
    }
    Py_BEGIN_ALLOW_THREADS
    ce = cudaDeviceSynchronize();
    Py_END_ALLOW_THREADS
    SN_CUDA_GOTO(st, ce, "cudaDeviceSynchronize (close)", fail);
    sn_watch_forget(c);
    if (st->on_close != NULL) {
        Py_BEGIN_ALLOW_THREADS
        rc = st->on_close(c, 1);
        Py_END_ALLOW_THREADS
        if (rc != ncclSuccess) {
            sn_set_nccl_error(st, rc, c->comm,
                              "ncclCommWindowDeregister (XLA buffer)");
            goto fail;
        }
    }
    if (c->devcomm != NULL && c->comm == NULL) {   /* a loopback rank */
        symnccl_devcomm_free(c->devcomm);
        c->devcomm = NULL;
    }
    if (c->devcomm != NULL) {
        Py_BEGIN_ALLOW_THREADS
        rc = symnccl_devcomm_destroy(c->comm, c->devcomm);
        Py_END_ALLOW_THREADS
        c->devcomm = NULL;
        if (complete_within(st, c, rc, "ncclDevCommDestroy", timeout) < 0)
            goto fail;
    }
    if (deregister_windows(st, c) < 0)
        goto fail;
    sn_loopback_leave(c);
    sn_staging_free(c);
    sn_scratch_free(c);
    sn_fault_free(c);
    if (c->comm != NULL) {
        Py_BEGIN_ALLOW_THREADS
        rc = ncclCommFinalize(c->comm);
        Py_END_ALLOW_THREADS
        if (complete_within(st, c, rc, "ncclCommFinalize", timeout) < 0)
            goto fail;
        Py_BEGIN_ALLOW_THREADS
        rc = ncclCommDestroy(c->comm);
        Py_END_ALLOW_THREADS
        c->comm = NULL;
    }
    else
        rc = ncclSuccess;   /* a loopback rank: no NCCL communicator */
    Py_BEGIN_ALLOW_THREADS
    free_dead(end_teardown(c, SN_CLOSED), 1);
    Py_END_ALLOW_THREADS
    sn_device_pop(prev);
    if (rc != ncclSuccess)
        return sn_set_nccl_error(st, rc, NULL, "ncclCommDestroy");
    return 0;

fail:
    sn_device_pop(prev);
    return -1;
}

/* ------------------------------------------------------------------ */
/* Deallocation and exit. */

void
sn_comm_finalize(SNState *st, CommObject *c)
{
    live_remove(st, c);
    sn_watch_forget(c);
    if (st->shutting_down)
        return;
    sn_lock(c);
    const int state = c->life.state;
    int failed;
    (void)may_enter(c, &failed);
    sn_unlock(c);
    if (state == SN_OPEN && (c->comm != NULL || c->loopback != NULL)) {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        if (failed)   /* the user was told at the failure */
            sn_comm_abort(st, c);
        else if (sn_comm_close(st, c) < 0) {
            PyErr_WriteUnraisable((PyObject *)c);
            sn_comm_abort(st, c);
        }
        PyErr_Restore(et, ev, tb);
    }
    /* Callers that hold no reference may still be inside (XLA handlers
     * past an abort's bounds): c's memory must outlive them. */
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

int
sn_comm_shutdown_all(SNState *st, double timeout)
{
    /* the live list, as new references: closing releases the GIL, and
     * another thread may meanwhile drop a communicator of the list */
    Py_ssize_t n = 0;
    for (CommObject *c = st->live; c != NULL; c = c->life.next)
        n++;
    CommObject **cs = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof(*cs));
    if (cs == NULL)
        return 0;
    n = 0;
    for (CommObject *c = st->live; c != NULL; c = c->life.next)
        cs[n++] = (CommObject *)Py_NewRef((PyObject *)c);
    int failures = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        CommObject *c = cs[i];
        sn_lock(c);
        const int state = c->life.state;
        sn_unlock(c);
        if (state == SN_OPEN &&
            close_within(st, c, timeout < c->timeout ? timeout
                                                     : c->timeout) < 0) {
            PyErr_Clear();
            sn_comm_abort(st, c);
            failures++;
        }
    }
    /* a last reference may go here: closed or aborted above, its
     * finalisation has nothing left to do */
    for (Py_ssize_t i = 0; i < n; i++)
        Py_DECREF((PyObject *)cs[i]);
    PyMem_Free(cs);
    return failures;
}
