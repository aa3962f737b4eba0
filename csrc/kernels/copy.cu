// Plain device-to-device copy kernel, and a helper that reads a window's
// LSA pointer for the host. Used by the benchmark's NVLink ceiling
// ("nvlink:copy_kernel": pull a peer's window over NVLink with ordinary
// 16-byte loads) and for nothing else.
#include <cstdint>

#include <nccl.h>
#include <nccl_device.h>

#include "launch.h"

SYMNCCL_BEGIN
namespace {

__global__ void __launch_bounds__(512)
    copy_kernel(char* dst, const char* src, size_t nbytes) {
  const size_t nvec = nbytes / 16;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  constexpr int U = 4;
  size_t v = first;
  for (; v + (U - 1) * stride < nvec; v += U * stride) {
    uint4 r[U];
#pragma unroll
    for (int u = 0; u < U; u++)
      r[u] = __ldcg(reinterpret_cast<const uint4*>(src) + v + u * stride);
#pragma unroll
    for (int u = 0; u < U; u++)
      reinterpret_cast<uint4*>(dst)[v + u * stride] = r[u];
  }
  for (; v < nvec; v += stride)
    reinterpret_cast<uint4*>(dst)[v] =
        __ldcg(reinterpret_cast<const uint4*>(src) + v);
  for (size_t b = nvec * 16 + first; b < nbytes; b += stride) dst[b] = src[b];
}

__global__ void lsa_pointer(ncclWindow_t win, size_t off, int peer,
                            void** out) {
  *out = ncclGetLsaPointer(win, off, peer);
}

}  // namespace
SYMNCCL_END

cudaError_t snk_copy(void* dst, const void* src, size_t nbytes, int ctas,
                     cudaStream_t stream) {
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) &
       15) != 0)
    return cudaErrorInvalidValue;
  if (nbytes == 0) return cudaSuccess;
  symnccl::copy_kernel<<<ctas, 512, 0, stream>>>(static_cast<char*>(dst),
                                        static_cast<const char*>(src), nbytes);
  return cudaGetLastError();
}

cudaError_t snk_lsa_pointer(ncclWindow_t win, size_t offset, int peer,
                            void** out) {
  void** d = nullptr;
  cudaError_t e = cudaMalloc(&d, sizeof(void*));
  if (e != cudaSuccess) return e;
  symnccl::lsa_pointer<<<1, 1>>>(win, offset, peer, d);
  e = cudaGetLastError();
  if (e == cudaSuccess)
    e = cudaMemcpy(out, d, sizeof(void*), cudaMemcpyDeviceToHost);
  cudaFree(d);
  return e;
}
