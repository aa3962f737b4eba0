// Helpers shared by the kernels that poll flags instead of using barriers
// (ll_allreduce.cu, ll128_allreduce.cu, push_allreduce.cu): the bounded
// wait's clock, the packet kernels' per-call epoch, 8-byte words of a T
// array of any alignment and length, and their word-wise reduction.
#ifndef SYMNCCL_KERNELS_PACKETS_CUH
#define SYMNCCL_KERNELS_PACKETS_CUH

#include <cstddef>
#include <cstdint>

#include "reduce.cuh"

namespace symnccl {

__device__ __forceinline__ uint64_t global_timer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// For a polling loop: true once it has spun for more than timeout_ns (the
// clock is read every 1024 spins, starting at the first such read; `start`
// is the loop's, 0 on entry).
__device__ __forceinline__ bool past_deadline(uint32_t spins, uint64_t& start,
                                              uint64_t timeout_ns) {
  if ((spins & 1023) != 1023) return false;
  const uint64_t now = global_timer();
  if (start == 0) {
    start = now;
    return false;
  }
  return now - start > timeout_ns;
}

// This CTA's call of a packet kernel (ll, ll128): the call counter kept in
// device memory, the 32-bit flag (c mod (2^32 - 1)) + 1 of call c (never
// 0, the value of a cleared buffer) and the byte offset of its slot c & 1
// (two slots of n rows of row_bytes after `base`). Store epoch + 1 back at
// the end of the kernel (end_call).
struct PacketCall {
  uint64_t epoch;
  uint32_t flag;
  size_t slot_off;
};

__device__ __forceinline__ PacketCall begin_call(const uint64_t* epochs,
                                                 size_t base, int n,
                                                 size_t row_bytes) {
  __shared__ uint64_t s_epoch;
  if (threadIdx.x == 0) s_epoch = epochs[blockIdx.x];
  __syncthreads();
  PacketCall c;
  c.epoch = s_epoch;
  c.flag = (uint32_t)(c.epoch % 0xFFFFFFFFull) + 1u;
  c.slot_off = base + (c.epoch & 1) * (size_t)n * row_bytes;
  return c;
}

// After every thread of the CTA is done with the call.
__device__ __forceinline__ void end_call(uint64_t* epochs,
                                         const PacketCall& c) {
  __syncthreads();
  if (threadIdx.x == 0) epochs[blockIdx.x] = c.epoch + 1;
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

// Rank q's 8-byte word into the accumulators (q == 0 starts them): the
// fixed rank order 0..n-1 of every LSA kernel.
template <typename T>
__device__ __forceinline__ void accumulate(typename Acc<T>::type* acc,
                                           uint64_t w, int q, int op) {
  constexpr int K = 8 / sizeof(T);
  union { uint64_t u; T t[K]; } v;
  v.u = w;
#pragma unroll
  for (int k = 0; k < K; k++)
    acc[k] = q == 0 ? Acc<T>::to(v.t[k])
                    : reduce2(op, acc[k], Acc<T>::to(v.t[k]));
}

// The accumulators as one 8-byte word of T (avg divides by n).
template <typename T>
__device__ __forceinline__ uint64_t finished(const typename Acc<T>::type* acc,
                                             int op, int n) {
  constexpr int K = 8 / sizeof(T);
  union { uint64_t u; T t[K]; } r;
#pragma unroll
  for (int k = 0; k < K; k++) r.t[k] = finish<T>(op, acc[k], n);
  return r.u;
}

}  // namespace symnccl

#endif  // SYMNCCL_KERNELS_PACKETS_CUH
