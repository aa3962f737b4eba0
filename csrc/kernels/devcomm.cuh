// The device-communicator holder shared by the .cu files (C++ only).
#ifndef SYMNCCL_KERNELS_DEVCOMM_CUH
#define SYMNCCL_KERNELS_DEVCOMM_CUH

#include <nccl.h>
#include <nccl_device.h>

#include "launch.h"

struct symnccl_devcomm {
  ncclDevComm dc;
  int requested_multimem;
};

// Every kernel's launch. With a.pdl, as a programmatic dependent launch
// (PDL): its CTAs may be scheduled while the previous kernel on the stream
// drains, so the launch latency overlaps it; the kernel waits for that
// kernel's completion and memory at entry (primitives.cuh, pdl_wait), before
// it reads its inputs or its call counter, and lets the next kernel launch
// right after that wait only where the loaded NCCL's kernels wait too
// (a.pdl_early; else at its completion). Captured into CUDA graphs as a
// programmatic edge.
// (Internal linkage: the objects of several NCCL minors are joined into
// one, whose only global symbol is each minor's table.)
static inline cudaError_t symnccl_launch_kernel(
    void (*kernel)(ncclDevComm, const symnccl_kargs), const symnccl_kargs& a,
    cudaStream_t stream) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(a.ctas);
  cfg.blockDim = dim3(a.threads);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = a.pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, a.dc->dc, a);
}

#endif  // SYMNCCL_KERNELS_DEVCOMM_CUH
