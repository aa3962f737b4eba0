// LSA all-reduce kernels on NCCL symmetric windows (NCCL 2.28 device API).
//
// one_shot: every rank loads every peer's whole input over NVLink
//   (ncclGetLsaPointer) and writes the reduced result locally.
//   Moves (n-1)*S bytes per rank; best for small messages.
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
// Staging: when the input is not in a window, src != nullptr and each CTA
// first copies its share of src into the (staging) window; the per-CTA
// barriers make that share visible to the same CTA on every peer, because
// element-to-CTA mapping is identical in every phase and on every rank.
//
// Requirements: sm_90+ (built for sm_90/sm_100); every rank launches the
// same grid (the host derives it from count and nranks only); grid <=
// lsaBarrierCount (SN_MAX_CTAS); barrier index = blockIdx.x; all ranks are
// in one LSA team (lsa_size == nranks). The window offset must be equal on
// all ranks. 16-byte vectors when window offset, src and out are 16-byte
// aligned, else a scalar path; tails are scalar.
//
// Reduction: fixed order rank 0..n-1, accumulated in fp32 for 16-bit and
// fp8 types (fp64 for double, wrapping 64-bit for integers), so every rank
// gets bitwise-identical results. World size is a template parameter
// (2, 4, 8) with a generic fallback up to kMaxRanks.
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <nccl.h>
#include <nccl_device.h>

#include "devcomm.cuh"
#include "launch.h"
#include "reduce.cuh"

namespace {

using symnccl::kMaxRanks;
// Vectors per thread per loop iteration: loads in flight per peer.
constexpr int kUnroll = 4;

using symnccl::Acc;
using symnccl::finish;
using symnccl::reduce2;

// ---------------------------------------------------------------- kernel

template <typename T>
struct Vec {
  static constexpr int kElems = 16 / sizeof(T);
};

// Peer base pointers for this kernel's window region, in LSA rank order.
template <int N>
using Peers = symnccl::LsaPtrs<N>;

template <typename T, int N>
__device__ __forceinline__ void reduce_vec(const Peers<N>& peers, int n,
                                           size_t byte_off, int op, T* dst) {
  using A = typename Acc<T>::type;
  constexpr int E = Vec<T>::kElems;
  const int nr = N > 0 ? N : n;
  alignas(16) T v[E];
  A acc[E];
  *reinterpret_cast<uint4*>(v) =
      __ldcg(reinterpret_cast<const uint4*>(peers.p[0] + byte_off));
#pragma unroll
  for (int e = 0; e < E; e++) acc[e] = Acc<T>::to(v[e]);
#pragma unroll
  for (int q = 1; q < (N > 0 ? N : kMaxRanks); q++) {
    if (N == 0 && q >= nr) break;
    *reinterpret_cast<uint4*>(v) =
        __ldcg(reinterpret_cast<const uint4*>(peers.p[q] + byte_off));
#pragma unroll
    for (int e = 0; e < E; e++) acc[e] = reduce2(op, acc[e], Acc<T>::to(v[e]));
  }
#pragma unroll
  for (int e = 0; e < E; e++) dst[e] = finish<T>(op, acc[e], nr);
}

template <typename T, int N>
__device__ __forceinline__ T reduce_one(const Peers<N>& peers, int n,
                                        size_t byte_off, int op) {
  using A = typename Acc<T>::type;
  const int nr = N > 0 ? N : n;
  A acc = Acc<T>::to(*reinterpret_cast<const T*>(peers.p[0] + byte_off));
#pragma unroll
  for (int q = 1; q < (N > 0 ? N : kMaxRanks); q++) {
    if (N == 0 && q >= nr) break;
    acc = reduce2(op, acc,
                  Acc<T>::to(*reinterpret_cast<const T*>(peers.p[q] +
                                                         byte_off)));
  }
  return finish<T>(op, acc, nr);
}

// U full vectors at elements e0, e0 + de, ...: U loads in flight per peer,
// fixed rank order; the results (as raw 16-byte vectors) go to res.
template <typename T, int N, int U>
__device__ __forceinline__ void reduce_batch_regs(const Peers<N>& peers,
                                                  int n, size_t e0, size_t de,
                                                  int op, uint4 (&res)[U]) {
  using A = typename Acc<T>::type;
  constexpr int E = Vec<T>::kElems;
  const int nr = N > 0 ? N : n;
  A acc[U][E];
#pragma unroll
  for (int q = 0; q < (N > 0 ? N : kMaxRanks); q++) {
    if (N == 0 && q >= nr) break;
    uint4 raw[U];
#pragma unroll
    for (int u = 0; u < U; u++)
      raw[u] = __ldcg(reinterpret_cast<const uint4*>(peers.p[q] +
                                                     (e0 + u * de) *
                                                         sizeof(T)));
#pragma unroll
    for (int u = 0; u < U; u++) {
      alignas(16) T v[E];
      *reinterpret_cast<uint4*>(v) = raw[u];
#pragma unroll
      for (int e = 0; e < E; e++)
        acc[u][e] = q == 0 ? Acc<T>::to(v[e])
                           : reduce2(op, acc[u][e], Acc<T>::to(v[e]));
    }
  }
#pragma unroll
  for (int u = 0; u < U; u++) {
    alignas(16) T r[E];
#pragma unroll
    for (int e = 0; e < E; e++) r[e] = finish<T>(op, acc[u][e], nr);
    res[u] = *reinterpret_cast<uint4*>(r);
  }
}

// The same, stored to out + e0 + u * de.
template <typename T, int N, int U>
__device__ __forceinline__ void reduce_batch(const Peers<N>& peers, int n,
                                             size_t e0, size_t de, int op,
                                             T* out) {
  uint4 res[U];
  reduce_batch_regs<T, N, U>(peers, n, e0, de, op, res);
#pragma unroll
  for (int u = 0; u < U; u++)
    *reinterpret_cast<uint4*>(out + e0 + u * de) = res[u];
}

// Reduces the (possibly partial or unaligned) vector at element e into dst.
template <typename T, int N>
__device__ __forceinline__ void reduce_tail(const Peers<N>& peers, int n,
                                            size_t e, size_t count,
                                            bool aligned, int op, T* dst) {
  constexpr int E = Vec<T>::kElems;
  size_t len = count - e < (size_t)E ? count - e : E;
  if (aligned && len == E) {
    reduce_vec<T, N>(peers, n, e * sizeof(T), op, dst + e);
  } else {
    for (size_t i = 0; i < len; i++)
      dst[e + i] = reduce_one<T, N>(peers, n, (e + i) * sizeof(T), op);
  }
}

// Copies elements [e, e + len) (len <= E) of src into dst.
template <typename T>
__device__ __forceinline__ void copy_elems(const T* src, T* dst, size_t e,
                                           size_t len, bool aligned) {
  constexpr int E = Vec<T>::kElems;
  if (aligned && len == E) {
    *reinterpret_cast<uint4*>(dst + e) =
        *reinterpret_cast<const uint4*>(src + e);
  } else {
    for (size_t i = 0; i < len; i++) dst[e + i] = src[e + i];
  }
}

template <typename T, int N>
__global__ void __launch_bounds__(512)
    one_shot(ncclDevComm dc, ncclWindow_t win, size_t win_off, const T* src,
             T* out, T* scratch, size_t count, int op, int in_place) {
  constexpr int E = Vec<T>::kElems;
  constexpr int U = kUnroll;
  const int n = N > 0 ? N : dc.lsaSize;
  const Peers<N> peers = symnccl::lsa_ptrs<N>(win, win_off, n);
  T* mine = static_cast<T*>(ncclGetLsaPointer(win, win_off, dc.lsaRank));
  const bool aligned = ((win_off | reinterpret_cast<uintptr_t>(out) |
                         reinterpret_cast<uintptr_t>(src)) &
                        15) == 0;
  const size_t nvec = (count + E - 1) / E;
  const size_t nfull = aligned ? count / E : 0;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  // In place, peers still read the elements this rank would overwrite:
  // reduce into the local scratch, and copy back after the exit barrier
  // (each thread copies what it computed, so no extra synchronisation).
  T* dst = in_place ? scratch : out;

  ncclLsaBarrierSession<ncclCoopCta> bar{ncclCoopCta(), dc, ncclTeamLsa(dc),
                                         dc.lsaBarrier, blockIdx.x};
  if (src != nullptr) {
    for (size_t v = first; v < nvec; v += stride) {
      size_t e = v * E;
      copy_elems(src, mine, e, count - e < (size_t)E ? count - e : E, aligned);
    }
  }
  bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);

  for (size_t v = first; v < nvec; v += U * stride) {
    if (v + (U - 1) * stride < nfull) {
      reduce_batch<T, N, U>(peers, n, v * E, stride * E, op, dst);
    } else {
      for (int u = 0; u < U && v + u * stride < nvec; u++)
        reduce_tail<T, N>(peers, n, (v + u * stride) * E, count, aligned, op,
                          dst);
    }
  }
  bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
  if (in_place) {
    for (size_t v = first; v < nvec; v += stride) {
      size_t e = v * E;
      copy_elems(scratch, out, e, count - e < (size_t)E ? count - e : E,
                 aligned);
    }
  }
}

template <typename T, int N>
__global__ void __launch_bounds__(512)
    two_shot(ncclDevComm dc, ncclWindow_t win, size_t win_off,
             ncclWindow_t mid_win, size_t mid_off, const T* src, T* out,
             size_t count, int op, int out_is_mid) {
  constexpr int E = Vec<T>::kElems;
  constexpr int U = kUnroll;
  const int n = N > 0 ? N : dc.lsaSize;
  const int me = dc.lsaRank;
  const Peers<N> peers = symnccl::lsa_ptrs<N>(win, win_off, n);
  const Peers<N> mids = symnccl::lsa_ptrs<N>(mid_win, mid_off, n);
  T* mine = static_cast<T*>(ncclGetLsaPointer(win, win_off, me));
  T* mine_mid = static_cast<T*>(ncclGetLsaPointer(mid_win, mid_off, me));
  const bool aligned = ((win_off | mid_off | reinterpret_cast<uintptr_t>(out) |
                         reinterpret_cast<uintptr_t>(src)) &
                        15) == 0;
  // Slice length: whole vectors, so every slice starts 16-byte aligned.
  const size_t slice = ((count + n - 1) / n + E - 1) / E * E;
  const size_t svec = slice / E;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;

  ncclLsaBarrierSession<ncclCoopCta> bar{ncclCoopCta(), dc, ncclTeamLsa(dc),
                                         dc.lsaBarrier, blockIdx.x};
  if (src != nullptr) {
    for (int q = 0; q < n; q++) {
      for (size_t v = first; v < svec; v += stride) {
        size_t e = q * slice + v * E;
        if (e >= count) break;
        copy_elems(src, mine, e, count - e < (size_t)E ? count - e : E,
                   aligned);
      }
    }
  }
  // Entry: every peer's input is in place, and every peer has finished its
  // previous kernel (so nobody still reads the mid buffers pushed to below).
  bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);

  // Reduce my slice from every peer's input, and push each result vector
  // into every rank's mid buffer at the same place. Slice `me` is read and
  // written by this rank only (the thread that reads element e of it from
  // every peer is the one that writes e), so in place needs no scratch.
  const size_t nfull = aligned ? count / E : 0;   // full vectors overall
  for (size_t v = first; v < svec; v += U * stride) {
    size_t e = me * slice + v * E;
    if (e >= count) break;
    if (v + (U - 1) * stride < svec &&
        me * svec + v + (U - 1) * stride < nfull) {
      uint4 res[U];
      reduce_batch_regs<T, N, U>(peers, n, e, stride * E, op, res);
#pragma unroll
      for (int q = 0; q < (N > 0 ? N : kMaxRanks); q++) {
        if (N == 0 && q >= n) break;
#pragma unroll
        for (int u = 0; u < U; u++)
          *reinterpret_cast<uint4*>(mids.p[q] +
                                    (e + u * stride * E) * sizeof(T)) =
              res[u];
      }
    } else {
      for (int u = 0; u < U && v + u * stride < svec; u++) {
        size_t eu = e + u * stride * E;
        if (eu >= count) break;
        size_t len = count - eu < (size_t)E ? count - eu : E;
        alignas(16) T r[E];
        if (aligned && len == E)
          reduce_vec<T, N>(peers, n, eu * sizeof(T), op, r);
        else
          for (size_t i = 0; i < len; i++)
            r[i] = reduce_one<T, N>(peers, n, (eu + i) * sizeof(T), op);
        for (int q = 0; q < n; q++) {
          T* to = reinterpret_cast<T*>(mids.p[q]);
          if (aligned && len == E)
            *reinterpret_cast<uint4*>(to + eu) =
                *reinterpret_cast<const uint4*>(r);
          else
            for (size_t i = 0; i < len; i++) to[eu + i] = r[i];
        }
      }
    }
  }
  // Exit: every push into my mid buffer (by the same CTA index on every
  // rank, which covers exactly the elements this CTA copies below) landed.
  bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
  if (out_is_mid) return;   // in place in the window: done
  for (int q = 0; q < n; q++) {
    for (size_t v = first; v < svec; v += stride) {
      size_t e = q * slice + v * E;
      if (e >= count) break;
      copy_elems<T>(mine_mid, out, e, count - e < (size_t)E ? count - e : E,
                    aligned);
    }
  }
}

template <typename T, int N>
cudaError_t launch_t(const symnccl_lsa_args& a, cudaStream_t stream) {
  const T* src = static_cast<const T*>(a.src);
  T* out = static_cast<T*>(a.out);
  if (a.algo == SYMNCCL_ALGO_ONE_SHOT) {
    one_shot<T, N><<<a.ctas, a.threads, 0, stream>>>(
        a.dc->dc, a.win, a.win_offset, src, out,
        static_cast<T*>(a.scratch), a.count, a.op, a.in_place);
  } else {
    two_shot<T, N><<<a.ctas, a.threads, 0, stream>>>(
        a.dc->dc, a.win, a.win_offset, a.mid_win, a.mid_offset, src, out,
        a.count, a.op, a.in_place && a.mid_win == a.win &&
                           a.mid_offset == a.win_offset);
  }
  return cudaGetLastError();
}

}  // namespace

extern "C" int symnccl_lsa_supported(ncclDataType_t dtype, int op,
                                     int nranks) {
  if (nranks < 1 || nranks > kMaxRanks) return 0;
  if (op != SYMNCCL_OP_SUM && op != SYMNCCL_OP_MAX && op != SYMNCCL_OP_MIN &&
      op != SYMNCCL_OP_AVG)
    return 0;
  switch (dtype) {
    case ncclFloat32: case ncclFloat64: case ncclFloat16: case ncclBfloat16:
    case ncclFloat8e4m3: case ncclFloat8e5m2: case ncclInt32: case ncclInt64:
      return 1;
    default:
      return 0;
  }
}

extern "C" cudaError_t symnccl_lsa_allreduce(const symnccl_lsa_args* a,
                                             cudaStream_t stream) {
  if (a->dc->dc.lsaSize > kMaxRanks) return cudaErrorInvalidValue;
  return symnccl::dispatch(a->dtype, a->dc->dc.lsaSize, [&](auto t, auto n) {
    return launch_t<decltype(t), decltype(n)::value>(*a, stream);
  });
}
