/* The runtime's base, below every other runtime file and free of the
 * Python API: a failure as a value (sn_err: sn_fail fills it; the Python
 * face raises it, python/errors.c's sn_raise) and a stream's capture id. */
#include "runtime.h"

#include <stdarg.h>
#include <stdio.h>

int
sn_fail(sn_err *e, cudaError_t cuda, ncclResult_t nccl, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
    va_end(ap);
    e->cuda = cuda;
    e->nccl = nccl;
    e->kind = SN_ERR_RUNTIME;
    return -1;
}

int
sn_fail_no_memory(sn_err *e)
{
    sn_fail(e, cudaSuccess, ncclSuccess, "out of memory");
    e->kind = SN_ERR_NO_MEMORY;
    return -1;
}

cudaError_t
sn_capture_id(cudaStream_t s, unsigned long long *id)
{
    enum cudaStreamCaptureStatus cs;
    unsigned long long i = 0;
    cudaError_t e = cudaStreamGetCaptureInfo(s, &cs, &i, NULL, NULL, NULL,
                                             NULL);
    *id = e == cudaSuccess && cs == cudaStreamCaptureStatusActive ? i : 0;
    return e;
}
