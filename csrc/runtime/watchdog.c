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
 * included): the thread hands it to the Python face's handler
 * (sn_watch_on_expired; module.c's, which takes the GIL), and this file
 * calls no Python. While a thread is inside a method of that communicator
 * (c->life.busy) the watchdog leaves it alone: such a method waits with its
 * own bound and records the failure itself; the watchdog aborts once it has
 * left. A communicator being closed or aborted is its teardown's. Calls inside a CUDA graph capture or a symnccl.group() are not
 * watched (README: Failures).
 */
#include "runtime.h"

#include <errno.h>
#include <time.h>

/* How often the thread looks at the events. */
#define POLL_SECONDS 0.05

/* The thread's state. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static pthread_t thread;
static int running, stopping;

/* What the thread runs when a communicator has expired (set once, at
 * import, before any communicator exists). */
static void (*on_expired)(void);

void
sn_watch_on_expired(void (*fn)(void))
{
    on_expired = fn;
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
        /* the interpreter is alive: sn_watch_stop and sn_watch_join, at
         * exit, stop this thread before it goes */
        if (sn_watch_poll() && on_expired != NULL)
            on_expired();
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

int
sn_watch_stop(void)
{
    pthread_mutex_lock(&mu);
    stopping = 1;
    int join = running;
    running = 0;
    pthread_cond_signal(&wake);
    pthread_mutex_unlock(&mu);
    return join;
}

void
sn_watch_join(void)
{
    pthread_join(thread, NULL);
}
