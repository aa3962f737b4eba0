// Device primitives every kernel family is composed of (docs/ARCHITECTURE.md,
// "Kernels"):
//
//   bounded_wait      the one poll loop with a deadline; every wait for a
//                     peer (packet flags, push flags) goes through it
//   load_pack /       tail-safe 8- and 16-byte packs of a T array of any
//   store_pack        alignment and length
//   Peers             a window region on every rank of the LSA team, world
//                     size a run-time value
//   Accum             one pack's accumulators in the fixed rank order
//   reduce_peers      U packs reduced over every peer, loads of a batch
//                     of peers in flight at once (peers unrolled in batches)
//   release_store /   flag stores and loads that order the data around
//   acquire_load      them across GPUs
//   begin_call /      a packet kernel's per-call epoch, flag and slot
//   end_call
#ifndef SYMNCCL_KERNELS_PRIMITIVES_CUH
#define SYMNCCL_KERNELS_PRIMITIVES_CUH

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <type_traits>

#include <nccl.h>
#include <nccl_device.h>

#include "launch.h"
#include "reduce.cuh"

SYMNCCL_BEGIN

// Peers whose loads a reduction keeps in flight at once: the world size is
// a run-time value, and the peer loop runs in batches of this many, each
// unrolled (NCCL's symmetric kernels do the same).
constexpr int kPeerBatch = 2;

// ------------------------------------------------------------ bounded wait

__device__ __forceinline__ uint64_t global_timer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// What a wait is for, for the message when it gives up.
struct WaitSite {
  const char* kernel;  // "ll all_reduce", ...
  int peer;            // the rank waited for
  uint64_t flag;       // the flag or epoch waited for
};

// A wait that gave up: the peer is gone or did not make the same call.
// Prints which, then traps: the launch fails with a CUDA error instead of a
// GPU spinning forever. Out of line: the waits' fast path stays small.
static __device__ __noinline__ void give_up(const char* kernel, int peer,
                                           uint64_t flag,
                                           uint64_t timeout_ns) {
  printf("symnccl: %s waited more than %llu s for rank %d (flag %llu): a "
         "peer is gone or did not make the same call\n",
         kernel, (unsigned long long)(timeout_ns / 1000000000ull), peer,
         (unsigned long long)flag);
  __trap();
}

// Calls ready() until it returns true, for at most timeout_ns (the clock
// is read every 1024 spins). kWarp: ready() is warp-collective (all 32
// lanes call it together), so the lanes also decide together to give up.
template <bool kWarp = false, typename Ready>
__device__ __forceinline__ void bounded_wait(Ready&& ready,
                                             uint64_t timeout_ns,
                                             const WaitSite& site) {
  uint64_t start = 0;
  for (uint32_t spins = 0;; spins++) {
    if (ready()) return;
    if ((spins & 1023) != 1023) continue;
    const uint64_t now = global_timer();
    if (start == 0) start = now;
    bool late = now - start > timeout_ns;
    if (kWarp) late = __any_sync(0xffffffffu, late);
    if (late) give_up(site.kernel, site.peer, site.flag, timeout_ns);
  }
}

// ------------------------------------------------------------------- packs

// P bytes of T: the raw word type and the elements it holds.
template <int P>
using Raw = typename std::conditional<P == 16, uint4, uint64_t>::type;

template <typename T, int P>
struct Pack {
  static_assert(P == 8 || P == 16, "8- or 16-byte packs");
  static constexpr int kElems = P / sizeof(T);
  union U {
    Raw<P> raw;
    T t[kElems];
  };
};

// Pack i of a T array of `count` elements: elements [i*E, i*E + E); those
// past the end read as zero. `aligned`: p is P-byte aligned. kCg: load
// through L2 only (memory other GPUs write while this kernel runs).
template <int P, bool kCg = false, typename T>
__device__ __forceinline__ Raw<P> load_pack(const T* p, size_t i,
                                            size_t count, bool aligned) {
  constexpr int E = Pack<T, P>::kElems;
  if (aligned && (i + 1) * E <= count) {
    const Raw<P>* q = reinterpret_cast<const Raw<P>*>(p + i * E);
    return kCg ? __ldcg(q) : *q;
  }
  typename Pack<T, P>::U v;
  v.raw = Raw<P>{};
  for (int k = 0; k < E; k++)
    if (i * E + k < count) v.t[k] = p[i * E + k];
  return v.raw;
}

// Writes the elements of pack i that lie before `count`.
template <int P, typename T>
__device__ __forceinline__ void store_pack(T* p, size_t i, size_t count,
                                           bool aligned, Raw<P> w) {
  constexpr int E = Pack<T, P>::kElems;
  if (aligned && (i + 1) * E <= count) {
    *reinterpret_cast<Raw<P>*>(p + i * E) = w;
    return;
  }
  typename Pack<T, P>::U v;
  v.raw = w;
  for (int k = 0; k < E; k++)
    if (i * E + k < count) p[i * E + k] = v.t[k];
}

// -------------------------------------------------------------------- peers

// The same region of a window on every rank of the LSA team (the region
// starts at the same offset everywhere): peer(q) is where this GPU reaches
// rank q's copy. NCCL maps the team's copies of a window evenly spaced
// (lsaFlatBase + rank * stride; the host checks it when a communicator is
// created, symnccl_lsa_layout_ok), so two registers hold every peer's
// address: no table, and no reloads of the window inside loops whose
// volatile stores keep the compiler from hoisting them.
struct Peers {
  char* base;     // rank 0's copy
  size_t stride;  // from one rank's copy to the next's

  __device__ __forceinline__ static Peers of(ncclWindow_t win, size_t off) {
    char* p0 = static_cast<char*>(ncclGetLsaPointer(win, off, 0));
    char* p1 = static_cast<char*>(ncclGetLsaPointer(win, off, 1));
    return {p0, (size_t)(p1 - p0)};
  }
  __device__ __forceinline__ char* operator()(int q) const {
    return base + (size_t)q * stride;
  }
  __device__ __forceinline__ Peers at(size_t more) const {
    return {base + more, stride};
  }
};

// --------------------------------------------------------------- reduction

// One pack's accumulators: set() with rank 0's pack, then fold() the next
// ranks' in order 1..n-1: the fixed order that gives every rank and every
// algorithm the same bits for the same inputs. Op: OpSum (sum and avg),
// OpMax, OpMin; result() divides for avg.
template <typename T, int P, typename Op>
struct Accum {
  using A = typename Acc<T>::type;
  static constexpr int E = Pack<T, P>::kElems;
  A v[E];

  __device__ __forceinline__ void set(Raw<P> w) {
    typename Pack<T, P>::U x;
    x.raw = w;
#pragma unroll
    for (int k = 0; k < E; k++) v[k] = Acc<T>::to(x.t[k]);
  }
  __device__ __forceinline__ void fold(Raw<P> w) {
    typename Pack<T, P>::U x;
    x.raw = w;
#pragma unroll
    for (int k = 0; k < E; k++) v[k] = Op::apply(v[k], Acc<T>::to(x.t[k]));
  }
  // The result as a pack of T (op: SYMNCCL_OP_*, for avg's division).
  __device__ __forceinline__ Raw<P> result(int op, int n) const {
    typename Pack<T, P>::U r;
#pragma unroll
    for (int k = 0; k < E; k++) r.t[k] = finish<T>(op, v[k], n);
    return r.raw;
  }
};

// U packs reduced over every rank in order: load(q, raw) fills rank q's U
// packs; the loads of kPeerBatch ranks are issued before any of them is
// accumulated, and rank 0 is peeled off so no branch on the rank is left
// in the loop.
template <typename T, int P, int U, typename Op, typename Load>
__device__ __forceinline__ void reduce_ranks(int n, Load&& load,
                                             Accum<T, P, Op> (&acc)[U]) {
  Raw<P> raw[kPeerBatch][U];
#pragma unroll
  for (int b = 0; b < kPeerBatch; b++)
    if (b < n) load(b, raw[b]);
#pragma unroll
  for (int u = 0; u < U; u++) acc[u].set(raw[0][u]);
#pragma unroll
  for (int b = 1; b < kPeerBatch; b++)
    if (b < n)
#pragma unroll
      for (int u = 0; u < U; u++) acc[u].fold(raw[b][u]);
  for (int q0 = kPeerBatch; q0 < n; q0 += kPeerBatch) {
#pragma unroll
    for (int b = 0; b < kPeerBatch; b++)
      if (q0 + b < n) load(q0 + b, raw[b]);
#pragma unroll
    for (int b = 0; b < kPeerBatch; b++)
      if (q0 + b < n)
#pragma unroll
        for (int u = 0; u < U; u++) acc[u].fold(raw[b][u]);
  }
}

// U whole 16-byte packs at byte offsets off, off + step, ... of every
// peer's region, reduced in rank order. Every pack must be full and
// 16-byte aligned on every peer.
template <typename T, int U>
__device__ __forceinline__ void reduce_peers(const Peers& peers, int n,
                                             size_t off, size_t step, int op,
                                             uint4 (&res)[U]) {
  with_op(op, [&](auto o) {
    Accum<T, 16, decltype(o)> acc[U];
    reduce_ranks<T, 16, U>(n, [&](int q, uint4(&raw)[U]) {
      const char* p = peers(q) + off;
#pragma unroll
      for (int u = 0; u < U; u++)
        raw[u] = __ldcg(reinterpret_cast<const uint4*>(p + u * step));
    }, acc);
#pragma unroll
    for (int u = 0; u < U; u++) res[u] = acc[u].result(op, n);
  });
}

// Pack i (elements of a T array of `count` at the peers' region start),
// reduced in rank order; any alignment, any tail.
template <typename T>
__device__ __forceinline__ uint4 reduce_peers_tail(const Peers& peers, int n,
                                                   size_t i, size_t count,
                                                   bool aligned, int op) {
  return with_op(op, [&](auto o) {
    Accum<T, 16, decltype(o)> acc[1];
    reduce_ranks<T, 16, 1>(n, [&](int q, uint4(&raw)[1]) {
      raw[0] = load_pack<16, true>(reinterpret_cast<const T*>(peers(q)), i,
                                   count, aligned);
    }, acc);
    return acc[0].result(op, n);
  });
}

// -------------------------------------------------------------------- flags

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

// ------------------------------------------------------------------ epochs

// This CTA's call of a packet kernel (ll, ll128): the call counter kept in
// device memory (so graph replays need no host), the 32-bit flag
// (c mod (2^32 - 1)) + 1 of call c (never 0, the value of a cleared buffer)
// and the byte offset of its slot c & 1 (two slots of n rows of row_bytes
// after `base`). end_call stores epoch + 1 back.
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

SYMNCCL_END

#endif  // SYMNCCL_KERNELS_PRIMITIVES_CUH
