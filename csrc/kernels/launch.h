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
enum { SYMNCCL_ALGO_ONE_SHOT = 1, SYMNCCL_ALGO_TWO_SHOT = 2 };

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

#ifdef __cplusplus
}
#endif

#endif /* SYMNCCL_KERNELS_LAUNCH_H */
