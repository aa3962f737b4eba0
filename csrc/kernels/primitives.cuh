// Device primitives every kernel family is composed of (docs/ARCHITECTURE.md,
// "Kernels"):
//
//   bounded_wait      the one poll loop with a deadline; every wait for a
//                     peer (packets, flags, barriers) goes through it and
//   give_up           gives up without a trap: the failure record and the
//                     fault words
//   enter             every kernel's first step: its call counter and
//                     whether the communicator has failed (Entry)
//   load_pack /       tail-safe 8- and 16-byte packs of a T array of any
//   store_pack        alignment and length
//   Peers             a window region on every rank of the LSA team, world
//                     size a run-time value
//   Accum             one pack's accumulators in the fixed rank order
//   reduce_peers      U packs reduced over every peer, loads of a batch
//                     of peers in flight at once (peers unrolled in batches)
//   release_store /   flag stores and loads that order the data around
//   acquire_load      them across GPUs
//   Group             a CTA, or a warp-specialised part of it, with a
//                     barrier of its own
//   signal_flags /    a CTA's flags to the same CTA of every peer (push)
//   signal_read /
//   wait_flags
//   Barrier           the load kernels' barrier, built on them
//   PacketCall /      a packet kernel's per-call epoch, flag and slot
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

// ------------------------------------------------------------------ faults
//
// No kernel ever traps: a trap leaves the process's CUDA context unusable
// (every later CUDA call fails), so nothing could be saved or rebuilt. A
// wait that gives up (the timeout passed, abort() was called, or a peer
// gave up first) calls give_up: the first CTA of this rank to do so fills
// the failure record (symnccl_fault, host-mapped), the fault word of this
// rank and of every peer is set, and the wait returns false. The caller
// then sends nothing more and waits for nothing more: a thread whose wait
// is its own carries on to the end of the kernel with an `ok` flag down
// (packet kernels), a CTA whose wait is collective returns as a whole
// (wait_flags). (A PTX exit in the middle of a kernel would be shorter,
// but it makes ptxas cap the registers of the whole kernel: the packet
// kernels then spill.) Every kernel reads its rank's
// fault word first (enter), and its CTA leaves at its first CTA-wide step,
// before it reads a peer's memory, when it is set: after a failure a
// communicator's kernels, graph replays included, do nothing until the host
// raises.

__device__ __forceinline__ uint64_t global_timer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Memory that peers or the host write while this kernel runs.
__device__ __forceinline__ uint64_t load_relaxed(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];"
               : "=l"(v)
               : "l"(p)
               : "memory");
  return v;
}

// What a wait is for, for the record when it gives up.
struct WaitSite {
  int wait;       // SYMNCCL_WAIT_*
  int peer;       // the rank waited for
  uint64_t flag;  // the flag or epoch waited for
};

// Records why this rank's call failed and tells the peers. `why`:
// SYMNCCL_FAULT_TIMEOUT, _ABORT, or _PEER when the fault word was found
// set. Out of line: the waits' fast path stays small.
// The kernels take their arguments as __grid_constant__, so `a` points
// into the launch's parameters: no copy.
//
// Who is named (docs/FAILURES.md): the first rank to give up names the
// rank it waited for (itself after an abort), and writes that name into
// the code it leaves in every fault word; a rank told by its word names
// the same rank, so every survivor names the rank that stopped, not the
// survivor that happened to give up first. When the first rank named the
// rank told (it came late: it was not gone), that one names the first.
// (Kept small: a larger body costs the packet kernels registers, which sit
// at their cap, through the call.)
static __device__ __noinline__ void give_up(const symnccl_kargs* a, int me,
                                            int n, uint32_t why,
                                            WaitSite site,
                                            uint64_t waited_ns) {
  uint64_t* word = a->fault_word;
  const uint64_t w = load_relaxed(word);
  uint32_t reason = why;
  int peer = site.peer, detail = 0, origin = me;
  if (w != 0) {
    origin = SYMNCCL_FAULT_ORIGIN(w);
    if (origin == me) return;  // another CTA of this rank gave up first
    reason = SYMNCCL_FAULT_PEER;
    detail = SYMNCCL_FAULT_REASON(w);
    const int named = SYMNCCL_FAULT_NAMED(w);
    peer = named < 0 || named == me ? origin : named;
  }
  // The record: written once, by the first CTA, unless the host wrote one
  // (the watchdog, for an NCCL kernel); `reason` last.
  volatile symnccl_fault* r = a->fault;
  if (atomicCAS(a->claim, 0u, 1u) == 0u && r->reason == 0) {
    r->kernel = a->kernel;
    r->collective = a->collective;
    r->peer = peer;
    r->detail = detail;
    r->origin = origin;
    r->wait = site.wait;
    r->cta = (int)blockIdx.x;
    r->flag = site.flag;
    r->waited_ns = waited_ns;
    __threadfence_system();
    r->reason = reason;
  }
  if (reason == SYMNCCL_FAULT_PEER) return;  // the words are set already
  // This rank's word (the other CTAs leave at their next poll, later
  // kernels at entry), then every peer's: their waits for this rank end at
  // once instead of at their own timeout, and a peer that comes back late
  // finds its word set instead of data from a call this rank gave up.
  const unsigned long long code = SYMNCCL_FAULT_CODE(
      reason, me, why == SYMNCCL_FAULT_ABORT ? me : site.peer);
  atomicCAS_system(reinterpret_cast<unsigned long long*>(word), 0ull, code);
  char* p0 =
      static_cast<char*>(ncclGetLsaPointer(a->ctl_win, a->ctl_offset, 0));
  char* p1 = n > 1 ? static_cast<char*>(
                         ncclGetLsaPointer(a->ctl_win, a->ctl_offset, 1))
                   : p0;
  for (int q = 0; q < n; q++)
    if (q != me)
      atomicCAS_system(
          reinterpret_cast<unsigned long long*>(p0 + (size_t)q * (p1 - p0)),
          0ull, code);
}

// Calls ready() until it returns true: then true. Every 1024 spins it
// reads the clock and this rank's fault word, every 16384 the host's abort
// flag; it gives up (false, after give_up) when the word is set, abort()
// was called, or `a.timeout_ns` passed. kWarp: ready() is warp-collective
// (all 32 lanes call it together), so the lanes decide together.
template <bool kWarp = false, typename Ready>
__device__ __forceinline__ bool bounded_wait(Ready&& ready,
                                             const symnccl_kargs& a, int me,
                                             int n, const WaitSite& site) {
  uint64_t start = 0;
  for (uint32_t spins = 0;; spins++) {
    if (ready()) return true;
    if ((spins & 1023) != 1023) continue;
    const uint64_t now = global_timer();
    if (start == 0) start = now;
    uint32_t why =
        load_relaxed(a.fault_word) != 0 ? (uint32_t)SYMNCCL_FAULT_PEER
        : now - start > a.timeout_ns    ? (uint32_t)SYMNCCL_FAULT_TIMEOUT
        : (spins & 16383) == 16383 &&
                *reinterpret_cast<volatile uint32_t*>(&a.fault->abort) != 0
            ? (uint32_t)SYMNCCL_FAULT_ABORT
            : 0u;
    if (kWarp) why = __reduce_max_sync(0xffffffffu, why);
    if (why != 0) {
      if (!kWarp || (threadIdx.x & 31) == 0)
        give_up(&a, me, n, why, site, now - start);
      return false;
    }
  }
}

// Every kernel's first step: this CTA's call counter (a.epochs[blockIdx.x])
// and this rank's fault word, both in flight at once. ok is false once the
// communicator has failed (thread 0 records it).
//
// The load kernels (one_shot, two_shot, multimem) take enter(): every
// thread loads both, with no CTA-wide step, so the kernel's first loads
// overlap them; the CTA learns the verdict at its first Barrier::sync (ok),
// before it reads a peer's memory. Sharing thread 0's loads through a
// __syncthreads instead cost ~0.4 us per launch on H200 (1-rank kernel
// cost; docs/PERFORMANCE.md, 'Entry checks and the bounded barrier').
//
// The kernels that store to peers at once (packets, push) take
// enter_cta(): the CTA agrees on the verdict before its first store.
struct Entry {
  uint64_t epoch;
  bool ok;
};

// Programmatic dependent launch (devcomm.cuh, symnccl_launch_kernel): wait
// until the previous kernel on the stream has completed and its memory is
// visible (at once when not launched so), then, with `early`, let the next
// kernel's launch begin (a symnccl kernel waits likewise before it reads
// what this one writes).
//
// Without `early` the trigger is the implicit one: the next kernel is scheduled
// only once every CTA of this one has completed (PTX ISA, griddepcontrol:
// dependents launch when all CTAs have issued launch_dependents "or
// completed"). That is for an NCCL kernel that may follow: NCCL before 2.30.7
// launches its symmetric kernels as programmatic dependent launches that never
// execute griddepcontrol.wait (2.30.7 added cudaGridDependencySynchronize at
// their entry), so after an early trigger one could run alongside this kernel,
// reading its input before this kernel wrote it. With the implicit trigger it
// starts only after this kernel ended, as it does after any kernel that never
// triggers (torch's, cuBLAS's): the case NCCL's launch was built for. The
// documents promise a secondary the memory of its primary only through .wait,
// so what is left (stores of completed CTAs not yet visible) is NCCL's own gap
// before 2.30.7, shared with every kernel that precedes it, not one of
// symnccl's. Launching symnccl's kernels without the PDL attribute would not
// help: the attribute of a launch orders that kernel after the one before it
// (which the wait above does), never the next one after it. Chosen per
// communicator from the loaded NCCL (nccl_policy.c, sn_nccl_pdl_early).
__device__ __forceinline__ void pdl_wait(int early) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (early) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Thread 0's entry on a failed communicator (record it) or with a fault to
// inject (testing: Communicator._inject_fault); out of line, so that the
// kernels carry none of it. false: the CTA must leave.
static __device__ __noinline__ bool entry_slow(const symnccl_kargs* a,
                                               int me, int n, uint64_t epoch,
                                               uint64_t word) {
  if (word != 0) {
    give_up(a, me, n, SYMNCCL_FAULT_PEER, {SYMNCCL_WAIT_NONE, -1, 0}, 0);
    return false;
  }
  return bounded_wait([] { return false; }, *a, me, n,
                      {SYMNCCL_WAIT_ENTRY, (me + 1) % n, epoch});
}

__device__ __forceinline__ Entry enter(const symnccl_kargs& a, int me,
                                       int n) {
  pdl_wait(a.pdl_early);
  const uint64_t word = load_relaxed(a.fault_word);
  Entry r{a.epochs[blockIdx.x], word == 0};
  if (threadIdx.x == 0 && (word != 0 || a.inject))
    r.ok = entry_slow(&a, me, n, r.epoch, word);
  return r;
}

// enter() for a kernel that counts no call and waits for no peer (the
// add+norm with no peer, whose grid may be larger than the counters):
// the fault word only. The caller has passed pdl_wait (it may load its
// inputs in between).
__device__ __forceinline__ bool enter_uncounted(const symnccl_kargs& a,
                                                int me, int n) {
  const uint64_t word = load_relaxed(a.fault_word);
  bool ok = word == 0;
  if (threadIdx.x == 0 && (word != 0 || a.inject))
    ok = entry_slow(&a, me, n, 0, word);
  return ok;
}

// The CTA's verdict before anything else, through thread 0 and shared
// memory (every thread holding its own Entry across the agreement cost the
// packet kernels and push registers and spills). false: the CTA must
// leave.
__device__ __forceinline__ bool enter_cta(const symnccl_kargs& a, int me,
                                          int n, uint64_t& epoch) {
  __shared__ uint64_t s_epoch;
  __shared__ int s_ok;
  // every thread (thread 0's second wait in enter is a no-op)
  pdl_wait(a.pdl_early);
  if (threadIdx.x == 0) {
    const Entry en = enter(a, me, n);
    s_epoch = en.epoch;
    s_ok = en.ok;
  }
  __syncthreads();
  epoch = s_epoch;
  return s_ok != 0;
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

// T(a + b) elementwise on packs of P bytes, in Acc<T>, rounded once to T
// (16-bit floats a word's pair at once: Half2, reduce.cuh): the fused
// kernels' residual add, and their two ranks' sum, for which Accum's
// set(a), fold(b), result(SYMNCCL_OP_SUM, 2) give the same bits.
template <typename T, int P>
__device__ __forceinline__ Raw<P> add_packs(Raw<P> a, Raw<P> b) {
  if constexpr (Half2<T>::kOf) {
    // the pack as 32-bit words, each a pair of T
    typename Pack<uint32_t, P>::U x, y, s;
    x.raw = a;
    y.raw = b;
#pragma unroll
    for (int k = 0; k < Pack<uint32_t, P>::kElems; k++)
      s.t[k] = add_pairs<T>(x.t[k], y.t[k]);
    return s.raw;
  } else {
    typename Pack<T, P>::U x, y, s;
    x.raw = a;
    y.raw = b;
#pragma unroll
    for (int k = 0; k < Pack<T, P>::kElems; k++)
      s.t[k] = Acc<T>::from(Acc<T>::to(x.t[k]) + Acc<T>::to(y.t[k]));
    return s.raw;
  }
}

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

// Threads of a CTA that synchronise among themselves: the whole CTA
// (hardware barrier 0, __syncthreads), or a warp-specialised part of it
// on a named barrier of its own (push_slices: senders and consumers).
struct Group {
  int tid;   // this thread's index in the group
  int size;  // threads, a multiple of 32
  int bar;   // barrier id; 0: the CTA's

  __device__ __forceinline__ static Group cta() {
    return {(int)threadIdx.x, (int)blockDim.x, 0};
  }
  __device__ __forceinline__ void sync() const {
    if (bar == 0)
      __syncthreads();
    else
      asm volatile("bar.sync %0, %1;" ::"r"(bar), "r"(size) : "memory");
  }
  // true when p holds on every thread of the group
  __device__ __forceinline__ bool all(bool p) const {
    if (bar == 0) return __syncthreads_and(p) != 0;
    uint32_t r;
    asm volatile(
        "{\n\t.reg .pred q;\n\t"
        "setp.ne.u32 q, %1, 0;\n\t"
        "bar.red.and.pred q, %2, %3, q;\n\t"
        "selp.u32 %0, 1, 0, q;\n\t}"
        : "=r"(r)
        : "r"((uint32_t)p), "r"(bar), "r"(size)
        : "memory");
    return r != 0;
  }
};

// A CTA's flags, one line per CTA of one 8-byte flag per source rank
// (SYMNCCL_FLAG_LINE): CTA b of every rank signals CTA b of every peer.

// Every store of the group's threads so far, then this CTA's flag at every
// peer := v, at line_off into `lines` (the group's thread q signals peer
// q; the group has at least n threads).
__device__ __forceinline__ void signal_flags(const Peers& lines,
                                             size_t line_off, int me, int n,
                                             uint64_t v, bool ok = true,
                                             const Group& g = Group::cta()) {
  g.sync();
  const int q = g.tid;
  if (ok && q < n && q != me)
    release_store(
        reinterpret_cast<uint64_t*>(lines(q) + line_off + (size_t)me * 8), v);
}

// "I have read what you stored": after every thread of the group has
// consumed its loads of the peers' stores (each loaded value stored on
// before the group's barrier, so each load has returned), this CTA's flag
// at every peer := v, a relaxed store with no fence. The peer only
// overwrites what was read once it sees the flag (a write after read):
// nothing of this rank's must be visible to it first, so the release
// (MEMBAR.SYS, which waits for every store of the thread, the copies
// into the output included) orders nothing it needs. NCCL's primitives
// likewise fence a sender's step and not a receiver's.
__device__ __forceinline__ void signal_read(const Peers& lines,
                                           size_t line_off, int me, int n,
                                           uint64_t v,
                                           const Group& g = Group::cta()) {
  g.sync();
  const int q = g.tid;
  if (q < n && q != me)
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(
                     lines(q) + line_off + (size_t)me * 8),
                 "l"(v)
                 : "memory");
}

// Until every peer's flag in my `line` is >= v (the group's thread s waits
// for peer s); then every thread of the group may read what the peers
// stored before raising their flags. false: a wait gave up, or a thread
// came with ok false (its Entry), and the whole group must stop.
__device__ __forceinline__ bool wait_flags(const char* line, int me, int n,
                                           uint64_t v, const symnccl_kargs& a,
                                           int wait, bool ok = true,
                                           const Group& g = Group::cta()) {
  const int s = g.tid;
  if (ok && s < n && s != me) {
    const uint64_t* f =
        reinterpret_cast<const uint64_t*>(line + (size_t)s * 8);
    ok = bounded_wait([&] { return acquire_load(f) >= v; }, a, me, n,
                      {wait, s, v});
  }
  return g.all(ok);
}

// The barrier of the load kernels (one_shot, two_shot, multimem): CTA b of
// every rank meets CTA b of every peer, on flag line b of the staging
// window's control block. The flags only grow: barrier k of a CTA whose
// counter was e at entry waits for e + k.
struct Barrier {
  Peers lines;       // line 0 of every rank
  size_t off;        // this CTA's line
  const char* mine;  // line 0 here

  __device__ __forceinline__ static Barrier of(const symnccl_kargs& a,
                                               int me, int n) {
    const Peers p = Peers::of(a.ctl_win, a.ctl_offset + SYMNCCL_CTL_BARRIER);
    return {p, (size_t)blockIdx.x * SYMNCCL_FLAG_LINE(n), p(me)};
  }
  // false: the CTA must leave (ok: this thread's verdict so far)
  __device__ __forceinline__ bool sync(uint64_t v, const symnccl_kargs& a,
                                       int me, int n, bool ok = true) const {
    signal_flags(lines, off, me, n, v, ok);
    return wait_flags(mine + off, me, n, v, a, SYMNCCL_WAIT_BARRIER, ok);
  }
};

// ------------------------------------------------------------------ epochs

// This CTA's call of a packet kernel (ll, ll128), from its call counter
// (enter; kept in device memory, so graph replays need no host): the
// 32-bit flag (c mod (2^32 - 1)) + 1 of call c (never 0, the value of a
// cleared buffer) and the byte offset of its slot c & 1 (two slots of n
// rows of row_bytes after `base`). end_call stores epoch + 1 back.
struct PacketCall {
  uint64_t epoch;
  uint32_t flag;
  size_t slot_off;

  __device__ __forceinline__ PacketCall(uint64_t e, size_t base, int n,
                                        size_t row_bytes)
      : epoch(e),
        flag((uint32_t)(e % 0xFFFFFFFFull) + 1u),
        slot_off(base + (e & 1) * (size_t)n * row_bytes) {}
};

// After every thread of the CTA is done with the call.
__device__ __forceinline__ void end_call(uint64_t* epochs,
                                         const PacketCall& c) {
  __syncthreads();
  if (threadIdx.x == 0) epochs[blockIdx.x] = c.epoch + 1;
}

SYMNCCL_END

#endif  // SYMNCCL_KERNELS_PRIMITIVES_CUH
