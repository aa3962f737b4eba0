/* The watchdog of NCCL calls.
 *
 * symnccl's own kernels bound every wait themselves; NCCL's kernels do not
 * (a peer that never arrives keeps them spinning, and every later launch on
 * the stream, torch.cuda.synchronize() included, behind them). So after
 * each eager NCCL call the communicator records an event (sn_watch_nccl),
 * and one thread per process polls those events. A call that has not
 * completed within the communicator's timeout, or one whose abort flag was
 * raised (abort_on_signal), makes the watchdog record the failure and abort
 * the communicator: ncclCommAbort ends NCCL's kernels, the stream drains,
 * and the next call (or check()) raises PeerTimeoutError.
 *
 * The abort needs the GIL (it runs the same path as abort(), hooks
 * included). While a thread is inside a method of that communicator
 * (c->life.busy) the watchdog leaves it alone: such a method waits with its
 * own bound and records the failure itself; the watchdog aborts once it has
 * left. A communicator being closed or aborted is its teardown's. Calls inside a CUDA graph capture or a symnccl.group() are not
 * watched (README: Failures).
 */
#include "symnccl.h"

#include <errno.h>
#include <time.h>

/* How often the thread looks at the events. */
#define POLL_SECONDS 0.05

/* The thread's state. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static pthread_t thread;
static int running, stopping;

/* With the GIL: records and aborts every expired communicator that no
 * thread is inside. */
static void
abort_expired(void)
{
    CommObject *todo[16];
    int n = sn_watch_collect(todo, 16);
    for (int i = 0; i < n; i++) {
        CommObject *c = todo[i];
        const int signalled = c->fail.fault != NULL &&
                              ((volatile symnccl_fault *)c->fail.fault)->abort;
        sn_fault_record(c, signalled ? SYMNCCL_FAULT_ABORT
                                     : SYMNCCL_FAULT_TIMEOUT,
                        SYMNCCL_K_COUNT, c->watch.collective, -1,
                        SYMNCCL_WAIT_NCCL,
                        c->timeout + (sn_now() - c->watch.deadline), NULL);
        sn_comm_abort_owned(c->st, c);
        Py_DECREF(c);
    }
}

static void *
watch_main(void *unused)
{
    /* The event queries of this thread must not touch other threads' CUDA
     * graph captures: in the default (global) capture mode a query from any
     * thread during a capture invalidates it (seen: a capture begun within
     * one poll of an eager NCCL call failed). Relaxed mode for this thread,
     * as torch's own NCCL watchdog does. */
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    (void)cudaThreadExchangeStreamCaptureMode(&mode);
    pthread_mutex_lock(&mu);
    while (!stopping) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        long ns = until.tv_nsec + (long)(POLL_SECONDS * 1e9);
        until.tv_sec += ns / 1000000000L;
        until.tv_nsec = ns % 1000000000L;
        int rc = 0;
        while (!stopping && rc != ETIMEDOUT)
            rc = pthread_cond_timedwait(&wake, &mu, &until);
        if (stopping)
            break;
        pthread_mutex_unlock(&mu);
        if (sn_watch_poll()) {
            /* the interpreter is alive: sn_watch_shutdown, at exit, stops
             * this thread before it goes */
            PyGILState_STATE g = PyGILState_Ensure();
            abort_expired();
            PyGILState_Release(g);
        }
        pthread_mutex_lock(&mu);
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

int
sn_watch_nccl(CommObject *c, int collective, cudaStream_t stream)
{
    if (!sn_watch_arm(c, collective, stream))
        return 0;
    pthread_mutex_lock(&mu);
    if (!running && !stopping &&
        pthread_create(&thread, NULL, watch_main, NULL) == 0)
        running = 1;
    pthread_mutex_unlock(&mu);
    return 1;
}

void
sn_watch_shutdown(void)
{
    pthread_mutex_lock(&mu);
    stopping = 1;
    int join = running;
    running = 0;
    pthread_cond_signal(&wake);
    pthread_mutex_unlock(&mu);
    if (join) {
        Py_BEGIN_ALLOW_THREADS
        pthread_join(thread, NULL);
        Py_END_ALLOW_THREADS
    }
}
