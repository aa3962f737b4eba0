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

#ifdef __cplusplus
}
#endif

#endif /* SYMNCCL_KERNELS_LAUNCH_H */
