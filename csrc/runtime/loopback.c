/* Loopback teams: every rank of a communicator on one GPU, for testing.
 *
 * NCCL refuses two ranks on one GPU, so symnccl's kernels could otherwise
 * be tried only at the world sizes of the machines at hand. A loopback team
 * is nranks Communicators of one process and one GPU whose kernels run the
 * same code, launched by the same host path (launch.c), as a real team's:
 *
 *   - each rank's staging memory (staging.c's layout) is its own physical
 *     allocation, mapped SYMNCCL_LOOPBACK_STRIDE apart in one reserved
 *     address range: the flat layout NCCL gives a window's copies in an LSA
 *     team, so peers are reached exactly as over NVLink (primitives.cuh,
 *     Peers), only through this GPU's memory;
 *   - the device communicator and the window hold just what the kernels
 *     read (kernels/devcomm.cu, snk_loopback_*).
 *
 * Each rank's calls go on a stream of their own (the caller's); the ranks'
 * kernels then run concurrently, as the ranks of a real team do, provided
 *   - the GPU holds all their CTAs at once (a team's grids must fit: the
 *     waits of a kernel that cannot be scheduled time out and say so);
 *   - no kernel is loaded while a rank waits for a later one: CUDA loads a
 *     kernel at its first launch (CUDA_MODULE_LOADING=LAZY, the default),
 *     and that load waits for every kernel running in the context. A
 *     kernel first launched between two ranks' calls (torch.cuda._sleep,
 *     say) waits for the early ranks, which wait for the late ones, until
 *     the timeout. On real teams each rank has a context of its own.
 *
 * There is no NCCL communicator behind a loopback rank: algo="nccl" and
 * the collectives that pass through to NCCL raise, and no SymmetricBuffer
 * can be registered on it. It is a testing facility
 * (Communicator._loopback in comm.c; tests/test_loopback.py), not a way to
 * run a job.
 *
 * The team's memory goes when its last rank's does: a rank's kernels write
 * into its peers' memory. No Python here: failures are sn_errs, which
 * comm.c raises.
 */
#include "runtime.h"

#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct sn_loopback {
    int refs;                  /* ranks whose memory is still held */
    int nranks;
    CUdeviceptr base;          /* nranks x SYMNCCL_LOOPBACK_STRIDE, reserved */
    size_t bytes;              /* each rank's mapping */
    CUmemGenericAllocationHandle mem[SYMNCCL_MAX_RANKS];
    int mapped[SYMNCCL_MAX_RANKS];
    ncclWindow_t win[SYMNCCL_MAX_RANKS];
};

/* The driver's virtual memory calls, through the runtime's entry points
 * (the module links no libcuda). */
static struct {
    CUresult (*granularity)(size_t *, const CUmemAllocationProp *,
                            CUmemAllocationGranularity_flags);
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr,
                        unsigned long long);
    CUresult (*free_range)(CUdeviceptr, size_t);
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t,
                       const CUmemAllocationProp *, unsigned long long);
    CUresult (*release)(CUmemGenericAllocationHandle);
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                    unsigned long long);
    CUresult (*unmap)(CUdeviceptr, size_t);
    CUresult (*access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    int loaded;
} drv;

static int
load_driver(sn_err *err)
{
    static const struct {
        const char *name;
        void **fn;
    } fns[] = {
        {"cuMemGetAllocationGranularity", (void **)&drv.granularity},
        {"cuMemAddressReserve", (void **)&drv.reserve},
        {"cuMemAddressFree", (void **)&drv.free_range},
        {"cuMemCreate", (void **)&drv.create},
        {"cuMemRelease", (void **)&drv.release},
        {"cuMemMap", (void **)&drv.map},
        {"cuMemUnmap", (void **)&drv.unmap},
        {"cuMemSetAccess", (void **)&drv.access},
    };
    if (drv.loaded)
        return 0;
    for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++) {
        enum cudaDriverEntryPointQueryResult q;
        cudaError_t e = cudaGetDriverEntryPointByVersion(
            fns[i].name, fns[i].fn, 12000, cudaEnableDefault, &q);
        if (e != cudaSuccess || q != cudaDriverEntryPointSuccess) {
            return sn_fail(err, cudaSuccess, ncclSuccess, "loopback team: "
                           "the driver entry point %s is not available",
                           fns[i].name);
        }
    }
    drv.loaded = 1;
    return 0;
}

/* A driver call of the team's teardown, which has nobody to raise to:
 * a failure is written to stderr and the teardown goes on. */
static void
team_free_step(CUresult r, const char *what)
{
    if (r != CUDA_SUCCESS)
        fprintf(stderr, "symnccl: loopback team: %s failed during teardown "
                "(CUresult %d)\n", what, (int)r);
}

static void
team_free(sn_loopback *t)
{
    const size_t range = (size_t)t->nranks * SYMNCCL_LOOPBACK_STRIDE;
    for (int q = 0; q < t->nranks; q++) {
        symnccl_loopback_window_free(t->win[q]);
        if (t->mapped[q])
            team_free_step(drv.unmap(t->base +
                                     (size_t)q * SYMNCCL_LOOPBACK_STRIDE,
                                     t->bytes), "cuMemUnmap");
        if (t->mem[q] != 0)
            team_free_step(drv.release(t->mem[q]), "cuMemRelease");
    }
    if (t->base != 0)
        team_free_step(drv.free_range(t->base, range), "cuMemAddressFree");
    free(t);
}

#define CU_GOTO(call, what)                                             \
    do {                                                                \
        CUresult r_ = (call);                                           \
        if (r_ != CUDA_SUCCESS) {                                       \
            sn_fail(err, cudaSuccess, ncclSuccess, "loopback team: %s " \
                    "failed (CUresult %d)", what, (int)r_);             \
            goto error;                                                 \
        }                                                               \
    } while (0)

sn_loopback *
sn_loopback_new(int nranks, int device, size_t bytes, sn_err *err)
{
    if (load_driver(err) < 0)
        return NULL;
    sn_loopback *t = calloc(1, sizeof(*t));
    if (t == NULL) {
        sn_fail_no_memory(err);
        return NULL;
    }
    t->nranks = nranks;
    t->refs = 1;   /* the caller's (sn_loopback_release) */
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    size_t gran = 0;
    CU_GOTO(drv.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            "cuMemGetAllocationGranularity");
    t->bytes = (bytes + gran - 1) / gran * gran;
    CU_GOTO(drv.reserve(&t->base, (size_t)nranks * SYMNCCL_LOOPBACK_STRIDE,
                        gran, 0, 0),
            "cuMemAddressReserve");
    CUmemAccessDesc access;
    memset(&access, 0, sizeof(access));
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    for (int q = 0; q < nranks; q++) {
        const CUdeviceptr at = t->base + (size_t)q * SYMNCCL_LOOPBACK_STRIDE;
        CU_GOTO(drv.create(&t->mem[q], t->bytes, &prop, 0), "cuMemCreate");
        CU_GOTO(drv.map(at, t->bytes, 0, t->mem[q], 0), "cuMemMap");
        t->mapped[q] = 1;
        CU_GOTO(drv.access(at, t->bytes, &access, 1), "cuMemSetAccess");
        SN_CUDA_ERR_GOTO(err, symnccl_loopback_window((char *)t->base, q,
                                                      &t->win[q]),
                         "loopback window", error);
    }
    /* zeroed whole; each rank's sn_staging_clear then gives the regions
     * their first contents, as a real communicator's (comm.c) */
    for (int q = 0; q < nranks; q++)
        SN_CUDA_ERR_GOTO(err, cudaMemset((char *)t->base +
                                             (size_t)q *
                                                 SYMNCCL_LOOPBACK_STRIDE,
                                         0, t->bytes),
                         "cudaMemset (loopback)", error);
    SN_CUDA_ERR_GOTO(err, cudaDeviceSynchronize(), "cudaDeviceSynchronize",
                     error);
    return t;
error:
    team_free(t);
    return NULL;
}

int
sn_loopback_join(CommObject *c, sn_loopback *t, sn_err *err)
{
    const int q = c->rank;
    if (symnccl_loopback_devcomm(q, t->nranks, &c->devcomm) != ncclSuccess)
        return sn_fail_no_memory(err);
    c->mem.staging = (char *)t->base + (size_t)q * SYMNCCL_LOOPBACK_STRIDE;
    c->loopback = t;
    __atomic_add_fetch(&t->refs, 1, __ATOMIC_RELAXED);
    c->mem.staging_win = sn_window_node(c, c->mem.staging,
                                        c->mem.layout.bytes);
    if (c->mem.staging_win == NULL)
        return sn_fail_no_memory(err);
    c->mem.staging_win->win = t->win[q];
    c->lsa_size = t->nranks;
    c->lsa_rank = q;
    c->symmetric = 1;
    c->symmetric_reason = "loopback team (one GPU)";
    c->multicast = 0;
    c->multicast_reason = "loopback team: no multicast";
    return 0;
}

void
sn_loopback_release(sn_loopback *t)
{
    /* atomic: the ranks' teardowns may run on different threads, without
     * the GIL (lifecycle.c, abort_finish) */
    if (t != NULL && __atomic_sub_fetch(&t->refs, 1, __ATOMIC_ACQ_REL) == 0)
        team_free(t);
}

void
sn_loopback_leave(CommObject *c)
{
    sn_loopback *t = c->loopback;
    c->loopback = NULL;
    if (t != NULL)
        c->mem.staging = NULL;
    sn_loopback_release(t);
}
