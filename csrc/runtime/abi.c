/* The kernels' NCCL ABI: which build of the CUDA C++ side this process uses.
 *
 * setup.py compiles the kernels once per NCCL release of NCCL_HEADERS,
 * each against that release's headers (launch.h); one build may serve
 * several minors (nccl_policy.c: a library takes a device communicator of
 * older headers where it carries a conversion for them). The build for the
 * loaded libnccl is chosen once, when the module is imported (the newest
 * that may run on it), and the C entry points of launch.h call through its
 * table.
 */
#include "runtime.h"

#include <dlfcn.h>
#include <stdio.h>

#ifndef SYMNCCL_NCCL_BUILDS
#error "setup.py defines SYMNCCL_NCCL_BUILDS(X): the NCCL minors built"
#endif

#define BUILD_(minor) &symnccl_kernels_2_##minor,
static const symnccl_kernels *const builds[] = {
    SYMNCCL_NCCL_BUILDS(BUILD_) NULL};
#undef BUILD_

#define N_BUILDS ((int)(sizeof(builds) / sizeof(builds[0])) - 1)

/* The build in use: one libnccl per process, so one table. */
static const symnccl_kernels *K;
/* The loaded libnccl's NCCL_VERSION_CODE. */
static int runtime;

/* Where the loaded libnccl lies, for messages. */
static const char *
library_path(void)
{
    Dl_info info;
    if (dladdr((void *)ncclGetVersion, &info) != 0 && info.dli_fname != NULL)
        return info.dli_fname;
    return "libnccl.so.2";
}

/* The warning of sn_abi_multi_gpu_caveat for the build in use, or empty
 * when that pair has passed on two GPUs. */
static char caveat[600];

int
sn_abi_select(int nccl_version_code, char *msg, size_t size)
{
    int heads[N_BUILDS > 0 ? N_BUILDS : 1];
    char why[600];
    runtime = nccl_version_code;
    K = NULL;
    for (int i = 0; i < N_BUILDS; i++)
        heads[i] = builds[i]->nccl_headers;
    const int i = sn_nccl_pick_build(runtime, heads, N_BUILDS, why,
                                     sizeof(why));
    if (i < 0) {
        /* symnccl would run without its kernels: it does not run at all */
        snprintf(msg, size, "%s (libnccl: %s)", why, library_path());
        return -1;
    }
    K = builds[i];
    if (sn_nccl_multi_gpu_caveat(runtime, K->nccl_headers, caveat,
                                 sizeof(caveat)) == NULL)
        caveat[0] = '\0';
    return 0;
}

int
sn_abi_runtime(void)
{
    return runtime;
}

int
sn_abi_headers(void)
{
    return K != NULL ? K->nccl_headers : 0;
}

int
sn_abi_build(int i, int *minor, int *headers)
{
    if (i < 0 || i >= N_BUILDS)
        return 0;
    *minor = builds[i]->nccl_minor;
    *headers = builds[i]->nccl_headers;
    return 1;
}

int
sn_abi_minor(void)
{
    return K != NULL ? K->nccl_minor : -1;
}

const char *
sn_abi_multi_gpu_caveat(int minor)
{
    if (K == NULL || K->nccl_minor != minor || caveat[0] == '\0')
        return NULL;
    return caveat;
}

/* ------------------------------------------------------------------ */
/* launch.h's entry points. Import fails before any of them can be reached
 * without a table (symnccl/__init__.py checks the loaded NCCL first). */

cudaError_t
symnccl_launch(const symnccl_kargs *a, cudaStream_t stream)
{
    return K->launch(a, stream);
}

size_t
symnccl_packet_max_count(int kernel, size_t row_bytes, size_t itemsize,
                         int nranks)
{
    return K->packet_max_count(kernel, row_bytes, itemsize, nranks);
}

size_t
symnccl_push_region_bytes(int nranks, size_t slot_bytes, size_t *data_offset)
{
    return K->push_region_bytes(nranks, slot_bytes, data_offset);
}

cudaError_t
symnccl_lsa_layout_ok(ncclWindow_t win, int nranks, int *ok)
{
    return K->lsa_layout_ok(win, nranks, ok);
}

ncclResult_t
symnccl_devcomm_create(ncclComm_t comm, int lsa_barrier_count,
                       int request_multimem, symnccl_devcomm **out)
{
    return K->devcomm_create(comm, lsa_barrier_count, request_multimem, out);
}

ncclResult_t
symnccl_devcomm_destroy(ncclComm_t comm, symnccl_devcomm *dc)
{
    return K->devcomm_destroy(comm, dc);
}

void
symnccl_devcomm_free(symnccl_devcomm *dc)
{
    K->devcomm_free(dc);
}

void
symnccl_devcomm_info(const symnccl_devcomm *dc, int *lsa_size, int *lsa_rank,
                     int *has_multimem)
{
    K->devcomm_info(dc, lsa_size, lsa_rank, has_multimem);
}

ncclResult_t
symnccl_comm_properties(ncclComm_t comm, int *device_api, int *multimem)
{
    return K->comm_properties(comm, device_api, multimem);
}

cudaError_t
symnccl_copy(void *dst, const void *src, size_t nbytes, int ctas,
             cudaStream_t stream)
{
    return K->copy(dst, src, nbytes, ctas, stream);
}

cudaError_t
symnccl_lsa_pointer(ncclWindow_t win, size_t offset, int peer, void **out)
{
    return K->lsa_pointer(win, offset, peer, out);
}

ncclResult_t
symnccl_loopback_devcomm(int rank, int nranks, symnccl_devcomm **out)
{
    return K->loopback_devcomm(rank, nranks, out);
}

cudaError_t
symnccl_loopback_window(char *flat_base, int rank, ncclWindow_t *out)
{
    return K->loopback_window(flat_base, rank, out);
}

void
symnccl_loopback_window_free(ncclWindow_t win)
{
    K->loopback_window_free(win);
}
