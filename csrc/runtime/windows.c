/* The window cache: one NCCL_WIN_COLL_SYMMETRIC window per registered
 * allocation, never two (registering an allocation twice exhausts NCCL's
 * symmetric VA), shared by every buffer inside it and found again by
 * address when a collective's input lies in it. No Python here: the
 * faces that register and deregister windows (python/buffer.c for a
 * SymmetricBuffer, lifecycle.c at close) release the GIL around NCCL's
 * calls and raise.
 */
#include "runtime.h"

#include <stdlib.h>

sn_window *
sn_window_node(CommObject *c, char *base, size_t size)
{
    sn_window *w = calloc(1, sizeof(sn_window));
    if (w == NULL)
        return NULL;
    w->base = base;
    w->size = size;
    w->refs = 1;
    w->next = c->windows;
    c->windows = w;
    return w;
}

static void
unlink_node(CommObject *c, sn_window *w)
{
    for (sn_window **pp = &c->windows; *pp != NULL; pp = &(*pp)->next)
        if (*pp == w) {
            *pp = w->next;
            return;
        }
}

sn_window *
sn_window_share(CommObject *c, char *base, size_t size)
{
    /* a window whose buffers are gone (dead) is being released: its
     * memory may be freed, and the address handed out again, before its
     * node goes */
    for (sn_window *w = c->windows; w != NULL; w = w->next)
        if (w->dead == NULL && !w->lost && base >= w->base &&
            base + size <= w->base + w->size) {
            w->refs++;
            return w;
        }
    return NULL;
}

ncclResult_t
sn_window_register(CommObject *c, sn_window *w)
{
    return ncclCommWindowRegister(c->comm, w->base, w->size, &w->win,
                                  NCCL_WIN_COLL_SYMMETRIC);
}

void
sn_window_forget(CommObject *c, sn_window *w)
{
    unlink_node(c, w);
    free(w);
}

void
sn_window_lose(CommObject *c, sn_window *w)
{
    w->lost = 1;
    w->refs = 0;
}

int
sn_window_deregister_now(CommObject *c, sn_window *w)
{
    if (w->win == NULL || c->comm == NULL) {
        w->win = NULL;
        return 0;
    }
    int prev = -1;
    cudaGetDevice(&prev);
    cudaSetDevice(c->device);
    ncclResult_t rc = ncclCommWindowDeregister(c->comm, w->win);
    if (rc == ncclInProgress) {
        int failed;
        ncclResult_t bad = ncclSuccess;
        rc = sn_wait_nccl(&c->comm, 1, sn_deadline(c->timeout), &c->life.stop,
                          &failed, &bad) == SN_WAIT_DONE ? ncclSuccess
                                                         : ncclInProgress;
    }
    (void)cudaGetLastError();
    if (prev >= 0)
        cudaSetDevice(prev);
    if (rc != ncclSuccess)
        return -1;
    w->win = NULL;
    return 0;
}

sn_window *
sn_window_find(const CommObject *c, const char *ptr, size_t size)
{
    for (sn_window *w = c->windows; w != NULL; w = w->next)
        if (w->win != NULL && w->dead == NULL && !w->lost &&
            ptr >= w->base && ptr + size <= w->base + w->size)
            return w;
    return NULL;
}

void
sn_windows_detach(CommObject *c, int deregister)
{
    /* Buffers may outlive the communicator: their memory stays valid
     * (ncclMemFree needs no communicator); only the window goes. With
     * `deregister` (abort(), once no kernel of c runs any more) each window
     * is deregistered first. That is local in NCCL 2.28-2.30, the releases
     * whose sources were read (2.31 and 2.32 not read; no peer takes
     * part, so a dead one does not matter), and without it ncclCommAbort
     * keeps NCCL's reference to the memory: ncclMemFree could not give it
     * back to the device. Errors are ignored: c is being aborted. */
    for (sn_window *w = c->windows; w != NULL; w = w->next) {
        if (deregister && w->win != NULL && c->comm != NULL) {
            ncclResult_t rc = ncclCommWindowDeregister(c->comm, w->win);
            if (rc == ncclInProgress) {
                int failed;
                ncclResult_t bad;
                sn_wait_nccl(&c->comm, 1, sn_deadline(1.0), NULL, &failed,
                             &bad);
            }
        }
        w->win = NULL;
    }
}

size_t
sn_windows_count(const CommObject *c)
{
    size_t n = 0;
    for (const sn_window *w = c->windows; w != NULL; w = w->next)
        n += w->win != NULL;
    return n;
}

void
sn_windows_free(CommObject *c)
{
    sn_window *w = c->windows;
    c->windows = NULL;
    while (w != NULL) {
        sn_window *next = w->next;
        free(w);
        w = next;
    }
}
