// Store-only ("push") kernel on NCCL symmetric windows: a two-shot in
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
// of blockDim.x (Deal); CTA b of every rank handles the same vectors
// in every phase, every slice and every chunk, so one flag per (phase, CTA,
// source rank) says "CTA b's vectors are there", and CTA b is the only one
// to touch its vectors of any slot. The grid is fixed per communicator (the
// host always launches the same number of CTAs); blockDim.x >= n.
//
// Epochs: CTA b keeps a 64-bit counter in local device memory
// (`epochs[b]`), one count per chunk, so graph replays need no host. Chunk
// with epoch e uses parity e & 1 and raises flags to e + 1 (flags only grow;
// waits are for >= e + 1). Every push kernel (push_slices, push_all_to_all
// in alltoall.cuh) numbers its chunks so: the chunks of consecutive push
// calls, of any kind, are consecutive epochs.
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
// length (Deal). Between calls: the first two chunks of a call (epochs e0
// and e0 + 1) reuse the slots of epochs e0 - 2 and e0 - 1, chunks of the
// push calls before, which no push kernel waits for at its end
// (push_slices and push_all_to_all leave while peers may still read them),
// so every push kernel waits at its entry, before its first store to a
// peer, until every peer's flag 1 (of the same CTA) is >= e0: that peer has
// read every chunk any push call of this rank sent it. After a push
// all-reduce it holds at once (its last gather waited for it). Result
// slots are used by this kernel alone, and a rank gathered all of them
// before its call ended.
//
// Reduction: fixed rank order 0..n-1 with the accumulators of reduce.cuh:
// the same bits on every rank, and the same bits as the other algorithms.
// Tails and inputs/outputs that are not 16-byte aligned take the tail-safe
// pack paths; slots are always aligned, and every slice starts a whole
// number of vectors (slots are whole pages) after src and out.
#ifndef SYMNCCL_KERNELS_PUSH_CUH
#define SYMNCCL_KERNELS_PUSH_CUH

#include "primitives.cuh"

SYMNCCL_BEGIN

// Where flag `phase` of CTA `cta` lies in a flag region: one line
// (SYMNCCL_FLAG_LINE) per phase and CTA, of one flag per source rank.
__device__ __forceinline__ size_t push_line(int phase, int cta, int n) {
  return ((size_t)phase * SYMNCCL_PUSH_MAX_CTAS + cta) * SYMNCCL_FLAG_LINE(n);
}

// Geometry of one chunk: full chunks of chunk_elems, then a shorter last
// one (so the last reduce and gather, which overlap nothing, are short).
struct PushChunk {
  size_t c0;     // first element of the chunk
  size_t slice;  // elements per slice (a whole number of vectors)
  size_t nv;     // vectors per slice
};

__device__ __forceinline__ PushChunk push_chunk(size_t j, size_t chunk_elems,
                                                size_t count, int n, int E) {
  PushChunk r;
  r.c0 = j * chunk_elems;
  const size_t cj = count - r.c0 < chunk_elems ? count - r.c0 : chunk_elems;
  r.slice = ((cj + n - 1) / n + E - 1) / E * E;
  r.nv = r.slice / E;
  return r;
}

// Which vectors of a slice (or slot) this thread handles: they are dealt to
// the CTAs in tiles of blockDim.x (8 KiB at 512 threads), tile k to CTA
// k % gridDim.x. Which CTA owns a vector depends on its position only, not
// on the slice length, so CTA b handles the same vectors of a slot in a
// short last chunk as in a full one, and in every push kernel: the
// two-parity arguments order CTA b only against CTA b of the peers and
// need exactly that. (Cutting each chunk into gridDim.x contiguous runs
// broke it: the short last chunk's runs lay across other CTAs' runs of
// chunk nch - 3, so CTA b could overwrite a receive slot that another CTA
// of the peer had not yet reduced; docs/PERFORMANCE.md, 'Push: how
// vectors are dealt to CTAs'.) Inside the CTA, a group of blockDim.x / K
// threads (the whole CTA: K = 1) takes K vectors of each tile: thread t those at t, t + blockDim.x / K, ...
template <int K>
struct Deal {
  size_t first;  // my first vector
  size_t tile;   // from one of my CTA's tiles to the next
  size_t inner;  // from one of my vectors of a tile to the next

  __device__ __forceinline__ static Deal of(const Group& g) {
    return {(size_t)blockIdx.x * blockDim.x + g.tid,
            (size_t)gridDim.x * blockDim.x, (size_t)g.size};
  }
  // the u-th of my vectors from v, the first of mine in one of my tiles
  __device__ __forceinline__ size_t at(size_t v, int u) const {
    return v + (size_t)(u / K) * tile + (size_t)(u % K) * inner;
  }
};

// Elements of slice q, relative to its start, that lie before `count`.
__device__ __forceinline__ size_t slice_len(const PushChunk& r, int q,
                                            size_t count) {
  const size_t s = r.c0 + q * r.slice;
  return s >= count ? 0 : count - s < r.slice ? count - s : r.slice;
}

// to <- from for this thread's vectors (d) of one slice of `len` valid
// elements (U vectors per thread in flight). Scatter: from = input (any
// alignment), to = a peer's slot, written in whole vectors (`whole`).
// Gather: from = a slot (or the input), to = the output, valid elements
// only. Bytes (the all-gather's and the all-to-all's unit) whose ends are
// not 16-byte aligned but are 4-byte aligned (an all-gather's slices at 3
// ranks) move as 4-byte words: the same 16-byte vectors (so the same
// deal), a quarter of the loads and stores a byte at a time would take.
// (Not the 2-byte units: their reduce-scatter and all-reduce kernels then
// spilled 16-32 bytes.)
template <typename T, int U, int K>
__device__ __forceinline__ void push_copy(size_t len, const T* from,
                                          bool from_al, T* to, bool to_al,
                                          bool whole, const Deal<K>& d) {
  static_assert(U % K == 0, "whole tiles per step");
  if constexpr (sizeof(T) == 1) {
    if (!(from_al && to_al) &&
        ((reinterpret_cast<uintptr_t>(from) | reinterpret_cast<uintptr_t>(to) |
          len) & 3) == 0) {
      push_copy<uint32_t, U, K>(len / 4,
                                reinterpret_cast<const uint32_t*>(from),
                                from_al, reinterpret_cast<uint32_t*>(to),
                                to_al, whole, d);
      return;
    }
  }
  constexpr int E = Pack<T, 16>::kElems;
  const size_t nv = (len + E - 1) / E;
  for (size_t v = d.first; v < nv; v += U / K * d.tile) {
    uint4 x[U];
#pragma unroll
    for (int u = 0; u < U; u++)
      if (d.at(v, u) < nv)
        x[u] = load_pack<16, true>(from, d.at(v, u), len, from_al);
#pragma unroll
    for (int u = 0; u < U; u++)
      if (d.at(v, u) < nv)
        store_pack<16>(to, d.at(v, u), whole ? (d.at(v, u) + 1) * E : len,
                       to_al, x[u]);
  }
}

// Vectors per thread in flight: in the reduction, per peer (kPeerBatch
// peers at once), as many as the accumulators allow without spilling
// (kReduce x E values of Acc<T>, kPeerBatch x kReduce vectors); in the
// plain copies, kCopy.
template <typename T>
struct PushUnroll {
  static constexpr int kReduce = Pack<T, 16>::kElems >= 16 ? 1 : 2;
  static constexpr int kCopy = 4;
};

// What the reduce phase of one chunk needs to know.
template <typename T>
struct PushReduce {
  const T* own;        // my slice of the input
  bool own_al;         // ... is 16-byte aligned
  size_t len;          // its valid elements
  const char* slots;   // my receive slots of this parity, [source rank]
  size_t slot_bytes;
  Peers dst;           // kShare: where the results go on every rank
  size_t dst_off;      // ... at this byte offset
  bool to_window;      // dst is output memory (valid elements only)
  T* out;              // else: my own results go here
  bool out_al;
};

// Vectors v, v + step, ... (UU of them) of my slice reduced in rank order
// (the own part from the input, the peers' from my slots) and stored to
// every rank (kShare: the all-reduce), or to my output only (the
// reduce-scatter). kWhole: all UU are whole vectors, and the input and
// (unless the results go to a window) the output are 16-byte aligned: one
// 16-byte load or store each; else any of them may be partial or past the
// end.
template <typename T, int UU, bool kWhole, bool kShare = true>
__device__ __forceinline__ void push_reduce(const PushReduce<T>& r, size_t v,
                                            size_t step, int me, int n,
                                            int op) {
  constexpr int E = Pack<T, 16>::kElems;
  const size_t nv = (r.len + E - 1) / E;
  with_op(op, [&](auto o) {
    Accum<T, 16, decltype(o)> acc[UU];
    reduce_ranks<T, 16, UU>(n, [&](int q, uint4(&x)[UU]) {
      const uint4* from =
          q == me ? reinterpret_cast<const uint4*>(r.own)
                  : reinterpret_cast<const uint4*>(r.slots +
                                                   (size_t)q * r.slot_bytes);
#pragma unroll
      for (int u = 0; u < UU; u++) {
        const size_t vv = v + u * step;
        if (kWhole)
          x[u] = __ldcg(from + vv);
        else
          x[u] = vv >= nv  ? uint4{}
                 : q == me ? load_pack<16, true>(r.own, vv, r.len, r.own_al)
                           : __ldcg(from + vv);
      }
    }, acc);
#pragma unroll
    for (int u = 0; u < UU; u++) {
      const size_t vv = v + u * step;
      if (!kWhole && vv >= nv) continue;
      const uint4 w = acc[u].result(op, n);
      if (!r.to_window) {  // mine straight into my output
        if (kWhole)
          reinterpret_cast<uint4*>(r.out)[vv] = w;
        else
          store_pack<16>(r.out, vv, r.len, r.out_al, w);
      }
      for (int q = 0; kShare && q < n; q++) {
        if (!r.to_window && q == me) continue;
        // in place the destination is output memory: valid elements only
        // (out_offset is 16-byte aligned); slots take whole vectors
        char* to = r.dst(q) + r.dst_off;
        if (kWhole)
          reinterpret_cast<uint4*>(to)[vv] = w;
        else
          store_pack<16>(reinterpret_cast<T*>(to), vv,
                         r.to_window ? r.len : (vv + 1) * E, true, w);
      }
    }
  });
}

template <typename T>
__global__ void __launch_bounds__(512)
    push(ncclDevComm dc, const __grid_constant__ symnccl_kargs a) {
  constexpr int E = Pack<T, 16>::kElems;
  constexpr int U = PushUnroll<T>::kReduce;
  constexpr int UC = PushUnroll<T>::kCopy;
  const int n = dc.lsaSize;
  const int me = dc.lsaRank;

  uint64_t e0;
  if (!enter_cta(a, me, n, e0)) return;
  const Peers flags = Peers::of(a.region_win, a.region_offset);
  const char* my_flags = flags(me);
  // every peer has read all that the push calls before this one sent it
  // (flag 1 >= e0): the slots of chunks 0 and 1 are free ('Between
  // calls'). First, with nothing else live: after the set-up below, the
  // 16-bit and fp64 kernels spilled 8-16 bytes.
  if (!wait_flags(my_flags + push_line(1, blockIdx.x, n), me, n, e0, a,
                  SYMNCCL_WAIT_PREVIOUS))
    return;

  // Receive slots [parity][source], then result slots [parity][slice].
  const T* src = static_cast<const T*>(a.src);
  T* out = static_cast<T*>(a.out);
  const size_t count = a.count;
  const size_t slot_bytes = a.row_bytes;
  const size_t chunk_elems = slot_bytes / sizeof(T) * n;
  const size_t nch = (count + chunk_elems - 1) / chunk_elems;
  const bool src_al = (reinterpret_cast<uintptr_t>(src) & 15) == 0;
  const bool out_al = (reinterpret_cast<uintptr_t>(out) & 15) == 0;
  const bool to_window = a.out_win != nullptr;
  const Deal<1> d = Deal<1>::of(Group::cta());
  const size_t step = d.tile;
  const Peers data = Peers::of(a.region_win, a.data_offset);
  const size_t res_rel = 2 * (size_t)n * slot_bytes;
  const char* my_data = data(me);
  // Where results go on every rank: the output in place, else result slots.
  const Peers dst = to_window ? Peers::of(a.out_win, a.out_offset)
                              : data.at(res_rel);

  // 3. gather chunk jc's results: complete once every peer's flag 1
  // reached e (the chunk's epoch + 1); in place they are already in out.
  // false: the CTA must leave.
  auto gather = [&](size_t jc, uint64_t e) {
    if (!wait_flags(my_flags + push_line(1, blockIdx.x, n), me, n, e, a,
                    SYMNCCL_WAIT_RESULTS))
      return false;
    if (to_window) return true;
    const PushChunk rp = push_chunk(jc, chunk_elems, count, n, E);
    const size_t pp = (e - 1) & 1;
    for (int q = 0; q < n; q++)
      if (q != me)
        push_copy<T, UC>(slice_len(rp, q, count),
                         reinterpret_cast<const T*>(
                             my_data + res_rel + (pp * n + q) * slot_bytes),
                         true, out + rp.c0 + q * rp.slice, out_al, false, d);
    return true;
  };

  for (size_t j = 0; j < nch; j++) {
    const uint64_t e = e0 + j;
    const size_t par = e & 1;
    const PushChunk r = push_chunk(j, chunk_elems, count, n, E);

    // 1. scatter my slices into their owners' receive slots
    for (int k = 1; k < n; k++) {
      const int q = (me + k) % n;
      push_copy<T, UC>(
          slice_len(r, q, count), src + r.c0 + q * r.slice, src_al,
          reinterpret_cast<T*>(data(q) + (par * n + me) * slot_bytes), true,
          true, d);
    }
    signal_flags(flags, push_line(0, blockIdx.x, n), me, n, e + 1);

    // 3 (previous chunk), overlapping this chunk's scatter
    if (j > 0 && !gather(j - 1, e)) return;

    // 2. reduce my slice (rank order) and push the result everywhere
    if (!wait_flags(my_flags + push_line(0, blockIdx.x, n), me, n, e + 1, a,
                    SYMNCCL_WAIT_SLICES))
      return;
    const size_t m0 = r.c0 + me * r.slice;
    const PushReduce<T> pr{src + m0,
                           src_al,
                           slice_len(r, me, count),
                           my_data + par * n * slot_bytes,
                           slot_bytes,
                           dst,
                           to_window ? m0 * sizeof(T)
                                     : (par * n + me) * slot_bytes,
                           to_window,
                           out + m0,
                           out_al};
    const size_t nv = (pr.len + E - 1) / E;
    const size_t nwhole = src_al && (to_window || out_al) ? pr.len / E : 0;
    for (size_t v = d.first; v < nv; v += U * step) {
      if (v + (U - 1) * step < nwhole)
        push_reduce<T, U, true>(pr, v, step, me, n, a.op);
      else
        for (int u = 0; u < U; u++)
          push_reduce<T, 1, false>(pr, v + u * step, step, me, n, a.op);
    }
    signal_flags(flags, push_line(1, blockIdx.x, n), me, n, e + 1);
  }

  // 3 (last chunk)
  if (nch > 0 && !gather(nch - 1, e0 + nch)) return;
  if (threadIdx.x == 0) a.epochs[blockIdx.x] = e0 + nch;
}

// reduce_scatter and all_gather on the same region, flags and per-CTA
// counters (the host maps them to the push epochs), so any push call may
// follow any other. Each slice (a block of the reduce-scatter's input, a
// rank's all-gather input) is cut into chunks of a.chunk_bytes (a slot, or
// less: SYMNCCL_PUSH_CHUNK_KIB); chunk j of every slice is one epoch
// e = e0 + j, in the slots of parity e & 1. Two roles per chunk:
//   send: once every peer has read chunk j - 2 (flag 1 >= e - 1: the last
//      reader of the slots of parity e & 1; for chunks 0 and 1, whose
//      chunk j - 2 was a push call's before, the entry's wait: flag 1 >=
//      e0), store my chunk j for rank
//      q (reduce-scatter: of slice q; all-gather: of my own input) into
//      q's receive slot [e & 1][me], for every q != me in rotated order,
//      the all-gather also into my own output; then flag 0 := e + 1 at
//      every peer;
//   consume: once flag 0 >= e + 1 from every peer, reduce my slice's chunk
//      in rank order 0..n-1 (my own part from my input) into my output, or
//      copy each peer's slot into its place in my output; then flag 1 :=
//      e + 1 at every peer ("your chunk j is read": a relaxed store,
//      signal_read, where flag 0 is a release).
// kSplit false (chunks of a whole slot, the default): every thread sends,
// then consumes, chunk after chunk (the order measured on 2 GPUs:
// docs/PERFORMANCE.md, 'Push chunks'). kSplit true (smaller chunks): each
// CTA is two warp groups with barriers of their own, the senders (first half) up to
// two chunks ahead of the consumers (second half), so that NVLink and local
// memory work at once; with one group the threads that store a chunk are
// the ones that reduce it, and the two never overlap (docs/PERFORMANCE.md,
// 'Push chunks').
// No cycle: a send waits for the peers' consumption of chunk j - 2, which
// waits only for sends of chunks <= j - 2, and the entry's wait for the
// consumption of earlier calls' chunks. A call ends without waiting for
// the peers to read its last chunks (they read only their own slots, never
// this rank's memory); the next push call's entry waits for that before
// its first store (push<T>'s argument, 'Between calls'). Flag 0 means
// the same in every push kernel (the stores of that chunk are in your
// slots), and so does flag 1 (the peer has read them; the all-reduce
// raises it after its reduction). Which CTA handles a vector is push<T>'s
// deal (by position in the chunk), so one flag per (phase, CTA, source
// rank) again suffices; split, each group takes half of its CTA's vectors
// of each tile (Deal<2>). A group that gives up stops its loop; the other
// one's next wait finds this rank's fault word set; both meet at the end.
// The all-gather runs on bytes (SYMNCCL_DT_BYTES); count is a slice's
// elements and slice_stride the distance between slices (of the input for
// reduce_scatter, of the output for all_gather).
template <typename T, bool kGather, bool kSplit>
__device__ __forceinline__ void push_slices(const ncclDevComm& dc,
                                            const symnccl_kargs& a) {
  constexpr int E = Pack<T, 16>::kElems;
  constexpr int UC = PushUnroll<T>::kCopy;
  constexpr int K = kSplit ? 2 : 1;   // my vectors per tile
  const int n = dc.lsaSize;
  const int me = dc.lsaRank;
  const T* src = static_cast<const T*>(a.src);
  T* out = static_cast<T*>(a.out);
  const size_t m = a.count;
  const size_t stride = a.slice_stride;
  const size_t slot_bytes = a.row_bytes;
  // chunk_bytes is a multiple of 16 (the host's): every chunk starts
  // 16-byte aligned relative to its slice
  const size_t chunk = a.chunk_bytes / sizeof(T);
  const size_t nch = (m + chunk - 1) / chunk;
  auto aligned = [](const void* p) {
    return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
  };

  // the window's descriptor (constant since its registration), loaded
  // before the entry so that the two overlap
  const Peers flags = Peers::of(a.region_win, a.region_offset);
  const Peers data = Peers::of(a.region_win, a.data_offset);

  uint64_t e0;
  if (!enter_cta(a, me, n, e0)) return;

  const char* my_flags = flags(me);
  const size_t line0 = push_line(0, blockIdx.x, n);
  const size_t line1 = push_line(1, blockIdx.x, n);
  // split: blockDim.x is a multiple of 64 and half of it >= n (the host's)
  const int half = (int)blockDim.x / 2;
  const bool sends = !kSplit || (int)threadIdx.x < half;
  const bool consumes = !kSplit || (int)threadIdx.x >= half;
  const Group g = !kSplit ? Group::cta()
                  : sends ? Group{(int)threadIdx.x, half, 1}
                          : Group{(int)threadIdx.x - half, half, 2};
  const Deal<K> d = Deal<K>::of(g);
  // the senders: every peer has read all that the push calls before this
  // one sent it (flag 1 >= e0), so the slots of chunks 0 and 1 are free
  bool ok = !sends || wait_flags(my_flags + line1, me, n, e0, a,
                                 SYMNCCL_WAIT_PREVIOUS, true, g);

  for (size_t j = 0; j < nch && ok; j++) {
    const uint64_t e = e0 + j;
    const size_t c0 = j * chunk;
    const size_t len = m - c0 < chunk ? m - c0 : chunk;
    const size_t par = e & 1;
    if (sends) {
      if (j >= 2 && !(ok = wait_flags(my_flags + line1, me, n, e - 1, a,
                                      SYMNCCL_WAIT_RESULTS, true, g)))
        break;
      for (int k = 1; k < n; k++) {
        const int q = (me + k) % n;
        const T* from = kGather ? src + c0 : src + q * stride + c0;
        push_copy<T, UC>(len, from, aligned(from),
                         reinterpret_cast<T*>(data(q) +
                                              (par * n + me) * slot_bytes),
                         true, true, d);
      }
      T* own = out + me * stride + c0;
      if (kGather && own != src + c0)  // not in place
        push_copy<T, UC>(len, src + c0, aligned(src + c0), own, aligned(own),
                         false, d);
      signal_flags(flags, line0, me, n, e + 1, true, g);
    }
    if (!consumes) continue;
    if (!(ok = wait_flags(my_flags + line0, me, n, e + 1, a,
                          SYMNCCL_WAIT_SLICES, true, g)))
      break;
    const char* slots = data(me) + par * n * slot_bytes;
    if constexpr (kGather) {
      for (int k = 1; k < n; k++) {
        const int q = (me + k) % n;
        T* to = out + q * stride + c0;
        push_copy<T, UC>(len,
                         reinterpret_cast<const T*>(slots + q * slot_bytes),
                         true, to, aligned(to), false, d);
      }
    } else {
      const T* own = src + me * stride + c0;
      const PushReduce<T> pr{own,   aligned(own), len,     slots,
                             slot_bytes, Peers{},   0,       false,
                             out + c0,   aligned(out + c0)};
      const size_t nv = (len + E - 1) / E;
      const size_t nwhole = pr.own_al && pr.out_al ? len / E : 0;
      // two of my vectors at a time, v and d.at(v, 1): one reduction of
      // both where the accumulators allow (PushUnroll)
      for (size_t v = d.first; v < nv; v += 2 / K * d.tile) {
        const size_t v1 = d.at(v, 1);
        if constexpr (PushUnroll<T>::kReduce == 2) {
          if (v1 < nwhole) {
            push_reduce<T, 2, true, false>(pr, v, v1 - v, me, n, a.op);
            continue;
          }
        }
        for (int h = 0; h < 2; h++) {
          const size_t vv = h == 0 ? v : v1;
          if (vv < nwhole)
            push_reduce<T, 1, true, false>(pr, vv, 0, me, n, a.op);
          else
            push_reduce<T, 1, false, false>(pr, vv, 0, me, n, a.op);
        }
      }
    }
    signal_read(flags, line1, me, n, e + 1, g);
  }

  // no wait for the peers to read my last chunks: the next push call's
  // entry waits for that before it stores anything
  if (__syncthreads_and(ok) && threadIdx.x == 0)
    a.epochs[blockIdx.x] = e0 + nch;
}

// (512, 1): with the bare 512 ptxas gave the fp8 reduce-scatter 64
// registers and 136 bytes of spills; with one CTA per SM declared the
// minimum it takes 96 and spills none (the grid is 64 CTAs: occupancy is
// not what limits these kernels).
// kSplit: a kernel of its own (both bodies in one kernel spilled 16-40
// bytes in the 16-bit and fp8 reduce-scatter); launch: push_split.
template <typename T, bool kSplit>
__global__ void __launch_bounds__(512, 1)
    push_reduce_scatter(ncclDevComm dc,
                        const __grid_constant__ symnccl_kargs a) {
  push_slices<T, false, kSplit>(dc, a);
}

template <typename T, bool kSplit>
__global__ void __launch_bounds__(512, 1)
    push_all_gather(ncclDevComm dc, const __grid_constant__ symnccl_kargs a) {
  push_slices<T, true, kSplit>(dc, a);
}

// Whether a push reduce_scatter/all_gather launch runs the split kernels:
// chunks smaller than a slot.
__host__ __forceinline__ bool push_split(const symnccl_kargs& a) {
  return a.chunk_bytes < a.row_bytes;
}

SYMNCCL_END


#endif  // SYMNCCL_KERNELS_PUSH_CUH
