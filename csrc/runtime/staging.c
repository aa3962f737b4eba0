/* The staging window and the device scratch: where every region lives.
 *
 * One ncclMemAlloc allocation per communicator, registered as one
 * symmetric window at creation (registration is collective, so it cannot
 * be left to the first op, which ranks might reach with different kinds of
 * input):
 *
 *   [0, staging)            staging area: one_shot/two_shot/multimem copy
 *                           inputs that are not in a window here, and
 *                           two_shot's phase-1 results of out-of-place calls
 *   ll region               2 slots x nranks rows of ll_row bytes
 *   ll128 region            2 slots x nranks rows of ll128_row bytes
 *   push region             flag lines, then 4 x nranks slots of push_slot
 *   control block           this rank's fault word, then the barrier flag
 *                           lines of the load kernels (SYMNCCL_CTL_BYTES)
 *   splits area             all_to_all: nranks x nranks LL packets, one
 *                           per count (kernels/alltoall.cuh)
 *   lamport region          2 slots x nranks rows of lamport_row bytes
 *                           (the fused kernel's)
 *   lamport_ar region       the same for all_reduce's lamport
 *
 * Every region is page-aligned and at the same offset on every rank. The
 * ll and ll128 regions, push's flag lines, the control block and the
 * splits area start zeroed (a flag is never 0); their slots need no
 * clearing. The lamport regions start all ones (their packets' "empty",
 * kernels/packet.cuh), and their readers leave them so. The scratch
 * (cudaMalloc, local) holds the barrier word of barrier(), the claim word
 * of the failure record and the per-CTA call counters of each kernel
 * family (SN_MAX_CTAS each, kernels/table.h), zeroed once.
 *
 * No Python here: failures are sn_errs; lifecycle.c releases the GIL
 * around the staging window's ncclMemAlloc (sn_staging_reserve).
 */
#include "runtime.h"

#include <string.h>

/* Sizes of the packet regions per communicator; the push region's is the
 * SYMNCCL_PUSH_REGION_MIB knob. LL128's 16 MiB: 2 ranks carry 3.75 MiB a
 * launch, so ll128_rmsnorm's T 128 x H 8192 bf16 (2.2 MiB of items, a
 * row's items padded to whole 480-byte items) takes one launch. */
#define LL_REGION (16u << 20)
#define LL128_REGION (16u << 20)
#define LAMPORT_REGION (16u << 20)
/* all_reduce's: 4 MiB a launch on 2 ranks, the top of its auto range
 * (registry.c) */
#define LAMPORT_AR_REGION (16u << 20)
#define PAGE ((size_t)4096)

/* Scratch: the barrier word, the claim word, then one epoch array per
 * kernel family (kernels/table.h). */
#define SCRATCH_CLAIM 128
#define SCRATCH_EPOCHS 256
#define SCRATCH_BYTES \
    (SCRATCH_EPOCHS + SYMNCCL_FAMILY_COUNT * 8 * SN_MAX_CTAS)

_Static_assert(SYMNCCL_PUSH_MAX_CTAS <= SN_MAX_CTAS,
               "push epochs live in the scratch's SN_MAX_CTAS slots");

static size_t
pages(size_t bytes)
{
    return bytes / PAGE * PAGE;
}

void
sn_layout_compute(CommObject *c, size_t staging_bytes)
{
    sn_layout *l = &c->mem.layout;
    const size_t n = (size_t)c->nranks;
    memset(l, 0, sizeof(*l));
    l->staging = staging_bytes;
    /* ll: rows of 2 x the largest message a launch carries (16-byte
     * packets per 8 bytes), 2 slots x n rows in the region */
    l->ll_offset = staging_bytes;
    l->ll_row = 2 * pages(LL_REGION / (4 * n));
    l->ll128_offset = l->ll_offset + 2 * n * l->ll_row;
    l->ll128_row = pages(LL128_REGION / (2 * n));
    l->push_offset = l->ll128_offset + 2 * n * l->ll128_row;
    l->push_slot = pages(((size_t)c->knobs.push_region_mib << 20) / (4 * n));
    if (l->push_slot == 0)
        l->push_slot = PAGE;
    size_t flags = 0;
    size_t push = symnccl_push_region_bytes(c->nranks, l->push_slot, &flags);
    l->push_data = l->push_offset + flags;
    l->ctl_offset = l->push_offset + push;
    l->splits_offset = l->ctl_offset +
                       pages(SYMNCCL_CTL_BYTES(c->nranks) + PAGE - 1);
    /* one 16-byte LL packet per (source, destination) count */
    l->lamport_offset = l->splits_offset + pages(n * n * 16 + PAGE - 1);
    /* lamport: rows of the largest message a launch carries (its packets
     * are all data) */
    l->lamport_row = pages(LAMPORT_REGION / (2 * n));
    l->lamport_ar_offset = l->lamport_offset + 2 * n * l->lamport_row;
    l->lamport_ar_row = pages(LAMPORT_AR_REGION / (2 * n));
    l->bytes = l->lamport_ar_offset + 2 * n * l->lamport_ar_row;
}

int
sn_packet_region(const sn_layout *l, int family, size_t *offset,
                 size_t *row)
{
    size_t o = 0, r = 0;
    switch (family) {
    case SYMNCCL_FAMILY_LL:
        o = l->ll_offset, r = l->ll_row;
        break;
    case SYMNCCL_FAMILY_LL128:
        o = l->ll128_offset, r = l->ll128_row;
        break;
    case SYMNCCL_FAMILY_LAMPORT:
        o = l->lamport_offset, r = l->lamport_row;
        break;
    case SYMNCCL_FAMILY_LAMPORT_AR:
        o = l->lamport_ar_offset, r = l->lamport_ar_row;
        break;
    default:
        break;
    }
    if (offset != NULL)
        *offset = o;
    if (row != NULL)
        *row = r;
    return r != 0;
}

int
sn_staging_wanted(const CommObject *c)
{
    return c->symmetric && c->lsa_size == c->nranks &&
           c->mem.layout.staging != 0;
}

ncclResult_t
sn_staging_reserve(CommObject *c)
{
    void *p = NULL;
    ncclResult_t rc = ncclMemAlloc(&p, c->mem.layout.bytes);
    if (rc == ncclSuccess)
        c->mem.staging = p;
    return rc;
}

int
sn_staging_clear(CommObject *c, sn_err *err)
{
    const sn_layout *l = &c->mem.layout;
    /* the ll and ll128 regions, push's flag lines, the control block and
     * the splits area zeroed, the lamport regions (the last two) all ones;
     * no peer can write into them before the window is registered, after
     * this returns (a loopback team's ranks: before the team's first
     * call) */
    cudaError_t e = cudaMemset(c->mem.staging + l->ll_offset, 0,
                               l->push_data - l->ll_offset);
    if (e == cudaSuccess)
        e = cudaMemset(c->mem.staging + l->ctl_offset, 0,
                       l->lamport_offset - l->ctl_offset);
    if (e == cudaSuccess)
        e = cudaMemset(c->mem.staging + l->lamport_offset, 0xff,
                       l->bytes - l->lamport_offset);
    if (e == cudaSuccess)
        e = cudaDeviceSynchronize();
    if (e != cudaSuccess)
        return sn_fail(err, e, ncclSuccess, "clearing the packet and push "
                                            "regions");
    return 0;
}

void
sn_staging_free(CommObject *c)
{
    /* a loopback rank's is its team's (lifecycle.c leaves the team first) */
    if (c->mem.staging != NULL && c->loopback == NULL)
        ncclMemFree(c->mem.staging);
    c->mem.staging = NULL;
    c->mem.staging_win = NULL;   /* the node stays in c->windows, detached */
}

int
sn_scratch_alloc(CommObject *c, sn_err *err)
{
    SN_CUDA_ERR_GOTO(err, cudaMalloc((void **)&c->mem.scratch,
                                     SCRATCH_BYTES),
                     "cudaMalloc (scratch)", error);
    SN_CUDA_ERR_GOTO(err, cudaMemset(c->mem.scratch, 0, SCRATCH_BYTES),
                     "cudaMemset (scratch)", error);
    SN_CUDA_ERR_GOTO(err, cudaEventCreateWithFlags(&c->order.event,
                                                   cudaEventDisableTiming),
                     "cudaEventCreateWithFlags", error);
    return 0;
error:
    return -1;
}

int
sn_check_buffers(CommObject *c, size_t bytes, void **dev, void **host,
                 sn_err *err)
{
    /* both or neither: a pair half made (cudaMallocHost failing after
     * cudaMalloc) is freed, never kept for the next call to write through
     * its NULL */
    if (c->mem.check_dev == NULL) {
        const size_t size = bytes * ((size_t)c->nranks + 1);
        void *d = NULL, *h = NULL;
        cudaError_t e = cudaMalloc(&d, size);
        if (e != cudaSuccess)
            return sn_fail(err, e, ncclSuccess, "cudaMalloc (SYMNCCL_CHECK)");
        e = cudaMallocHost(&h, size);
        if (e != cudaSuccess) {
            sn_fail(err, e, ncclSuccess, "cudaMallocHost (SYMNCCL_CHECK)");
            cudaFree(d);
            return -1;
        }
        c->mem.check_dev = d;
        c->mem.check_host = h;
    }
    *dev = c->mem.check_dev;
    *host = c->mem.check_host;
    return 0;
}

void
sn_scratch_free(CommObject *c)
{
    if (c->mem.scratch != NULL) {
        cudaFree(c->mem.scratch);
        c->mem.scratch = NULL;
    }
    if (c->mem.check_dev != NULL) {
        cudaFree(c->mem.check_dev);
        c->mem.check_dev = NULL;
    }
    if (c->mem.check_host != NULL) {
        cudaFreeHost(c->mem.check_host);
        c->mem.check_host = NULL;
    }
    int64_t **devs[] = {&c->a2a.dev, &c->a2a.lost_dev};
    int64_t **hosts[] = {&c->a2a.host, &c->a2a.lost_host};
    for (int i = 0; i < 2; i++) {
        if (*devs[i] != NULL)
            cudaFree(*devs[i]);
        if (*hosts[i] != NULL)
            cudaFreeHost(*hosts[i]);
        *devs[i] = *hosts[i] = NULL;
    }
    if (c->order.event != NULL) {
        cudaEventDestroy(c->order.event);
        c->order.event = NULL;
    }
}

uint64_t *
sn_epochs(const CommObject *c, int kernel)
{
    /* the kernels of a family share its slots or barrier lines, so its
     * call counters */
    const int family = symnccl_kernel_row_of(kernel).family;
    return (uint64_t *)((char *)c->mem.scratch + SCRATCH_EPOCHS +
                        (size_t)family * 8 * SN_MAX_CTAS);
}

int *
sn_barrier_word(const CommObject *c)
{
    return c->mem.scratch;
}

unsigned *
sn_claim_word(const CommObject *c)
{
    return (unsigned *)((char *)c->mem.scratch + SCRATCH_CLAIM);
}
