/* The one bounded wait for non-blocking NCCL communicators.
 *
 * Every NCCL call symnccl makes is on a non-blocking communicator
 * (ncclConfig_t.blocking = 0), so that every wait for peers is bounded by
 * the communicator's timeout and interruptible by Ctrl-C: the call returns
 * at once and the communicator reports ncclInProgress until it completes.
 * sn_wait_nccl polls that without Python (for the XLA handler, which runs on
 * XLA's threads, and for deallocators); python/blocking.c's sn_wait_comms
 * wraps it for Python callers.
 */
#include "runtime.h"

#include <time.h>

/* After the spin (SN_WAIT_SPIN_SECONDS), naps of this length. */
#define NAP_NS 20000
double
sn_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double
sn_deadline(double seconds)
{
    return sn_now() + seconds;
}

/* since: when the whole wait began (for the spin phase). */
int
sn_wait_nccl_since(ncclComm_t *comms, int n, double since, double until,
                   const volatile int *stop, int *failed, ncclResult_t *bad)
{
    for (;;) {
        if (stop != NULL && *stop)
            return SN_WAIT_STOPPED;
        int busy = 0;
        for (int i = 0; i < n; i++) {
            ncclResult_t async = ncclSuccess;
            ncclResult_t rc = ncclCommGetAsyncError(comms[i], &async);
            if (rc == ncclSuccess && async == ncclInProgress) {
                busy = 1;
                continue;
            }
            if (rc != ncclSuccess || async != ncclSuccess) {
                *failed = i;
                *bad = rc != ncclSuccess ? rc : async;
                return SN_WAIT_FAILED;
            }
        }
        if (!busy)
            return SN_WAIT_DONE;
        double now = sn_now();
        if (now >= until)
            return SN_WAIT_TIMEOUT;
        if (now - since > SN_WAIT_SPIN_SECONDS) {
            struct timespec pause = {0, NAP_NS};
            nanosleep(&pause, NULL);
        }
    }
}

int
sn_wait_nccl(ncclComm_t *comms, int n, double until,
             const volatile int *stop, int *failed, ncclResult_t *bad)
{
    return sn_wait_nccl_since(comms, n, sn_now(), until, stop, failed, bad);
}
