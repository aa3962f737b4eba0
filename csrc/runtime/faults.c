/* Failures of a communicator: its failure record, the checks that raise
 * from it, and the first steps of an abort. docs/ARCHITECTURE.md
 * ("Failures") has the whole model; in short:
 *
 *   - the record (symnccl_fault, kernels/launch.h) lives in mapped host
 *     memory. symnccl's kernels fill it when a wait for a peer gives up
 *     (they never trap); the host fills it when an NCCL call overstays the
 *     timeout (watchdog.c) or the ranks' calls differ (SYMNCCL_CHECK=1);
 *   - the host reads it without synchronising, wherever the communicator is
 *     used (sn_comm_enter, check(), close()): once it is set, every call
 *     raises PeerTimeoutError (CallMismatchError) until abort();
 *   - stopping the kernels: the abort flag their waits poll, and this
 *     rank's fault word, which every kernel reads at entry, written through
 *     a stream of the communicator's own that no other work can block.
 *
 * No Python here: python/failures.c raises the failure, waits for an
 * eager NCCL call with the GIL released, and installs abort_on_signal.
 */
#include "runtime.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* The record and the code written to the fault word, in one pinned
 * allocation. */
typedef struct {
    symnccl_fault rec;
    uint64_t word;
} fault_host;

/* A fault word holds ranks in 8 bits, 0xff meaning none (launch.h,
 * SYMNCCL_FAULT_CODE). */
_Static_assert(SYMNCCL_MAX_RANKS < 0xff, "a fault word has 8-bit ranks");

#define NAME_(id, name) name,
static const char *const fault_names[SYMNCCL_FAULT_COUNT] = {
    SYMNCCL_FAULTS(NAME_)};
static const char *const wait_names[SYMNCCL_WAIT_COUNT] = {
    SYMNCCL_WAITS(NAME_)};
#undef NAME_

static const char *
name_of(const char *const *names, int count, int i)
{
    return i >= 0 && i < count ? names[i] : "?";
}

static void fault_track(symnccl_fault *rec, int on);

const char *
sn_fault_reason_name(int reason)
{
    return name_of(fault_names, SYMNCCL_FAULT_COUNT, reason);
}

int
sn_fault_alloc(CommObject *c, sn_err *err)
{
    fault_host *h = NULL;
    SN_CUDA_ERR_GOTO(err, cudaHostAlloc((void **)&h, sizeof(*h),
                                        cudaHostAllocMapped |
                                            cudaHostAllocPortable),
                     "cudaHostAlloc (failure record)", error);
    memset(h, 0, sizeof(*h));
    fault_track(&h->rec, 1);
    c->fail.fault = &h->rec;
    c->fail.fault_src = &h->word;
    SN_CUDA_ERR_GOTO(err,
                     cudaHostGetDevicePointer((void **)&c->fail.fault_dev,
                                              &h->rec, 0),
                     "cudaHostGetDevicePointer (failure record)", error);
    SN_CUDA_ERR_GOTO(err, cudaStreamCreateWithFlags(&c->fail.ctl_stream,
                                                    cudaStreamNonBlocking),
                     "cudaStreamCreateWithFlags", error);
    SN_CUDA_ERR_GOTO(err, cudaEventCreateWithFlags(&c->watch.event,
                                                   cudaEventDisableTiming),
                     "cudaEventCreateWithFlags", error);
    return 0;
error:
    return -1;
}

void
sn_fault_free(CommObject *c)
{
    if (c->fail.fault != NULL) {
        fault_track(c->fail.fault, 0);
        /* the allocation starts with the record */
        cudaFreeHost(c->fail.fault);
        c->fail.fault = c->fail.fault_dev = NULL;
        c->fail.fault_src = NULL;
    }
    if (c->fail.ctl_stream != NULL) {
        cudaStreamDestroy(c->fail.ctl_stream);
        c->fail.ctl_stream = NULL;
    }
    if (c->watch.event != NULL) {
        cudaEventDestroy(c->watch.event);
        c->watch.event = NULL;
    }
}

int
sn_fault_poll(CommObject *c)
{
    if (c->fail.failure.reason != 0)
        return 1;
    if (c->fail.fault == NULL)
        return 0;
    const volatile symnccl_fault *r = c->fail.fault;
    uint32_t reason = r->reason;
    if (reason == 0)
        return 0;
    /* the fields were written before `reason` (__threadfence_system) */
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    c->fail.failure.kernel = r->kernel;
    c->fail.failure.collective = r->collective;
    c->fail.failure.peer = r->peer;
    c->fail.failure.detail = r->detail;
    c->fail.failure.origin = r->origin;
    c->fail.failure.wait = r->wait;
    c->fail.failure.cta = r->cta;
    c->fail.failure.flag = r->flag;
    c->fail.failure.waited_ns = r->waited_ns;
    c->fail.failure.reason = reason;
    return 1;
}

void
sn_fault_record(CommObject *c, int reason, int kernel, int collective,
                int peer, int wait, double waited, const char *msg)
{
    if (sn_fault_poll(c))
        return;
    symnccl_fault f;
    memset(&f, 0, sizeof(f));
    f.kernel = kernel;
    f.collective = collective;
    f.peer = peer;
    f.origin = -1;
    f.wait = wait;
    f.cta = -1;
    f.waited_ns = (uint64_t)(waited * 1e9);
    if (msg != NULL)
        snprintf(c->fail.msg, sizeof(c->fail.msg), "%s", msg);
    if (c->fail.fault != NULL) {
        volatile symnccl_fault *r = c->fail.fault;
        r->kernel = f.kernel;
        r->collective = f.collective;
        r->peer = f.peer;
        r->detail = 0;
        r->origin = -1;
        r->wait = f.wait;
        r->cta = f.cta;
        r->flag = 0;
        r->waited_ns = f.waited_ns;
        __atomic_thread_fence(__ATOMIC_RELEASE);
        if (r->reason == 0)   /* a kernel may have been quicker */
            r->reason = (uint32_t)reason;
        sn_fault_poll(c);
        return;
    }
    f.reason = (uint32_t)reason;
    c->fail.failure = f;
}

void
sn_fault_describe(const CommObject *c, char *buf, size_t size)
{
    const symnccl_fault *f = &c->fail.failure;
    const char *coll = sn_collective_name(f->collective);
    const char *kernel = sn_kernel_name(f->kernel);
    const double waited = (double)f->waited_ns * 1e-9;
    char where[160], what[400];
    snprintf(where, sizeof(where), "%s (%s%s) on rank %d of %d (cuda:%d)",
             coll, f->kernel == SYMNCCL_K_COUNT ? "" : "symnccl kernel ",
             kernel, c->rank, c->nranks, c->device);
    if (c->fail.msg[0] != '\0')
        snprintf(what, sizeof(what), "%s", c->fail.msg);
    else if (f->reason == SYMNCCL_FAULT_TIMEOUT &&
             f->kernel == SYMNCCL_K_COUNT)
        snprintf(what, sizeof(what), "%s did not complete within %.1f s: a "
                 "peer is gone, stalled, or did not make the same call; the "
                 "NCCL communicator was aborted (ncclCommAbort), which ended "
                 "its kernels", where, waited);
    else if (f->reason == SYMNCCL_FAULT_TIMEOUT)
        snprintf(what, sizeof(what), "%s waited %.1f s for rank %d (%s, "
                 "flag %llu, CTA %d): rank %d is gone, stalled, or did not "
                 "make the same call", where, waited, f->peer,
                 name_of(wait_names, SYMNCCL_WAIT_COUNT, f->wait),
                 (unsigned long long)f->flag, f->cta, f->peer);
    else if (f->reason == SYMNCCL_FAULT_PEER && f->origin >= 0 &&
             f->origin != f->peer)
        snprintf(what, sizeof(what), "%s stopped: rank %d gave up on this "
                 "communicator first (%s) and rank %d is the one that "
                 "stopped, so no call of this rank can complete", where,
                 f->origin,
                 name_of(fault_names, SYMNCCL_FAULT_COUNT, f->detail),
                 f->peer);
    else if (f->reason == SYMNCCL_FAULT_PEER)
        snprintf(what, sizeof(what), "%s stopped: rank %d gave up on this "
                 "communicator first (%s), so no call of this rank can "
                 "complete", where, f->peer,
                 name_of(fault_names, SYMNCCL_FAULT_COUNT, f->detail));
    else if (f->reason == SYMNCCL_FAULT_ABORT)
        snprintf(what, sizeof(what), "%s was stopped by an abort on this "
                 "rank (abort_on_signal, or abort())", where);
    else
        snprintf(what, sizeof(what), "%s failed (%s)", where,
                 name_of(fault_names, SYMNCCL_FAULT_COUNT, (int)f->reason));
    snprintf(buf, size, "%s. The communicator refuses further calls: "
             "abort() it and create a new one among the ranks that are left "
             "(README: Failures)", what);
}

void
sn_fault_nap(void)
{
    struct timespec t = {0, 1000000};
    nanosleep(&t, NULL);
}

void
sn_fault_stop_kernels(CommObject *c, int reason, double seconds)
{
    if (c->fail.fault == NULL)
        return;
    ((volatile symnccl_fault *)c->fail.fault)->abort = 1;
    if (c->mem.staging == NULL || c->fail.ctl_stream == NULL)
        return;
    *c->fail.fault_src = SYMNCCL_FAULT_CODE(reason, c->lsa_rank, c->lsa_rank);
    int prev;
    if (cudaGetDevice(&prev) != cudaSuccess)
        return;
    cudaSetDevice(c->device);
    cudaError_t e = cudaMemcpyAsync(c->mem.staging + c->mem.layout.ctl_offset,
                                    c->fail.fault_src, sizeof(uint64_t),
                                    cudaMemcpyHostToDevice,
                                    c->fail.ctl_stream);
    double until = sn_deadline(seconds);
    while (e == cudaSuccess &&
           (e = cudaStreamQuery(c->fail.ctl_stream)) == cudaErrorNotReady &&
           sn_now() < until)
        sn_fault_nap();
    (void)cudaGetLastError();
    cudaSetDevice(prev);
}

/* 1 when ev is NULL, complete, or failed. */
int
sn_event_done(cudaEvent_t ev)
{
    if (ev == NULL)
        return 1;
    cudaError_t e = cudaEventQuery(ev);
    if (e == cudaErrorNotReady)
        return 0;
    (void)cudaGetLastError();
    return 1;
}

int
sn_fault_drain(CommObject *c, double seconds, int nccl)
{
    double until = sn_deadline(seconds);
    for (;;) {
        if (sn_event_done(c->order.event) &&
            (!nccl || sn_event_done(c->watch.event)))
            return 1;
        if (sn_now() >= until)
            return 0;
        sn_fault_nap();
    }
}

/* ------------------------------------------------------------------ */
/* abort_on_signal: a C signal handler that raises the abort flag of every
 * live communicator of the process, then hands the signal on. The waits of
 * symnccl's kernels see the flag within milliseconds and give up (reason
 * "abort"), the watchdog aborts a communicator whose NCCL call is in flight,
 * so a stream stuck in a collective drains, and Python gets to handle the
 * signal (KeyboardInterrupt) instead of waiting out the timeout. Only a
 * volatile store per record: async-signal-safe. */

#define LIVE_RECORDS 256
static symnccl_fault *volatile live_records[LIVE_RECORDS];

static void
fault_track(symnccl_fault *rec, int on)
{
    for (int i = 0; i < LIVE_RECORDS; i++)
        if (live_records[i] == (on ? NULL : rec)) {
            live_records[i] = on ? rec : NULL;
            return;
        }
}

static struct sigaction previous[NSIG];

static void
on_signal(int sig, siginfo_t *info, void *ctx)
{
    for (int i = 0; i < LIVE_RECORDS; i++) {
        symnccl_fault *r = live_records[i];
        if (r != NULL)
            ((volatile symnccl_fault *)r)->abort = 1;
    }
    const struct sigaction *p = &previous[sig];
    if (p->sa_flags & SA_SIGINFO)
        p->sa_sigaction(sig, info, ctx);
    else if (p->sa_handler == SIG_DFL) {
        signal(sig, SIG_DFL);   /* the default action, as if unhandled */
        raise(sig);
    }
    else if (p->sa_handler != SIG_IGN)
        p->sa_handler(sig);
}

int
sn_abort_on_signal(int sig)
{
    if (sig <= 0 || sig >= NSIG)
        return -2;
    struct sigaction now, before;
    if (sigaction(sig, NULL, &before) < 0)
        return -1;
    if ((before.sa_flags & SA_SIGINFO) && before.sa_sigaction == on_signal)
        return 0;   /* already installed */
    memset(&now, 0, sizeof(now));
    now.sa_sigaction = on_signal;
    now.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&now.sa_mask);
    previous[sig] = before;
    return sigaction(sig, &now, NULL) < 0 ? -1 : 0;
}

/* ------------------------------------------------------------------ */
/* The communicators with an NCCL call in flight, for the watchdog
 * (watchdog.c runs the thread; the list is here so that lifecycle.c can
 * take a communicator off it). Guarded by watch_mu; lock order: watch_mu,
 * then a communicator's lock. */

static pthread_mutex_t watch_mu = PTHREAD_MUTEX_INITIALIZER;
static CommObject *watched;    /* through watch.next / watch.prev */

int
sn_watch_arm(CommObject *c, int collective, cudaStream_t stream)
{
    unsigned long long capture = 0;
    if (c->watch.event == NULL ||
        sn_capture_id(stream, &capture) != cudaSuccess || capture != 0)
        return 0;
    if (cudaEventRecord(c->watch.event, stream) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    pthread_mutex_lock(&watch_mu);
    c->watch.collective = collective;
    c->watch.deadline = sn_deadline(c->timeout);
    c->watch.armed = 1;
    c->watch.expired = 0;
    if (!c->watch.listed) {
        c->watch.prev = NULL;
        c->watch.next = watched;
        if (watched != NULL)
            watched->watch.prev = c;
        watched = c;
        c->watch.listed = 1;
    }
    pthread_mutex_unlock(&watch_mu);
    return 1;
}

void
sn_watch_forget(CommObject *c)
{
    pthread_mutex_lock(&watch_mu);
    if (c->watch.listed) {
        if (c->watch.prev != NULL)
            c->watch.prev->watch.next = c->watch.next;
        else
            watched = c->watch.next;
        if (c->watch.next != NULL)
            c->watch.next->watch.prev = c->watch.prev;
        c->watch.next = c->watch.prev = NULL;
        c->watch.listed = 0;
    }
    c->watch.armed = c->watch.expired = 0;
    pthread_mutex_unlock(&watch_mu);
}

void
sn_watch_record(CommObject *c)
{
    const int signalled = c->fail.fault != NULL &&
                          ((volatile symnccl_fault *)c->fail.fault)->abort;
    sn_fault_record(c, signalled ? SYMNCCL_FAULT_ABORT : SYMNCCL_FAULT_TIMEOUT,
                    SYMNCCL_K_COUNT, c->watch.collective, -1,
                    SYMNCCL_WAIT_NCCL,
                    c->timeout + (sn_now() - c->watch.deadline), NULL);
}

/* An expired NCCL call, seen by the watchdog's poll before it takes the
 * GIL: where no thread is inside c, the failure is recorded (calls from
 * here on are refused at entry) and NCCL's kernels are told to stop with
 * ncclCommRevoke (NCCL >= 2.28.7), which raises NCCL's abort flag in host
 * memory and frees nothing; the abort that follows frees. Nothing here
 * calls CUDA or needs the GIL: a hung NCCL kernel can hold up another
 * thread's CUDA call (a lazily loaded kernel's first launch waits for the
 * device) while it holds the GIL and the driver's lock that the abort's own
 * CUDA calls need, so NCCL's kernel has to end first (2x H100, the sleep
 * scenario on nccl: the watchdog blocked in cudaMemcpyAsync, the caller in
 * torch's first launch of arange). The poll's own cudaEventQuery comes
 * before this; it was not what blocked there. Under watch_mu. */
static void
revoke_expired(CommObject *c)
{
    if (c->comm == NULL || c->watch.revoked)
        return;
    sn_lock(c);
    const int idle = c->life.busy == 0 && c->life.state == SN_OPEN;
    if (idle)
        sn_watch_record(c);
    sn_unlock(c);
    /* out of c's lock (no caller can enter now: the record refuses it);
     * c->comm stays valid under watch_mu, which every teardown takes to
     * forget the watch before it frees the communicator */
    if (!idle)
        return;
    const ncclResult_t rc = ncclCommRevoke(c->comm, NCCL_REVOKE_DEFAULT);
    if (rc == ncclSuccess || rc == ncclInProgress)
        c->watch.revoked = 1;
    else   /* the abort that follows still ends NCCL's kernels, later */
        fprintf(stderr, "symnccl: ncclCommRevoke of rank %d (cuda:%d) "
                "failed: %s; the abort ends NCCL's kernels instead\n",
                c->rank, c->device, ncclGetErrorString(rc));
}

int
sn_watch_poll(void)
{
    int expired = 0;
    double now = sn_now();
    pthread_mutex_lock(&watch_mu);
    for (CommObject *c = watched; c != NULL; c = c->watch.next) {
        expired |= c->watch.expired;   /* busy before: retried */
        if (!c->watch.armed || c->watch.expired)
            continue;
        cudaSetDevice(c->device);
        cudaError_t e = cudaEventQuery(c->watch.event);
        if (e != cudaErrorNotReady) {
            (void)cudaGetLastError();
            c->watch.armed = 0;
            continue;
        }
        const int aborted = c->fail.fault != NULL &&
                            ((volatile symnccl_fault *)c->fail.fault)->abort;
        if (now >= c->watch.deadline || aborted) {
            c->watch.expired = 1;
            expired = 1;
            revoke_expired(c);
        }
    }
    pthread_mutex_unlock(&watch_mu);
    return expired;
}

int
sn_watch_collect(CommObject **out, int max)
{
    int n = 0;
    pthread_mutex_lock(&watch_mu);
    for (CommObject *c = watched; c != NULL && n < max; c = c->watch.next) {
        if (!c->watch.expired)
            continue;
        /* a caller inside reports with its own bounded wait (retried);
         * a communicator being torn down is its teardown's. Else the
         * watchdog takes the teardown here, in one step with the check
         * (lifecycle.c, sn_comm_abort_owned finishes it). */
        sn_lock(c);
        const int idle = c->life.busy == 0 && c->life.state == SN_OPEN;
        if (idle) {
            c->life.state = SN_CLOSING;
            c->life.teardown = SN_TEAR_ABORT;
        }
        sn_unlock(c);
        if (!idle)
            continue;
        out[n++] = c;   /* the caller takes a reference, with the GIL */
    }
    pthread_mutex_unlock(&watch_mu);
    return n;
}
