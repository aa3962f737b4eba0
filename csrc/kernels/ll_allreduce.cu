// Low-latency ("ll") all-reduce on NCCL symmetric windows: no barrier.
//
// Every rank pushes its input to every peer as LL packets and polls its own
// memory for the peers' packets. A packet is 16 bytes, {data0, flag, data1,
// flag}, written by one 16-byte volatile store: each 8-byte half carries its
// own copy of the flag, so a reader that sees the flag in both halves has
// both halves of the data (NVLink guarantees 8-byte atomicity, not 16). Data
// and "it is there" travel in the same store: one one-way NVLink trip, where
// a barrier-based kernel needs a barrier round trip before it can load.
//
// Receive buffer (in the communicator's staging window, after the staging
// area, same offset on every rank):
//   [slot 0..1][source rank 0..n-1][packet 0..max_packets)   16 bytes each
// Rank r writes packet i of its input into slot s, row r, of every peer.
//
// Epochs: each CTA keeps a 64-bit call counter in local device memory
// (`epochs[blockIdx.x]`), read at kernel start and incremented at the end, so
// graph replays get fresh epochs with no host involvement. Call c uses slot
// c & 1 and flag (c mod (2^32 - 1)) + 1, never 0 (the buffer starts zeroed).
// The grid is fixed per communicator (the host always launches `ctas` CTAs),
// so every CTA counts every call and all counters agree on every rank.
//
// Why two slots are enough and no slot is ever cleared: a rank can only
// finish call c + 1 after receiving packets that peer p sent in call c + 1,
// which p's kernel sends only after its call c has completed (stream order),
// i.e. after p read everything of call c. So when rank r writes slot c & 1
// again (call c + 2), p is done with call c; a stale packet in a slot holds
// the flag of c - 2 (or older), never the one being waited for.
//
// Reduction: fixed rank order 0..n-1, own contribution read from the local
// input, fp32 accumulation for 16-bit and fp8 types: every rank gets the same
// bits. In place is safe: each thread reads its input elements before it
// writes the same elements of the output, and no other thread touches them.
//
// A peer that never arrives: polling gives up after `timeout_ns` (the
// communicator's timeout) with a message and a trap, so a dead peer turns
// into a CUDA error instead of a GPU spinning forever.
#include <cstdint>
#include <cstdio>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <nccl.h>
#include <nccl_device.h>

#include "devcomm.cuh"
#include "launch.h"
#include "packets.cuh"
#include "reduce.cuh"

namespace {

using symnccl::accumulate;
using symnccl::Acc;
using symnccl::finished;
using symnccl::load8;
using symnccl::past_deadline;
using symnccl::store8;

using symnccl::kMaxRanks;

__device__ __forceinline__ void ll_store(char* p, uint64_t data,
                                         uint32_t flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p),
               "r"((uint32_t)data), "r"(flag), "r"((uint32_t)(data >> 32)),
               "r"(flag)
               : "memory");
}

// Spins until both halves of the packet carry `flag`; returns its data.
__device__ __forceinline__ uint64_t ll_wait(const char* p, uint32_t flag,
                                            uint64_t timeout_ns, int from) {
  uint32_t d0, f0, d1, f1;
  uint64_t start = 0;
  for (uint32_t spins = 0;; spins++) {
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(d0), "=r"(f0), "=r"(d1), "=r"(f1)
                 : "l"(p)
                 : "memory");
    if (f0 == flag && f1 == flag) break;
    if (past_deadline(spins, start, timeout_ns)) {
      printf("symnccl: ll all_reduce waited more than %llu s for rank %d "
             "(flag %u): a peer is gone or did not make the same call\n",
             (unsigned long long)(timeout_ns / 1000000000ull), from, flag);
      __trap();
    }
  }
  return (uint64_t)d0 | ((uint64_t)d1 << 32);
}

// One packet's reduction in fixed rank order 0..n-1: `own` is this rank's
// 8 bytes, rank q's arrive at rows + q * row_stride (polled for `flag`).
template <typename T, int N>
__device__ __forceinline__ uint64_t reduce_packet(const char* rows,
                                                  size_t row_stride,
                                                  uint64_t own, int me, int n,
                                                  int op, uint32_t flag,
                                                  uint64_t timeout_ns) {
  typename Acc<T>::type acc[8 / sizeof(T)];
#pragma unroll
  for (int q = 0; q < (N > 0 ? N : kMaxRanks); q++) {
    if (N == 0 && q >= n) break;
    accumulate<T>(acc,
                  q == me ? own
                          : ll_wait(rows + (size_t)q * row_stride, flag,
                                    timeout_ns, q),
                  q, op);
  }
  return finished<T>(acc, op, n);
}

template <typename T, int N>
__global__ void __launch_bounds__(512)
    ll_allreduce(ncclDevComm dc, ncclWindow_t win, size_t ll_off,
                 size_t row_bytes, uint64_t* epochs, const T* in, T* out,
                 size_t count, int op, uint64_t timeout_ns) {
  constexpr int K = 8 / sizeof(T);
  const int n = N > 0 ? N : dc.lsaSize;
  const int me = dc.lsaRank;

  const symnccl::PacketCall call = symnccl::begin_call(epochs, ll_off, n,
                                                       row_bytes);
  const uint32_t flag = call.flag;
  const size_t slot_off = call.slot_off;

  const size_t npk = (count + K - 1) / K;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const bool in_al = (reinterpret_cast<uintptr_t>(in) & 7) == 0;
  const bool out_al = (reinterpret_cast<uintptr_t>(out) & 7) == 0;

  // Push: my packets into row `me` of every peer's slot.
  const symnccl::LsaPtrs<N> row_at =
      symnccl::lsa_ptrs<N>(win, slot_off + (size_t)me * row_bytes, n);
  for (size_t i = first; i < npk; i += stride) {
    uint64_t w = load8(in, i, count, in_al);
#pragma unroll
    for (int q = 0; q < (N > 0 ? N : kMaxRanks); q++) {
      if (N == 0 && q >= n) break;
      if (q != me) ll_store(row_at.p[q] + i * 16, w, flag);
    }
  }

  // Poll my own slot, reduce in rank order, write the result.
  const char* mine = static_cast<const char*>(
      ncclGetLsaPointer(win, slot_off, me));
  for (size_t i = first; i < npk; i += stride)
    store8(out, i, count, out_al,
           reduce_packet<T, N>(mine + i * 16, row_bytes,
                               load8(in, i, count, in_al), me, n, op, flag,
                               timeout_ns));

  symnccl::end_call(epochs, call);
}

// Two-shot in LL packets, for 3+ ranks from a few tens of KiB: each rank
// pushes slice q of its input only to rank q (phase 1), q reduces it as the
// packets arrive and pushes the result to every rank (phase 2), and every
// rank polls for the other slices' results (phase 3). Per rank (n-1)/n of
// the message goes out twice, instead of n-1 whole copies, still with no
// barrier: each phase waits only for packets of the phase before, which
// never wait, so nothing can deadlock.
//
// Slot layout (same slots, epochs and flags as ll_allreduce; a slot holds
// n * row_bytes): phase-1 rows [source rank r] at r * half, phase-2 rows
// [slice q] at (n + q) * half, half = row_bytes / 2 >= 16 * slice packets.
// The slot-reuse argument of the one-shot kernel holds as is: finishing
// call c + 1 needs phase-2 packets of every peer for c + 1, sent only after
// that peer's kernel c completed. Packet (slice q, index j) is read in
// phase 1 and written in phase 3 by the same thread, so in place is safe.
template <typename T, int N>
__global__ void __launch_bounds__(512)
    ll_two_shot(ncclDevComm dc, ncclWindow_t win, size_t ll_off,
                size_t row_bytes, uint64_t* epochs, const T* in, T* out,
                size_t count, int op, uint64_t timeout_ns) {
  constexpr int K = 8 / sizeof(T);
  const int n = N > 0 ? N : dc.lsaSize;
  const int me = dc.lsaRank;

  const symnccl::PacketCall call = symnccl::begin_call(epochs, ll_off, n,
                                                       row_bytes);
  const uint32_t flag = call.flag;
  const size_t slot_off = call.slot_off;
  const size_t half = row_bytes / 2;

  const size_t npk = (count + K - 1) / K;
  const size_t spk = (npk + n - 1) / n;   // packets per slice
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const bool in_al = (reinterpret_cast<uintptr_t>(in) & 7) == 0;
  const bool out_al = (reinterpret_cast<uintptr_t>(out) & 7) == 0;
  const char* mine = static_cast<const char*>(
      ncclGetLsaPointer(win, slot_off, me));

  // 1. slice q of my input -> rank q, row `me` (peers in rotated order)
  for (int k = 1; k < n; k++) {
    const int q = (me + k) % n;
    char* row = static_cast<char*>(
        ncclGetLsaPointer(win, slot_off + (size_t)me * half, q));
    for (size_t j = first; j < spk && q * spk + j < npk; j += stride)
      ll_store(row + j * 16, load8(in, q * spk + j, count, in_al), flag);
  }

  // 2. reduce my slice in rank order, push the result to every rank
  const symnccl::LsaPtrs<N> res_at =
      symnccl::lsa_ptrs<N>(win, slot_off + (size_t)(n + me) * half, n);
  for (size_t j = first; j < spk && me * spk + j < npk; j += stride) {
    const size_t i = me * spk + j;
    const uint64_t r = reduce_packet<T, N>(
        mine + j * 16, half, load8(in, i, count, in_al), me, n, op, flag,
        timeout_ns);
#pragma unroll
    for (int q = 0; q < (N > 0 ? N : kMaxRanks); q++) {
      if (N == 0 && q >= n) break;
      if (q != me) ll_store(res_at.p[q] + j * 16, r, flag);
    }
    store8(out, i, count, out_al, r);
  }

  // 3. every other slice's result
  for (int k = 1; k < n; k++) {
    const int q = (me + k) % n;
    const char* row = mine + (size_t)(n + q) * half;
    for (size_t j = first; j < spk && q * spk + j < npk; j += stride)
      store8(out, q * spk + j, count, out_al,
             ll_wait(row + j * 16, flag, timeout_ns, q));
  }

  symnccl::end_call(epochs, call);
}

template <typename T, int N>
cudaError_t launch_t(const symnccl_ll_args& a, cudaStream_t stream) {
  // the rows must hold the packets (16 bytes per 8 data bytes)
  const size_t npk = (a.count + 8 / sizeof(T) - 1) / (8 / sizeof(T));
  const size_t n = a.dc->dc.lsaSize;
  if (a.two_shot ? (npk + n - 1) / n * 16 > a.row_bytes / 2
                 : npk * 16 > a.row_bytes)
    return cudaErrorInvalidValue;
  if (a.two_shot)
    ll_two_shot<T, N><<<a.ctas, a.threads, 0, stream>>>(
        a.dc->dc, a.win, a.ll_offset, a.row_bytes, a.epochs,
        static_cast<const T*>(a.src), static_cast<T*>(a.out), a.count,
        a.op, a.timeout_ns);
  else
    ll_allreduce<T, N><<<a.ctas, a.threads, 0, stream>>>(
        a.dc->dc, a.win, a.ll_offset, a.row_bytes, a.epochs,
        static_cast<const T*>(a.src), static_cast<T*>(a.out), a.count,
        a.op, a.timeout_ns);
  return cudaGetLastError();
}

}  // namespace

extern "C" cudaError_t symnccl_ll_allreduce(const symnccl_ll_args* a,
                                            cudaStream_t stream) {
  if (a->dc->dc.lsaSize > kMaxRanks || a->threads > 512)
    return cudaErrorInvalidValue;
  return symnccl::dispatch(a->dtype, a->dc->dc.lsaSize, [&](auto t, auto n) {
    return launch_t<decltype(t), decltype(n)::value>(*a, stream);
  });
}

extern "C" size_t symnccl_ll_buffer_bytes(int nranks, size_t max_bytes) {
  return 2 * (size_t)nranks * 2 * max_bytes;
}
