// Store-only ("push") all-reduce on NCCL symmetric windows: a two-shot in
// which every byte crosses NVLink as a store, and per-CTA flags replace the
// barriers.
//
// The count is cut into chunks of n * slot elements and a shorter last one.
// For each chunk (slice q = the q-th n-th):
//   1. scatter: rank r stores its slice q into rank q's receive slot
//      [parity][r], for every q != r (peers in rotated order, so the ranks
//      do not all target the same GPU at once), then raises flag 0 at q;
//   2. reduce: rank q waits for flag 0 from every peer, reduces slice q in
//      rank order 0..n-1 (its own part read from its input) and stores the
//      result into every rank: straight into the output when the call is in
//      place on a window (same offset on every rank), else into that rank's
//      result slot [parity][q], then raises flag 1 at every peer;
//   3. gather: rank r waits for flag 1 from every peer and copies the result
//      slots into its output (nothing to do in place on a window).
// Only local memory is ever loaded: no NVLink read round trips, no
// barrier round trips; each phase costs one one-way trip for its flag. The
// scatter of chunk j + 1 is issued before waiting for the results of chunk
// j, so consecutive chunks overlap.
//
// Work split: the 16-byte vectors of a slice are dealt to the CTAs in tiles
// of blockDim.x (deal_first); CTA b of every rank handles the same vectors
// in every phase, every slice and every chunk, so one flag per (phase, CTA,
// source rank) says "CTA b's vectors are there", and CTA b is the only one
// to touch its vectors of any slot. The grid is fixed per communicator (the
// host always launches the same number of CTAs).
//
// Epochs: CTA b keeps a 64-bit counter in local device memory
// (`epochs[b]`), one count per chunk, so graph replays need no host. Chunk
// with epoch e uses parity e & 1 and raises flags to e + 1 (flags only grow;
// waits are for >= e + 1).
//
// Why two parities suffice: rank r scatters chunk e + 2 into q's slot
// (e & 1) only after waiting for q's flag 1 of chunk e + 1 - 1 = e, which q
// raises after it reduced chunk e, i.e. after reading that slot. Rank q
// pushes results of chunk e + 2 into r's result slot only after r's flag 0
// of chunk e + 2, which r raises after its gather of chunk e. In place, q
// stores results into CTA b's vectors of r's input slice q only after r's
// flag 0 of that chunk, which r raises after reading them for its scatter.
// Each of these steps orders CTA b against CTA b of the peer only, which is
// enough because CTA b owns the same vectors of a slot whatever the chunk's
// length (deal_first). Between calls, a rank starts call c + 1 only after
// every one of its CTAs saw every peer's matching CTA finish its last
// reduction of call c.
//
// Reduction: fixed rank order 0..n-1 with the accumulators of reduce.cuh:
// the same bits on every rank, and the same bits as the other algorithms.
// Tails (counts not a multiple of anything) and inputs/outputs that are not
// 16-byte aligned take element-wise paths; slots are always aligned.
//
// A peer that never arrives: polling gives up after `timeout_ns` with a
// message and a trap (a CUDA error instead of a GPU spinning forever).
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

using symnccl::Acc;
using symnccl::finish;
using symnccl::past_deadline;
using symnccl::reduce2;

using symnccl::kMaxRanks;

// Byte stride between the flag lines of two CTAs: one 128-byte line holds
// the flags of up to 16 source ranks.
__host__ __device__ inline size_t flag_line(int n) {
  return ((size_t)n * 8 + 127) / 128 * 128;
}

__device__ __forceinline__ void release_store(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v)
               : "memory");
}

__device__ __forceinline__ uint64_t acquire_load(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];"
               : "=l"(v)
               : "l"(p)
               : "memory");
  return v;
}

// Every thread's stores so far, then flag `phase` of this CTA := v at every
// peer (thread q signals peer q).
__device__ __forceinline__ void signal(ncclWindow_t win, size_t flags_off,
                                       int phase, int me, int n,
                                       uint64_t v) {
  __syncthreads();
  const int q = threadIdx.x;
  if (q < n && q != me) {
    size_t off = flags_off +
                 ((size_t)phase * SYMNCCL_PUSH_MAX_CTAS + blockIdx.x) *
                     flag_line(n) +
                 (size_t)me * 8;
    release_store(static_cast<uint64_t*>(ncclGetLsaPointer(win, off, q)), v);
  }
}

// Until every peer's flag `phase` for this CTA is >= v (thread s waits for
// peer s), then the whole CTA may read what the peers stored before.
__device__ __forceinline__ void wait(const char* my_flags, int phase, int me,
                                     int n, uint64_t v, uint64_t timeout_ns) {
  const int s = threadIdx.x;
  if (s < n && s != me) {
    const uint64_t* f = reinterpret_cast<const uint64_t*>(
        my_flags +
        ((size_t)phase * SYMNCCL_PUSH_MAX_CTAS + blockIdx.x) * flag_line(n) +
        (size_t)s * 8);
    uint64_t start = 0;
    for (uint32_t spins = 0; acquire_load(f) < v; spins++) {
      if (past_deadline(spins, start, timeout_ns)) {
        printf("symnccl: push all_reduce waited more than %llu s for rank "
               "%d (phase %d, epoch %llu): a peer is gone or did not make "
               "the same call\n",
               (unsigned long long)(timeout_ns / 1000000000ull), s, phase,
               (unsigned long long)(v - 1));
        __trap();
      }
    }
  }
  __syncthreads();
}

// One 16-byte vector of T: elements [e, e + len) of p, len <= E; missing
// elements read as zero. `al`: p + e is 16-byte aligned whenever len == E.
template <typename T>
__device__ __forceinline__ uint4 load_vec(const T* p, size_t e, int len,
                                          bool al) {
  constexpr int E = 16 / sizeof(T);
  if (al && len == E) return __ldcg(reinterpret_cast<const uint4*>(p + e));
  union { uint4 v; T t[E]; } u;
  u.v = make_uint4(0, 0, 0, 0);
  for (int i = 0; i < len; i++) u.t[i] = p[e + i];
  return u.v;
}

template <typename T>
__device__ __forceinline__ void store_vec(T* p, size_t e, int len, bool al,
                                          uint4 v) {
  constexpr int E = 16 / sizeof(T);
  if (al && len == E) {
    *reinterpret_cast<uint4*>(p + e) = v;
    return;
  }
  union { uint4 v; T t[E]; } u;
  u.v = v;
  for (int i = 0; i < len; i++) p[e + i] = u.t[i];
}

// Geometry of one chunk: full chunks of chunk_elems, then a shorter last
// one (so the last reduce and gather, which overlap nothing, are short).
struct Run {
  size_t c0;     // first element of the chunk
  size_t slice;  // elements per slice (a whole number of vectors)
  size_t nv;     // vectors per slice
};

__device__ __forceinline__ Run chunk_run(size_t j, size_t chunk_elems,
                                         size_t count, int n, int E) {
  Run r;
  r.c0 = j * chunk_elems;
  size_t cj = count - r.c0 < chunk_elems ? count - r.c0 : chunk_elems;
  size_t per = (cj + n - 1) / n;
  r.slice = (per + E - 1) / E * E;
  r.nv = r.slice / E;
  return r;
}

// Which vectors of a slice (or slot) this thread handles: they are dealt to
// the CTAs in tiles of blockDim.x (8 KiB at 512 threads), tile k to CTA
// k % gridDim.x, thread i taking vector i of the tile: vectors first,
// first + step, ... (< nv). Which CTA owns a vector depends on its position
// only, not on the slice length, so CTA b handles the same vectors of a
// slot in a short last chunk as in a full one: the two-parity argument
// above orders CTA b only against CTA b of the peers and needs exactly
// that. (Cutting each chunk into gridDim.x contiguous runs broke it: the
// short last chunk's runs lay across other CTAs' runs of chunk nch - 3, so
// CTA b could overwrite a receive slot that another CTA of the peer had
// not yet reduced; benchmarks/NOTES.md, 15.)
__device__ __forceinline__ size_t deal_first() {
  return (size_t)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ size_t deal_step() {
  return (size_t)gridDim.x * blockDim.x;
}

// Valid elements of vector v of slice q (0 when past the end).
__device__ __forceinline__ int vec_len(const Run& r, int q, size_t v,
                                       size_t count, int E) {
  size_t e = r.c0 + q * r.slice + v * E;
  if (e >= count) return 0;
  return count - e < (size_t)E ? (int)(count - e) : E;
}

// to[v * E ..] <- from[v * E ..] for this CTA's vectors of one slice (U
// vectors per thread in flight). Scatter: from = input (any alignment),
// to = a peer's slot, written in whole vectors (`whole`). Gather: from = a
// slot, to = the output, valid elements only.
template <typename T, int U>
__device__ __forceinline__ void copy_run(const Run& r, int q, const T* from,
                                         bool from_al, T* to, bool to_al,
                                         bool whole, size_t count) {
  constexpr int E = 16 / sizeof(T);
  const size_t step = deal_step();
  for (size_t v = deal_first(); v < r.nv; v += U * step) {
    uint4 x[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      size_t vv = v + u * step;
      int len = vv < r.nv ? vec_len(r, q, vv, count, E) : 0;
      if (len > 0) x[u] = load_vec(from, vv * E, len, from_al);
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      size_t vv = v + u * step;
      int len = vv < r.nv ? vec_len(r, q, vv, count, E) : 0;
      if (len > 0) store_vec(to, vv * E, whole ? E : len, to_al, x[u]);
    }
  }
}

template <typename T, int N>
__global__ void __launch_bounds__(512)
    push_allreduce(ncclDevComm dc, ncclWindow_t win, size_t flags_off,
                   size_t data_off, size_t slot_bytes, uint64_t* epochs,
                   const T* src, T* out, ncclWindow_t out_win,
                   size_t out_off, size_t count, int op,
                   uint64_t timeout_ns) {
  using A = typename Acc<T>::type;
  constexpr int E = 16 / sizeof(T);
  // vectors per thread in flight: as many as the accumulators allow without
  // spilling (acc is U x E values of Acc<T>)
  constexpr int U = N == 0 ? 1 : N <= 4 ? (E >= 16 ? 2 : 4) : (E >= 16 ? 1 : 2);
  constexpr int UC = 4;   // the same for the plain copies
  const int n = N > 0 ? N : dc.lsaSize;
  const int me = dc.lsaRank;
  const size_t chunk_elems = slot_bytes / sizeof(T) * n;
  const size_t nch = (count + chunk_elems - 1) / chunk_elems;
  const bool src_al = (reinterpret_cast<uintptr_t>(src) & 15) == 0;
  const bool out_al = (reinterpret_cast<uintptr_t>(out) & 15) == 0;
  const size_t step = deal_step();

  __shared__ uint64_t s_epoch;
  if (threadIdx.x == 0) s_epoch = epochs[blockIdx.x];
  __syncthreads();
  const uint64_t e0 = s_epoch;

  // Receive slots [parity][source], then result slots [parity][slice].
  const size_t res_off = data_off + 2 * (size_t)n * slot_bytes;
  const char* my_flags =
      static_cast<const char*>(ncclGetLsaPointer(win, flags_off, me));
  const char* my_data =
      static_cast<const char*>(ncclGetLsaPointer(win, data_off, me));
  // Where results go on every rank: the output in place, else result slots.
  const symnccl::LsaPtrs<N> dst =
      out_win != nullptr ? symnccl::lsa_ptrs<N>(out_win, out_off, n)
                         : symnccl::lsa_ptrs<N>(win, res_off, n);

  // 3. gather chunk jc's results: complete once every peer's flag 1
  // reached e (the chunk's epoch + 1); in place they are already in out.
  auto gather = [&](size_t jc, uint64_t e) {
    wait(my_flags, 1, me, n, e, timeout_ns);
    if (out_win != nullptr) return;
    const Run rp = chunk_run(jc, chunk_elems, count, n, E);
    const size_t pp = (e - 1) & 1;
    for (int q = 0; q < n; q++)
      if (q != me)
        copy_run<T, UC>(rp, q,
                        reinterpret_cast<const T*>(
                            my_data + (res_off - data_off) +
                            (pp * n + q) * slot_bytes),
                        true, out + rp.c0 + q * rp.slice, out_al, false,
                        count);
  };

  for (size_t j = 0; j < nch; j++) {
    const uint64_t e = e0 + j;
    const size_t par = e & 1;
    const Run r = chunk_run(j, chunk_elems, count, n, E);

    // 1. scatter my slices into their owners' receive slots
    for (int k = 1; k < n; k++) {
      const int q = (me + k) % n;
      char* slot = static_cast<char*>(ncclGetLsaPointer(
          win, data_off + (par * n + me) * slot_bytes, q));
      copy_run<T, UC>(r, q, src + r.c0 + q * r.slice, src_al,
                      reinterpret_cast<T*>(slot), true, true, count);
    }
    signal(win, flags_off, 0, me, n, e + 1);

    // 3 (previous chunk), overlapping this chunk's scatter
    if (j > 0) gather(j - 1, e);

    // 2. reduce my slice (rank order) and push the result everywhere
    wait(my_flags, 0, me, n, e + 1, timeout_ns);
    const T* own = src + r.c0 + me * r.slice;
    const size_t res_base =
        out_win != nullptr ? (r.c0 + me * r.slice) * sizeof(T)
                           : (par * n + me) * slot_bytes;
    for (size_t v = deal_first(); v < r.nv; v += U * step) {
      A acc[U][E];
      int lens[U];
#pragma unroll
      for (int u = 0; u < U; u++) {
        size_t vv = v + u * step;
        lens[u] = vv < r.nv ? vec_len(r, me, vv, count, E) : 0;
      }
#pragma unroll
      for (int q = 0; q < (N > 0 ? N : kMaxRanks); q++) {
        if (N == 0 && q >= n) break;
        uint4 x[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
          size_t vv = v + u * step;
          if (lens[u] > 0)
            x[u] = q == me
                       ? load_vec(own, vv * E, lens[u], src_al)
                       : __ldcg(reinterpret_cast<const uint4*>(
                                    my_data + (par * n + q) * slot_bytes) +
                                vv);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
          union { uint4 v; T t[E]; } w;
          w.v = x[u];
#pragma unroll
          for (int i = 0; i < E; i++)
            acc[u][i] = q == 0 ? Acc<T>::to(w.t[i])
                               : reduce2(op, acc[u][i], Acc<T>::to(w.t[i]));
        }
      }
#pragma unroll
      for (int u = 0; u < U; u++) {
        if (lens[u] == 0) continue;
        size_t vv = v + u * step;
        union { uint4 v; T t[E]; } w;
#pragma unroll
        for (int i = 0; i < E; i++) w.t[i] = finish<T>(op, acc[u][i], n);
        if (out_win == nullptr)   // mine straight into my output
          store_vec(out + r.c0 + me * r.slice, vv * E, lens[u], out_al, w.v);
#pragma unroll
        for (int q = 0; q < (N > 0 ? N : kMaxRanks); q++) {
          if (N == 0 && q >= n) break;
          if (out_win == nullptr && q == me) continue;
          // in place the destination is output memory: valid elements only
          // (out_off is 16-byte aligned); slots take whole vectors
          store_vec(reinterpret_cast<T*>(dst.p[q] + res_base), vv * E,
                    out_win != nullptr ? lens[u] : E, true, w.v);
        }
      }
    }
    signal(win, flags_off, 1, me, n, e + 1);
  }

  // 3 (last chunk)
  if (nch > 0) gather(nch - 1, e0 + nch);
  if (threadIdx.x == 0) epochs[blockIdx.x] = e0 + nch;
}

template <typename T, int N>
cudaError_t launch_t(const symnccl_push_args& a, cudaStream_t stream) {
  push_allreduce<T, N><<<a.ctas, a.threads, 0, stream>>>(
      a.dc->dc, a.win, a.flags_offset, a.data_offset, a.slot_bytes,
      a.epochs, static_cast<const T*>(a.src), static_cast<T*>(a.out),
      a.out_win, a.out_offset, a.count, a.op, a.timeout_ns);
  return cudaGetLastError();
}

}  // namespace

extern "C" size_t symnccl_push_region_bytes(int nranks, size_t slot_bytes,
                                            size_t* data_offset) {
  size_t flags = 2 * (size_t)SYMNCCL_PUSH_MAX_CTAS * flag_line(nranks);
  flags = (flags + 4095) / 4096 * 4096;
  if (data_offset != nullptr) *data_offset = flags;
  return flags + 4 * (size_t)nranks * slot_bytes;
}

extern "C" cudaError_t symnccl_push_allreduce(const symnccl_push_args* a,
                                              cudaStream_t stream) {
  if (a->dc->dc.lsaSize > kMaxRanks || a->threads > 512 ||
      a->threads % 32 != 0 || a->threads < a->dc->dc.lsaSize ||
      a->ctas > SYMNCCL_PUSH_MAX_CTAS ||
      a->slot_bytes % 16 != 0 ||
      (a->out_win != nullptr && a->out_offset % 16 != 0))
    return cudaErrorInvalidValue;
  return symnccl::dispatch(a->dtype, a->dc->dc.lsaSize, [&](auto t, auto n) {
    return launch_t<decltype(t), decltype(n)::value>(*a, stream);
  });
}
