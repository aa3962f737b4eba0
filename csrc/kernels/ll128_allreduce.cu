// "ll128" all-reduce: the ll kernel's one round, in 128-byte lines that
// carry 120 bytes of data and one 8-byte flag, instead of 16-byte packets
// that carry 8 (ll_allreduce.cu). The link carries 16/15 of the message
// per peer instead of 2x: at 1 MiB on 2 GPUs that is 1.07 MB per direction
// instead of 2.1 MB. On 3+ ranks and larger messages the host launches
// ll128_two_shot instead (ll's packet two-shot in these lines, below).
//
// A line is written by 8 consecutive lanes of one warp with one 16-byte
// volatile store each (lane 8l+7's second word is the flag), so a warp's
// store instruction covers 4 whole, 128-byte aligned lines; the reader
// loads the same 4 lines with one warp-wide 16-byte volatile load and
// accepts them when all 4 flags are current. This relies on NVLink and the
// receiving L2 keeping such a 128-byte line write whole with respect to such
// a 128-byte line read: the property NCCL's LL128 protocol rests on, which
// NCCL enables on NVLink-connected Hopper. It is not a documented CUDA
// memory-model guarantee; tests/_workers/collectives.py checks it with
// random data, poisoned outputs and bitwise comparisons in every dtype
// (a torn line would be a wrong result, not a hang).
//
// Buffer, slots, epochs and flags work as in the ll kernel, in a region and
// epoch array of ll128's own (same layout [slot 0..1][source rank][row],
// the communicator's ll grid, slot c & 1 and 32-bit flag (c mod (2^32 - 1))
// + 1 of call c, here as the word flag << 32 | flag); the two-slot argument
// of ll_allreduce.cu holds unchanged. Own buffers, because the two formats
// cannot share slots: ll looks for its flag in bytes 4-7 and 12-15 of each
// 16 bytes, where a stale ll128 line holds user data, and a data word that
// happens to equal the current flag in both places (bf16 pairs such as
// (1.0, 0.0) read as 16256) would be taken for a fresh packet. The stress
// test hit exactly that while both shared one region.
//
// Reduction: rank order 0..n-1 with the own contribution read from the
// input, fp32 accumulation for 16-bit and fp8 types: the same bits as ll.
// Each lane reads and writes the same words of in and out, so in place is
// safe.
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
constexpr int kWords = 60;        // data words in a warp's 4 lines
constexpr int kBlockBytes = 512;  // 4 lines of 128 bytes

__device__ __forceinline__ void store16(char* p, uint64_t a, uint64_t b) {
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a),
               "l"(b)
               : "memory");
}

// Spins until the 4 lines this warp reads at p (one 16-byte piece per
// lane) all carry `flag`; returns the lane's two words.
__device__ __forceinline__ void wait_lines(const char* p, uint64_t flag,
                                           bool flag_lane, uint64_t& v0,
                                           uint64_t& v1, uint64_t timeout_ns,
                                           int from) {
  uint64_t start = 0;
  for (uint32_t spins = 0;; spins++) {
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];"
                 : "=l"(v0), "=l"(v1)
                 : "l"(p)
                 : "memory");
    if (__all_sync(0xffffffffu, !flag_lane || v1 == flag)) return;
    if (past_deadline(spins, start, timeout_ns)) {
      if ((threadIdx.x & 31) == 0)
        printf("symnccl: ll128 all_reduce waited more than %llu s for rank "
               "%d (flag %u): a peer is gone or did not make the same call\n",
               (unsigned long long)(timeout_ns / 1000000000ull), from,
               (unsigned)flag);
      __trap();
    }
  }
}

// One lane's share of a warp's 4 lines: lane 8l + p carries words 2p and
// 2p + 1 of line l (15 data words each), except p = 7: word 14 and the flag.
struct LinePart {
  bool flag_lane;
  size_t lw;  // first word of the lane in its block
};

__device__ __forceinline__ LinePart line_part() {
  const int lane = threadIdx.x & 31;
  return {(lane & 7) == 7, (size_t)(lane >> 3) * 15 + (size_t)(lane & 7) * 2};
}

// The lane's two words of block b of `in` (the flag lane's second: flag).
template <typename T>
__device__ __forceinline__ void block_words(const T* in, size_t b,
                                            const LinePart& lp, size_t count,
                                            bool al, uint64_t flag,
                                            uint64_t& v0, uint64_t& v1) {
  const size_t w = b * kWords + lp.lw;
  v0 = load8(in, w, count, al);
  v1 = lp.flag_lane ? flag : load8(in, w + 1, count, al);
}

// The lane's words of block b into `out` (nothing past the end).
template <typename T>
__device__ __forceinline__ void put_block(T* out, size_t b, const LinePart& lp,
                                          size_t count, bool al, uint64_t v0,
                                          uint64_t v1) {
  const size_t nw = (count + 8 / sizeof(T) - 1) / (8 / sizeof(T));
  const size_t w = b * kWords + lp.lw;
  if (w < nw) store8(out, w, count, al, v0);
  if (!lp.flag_lane && w + 1 < nw) store8(out, w + 1, count, al, v1);
}

// Block b reduced in rank order 0..n-1: rank q's lines are polled at
// rows + q * row_stride (this lane's 16 bytes), the own from `in`. Returns
// the lane's two result words (the flag lane's second: flag).
template <typename T, int N>
__device__ __forceinline__ void reduce_block(const char* rows,
                                             size_t row_stride, const T* in,
                                             size_t b, const LinePart& lp,
                                             size_t count, bool in_al,
                                             int me, int n, int op,
                                             uint64_t flag,
                                             uint64_t timeout_ns,
                                             uint64_t& r0, uint64_t& r1) {
  using A = typename Acc<T>::type;
  constexpr int K = 8 / sizeof(T);
  A acc0[K], acc1[K];
#pragma unroll
  for (int q = 0; q < (N > 0 ? N : kMaxRanks); q++) {
    if (N == 0 && q >= n) break;
    uint64_t v0, v1;
    if (q == me)
      block_words(in, b, lp, count, in_al, 0, v0, v1);
    else
      wait_lines(rows + (size_t)q * row_stride, flag, lp.flag_lane, v0, v1,
                 timeout_ns, q);
    accumulate<T>(acc0, v0, q, op);
    accumulate<T>(acc1, v1, q, op);
  }
  r0 = finished<T>(acc0, op, n);
  r1 = lp.flag_lane ? flag : finished<T>(acc1, op, n);
}

// One-shot. blockDim.x must be a multiple of 32 (the host rounds the ll
// grid).
template <typename T, int N>
__global__ void __launch_bounds__(512)
    ll128_allreduce(ncclDevComm dc, ncclWindow_t win, size_t ll_off,
                    size_t row_bytes, uint64_t* epochs, const T* in, T* out,
                    size_t count, int op, uint64_t timeout_ns) {
  constexpr int K = 8 / sizeof(T);
  const int n = N > 0 ? N : dc.lsaSize;
  const int me = dc.lsaRank;

  const symnccl::PacketCall call = symnccl::begin_call(epochs, ll_off, n,
                                                       row_bytes);
  const uint64_t flag = (uint64_t)call.flag << 32 | call.flag;
  const size_t slot_off = call.slot_off;

  const LinePart lp = line_part();
  const size_t lane16 = (size_t)(threadIdx.x & 31) * 16;
  const size_t nb = ((count + K - 1) / K + kWords - 1) / kWords;
  const size_t warps = (size_t)gridDim.x * (blockDim.x / 32);
  const size_t wid = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const bool in_al = (reinterpret_cast<uintptr_t>(in) & 7) == 0;
  const bool out_al = (reinterpret_cast<uintptr_t>(out) & 7) == 0;

  // Push: my lines into row `me` of every peer's slot.
  const symnccl::LsaPtrs<N> row_at =
      symnccl::lsa_ptrs<N>(win, slot_off + (size_t)me * row_bytes, n);
  for (size_t b = wid; b < nb; b += warps) {
    uint64_t v0, v1;
    block_words(in, b, lp, count, in_al, flag, v0, v1);
    const size_t at = b * kBlockBytes + lane16;
#pragma unroll
    for (int q = 0; q < (N > 0 ? N : kMaxRanks); q++) {
      if (N == 0 && q >= n) break;
      if (q != me) store16(row_at.p[q] + at, v0, v1);
    }
  }

  // Poll my own slot, reduce in rank order, write the result.
  const char* mine =
      static_cast<const char*>(ncclGetLsaPointer(win, slot_off, me));
  for (size_t b = wid; b < nb; b += warps) {
    uint64_t r0, r1;
    reduce_block<T, N>(mine + b * kBlockBytes + lane16, row_bytes, in, b, lp,
                       count, in_al, me, n, op, flag, timeout_ns, r0, r1);
    put_block(out, b, lp, count, out_al, r0, r1);
  }

  symnccl::end_call(epochs, call);
}

// Two-shot in 128-byte lines, for 3+ ranks (the ll two-shot of
// ll_allreduce.cu with ll128's lines): the blocks are cut into n slices of
// sb consecutive blocks; slice q of every rank's input goes to rank q
// (phase 1), q reduces it as the lines arrive and stores the result to every
// rank (phase 2), and every rank polls for the other slices' results
// (phase 3). Per rank (n-1)/n of the message goes out twice (x 16/15)
// instead of n-1 whole copies, with no barrier: a phase waits only for lines
// of the phase before, which never waits.
//
// Slot layout as ll's two-shot: phase-1 rows [source rank r] at r * half,
// phase-2 rows [slice q] at (n + q) * half, half = row_bytes / 2 >=
// sb * 512. The two-slot argument holds as for ll's two-shot: a rank
// finishes call c + 1 only after some slice owner reduced c + 1, which
// needed phase-1 lines of every rank's kernel c + 1, sent only after that
// kernel's call c completed; so when any rank writes a slot again in c + 2,
// every rank is done with c. One-shot and two-shot calls may alternate on
// the same slots: finishing a one-shot call also needs every rank's lines,
// and both layouts keep each flag in bytes 120-127 of a 128-byte aligned
// line (half is a multiple of 2048), so a stale line of the other kind
// never shows data where a flag is polled. Block (slice q, j) is read in
// phase 1 and written in phase 3 by the same lane (warp j mod warps in
// both), so in place is safe.
template <typename T, int N>
__global__ void __launch_bounds__(512)
    ll128_two_shot(ncclDevComm dc, ncclWindow_t win, size_t ll_off,
                   size_t row_bytes, uint64_t* epochs, const T* in, T* out,
                   size_t count, int op, uint64_t timeout_ns) {
  constexpr int K = 8 / sizeof(T);
  const int n = N > 0 ? N : dc.lsaSize;
  const int me = dc.lsaRank;

  const symnccl::PacketCall call = symnccl::begin_call(epochs, ll_off, n,
                                                       row_bytes);
  const uint64_t flag = (uint64_t)call.flag << 32 | call.flag;
  const size_t slot_off = call.slot_off;
  const size_t half = row_bytes / 2;

  const LinePart lp = line_part();
  const size_t lane16 = (size_t)(threadIdx.x & 31) * 16;
  const size_t nb = ((count + K - 1) / K + kWords - 1) / kWords;
  const size_t sb = (nb + n - 1) / n;  // blocks per slice
  const size_t warps = (size_t)gridDim.x * (blockDim.x / 32);
  const size_t wid = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const bool in_al = (reinterpret_cast<uintptr_t>(in) & 7) == 0;
  const bool out_al = (reinterpret_cast<uintptr_t>(out) & 7) == 0;
  const char* mine =
      static_cast<const char*>(ncclGetLsaPointer(win, slot_off, me));

  // 1. slice q of my input -> rank q, row `me` (peers in rotated order)
  for (int k = 1; k < n; k++) {
    const int q = (me + k) % n;
    char* row = static_cast<char*>(
        ncclGetLsaPointer(win, slot_off + (size_t)me * half, q));
    for (size_t j = wid; j < sb && q * sb + j < nb; j += warps) {
      uint64_t v0, v1;
      block_words(in, q * sb + j, lp, count, in_al, flag, v0, v1);
      store16(row + j * kBlockBytes + lane16, v0, v1);
    }
  }

  // 2. reduce my slice in rank order, store the result to every rank
  const symnccl::LsaPtrs<N> res_at =
      symnccl::lsa_ptrs<N>(win, slot_off + (size_t)(n + me) * half, n);
  for (size_t j = wid; j < sb && me * sb + j < nb; j += warps) {
    const size_t b = me * sb + j;
    const size_t at = j * kBlockBytes + lane16;
    uint64_t r0, r1;
    reduce_block<T, N>(mine + at, half, in, b, lp, count, in_al, me, n, op,
                       flag, timeout_ns, r0, r1);
#pragma unroll
    for (int q = 0; q < (N > 0 ? N : kMaxRanks); q++) {
      if (N == 0 && q >= n) break;
      if (q != me) store16(res_at.p[q] + at, r0, r1);
    }
    put_block(out, b, lp, count, out_al, r0, r1);
  }

  // 3. every other slice's result
  for (int k = 1; k < n; k++) {
    const int q = (me + k) % n;
    const char* row = mine + (size_t)(n + q) * half;
    for (size_t j = wid; j < sb && q * sb + j < nb; j += warps) {
      uint64_t v0, v1;
      wait_lines(row + j * kBlockBytes + lane16, flag, lp.flag_lane, v0, v1,
                 timeout_ns, q);
      put_block(out, q * sb + j, lp, count, out_al, v0, v1);
    }
  }

  symnccl::end_call(epochs, call);
}

// Blocks a launch of `count` elements of `itemsize` bytes needs per row
// (two-shot: per half row).
size_t row_blocks(size_t count, size_t itemsize, int n, int two_shot) {
  const size_t nw = (count * itemsize + 7) / 8;
  const size_t blocks = (nw + kWords - 1) / kWords;
  return two_shot ? (blocks + n - 1) / n : blocks;
}

template <typename T, int N>
cudaError_t launch_t(const symnccl_ll_args& a, cudaStream_t stream) {
  const int n = a.dc->dc.lsaSize;
  if (row_blocks(a.count, sizeof(T), n, a.two_shot) * kBlockBytes >
      (a.two_shot ? a.row_bytes / 2 : a.row_bytes))
    return cudaErrorInvalidValue;
  auto kernel = a.two_shot ? ll128_two_shot<T, N> : ll128_allreduce<T, N>;
  kernel<<<a.ctas, a.threads, 0, stream>>>(
      a.dc->dc, a.win, a.ll_offset, a.row_bytes, a.epochs,
      static_cast<const T*>(a.src), static_cast<T*>(a.out), a.count, a.op,
      a.timeout_ns);
  return cudaGetLastError();
}

}  // namespace

extern "C" size_t symnccl_ll128_max_count(size_t row_bytes, size_t itemsize,
                                          int nranks, int two_shot) {
  const size_t blocks = two_shot ? row_bytes / 2 / kBlockBytes * nranks
                                 : row_bytes / kBlockBytes;
  return blocks * kWords * 8 / itemsize;
}

extern "C" cudaError_t symnccl_ll128_allreduce(const symnccl_ll_args* a,
                                               cudaStream_t stream) {
  if (a->dc->dc.lsaSize > kMaxRanks || a->threads > 512 ||
      a->threads % 32 != 0)
    return cudaErrorInvalidValue;
  return symnccl::dispatch(a->dtype, a->dc->dc.lsaSize, [&](auto t, auto n) {
    return launch_t<decltype(t), decltype(n)::value>(*a, stream);
  });
}
