// All-to-all with splits that stay on the device ("push_all_to_all"): rank r
// sends in_splits[q] rows of its input to rank q; rank q places the rows of
// rank 0, 1, ..., n-1 one after another in its output. Equal splits
// (Communicator.all_to_all) are the case in_splits[q] = m for every q. The
// kernel moves bytes (SYMNCCL_DT_BYTES, every dtype); a row is a.row_size
// bytes.
//
// It runs on the push kernels' region, flags and call counters (family
// PUSH, push.cuh): any push call may follow it and it may follow any push
// call. One call is epochs e0 .. e0 + nch - 1: chunk j (of a.chunk_bytes, a
// multiple of 16 <= a slot) is epoch e = e0 + j, in the slots of parity
// e & 1; nch = the most chunks any off-diagonal block takes, at least 1
// (chunk 0 is walked before the splits are known):
//
//   entry: CTA b waits until flag 1 of CTA b of every peer is >= e0 (that
//     peer has read every chunk any push call of mine sent it: no push call
//     waits for that at its end, push.cuh); CTA 0 waits so for every CTA of
//     every peer (all of them read the splits area). Meanwhile threads
//     0..n-1 load this rank's in_splits (int64, device; or a.host_splits
//     when in_splits is NULL), clamped after it (negative -> 0, the rows
//     past x's a.count rows dropped): row `me` of the matrix S[src][dst].
//   splits: CTA 0 stores my row into every peer's splits area (row `me`,
//     one LL packet per count, flag (e0 mod 2^32-1) + 1: data and flag in
//     one 16-byte store, packet.cuh).
//   chunk j (epoch e = e0 + j), as push_slices (push.cuh), unsplit:
//     send: (j >= 2) once every peer's flag 1 >= e - 1 (it has read chunk
//       j - 2, the last user of these slots; the entry's wait covers
//       chunks 0 and 1), store chunk j of my block for q into q's receive
//       slot [e & 1][me], every q != me in rotated order; then flag 0 :=
//       e + 1 at every peer. A sender needs only its own row, so chunk 0
//       goes before any peer's splits are known.
//     (j = 0, after the send) the matrix: every CTA polls the n - 1
//       peers' rows (sent at about the time of their chunk 0), so every
//       CTA of every rank holds the same n x n matrix and computes the
//       same nch. CTA 0 writes out_splits[r] = S[r][me] and out_offsets[r]
//       (where rank r's rows start in out).
//     own: piece j of my own block (nch pieces) copied from the input into
//       the output locally, after chunk j's stores, so that it overlaps
//       their trip (no flags: nothing of a peer's is touched).
//     consume: once every peer's flag 0 >= e + 1, copy chunk j of each
//       peer's slot to its place in my output; then flag 1 := e + 1 at
//       every peer (for chunk 0 it also says "I have read your splits":
//       the matrix was read before).
//   end: the counter := e0 + nch, without waiting for the peers to read my
//     last chunks (the next push call's entry does).
//
// Why it is correct:
// - Epochs: every push kernel numbers its chunks from the CTA's counter,
//   so the chunks of consecutive push calls, of any kind, are consecutive
//   epochs; a call takes at least one and leaves the counter after its
//   last. The grid is fixed per communicator and every rank walks the same
//   number of chunks in a call (here nch, from the same matrix), so epoch
//   e is the same chunk of the same call for CTA b of every rank. CTA b
//   raises flag 0 := e + 1 at q after its stores of epoch e into q's slots,
//   and flag 1 := e + 1 at q after it has read its vectors of q's chunk e;
//   epochs are walked in order and flags only grow (flag 0 a release
//   store, flag 1 a relaxed one, signal_read: it only allows a write
//   after a read; waits acquire; all of system scope: the peers are other
//   GPUs).
// - The slots: slot parity p is written at epochs e = p (mod 2), the
//   previous time at e - 2. CTA b of r stores epoch e into q's slot only
//   after it saw CTA b of q raise flag 1 >= e - 1, i.e. after q's CTA b
//   read epoch e - 2 (of this call or of an earlier push call of any
//   kind): inside the call the send of chunk j >= 2 waits for it; for the
//   first two epochs (e0 - 1 and e0 needed) the entry waited for >= e0.
//   CTA b reads and writes only its own vectors of a slot, in every push
//   kernel whatever the chunk's length (Deal), so CTA b against CTA b
//   suffices. No slot is overwritten while a peer still reads it.
// - The splits area holds one row per source, no parity, read by every
//   CTA. CTA 0 of r stores call c's row into q's area only after it saw
//   flag 1 >= e0(c) from every CTA b of q: each had read epoch e0(c) - 1,
//   so it had finished every earlier push call, the previous all-to-all c'
//   included, whose matrix it read before consuming c''s chunk 0 (epoch
//   e0(c') <= e0(c) - 1). No row is overwritten while a peer still polls
//   it.
// - No flag is taken for an earlier call's: flag 0 >= e + 1 is raised only
//   after the stores of epoch e, which is this call's (epochs are never
//   reused); flag 1 >= e - 1 and >= e0 mean what they say, whichever call
//   raised them. A splits packet carries its call's flag; a stale one in my
//   area is rank r's row of its previous all-to-all, of a smaller e0 (every
//   push call advances the counters by >= 1), so of another flag (until
//   2^32 - 1 epochs apart). Every CTA's counter agrees with every other's,
//   so the packets CTA 0 sends carry the flag every CTA polls for.
// - A call may end while a peer still reads the chunks it sent (its flag 1
//   to me still on the way): a peer reads only its own slots and splits
//   area, never my memory, so nothing of mine is still needed, and the
//   next push call's entry waits before it stores anything. The one store
//   a peer may still make into my memory after my kernel ended is that
//   flag 1 (a word of my push flag lines that only its CTA writes;
//   before, my end wait received it).
// - No cycle: the entry waits for the consumption of epochs < e0 (earlier
//   calls, which wait only for earlier calls); a matrix poll waits for CTA
//   0's packets, sent after that entry; the send of chunk j for the
//   consumption of j - 2, the consumption of j for the sends of j (and of
//   chunk 0 for the matrix).
// - Bounds: a rank reads at most x's a.count rows (the clamp, which is
//   also what it tells its peers) and writes at most out's a.out_rows
//   rows: rows that would land past them are dropped (out_splits still
//   reports what was sent, so sum(out_splits) > out rows shows it).
// - Faults: every wait (the entry's flags, the splits packets, flags 0 and
//   1) is bounded; a rank that never calls makes every other give up on
//   its splits packets or its flag 0 (SYMNCCL_WAIT_PACKETS, _SLICES,
//   naming it). A CTA that gave up leaves; its counter is not advanced.
//
// Requirements (launch.cu checks them for the push family): blockDim.x >= n
// and a multiple of 64, a.chunk_bytes a multiple of 16 and <= a slot. Any
// alignment of x, out and the rows (unaligned blocks take the byte-wise
// pack paths).
#ifndef SYMNCCL_KERNELS_ALLTOALL_CUH
#define SYMNCCL_KERNELS_ALLTOALL_CUH

#include "packet.cuh"
#include "push.cuh"

SYMNCCL_BEGIN

// The splits matrix and what each CTA derives from it (shared memory).
struct A2aShared {
  int64_t s[SYMNCCL_MAX_RANKS][SYMNCCL_MAX_RANKS];  // rows [src][dst]
  int64_t in_off[SYMNCCL_MAX_RANKS];   // my block for q starts here (rows)
  int64_t out_off[SYMNCCL_MAX_RANKS];  // rank r's rows start here in out
  int64_t out_cap[SYMNCCL_MAX_RANKS];  // ... of which this many fit
  unsigned long long nch;
};

// Bytes [c0, c0 + len) of a block of `total` bytes: the part in this chunk.
__device__ __forceinline__ size_t a2a_part(size_t total, size_t c0,
                                           size_t chunk) {
  return c0 >= total ? 0 : total - c0 < chunk ? total - c0 : chunk;
}

template <typename T>
__global__ void __launch_bounds__(512, 1)
    push_all_to_all(ncclDevComm dc, const __grid_constant__ symnccl_kargs a) {
  static_assert(sizeof(T) == 1, "all_to_all moves bytes");
  constexpr int UC = PushUnroll<T>::kCopy;
  __shared__ A2aShared sh;
  const int n = dc.lsaSize;
  const int me = dc.lsaRank;
  const T* src = static_cast<const T*>(a.src);
  T* out = static_cast<T*>(a.out);
  const size_t row = a.row_size;
  const size_t chunk = a.chunk_bytes;
  const size_t slot_bytes = a.row_bytes;
  auto aligned = [](const void* p) {
    return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
  };
  // the window's descriptor (constant since its registration), loaded
  // before the entry so that the two overlap
  const Peers splits = Peers::of(a.region_win, a.splits_offset);
  const Peers flags = Peers::of(a.region_win, a.region_offset);
  const Peers data = Peers::of(a.region_win, a.data_offset);

  uint64_t e0;
  if (!enter_cta(a, me, n, e0)) return;
  const uint64_t pflag = (uint32_t)(e0 % 0xFFFFFFFFull) + 1u;
  const char* my_flags = flags(me);
  const size_t line0 = push_line(0, blockIdx.x, n);
  const size_t line1 = push_line(1, blockIdx.x, n);
  const Group g = Group::cta();
  const Deal<1> d = Deal<1>::of(g);

  // my row of the matrix (device memory a kernel before this one may have
  // written: after enter's PDL wait), its loads in flight across the wait
  int64_t want = 0;
  if ((int)threadIdx.x < n)
    want = a.in_splits != nullptr ? a.in_splits[threadIdx.x]
                                  : a.host_splits[threadIdx.x];
  // the entry: every peer has read all I sent it before this call (flag 1
  // >= e0), from CTA b (my slots there), CTA 0 from every CTA (the splits
  // area: they all read it)
  bool ok = true;
  {
    const int lines = blockIdx.x == 0 ? (int)gridDim.x : 1;
    for (int t = threadIdx.x; t < lines * n && ok; t += blockDim.x) {
      const int s = t % n;
      const int b = blockIdx.x == 0 ? t / n : (int)blockIdx.x;
      if (s == me) continue;
      const uint64_t* f = reinterpret_cast<const uint64_t*>(
          my_flags + push_line(1, b, n) + (size_t)s * 8);
      ok = bounded_wait([&] { return acquire_load(f) >= e0; }, a, me, n,
                        {SYMNCCL_WAIT_PREVIOUS, s, e0});
    }
  }
  if ((int)threadIdx.x < n) sh.s[me][threadIdx.x] = want;
  if (!__syncthreads_and(ok)) return;
  // clamped to x's rows (every CTA alike)
  if (threadIdx.x == 0) {
    int64_t left = (int64_t)a.count;
    for (int q = 0; q < n; q++) {
      int64_t v = sh.s[me][q];
      v = v < 0 ? 0 : v > left ? left : v;
      sh.in_off[q] = (int64_t)a.count - left;
      sh.s[me][q] = v;
      left -= v;
    }
    sh.nch = 0;
  }
  __syncthreads();

  // the splits: CTA 0 sends my row to every peer
  if (blockIdx.x == 0)
    for (int t = threadIdx.x; t < n * n; t += blockDim.x) {
      const int q = t / n, k = t % n;
      if (q != me)
        LL::send(splits(q) + ((size_t)me * n + k) * LL::kItemBytes,
                 LL::Item{{(uint64_t)sh.s[me][k]}}, pflag);
    }

  size_t nch = 1;  // until the matrix is known (chunk 0's send)
  size_t own = 0, own_piece = 0;  // my own block's bytes, a chunk's piece
  for (size_t j = 0; j < nch; j++) {
    const uint64_t e = e0 + j;
    const size_t c0 = j * chunk;
    const size_t par = e & 1;
    if (j >= 2 && !wait_flags(my_flags + line1, me, n, e - 1, a,
                              SYMNCCL_WAIT_RESULTS, true, g))
      return;
    for (int k = 1; k < n; k++) {
      const int q = (me + k) % n;
      const size_t len = a2a_part((size_t)sh.s[me][q] * row, c0, chunk);
      const T* from = src + (size_t)sh.in_off[q] * row + c0;
      if (len != 0)
        push_copy<T, UC>(
            len, from, aligned(from),
            reinterpret_cast<T*>(data(q) + (par * n + me) * slot_bytes), true,
            true, d);
    }
    signal_flags(flags, line0, me, n, e + 1, true, g);

    if (j == 0) {
      // every peer's row
      for (int t = threadIdx.x; t < n * n; t += blockDim.x) {
        const int r = t / n, k = t % n;
        if (r == me) continue;
        const LL::Item it =
            LL::recv(splits(me) + ((size_t)r * n + k) * LL::kItemBytes,
                     pflag, a, me, n, r, ok);
        if (!ok) break;
        sh.s[r][k] = (int64_t)it.w[0];
      }
      if (!__syncthreads_and(ok)) return;
      // where each source's rows go, what fits, and the chunks every rank
      // walks
      if (threadIdx.x == 0) {
        int64_t at = 0;
        for (int r = 0; r < n; r++) {
          const int64_t v = sh.s[r][me];
          const int64_t room = (int64_t)a.out_rows - at;
          sh.out_off[r] = at;
          sh.out_cap[r] = room <= 0 ? 0 : v < room ? v : room;
          at += v;
        }
      }
      for (int t = threadIdx.x; t < n * n; t += blockDim.x) {
        const int r = t / n, k = t % n;
        if (r != k) {
          const size_t bytes = (size_t)sh.s[r][k] * row;
          atomicMax(&sh.nch,
                    (unsigned long long)((bytes + chunk - 1) / chunk));
        }
      }
      __syncthreads();
      if (blockIdx.x == 0 && (int)threadIdx.x < n) {
        if (a.out_splits != nullptr)
          a.out_splits[threadIdx.x] = sh.s[threadIdx.x][me];
        if (a.out_offsets != nullptr)
          a.out_offsets[threadIdx.x] = sh.out_off[threadIdx.x];
      }
      if (sh.nch > 1) nch = (size_t)sh.nch;
      own = (size_t)sh.out_cap[me] * row;
      own_piece = (own / nch + 15) / 16 * 16;
    }
    // my own block, locally, a piece a chunk after the chunk's stores, so
    // that it overlaps their trip as the all-gather's own copy does (all
    // of it after chunk 0's stores kept NVLink idle while it ran): this
    // CTA's vectors of piece j, the last piece taking what is left
    {
      const size_t p0 = j * own_piece;
      const size_t len = j + 1 == nch ? (own > p0 ? own - p0 : 0)
                                      : a2a_part(own, p0, own_piece);
      const T* from = src + (size_t)sh.in_off[me] * row + p0;
      T* to = out + (size_t)sh.out_off[me] * row + p0;
      if (len != 0)
        push_copy<T, UC>(len, from, aligned(from), to, aligned(to), false, d);
    }

    if (!wait_flags(my_flags + line0, me, n, e + 1, a, SYMNCCL_WAIT_SLICES,
                    true, g))
      return;
    const char* slots = data(me) + par * n * slot_bytes;
    for (int k = 1; k < n; k++) {
      const int r = (me + k) % n;
      const size_t len = a2a_part((size_t)sh.out_cap[r] * row, c0, chunk);
      T* to = out + (size_t)sh.out_off[r] * row + c0;
      if (len != 0)
        push_copy<T, UC>(len,
                         reinterpret_cast<const T*>(slots + r * slot_bytes),
                         true, to, aligned(to), false, d);
    }
    signal_read(flags, line1, me, n, e + 1, g);
  }

  // no wait for the peers to read my last chunks: the next push call's
  // entry waits for that before it stores anything
  if (threadIdx.x == 0) a.epochs[blockIdx.x] = e0 + nch;
}

// ---------------------------------------------------------------- packets
//
// ll_all_to_all: small messages in one launch of LL packets, no flags:
// rank r writes row r of every peer q's slot (the LL region, packet.cuh):
// packet 0 carries the count S[r][q], packets 1.. the bytes of its block
// for q, all with the call's flag, pushed at once. Rank q polls packet 0 of
// every row, then as many data packets as the rows that fit in out; it
// knows nothing else of the matrix and needs nothing else (one launch, no
// chunks to agree on). One one-way trip.
//
// Slots: the packet kernels' two slots and call counters (family LL), so
// the packet one-shot's argument holds as it is: every rank receives a
// packet (the count) from every peer in every call, so a rank finishes call
// c + 1 only after every peer finished call c, and a slot is written again
// (call c + 2) only after everyone is done with it.
//
// A row carries the count and at most a2a_ll_rows rows of the block (a
// function of the communicator and the row size, which every rank agrees
// on): a block past it is cut there, and the count says what was sent
// (out_splits: what arrived). "auto" takes ll only where out's rows (the
// same on every rank) are within it, so it never cuts a row out would have
// kept (launch.c, sn_a2a_plan).
//
// Requirements (launch.cu checks): one row of x fits in a row after the
// count.
// The rows of a block one row of LL packets carries after its count.
__host__ __device__ inline size_t a2a_ll_rows(size_t row_bytes,
                                              size_t row_size) {
  const size_t packets = row_bytes / LL::kItemBytes;
  return packets < 2 || row_size == 0
             ? 0
             : (packets - 1) * LL::kItemData / row_size;
}

template <typename T>
__global__ void __launch_bounds__(512)
    ll_all_to_all(ncclDevComm dc, const __grid_constant__ symnccl_kargs a) {
  static_assert(sizeof(T) == 1, "all_to_all moves bytes");
  using F = LL;
  __shared__ int64_t s_send[SYMNCCL_MAX_RANKS], s_in_off[SYMNCCL_MAX_RANKS];
  __shared__ int64_t s_recv[SYMNCCL_MAX_RANKS], s_out_off[SYMNCCL_MAX_RANKS];
  __shared__ int64_t s_cap[SYMNCCL_MAX_RANKS];
  const int n = dc.lsaSize;
  const int me = dc.lsaRank;
  uint64_t epoch;
  if (!enter_cta(a, me, n, epoch)) return;
  const PacketCall call(epoch, a.region_offset, n, a.row_bytes);
  const uint64_t flag = F::wire_flag(call.flag);
  const T* src = static_cast<const T*>(a.src);
  T* out = static_cast<T*>(a.out);
  const size_t row = a.row_size;

  if (threadIdx.x == 0) {
    int64_t left = (int64_t)a.count;
    for (int q = 0; q < n; q++) {
      int64_t v = a.in_splits != nullptr ? a.in_splits[q] : a.host_splits[q];
      v = v < 0 ? 0 : v > left ? left : v;
      s_in_off[q] = (int64_t)a.count - left;
      s_send[q] = v;
      left -= v;
    }
  }
  __syncthreads();

  // my counts and blocks into row `me` of every peer's slot, each block
  // cut at what a row carries
  const Peers rows =
      Peers::of(a.region_win, call.slot_off + (size_t)me * a.row_bytes);
  const size_t w0 = F::worker(), nw = F::workers();
  const int64_t fits = (int64_t)a2a_ll_rows(a.row_bytes, row);
  auto sent = [&](int q) { return s_send[q] < fits ? s_send[q] : fits; };
  if (w0 < (size_t)n && (int)w0 != me)
    F::send(rows((int)w0), F::Item{{(uint64_t)sent((int)w0)}}, flag);
  for (int k = 1; k < n; k++) {
    const int q = (me + k) % n;
    const size_t bytes = (size_t)sent(q) * row;
    const T* from = src + (size_t)s_in_off[q] * row;
    const bool al = aligned8(from);
    for (size_t i = w0; i < (bytes + 7) / 8; i += nw)
      F::send(rows(q) + (1 + i) * F::kItemBytes,
              F::load(from, i, bytes, al, flag), flag);
  }

  // the counts sent here, where each source's rows go, what fits
  const char* mine = Peers::of(a.region_win, call.slot_off)(me);
  bool ok = true;
  if ((int)threadIdx.x < n) {
    const int r = threadIdx.x;
    s_recv[r] = r == me ? s_send[me]
                        : (int64_t)F::recv(mine + (size_t)r * a.row_bytes, flag,
                                           a, me, n, r, ok)
                              .w[0];
  }
  const bool all_ok = __syncthreads_and(ok);
  if (all_ok && threadIdx.x == 0) {
    int64_t at = 0;
    for (int r = 0; r < n; r++) {
      const int64_t room = (int64_t)a.out_rows - at;
      s_out_off[r] = at;
      s_cap[r] = room <= 0 ? 0 : s_recv[r] < room ? s_recv[r] : room;
      at += s_recv[r];
    }
  }
  __syncthreads();
  if (all_ok) {
    if (blockIdx.x == 0 && (int)threadIdx.x < n) {
      if (a.out_splits != nullptr)
        a.out_splits[threadIdx.x] = s_recv[threadIdx.x];
      if (a.out_offsets != nullptr)
        a.out_offsets[threadIdx.x] = s_out_off[threadIdx.x];
    }
    // my own block, locally
    {
      const size_t bytes = (size_t)s_cap[me] * row;
      const T* from = src + (size_t)s_in_off[me] * row;
      T* to = out + (size_t)s_out_off[me] * row;
      const bool fa = aligned8(from), ta = aligned8(to);
      for (size_t i = w0; i < (bytes + 7) / 8; i += nw)
        store_pack<8>(to, i, bytes, ta, load_pack<8>(from, i, bytes, fa));
    }
    for (int k = 1; k < n && ok; k++) {
      const int r = (me + k) % n;
      const size_t bytes = (size_t)s_cap[r] * row;
      T* to = out + (size_t)s_out_off[r] * row;
      const bool al = aligned8(to);
      const char* from = mine + (size_t)r * a.row_bytes;
      for (size_t i = w0; i < (bytes + 7) / 8 && ok; i += nw)
        F::put(to, i, bytes, al,
               F::recv(from + (1 + i) * F::kItemBytes, flag, a, me, n, r, ok));
    }
  }
  end_call(a.epochs, call);
}

SYMNCCL_END

#endif  // SYMNCCL_KERNELS_ALLTOALL_CUH
