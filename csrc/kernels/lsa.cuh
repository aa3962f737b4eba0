// Load kernels on NCCL symmetric windows, between barriers (Barrier,
// primitives.cuh: per-CTA flags with a bounded wait):
//
// one_shot: every rank loads every peer's whole input over NVLink and
//   writes the reduced result locally. Moves (n-1)*S bytes per rank.
//   Barriers: entry (peers' inputs are ready), exit (no peer still reads
//   mine). In place (out is my own part of the window), peers read the very
//   elements being overwritten: the result goes to local scratch and each
//   thread copies its own elements back after the exit barrier.
//
// two_shot: reduce-scatter by loads, then all-gather by stores to peers.
//   Slice q = [q*L, (q+1)*L) with L a whole number of 16-byte vectors.
//   Rank r reduces slice r from every peer's input and stores each result
//   vector into every rank's "mid" buffer (nobody else reads or writes
//   slice r). In place on a window the mid buffer is the input itself;
//   otherwise it is the staging window and each rank copies the result out
//   locally after the exit barrier. Moves 2*(n-1)/n*S per rank over NVLink.
//   Barriers: entry (inputs ready, previous kernel done everywhere) and exit
//   (release/acquire: every pushed result landed); no middle barrier.
//
// one_shot_reduce (to a.root), one_shot_broadcast (from a.root): one_shot's
//   skeleton. reduce: every rank's input is in its window at the entry
//   barrier; the root alone reduces, with one_shot's loads and order (the
//   bits of the all-reduce); the exit barrier keeps the windows until it
//   has. broadcast: the root's input is in its window at the entry
//   barrier; every other rank loads it into its output; the exit barrier
//   keeps the root's window until they have. The host runs broadcast on
//   bytes (SYMNCCL_DT_BYTES).
//
// Staging: when the input is not in a window, src != nullptr and each CTA
// first copies its share of src into the (staging) window; the per-CTA
// barriers make that share visible to the same CTA on every peer, because
// the element-to-CTA mapping is identical in every phase and on every rank.
//
// Requirements: every rank launches the same grid (the host derives it from
// count and nranks only); grid <= SYMNCCL_MAX_CTAS; barrier line =
// blockIdx.x; all ranks in one LSA team. The window offsets are equal on
// all ranks. 16-byte vectors when window offsets, src and out are 16-byte
// aligned, else element-wise; tails element-wise (load_pack/store_pack).
// World size is a run-time value; the peers' loads are in flight a batch
// of peers at a time (reduce_peers).
#ifndef SYMNCCL_KERNELS_LSA_CUH
#define SYMNCCL_KERNELS_LSA_CUH

#include "primitives.cuh"

SYMNCCL_BEGIN

// 16-byte vectors per thread per loop iteration: loads in flight per peer.
// Two for 1-byte types, whose 16 fp32 accumulators per vector leave no
// registers for more.
template <typename T>
constexpr int lsa_unroll() {
  return sizeof(T) == 1 ? 2 : 4;
}

// Vector v of this thread's share, or the partial one at the end:
// elements [v*E, min(v*E + E, count)) of src into dst (any alignment).
template <typename T>
__device__ __forceinline__ void copy_vec(const T* src, T* dst, size_t v,
                                        size_t count, bool aligned) {
  store_pack<16>(dst, v, count, aligned, load_pack<16>(src, v, count, aligned));
}

// Vectors [v, v + U*stride) step stride of the whole input, reduced from
// every peer into dst + ... (dst: local memory). The full, aligned batch
// takes reduce_peers; anything else the tail-safe path.
template <typename T, int U>
__device__ __forceinline__ void reduce_vectors(const Peers& in, int n,
                                               size_t v, size_t stride,
                                               size_t nvec, size_t nfull,
                                               size_t count, bool aligned,
                                               int op, T* dst) {
  constexpr int E = Pack<T, 16>::kElems;
  if (v + (U - 1) * stride < nfull) {
    uint4 res[U];
    reduce_peers<T, U>(in, n, v * 16, stride * 16, op, res);
#pragma unroll
    for (int u = 0; u < U; u++)
      *reinterpret_cast<uint4*>(dst + (v + u * stride) * E) = res[u];
    return;
  }
  for (int u = 0; u < U && v + u * stride < nvec; u++)
    store_pack<16>(dst, v + u * stride, count, aligned,
                   reduce_peers_tail<T>(in, n, v + u * stride, count,
                                        aligned, op));
}

// The one-shot skeleton: what is staged, who reduces or loads, between the
// entry and exit barriers.
enum class OneShot { kAllReduce, kReduce, kBroadcast };

template <typename T, OneShot kMode>
__device__ __forceinline__ void one_shot_body(const ncclDevComm& dc,
                                              const symnccl_kargs& a) {
  constexpr int E = Pack<T, 16>::kElems;
  constexpr int U = lsa_unroll<T>();
  const int n = dc.lsaSize;
  const int me = dc.lsaRank;
  const Entry en = enter(a, me, n);
  const uint64_t e = en.epoch;
  const Barrier bar = Barrier::of(a, me, n);
  const Peers in = Peers::of(a.win, a.win_offset);
  T* mine = reinterpret_cast<T*>(in(me));
  const T* src = static_cast<const T*>(a.src);
  T* out = static_cast<T*>(a.out);
  const size_t count = a.count;
  const bool aligned = ((a.win_offset | reinterpret_cast<uintptr_t>(out) |
                         reinterpret_cast<uintptr_t>(src)) &
                        15) == 0;
  const size_t nvec = (count + E - 1) / E;
  const size_t nfull = aligned ? count / E : 0;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const bool root = me == a.root;
  // In place, peers still read the elements this rank would overwrite:
  // reduce into the local scratch, and copy back after the exit barrier
  // (each thread copies what it computed, so no extra synchronisation).
  // (reduce and broadcast are never in place on a window: the host stages
  // their input.)
  T* dst = a.in_place ? static_cast<T*>(a.scratch) : out;

  // the input into my window (broadcast: the root's, also into its out)
  if (src != nullptr && en.ok && (kMode != OneShot::kBroadcast || root))
    for (size_t v = first; v < nvec; v += stride) {
      const uint4 w = load_pack<16>(src, v, count, aligned);
      store_pack<16>(mine, v, count, aligned, w);
      if (kMode == OneShot::kBroadcast && out != src)
        store_pack<16>(out, v, count, aligned, w);
    }
  if (!bar.sync(e + 1, a, me, n, en.ok)) return;

  if (kMode == OneShot::kAllReduce || (kMode == OneShot::kReduce && root))
    for (size_t v = first; v < nvec; v += U * stride)
      reduce_vectors<T, U>(in, n, v, stride, nvec, nfull, count, aligned,
                           a.op, dst);
  if (kMode == OneShot::kBroadcast && !root) {
    const T* from = reinterpret_cast<const T*>(in(a.root));
    for (size_t v = first; v < nvec; v += stride)
      store_pack<16>(out, v, count, aligned,
                     load_pack<16, true>(from, v, count, aligned));
  }
  if (!bar.sync(e + 2, a, me, n)) return;
  if (threadIdx.x == 0) a.epochs[blockIdx.x] = e + 2;
  if (kMode == OneShot::kAllReduce && a.in_place)
    for (size_t v = first; v < nvec; v += stride)
      copy_vec(dst, out, v, count, aligned);
}

template <typename T>
__global__ void __launch_bounds__(512)
    one_shot(ncclDevComm dc, const __grid_constant__ symnccl_kargs a) {
  one_shot_body<T, OneShot::kAllReduce>(dc, a);
}

template <typename T>
__global__ void __launch_bounds__(512)
    one_shot_reduce(ncclDevComm dc, const __grid_constant__ symnccl_kargs a) {
  one_shot_body<T, OneShot::kReduce>(dc, a);
}

template <typename T>
__global__ void __launch_bounds__(512)
    one_shot_broadcast(ncclDevComm dc,
                       const __grid_constant__ symnccl_kargs a) {
  one_shot_body<T, OneShot::kBroadcast>(dc, a);
}

template <typename T>
__global__ void __launch_bounds__(512)
    two_shot(ncclDevComm dc, const __grid_constant__ symnccl_kargs a) {
  constexpr int E = Pack<T, 16>::kElems;
  constexpr int U = lsa_unroll<T>();
  const int n = dc.lsaSize;
  const int me = dc.lsaRank;
  const Entry en = enter(a, me, n);
  const uint64_t e = en.epoch;
  const Barrier bar = Barrier::of(a, me, n);
  const Peers in = Peers::of(a.win, a.win_offset);
  const Peers mid = Peers::of(a.mid_win, a.mid_offset);
  T* mine = reinterpret_cast<T*>(in(me));
  const T* mine_mid = reinterpret_cast<const T*>(mid(me));
  const T* src = static_cast<const T*>(a.src);
  T* out = static_cast<T*>(a.out);
  const size_t count = a.count;
  const bool aligned = ((a.win_offset | a.mid_offset |
                         reinterpret_cast<uintptr_t>(out) |
                         reinterpret_cast<uintptr_t>(src)) &
                        15) == 0;
  // in place in the window: the results land in the input itself
  const bool out_is_mid = a.in_place && a.mid_win == a.win &&
                          a.mid_offset == a.win_offset;
  // Slice: whole vectors, so every slice starts 16-byte aligned.
  const size_t svec = ((count + n - 1) / n + E - 1) / E;
  const size_t nvec = (count + E - 1) / E;
  const size_t nfull = aligned ? count / E : 0;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;

  if (src != nullptr && en.ok)
    for (int q = 0; q < n; q++)
      for (size_t v = q * svec + first; v < (q + 1) * svec && v < nvec;
           v += stride)
        copy_vec(src, mine, v, count, aligned);
  // Entry: every peer's input is in place, and every peer has finished its
  // previous kernel (so nobody still reads the mid buffers pushed to below).
  if (!bar.sync(e + 1, a, me, n, en.ok)) return;

  // My slice, reduced from every peer's input; each result vector is stored
  // into every rank's mid buffer at the same place. Slice `me` is read and
  // written by this rank only (the thread that reads vector v of it from
  // every peer is the one that writes v), so in place needs no scratch.
  const size_t lo = me * svec;
  const size_t hi = lo + svec < nvec ? lo + svec : nvec;
  for (size_t v = lo + first; v < hi; v += U * stride) {
    if (v + (U - 1) * stride < hi && v + (U - 1) * stride < nfull) {
      uint4 res[U];
      reduce_peers<T, U>(in, n, v * 16, stride * 16, a.op, res);
      for (int q = 0; q < n; q++) {
        char* to = mid(q);
#pragma unroll
        for (int u = 0; u < U; u++)
          *reinterpret_cast<uint4*>(to + (v + u * stride) * 16) = res[u];
      }
    } else {
      for (int u = 0; u < U && v + u * stride < hi; u++) {
        const uint4 r = reduce_peers_tail<T>(in, n, v + u * stride, count,
                                             aligned, a.op);
        for (int q = 0; q < n; q++)
          store_pack<16>(reinterpret_cast<T*>(mid(q)), v + u * stride,
                         count, aligned, r);
      }
    }
  }
  // Exit: every push into my mid buffer (by the same CTA index on every
  // rank, which covers exactly the elements this CTA copies below) landed.
  if (!bar.sync(e + 2, a, me, n)) return;
  if (threadIdx.x == 0) a.epochs[blockIdx.x] = e + 2;
  if (out_is_mid) return;
  for (int q = 0; q < n; q++)
    for (size_t v = q * svec + first; v < (q + 1) * svec && v < nvec;
         v += stride)
      copy_vec(mine_mid, out, v, count, aligned);
}

SYMNCCL_END

#endif  // SYMNCCL_KERNELS_LSA_CUH
