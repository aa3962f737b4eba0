// Helpers shared by the packet kernels (ll_allreduce.cu, ll128_allreduce.cu):
// 8-byte words of a T array of any alignment and length, and the clock
// their bounded waits read.
#ifndef SYMNCCL_KERNELS_PACKETS_CUH
#define SYMNCCL_KERNELS_PACKETS_CUH

#include <cstddef>
#include <cstdint>

namespace symnccl {

__device__ __forceinline__ uint64_t global_timer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The 8 bytes [8i, 8i + 8) of a T array of `count` elements; bytes past the
// end read as zero. `aligned`: p is 8-byte aligned.
template <typename T>
__device__ __forceinline__ uint64_t load8(const T* p, size_t i, size_t count,
                                          bool aligned) {
  constexpr int K = 8 / sizeof(T);
  if (aligned && (i + 1) * K <= count)
    return *reinterpret_cast<const uint64_t*>(p + i * K);
  union { uint64_t u; T t[K]; } v;
  v.u = 0;
  for (int k = 0; k < K; k++)
    if (i * K + k < count) v.t[k] = p[i * K + k];
  return v.u;
}

template <typename T>
__device__ __forceinline__ void store8(T* p, size_t i, size_t count,
                                       bool aligned, uint64_t w) {
  constexpr int K = 8 / sizeof(T);
  if (aligned && (i + 1) * K <= count) {
    *reinterpret_cast<uint64_t*>(p + i * K) = w;
    return;
  }
  union { uint64_t u; T t[K]; } v;
  v.u = w;
  for (int k = 0; k < K; k++)
    if (i * K + k < count) p[i * K + k] = v.t[k];
}

}  // namespace symnccl

#endif  // SYMNCCL_KERNELS_PACKETS_CUH
