/* C interface to symnccl's CUDA C++ side (csrc/kernels/).
 *
 * nccl_device.h is C++-only, so everything that needs it (the ncclDevComm
 * struct, device kernels) lives in .cu files behind these extern "C"
 * functions. The host .c files include only this header, nccl.h and the CUDA
 * runtime API.
 */
#ifndef SYMNCCL_KERNELS_LAUNCH_H
#define SYMNCCL_KERNELS_LAUNCH_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Opaque holder of an ncclDevComm (device communicator). */
typedef struct symnccl_devcomm symnccl_devcomm;

/* Allocates the holder and calls ncclDevCommCreate with lsaBarrierCount =
 * lsa_barrier_count and lsaMultimem = request_multimem. Collective: call it on
 * every rank, inside ncclGroupStart/End when one thread drives several
 * communicators. The holder is filled when the call (or the group) completes.
 * On failure *out is NULL. */
ncclResult_t symnccl_devcomm_create(ncclComm_t comm, int lsa_barrier_count,
                                    int request_multimem,
                                    symnccl_devcomm **out);

/* ncclDevCommDestroy, then frees the holder. dc may be NULL. */
ncclResult_t symnccl_devcomm_destroy(ncclComm_t comm, symnccl_devcomm *dc);

/* Topology read off a created device communicator. */
void symnccl_devcomm_info(const symnccl_devcomm *dc, int *lsa_size,
                          int *lsa_rank, int *has_multimem);

/* ---- LSA all-reduce (lsa_allreduce.cu) ---- */

enum { SYMNCCL_OP_SUM = 0, SYMNCCL_OP_MAX = 1, SYMNCCL_OP_MIN = 2,
       SYMNCCL_OP_AVG = 3 };
enum { SYMNCCL_ALGO_ONE_SHOT = 1, SYMNCCL_ALGO_TWO_SHOT = 2,
       SYMNCCL_ALGO_LL = 3, SYMNCCL_ALGO_MULTIMEM = 4, SYMNCCL_ALGO_PUSH = 5,
       SYMNCCL_ALGO_LL128 = 6 };

typedef struct {
    int algo;                  /* SYMNCCL_ALGO_* */
    const symnccl_devcomm *dc;
    ncclWindow_t win;          /* input window (peers read it) */
    size_t win_offset;         /* same on every rank */
    ncclWindow_t mid_win;      /* two-shot: where phase-1 results go */
    size_t mid_offset;
    const void *src;           /* non-NULL: copy src into win first */
    void *out;                 /* local output, any device memory */
    void *scratch;             /* one_shot in place: local, >= count elems */
    size_t count;
    ncclDataType_t dtype;
    int op;                    /* SYMNCCL_OP_* */
    int in_place;              /* out is this rank's part of win */
    int ctas, threads;         /* same on every rank; ctas <= barrier count */
} symnccl_lsa_args;

/* 1 if the LSA kernels handle this dtype/op at this LSA size. */
int symnccl_lsa_supported(ncclDataType_t dtype, int op, int nranks);
cudaError_t symnccl_lsa_allreduce(const symnccl_lsa_args *args,
                                  cudaStream_t stream);

/* ---- multicast all-reduce (multimem_allreduce.cu) ----
 * Same arguments as the LSA kernels (algo SYMNCCL_ALGO_MULTIMEM): the result
 * is written in place into win at win_offset (16-byte aligned) on every
 * rank, then copied to out unless in_place. Runs only on a device
 * communicator that NCCL granted lsaMultimem; cudaErrorInvalidValue
 * otherwise. */
int symnccl_multimem_supported(ncclDataType_t dtype, int op);
cudaError_t symnccl_multimem_allreduce(const symnccl_lsa_args *args,
                                       cudaStream_t stream);

/* ---- low-latency all-reduce (ll_allreduce.cu) ---- */

typedef struct {
    const symnccl_devcomm *dc;
    ncclWindow_t win;          /* window holding the LL receive buffer */
    size_t ll_offset;          /* its offset in win (same on every rank) */
    size_t row_bytes;          /* bytes per (slot, source rank) row: 16 per
                                  8 bytes of input, >= 2 * count * itemsize */
    uint64_t *epochs;          /* ctas zero-initialised counters, local */
    const void *src;           /* any device memory, 8-byte aligned or not */
    void *out;                 /* any device memory; may equal src */
    size_t count;
    ncclDataType_t dtype;
    int op;                    /* SYMNCCL_OP_* */
    int ctas, threads;         /* ctas: fixed for the communicator */
    uint64_t timeout_ns;       /* give up (trap) after waiting this long */
    int two_shot;              /* reduce-scatter + all-gather in packets;
                                  needs 2 * count * itemsize <= nranks *
                                  row_bytes / 2 */
} symnccl_ll_args;

/* Receive-buffer bytes the LL kernel needs per rank for nranks ranks and
 * messages of up to max_bytes: 2 slots x nranks rows x 2 x max_bytes. */
size_t symnccl_ll_buffer_bytes(int nranks, size_t max_bytes);
cudaError_t symnccl_ll_allreduce(const symnccl_ll_args *args,
                                 cudaStream_t stream);

/* ---- ll128 (ll128_allreduce.cu): ll's one round (or, with two_shot, its
 * packet two-shot) in 128-byte lines ----
 * The ll argument struct and grid, with ll_offset / row_bytes / epochs of
 * ll128's own region and counters (the two formats must not share slots);
 * threads a multiple of 32. At most
 * symnccl_ll128_max_count(row_bytes, itemsize, nranks, two_shot) elements
 * per launch. */
size_t symnccl_ll128_max_count(size_t row_bytes, size_t itemsize, int nranks,
                               int two_shot);
cudaError_t symnccl_ll128_allreduce(const symnccl_ll_args *args,
                                    cudaStream_t stream);

/* ---- store-only all-reduce (push_allreduce.cu) ---- */

/* Largest grid of the push kernel (flag lines are laid out for it). */
#define SYMNCCL_PUSH_MAX_CTAS 128

typedef struct {
    const symnccl_devcomm *dc;
    ncclWindow_t win;          /* window holding the push region */
    size_t flags_offset;       /* region start in win (same on every rank) */
    size_t data_offset;        /* slots' offset in win: flags_offset plus
                                  what symnccl_push_region_bytes reports */
    size_t slot_bytes;         /* bytes per slot (16-byte multiple): the
                                  largest slice of one chunk */
    uint64_t *epochs;          /* SYMNCCL_PUSH_MAX_CTAS zeroed counters */
    const void *src;           /* any device memory */
    void *out;                 /* any device memory; may equal src */
    ncclWindow_t out_win;      /* non-NULL: in place on a window, out is at
                                  out_offset (16-byte aligned, same on every
                                  rank) and results are stored there */
    size_t out_offset;
    size_t count;
    ncclDataType_t dtype;
    int op;                    /* SYMNCCL_OP_* */
    int ctas, threads;         /* ctas: fixed for the communicator */
    uint64_t timeout_ns;       /* give up (trap) after waiting this long */
} symnccl_push_args;

/* Bytes of the push region for nranks ranks and slots of slot_bytes: the
 * flag lines (their size goes to *data_offset, page-rounded), then 2 parities
 * x nranks receive slots and 2 x nranks result slots. Zero it before use. */
size_t symnccl_push_region_bytes(int nranks, size_t slot_bytes,
                                 size_t *data_offset);
cudaError_t symnccl_push_allreduce(const symnccl_push_args *args,
                                   cudaStream_t stream);

/* ---- benchmark helpers (copy.cu) ---- */

/* dst <- src with 16-byte loads (both 16-byte aligned), `ctas` x 512. */
cudaError_t symnccl_copy(void *dst, const void *src, size_t nbytes, int ctas,
                         cudaStream_t stream);
/* The address through which this GPU reaches `peer`'s copy of the window
 * at offset (ncclGetLsaPointer, read back by the host; synchronous). */
cudaError_t symnccl_lsa_pointer(ncclWindow_t win, size_t offset, int peer,
                                void **out);

#ifdef __cplusplus
}
#endif

#endif /* SYMNCCL_KERNELS_LAUNCH_H */
