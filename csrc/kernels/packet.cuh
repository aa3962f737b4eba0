// Packet kernels: data and "it is there" travel in the same store, pushed to
// peers and polled in local memory; no barrier. One one-shot and one
// two-shot skeleton, over the packet formats (LL and LL128 below; a third,
// Lamport, whose data is its own flag, is defined after them: the fused
// kernel and the one-shot all-reduce use it):
//
//   LL     a 16-byte packet {data0, flag, data1, flag} per 8 data bytes,
//          written by one 16-byte volatile store: each 8-byte half carries
//          its own copy of the flag, so a reader that sees the flag in both
//          halves has both halves (NVLink guarantees 8-byte atomicity, not
//          16). The link carries 2x the message. A thread per packet.
//   LL128  128-byte lines of 120 data bytes and one 8-byte flag word,
//          written by 8 consecutive lanes with one 16-byte volatile store
//          each, so a warp's store covers 4 whole, 128-byte aligned lines;
//          the reader loads the same 4 lines with one warp-wide 16-byte
//          load and takes them when all 4 flags are current. The link
//          carries 16/15 of the message. It relies on NVLink and the
//          receiving L2 keeping such a 128-byte line write whole for such a
//          128-byte line read: the property NCCL's LL128 protocol rests on,
//          which NCCL enables on NVLink-connected Hopper. It is not a
//          documented CUDA memory-model guarantee; tests/_workers/
//          collectives.py checks it with random data, poisoned outputs and
//          bitwise comparisons in every dtype (a torn line would be a wrong
//          result, not a hang). A warp per 4 lines (an "item" of 60 words).
//
// one-shot: every rank pushes its whole input to every peer (row `me` of
//   the peer's slot) and reduces the n rows of its own slot as they arrive.
//   One one-way NVLink trip; each rank sends (n-1) copies.
// two-shot (3+ ranks, larger messages): slice q of every rank's input goes
//   to rank q only (phase 1), q reduces it as it arrives and pushes the
//   result to every rank (phase 2), every rank polls for the other slices'
//   results (phase 3). Per rank (n-1)/n of the message goes out twice, still
//   without a barrier: each phase waits only for packets of the phase
//   before, which never wait, so nothing can deadlock.
//
// Region (in the communicator's staging window, same offset on every rank;
// LL and LL128 each have their own: the formats cannot share slots, since
// LL looks for its flag in bytes 4-7 and 12-15 of each 16, where a stale
// LL128 line holds user data that may equal the flag, e.g. bf16 (1.0, 0.0)
// reads as 16256):
//   [slot 0..1][row 0..n-1] of row_bytes
//   one-shot: row r holds rank r's items;
//   two-shot: half = row_bytes / 2, phase-1 rows [source rank r] at r * half,
//             phase-2 rows [slice q] at (n + q) * half.
//
// Epochs: each CTA keeps a 64-bit call counter in device memory (enter /
// end_call), so graph replays need no host. Call c uses slot c & 1 and
// flag (c mod (2^32 - 1)) + 1, never 0 (the region starts zeroed); LL128
// stores it as the word flag << 32 | flag. The grid is fixed per
// communicator, so every CTA counts every call and all counters agree on
// every rank. Why two slots are enough and no slot is ever cleared: a rank
// finishes call c + 1 only after receiving packets that a peer sent in call
// c + 1 (one-shot: every peer's; two-shot: a slice owner's, who needed
// every rank's phase-1 packets of c + 1), which a peer sends only after its
// call c completed (stream order), i.e. after it read everything of call c.
// So when any rank writes a slot again in call c + 2, every rank is done
// with call c; a stale packet holds the flag of c - 2 or older, never the
// one waited for. One-shot and two-shot calls may alternate on the same
// slots: both keep each flag in the same place of a packet or 128-byte
// aligned line (half is a multiple of 2048 bytes).
//
// Reduction: rank order 0..n-1, the own contribution read from the input,
// fp32 accumulation for 16-bit and fp8 types: the same bits on every rank
// and as every other algorithm. Each worker reads and writes the same
// elements of in and out (in the two-shot, item (slice q, j) is read in
// phase 1 and written in phase 3 by the same worker), so in place is safe.
// Any alignment of in and out; blockDim.x a multiple of 32 (LL128).
#ifndef SYMNCCL_KERNELS_PACKET_CUH
#define SYMNCCL_KERNELS_PACKET_CUH

#include "primitives.cuh"

SYMNCCL_BEGIN

// ------------------------------------------------------------------ formats
//
// A format defines: kWords data words per lane of an item, kItemBytes of
// row an item takes, kItemData data bytes it carries, whether its waits are
// warp-collective (kWarp), the largest CTA the one-shot takes in it
// (kMaxThreads, its launch bounds), who works on an item (a thread or a
// warp), and how an item is loaded from the input, sent, received and
// stored to the output.

struct LL {
  static constexpr int kWords = 1;
  static constexpr size_t kItemBytes = 16;
  static constexpr size_t kItemData = 8;
  static constexpr bool kWarp = false;
  static constexpr int kMaxThreads = 512;

  struct Item {
    uint64_t w[kWords];
  };

  // A pass of gridDim.x * blockDim.x items: a warp's 32 consecutive
  // items (coalesced), those runs dealt round the grid's CTAs (run c to
  // CTA c % gridDim.x), so a short message is spread over the SMs instead
  // of filling the first CTAs (blockDim.x a multiple of 32: launch.cu).
  __device__ static size_t worker() {
    const size_t run = (size_t)(threadIdx.x >> 5) * gridDim.x + blockIdx.x;
    return run * 32 + (threadIdx.x & 31);
  }
  __device__ static size_t workers() { return (size_t)gridDim.x * blockDim.x; }
  __device__ static size_t lane_offset() { return 0; }
  __device__ static uint64_t wire_flag(uint32_t f) { return f; }

  template <typename T>
  __device__ static Item load(const T* in, size_t i, size_t count, bool al,
                              uint64_t /*flag*/) {
    return {{load_pack<8>(in, i, count, al)}};
  }
  template <typename T>
  __device__ static void put(T* out, size_t i, size_t count, bool al,
                             const Item& it) {
    store_pack<8>(out, i, count, al, it.w[0]);
  }
  __device__ static Item with_flag(Item it, uint64_t /*flag*/) { return it; }

  __device__ static void send(char* p, const Item& it, uint64_t flag) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p),
                 "r"((uint32_t)it.w[0]), "r"((uint32_t)flag),
                 "r"((uint32_t)(it.w[0] >> 32)), "r"((uint32_t)flag)
                 : "memory");
  }

  // One look at the packet at p: true, with `word` its data, once both of
  // its flag halves are `flag` (one 16-byte load).
  __device__ static bool look(const char* p, uint64_t flag, uint64_t& word) {
    uint32_t d0, f0, d1, f1;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(d0), "=r"(f0), "=r"(d1), "=r"(f1)
                 : "l"(p)
                 : "memory");
    word = (uint64_t)d0 | ((uint64_t)d1 << 32);
    return f0 == (uint32_t)flag && f1 == (uint32_t)flag;
  }
  // Rank `from`'s packet at p. Once a wait of this thread gave up (ok
  // false) it waits for nothing more, and what it returns is garbage.
  __device__ static Item recv(const char* p, uint64_t flag,
                              const symnccl_kargs& a, int me, int n,
                              int from, bool& ok) {
    Item it = {{0}};
    if (ok)
      ok = bounded_wait([&] { return look(p, flag, it.w[0]); }, a, me, n,
                        {SYMNCCL_WAIT_PACKETS, from, flag});
    return it;
  }
};

struct LL128 {
  static constexpr int kWords = 2;
  static constexpr size_t kItemBytes = 512;  // 4 lines of 128 bytes
  static constexpr int kItemWords = 60;      // data words of an item
  static constexpr size_t kItemData = 8 * kItemWords;
  static constexpr bool kWarp = true;
  static constexpr int kMaxThreads = 512;

  struct Item {
    uint64_t w[kWords];
  };

  // warp w of CTA b takes item w * gridDim.x + b of a pass (as LL: a short
  // message spread over the grid's SMs)
  __device__ static size_t worker() {
    return (size_t)(threadIdx.x / 32) * gridDim.x + blockIdx.x;
  }
  __device__ static size_t workers() {
    return (size_t)gridDim.x * (blockDim.x / 32);
  }
  // Lane 8l + p stores bytes [16p, 16p + 16) of line l.
  __device__ static size_t lane_offset() {
    return (size_t)(threadIdx.x & 31) * 16;
  }
  __device__ static uint64_t wire_flag(uint32_t f) {
    return (uint64_t)f << 32 | f;
  }
  // Lane 8l + p carries words 2p and 2p + 1 of line l (15 data words a
  // line), except p = 7: word 14 and the flag.
  __device__ static bool flag_lane() { return (threadIdx.x & 7) == 7; }
  __device__ static size_t lane_word() {
    const int lane = threadIdx.x & 31;
    return (size_t)(lane >> 3) * 15 + (size_t)(lane & 7) * 2;
  }

  template <typename T>
  __device__ static Item load(const T* in, size_t b, size_t count, bool al,
                              uint64_t flag) {
    const size_t w = b * kItemWords + lane_word();
    return {{load_pack<8>(in, w, count, al),
             flag_lane() ? flag : load_pack<8>(in, w + 1, count, al)}};
  }
  template <typename T>
  __device__ static void put(T* out, size_t b, size_t count, bool al,
                             const Item& it) {
    const size_t nw = (count + 8 / sizeof(T) - 1) / (8 / sizeof(T));
    const size_t w = b * kItemWords + lane_word();
    if (w < nw) store_pack<8>(out, w, count, al, it.w[0]);
    if (!flag_lane() && w + 1 < nw) store_pack<8>(out, w + 1, count, al, it.w[1]);
  }
  __device__ static Item with_flag(Item it, uint64_t flag) {
    if (flag_lane()) it.w[1] = flag;
    return it;
  }

  __device__ static void send(char* p, const Item& it, uint64_t /*flag*/) {
    asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p),
                 "l"(it.w[0]), "l"(it.w[1])
                 : "memory");
  }

  // Rank `from`'s 4 lines at p (warp-collective: `ok` is the same in every
  // lane of the warp).
  __device__ static Item recv(const char* p, uint64_t flag,
                              const symnccl_kargs& a, int me, int n,
                              int from, bool& ok) {
    uint64_t v0 = 0, v1 = 0;
    const bool fl = flag_lane();
    if (ok)
      ok = bounded_wait<true>(
            [&] {
              asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];"
                           : "=l"(v0), "=l"(v1)
                           : "l"(p)
                           : "memory");
              return __all_sync(0xffffffffu, !fl || v1 == flag);
            },
            a, me, n, {SYMNCCL_WAIT_PACKETS, from, flag});
    return {{v0, v1}};
  }
};

// Lamport: 16-byte packets that are all data, with no flag: a slot's
// 8-byte word of all ones is "not written yet" (the sentinel), so the link
// carries the message once (LL: 2x, LL128: 16/15). All ones is a NaN in
// float32, float16 and bfloat16, and only those kernels use the format
// (the FLOAT unit, table.h): a word of x that is all ones (its every
// element that NaN) is sent with its lowest element's sign bit cleared,
// still a NaN (the canonical one), so no data word is ever the sentinel.
// The reductions add every peer's element in float32, which gives the
// canonical NaN whatever a NaN input's bits, so the results keep the bits
// of every other algorithm. A reader polls a packet with one 16-byte
// volatile load and takes it when neither word is all ones (NVLink keeps
// 8-byte stores whole, as LL relies on); then it stores all ones back
// (rearm), so a slot is empty again before its next use.
//
// Why a rearmed slot is empty when a peer next writes it (two slots, as
// LL's: the call counters' parity): rank r rearms what it read of slot s
// in call c, before its kernel of call c ends. A peer writes slot s of r
// again in call c + 2 only after its call c + 1 received r's packets of
// c + 1, which r sent after its call c had ended (stream order), and so
// after r's rearming stores were performed. The region starts all ones
// (staging.c) and a row `me` is never written. A call whose wait gave up
// leaves slots unread, and the communicator refuses every later call
// (faults.c), so no call reads them. Used by lamport_rmsnorm
// (rmsnorm.cuh: a thread's 16-byte vector is one packet) and, as the
// format LamportItems, by all_reduce's lamport one-shot.
struct Lamport {
  static constexpr size_t kItemBytes = 16;
  static constexpr size_t kItemData = 16;
  static constexpr uint64_t kEmpty = ~0ull;

  // w, never the sentinel (T: float32, float16 or bfloat16)
  template <typename T>
  __device__ static uint64_t sendable(uint64_t w) {
    static_assert(sizeof(T) == 2 || sizeof(T) == 4,
                  "Lamport packets carry float32, float16, bfloat16");
    return w == kEmpty ? w ^ (1ull << (8 * sizeof(T) - 1)) : w;
  }
  // The packet of words lo, hi into the slot at p, each word sendable.
  template <typename T>
  __device__ static void send(char* p, uint64_t lo, uint64_t hi) {
    asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p),
                 "l"(sendable<T>(lo)), "l"(sendable<T>(hi))
                 : "memory");
  }
  template <typename T>
  __device__ static void send(char* p, uint4 d) {
    send<T>(p, (uint64_t)d.x | (uint64_t)d.y << 32,
            (uint64_t)d.z | (uint64_t)d.w << 32);
  }
  // One look at the packet at p: true, with lo and hi its words, once both
  // are written.
  __device__ static bool look(const char* p, uint64_t& lo, uint64_t& hi) {
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];"
                 : "=l"(lo), "=l"(hi)
                 : "l"(p)
                 : "memory");
    return lo != kEmpty && hi != kEmpty;
  }
  __device__ static bool look(const char* p, uint4& d) {
    uint64_t lo, hi;
    const bool got = look(p, lo, hi);
    d = make_uint4((uint32_t)lo, (uint32_t)(lo >> 32), (uint32_t)hi,
                   (uint32_t)(hi >> 32));
    return got;
  }
  // After the packet at p was taken: empty again.
  __device__ static void rearm(char* p) {
    asm volatile("st.volatile.global.v2.u64 [%0], {%1, %1};" ::"l"(p),
                 "l"(kEmpty)
                 : "memory");
  }
};

// Lamport packets as a format of the skeletons below (all_reduce's
// `lamport` kernel; T is its element type): a thread per packet, whose two
// words are the item. Sent through Lamport::send<T> (an all-ones word of x
// goes as its stand-in); the own part of a reduction is x's word as it is.
// recv takes a packet once neither word is empty, and rearms it. Sums only
// (sum, avg; registry.c refuses max and min, which would pass a peer's
// stand-in through where the other algorithms pass x's all-ones word; a
// float32 sum makes the canonical NaN of either).
template <typename T>
struct LamportItems {
  static constexpr int kWords = 2;
  static constexpr size_t kItemBytes = Lamport::kItemBytes;
  static constexpr size_t kItemData = Lamport::kItemData;
  static constexpr bool kWarp = false;
  static constexpr int kMaxThreads = SYMNCCL_WIDE_MAX_THREADS;

  struct Item {
    uint64_t w[kWords];
  };

  __device__ static size_t worker() { return LL::worker(); }
  __device__ static size_t workers() { return LL::workers(); }
  __device__ static size_t lane_offset() { return 0; }
  // no flag travels: the call's is what a wait that gives up records
  __device__ static uint64_t wire_flag(uint32_t f) { return f; }

  // one 16-byte load or store where `p` allows it, else two 8-byte ones
  template <typename U>
  __device__ static Item load(const U* in, size_t i, size_t count, bool al,
                              uint64_t /*flag*/) {
    if (al && (reinterpret_cast<uintptr_t>(in) & 15) == 0) {
      const uint4 d = load_pack<16>(in, i, count, true);
      return {{(uint64_t)d.x | (uint64_t)d.y << 32,
               (uint64_t)d.z | (uint64_t)d.w << 32}};
    }
    return {{load_pack<8>(in, 2 * i, count, al),
             load_pack<8>(in, 2 * i + 1, count, al)}};
  }
  template <typename U>
  __device__ static void put(U* out, size_t i, size_t count, bool al,
                             const Item& it) {
    if (al && (reinterpret_cast<uintptr_t>(out) & 15) == 0) {
      store_pack<16>(out, i, count, true,
                     make_uint4((uint32_t)it.w[0], (uint32_t)(it.w[0] >> 32),
                                (uint32_t)it.w[1],
                                (uint32_t)(it.w[1] >> 32)));
      return;
    }
    store_pack<8>(out, 2 * i, count, al, it.w[0]);
    store_pack<8>(out, 2 * i + 1, count, al, it.w[1]);
  }
  __device__ static Item with_flag(Item it, uint64_t /*flag*/) { return it; }

  __device__ static void send(char* p, const Item& it, uint64_t /*flag*/) {
    Lamport::send<T>(p, it.w[0], it.w[1]);
  }
  // Rank `from`'s packet at p, then the slot rearmed. As LL::recv once a
  // wait gave up.
  __device__ static Item recv(const char* p, uint64_t flag,
                              const symnccl_kargs& a, int me, int n,
                              int from, bool& ok) {
    Item it = {{0, 0}};
    if (ok) {
      ok = bounded_wait([&] { return Lamport::look(p, it.w[0], it.w[1]); },
                        a, me, n, {SYMNCCL_WAIT_PACKETS, from, flag});
      if (ok) Lamport::rearm(const_cast<char*>(p));
    }
    return it;
  }
};

// Items a message of `bytes` takes in format F.
template <typename F>
__host__ __device__ constexpr size_t packet_items(size_t bytes) {
  return (bytes + F::kItemData - 1) / F::kItemData;
}

// Item i reduced in rank order 0..n-1: rank q's part is polled at
// rows + q * row_stride (this lane's piece), the own read from `in` before
// any poll, so its load overlaps the waits. ok: as F::recv's.
template <typename T, typename F>
__device__ __forceinline__ typename F::Item reduce_item(
    const char* rows, size_t row_stride, const T* in, size_t i, size_t count,
    bool in_al, int me, int n, int op, uint64_t flag, const symnccl_kargs& a,
    bool& ok) {
  using Item = typename F::Item;
  const Item own = F::load(in, i, count, in_al, 0);
  auto part = [&](int q) {
    return q == me ? own
                   : F::recv(rows + (size_t)q * row_stride, flag, a, me, n,
                             q, ok);
  };
  return with_op(op, [&](auto o) {
    Accum<T, 8, decltype(o)> acc[F::kWords];
    Item it = part(0);
#pragma unroll
    for (int w = 0; w < F::kWords; w++) acc[w].set(it.w[w]);
    for (int q = 1; q < n; q++) {
      it = part(q);
#pragma unroll
      for (int w = 0; w < F::kWords; w++) acc[w].fold(it.w[w]);
    }
    Item r;
#pragma unroll
    for (int w = 0; w < F::kWords; w++) r.w[w] = acc[w].result(op, n);
    return F::with_flag(r, flag);
  });
}

// ---------------------------------------------------------------- kernels

// What both packet kernels derive from their arguments.
template <typename T, typename F>
struct PacketLaunch {
  int n, me;
  const T* in;
  T* out;
  PacketCall call;
  uint64_t flag;  // as the format stores it
  size_t items;   // of the whole launch
  size_t lane;    // this lane's offset in an item's row bytes
  bool in_al, out_al;

  __device__ __forceinline__ PacketLaunch(int n_, int me_, uint64_t epoch,
                                          const symnccl_kargs& a)
      : n(n_),
        me(me_),
        in(static_cast<const T*>(a.src)),
        out(static_cast<T*>(a.out)),
        call(epoch, a.region_offset, n_, a.row_bytes),
        flag(F::wire_flag(call.flag)),
        items(packet_items<F>(a.count * sizeof(T))),
        lane(F::lane_offset()),
        in_al((reinterpret_cast<uintptr_t>(in) & 7) == 0),
        out_al((reinterpret_cast<uintptr_t>(out) & 7) == 0) {}
};

template <typename T, typename F>
__global__ void __launch_bounds__(F::kMaxThreads)
    packet_one_shot(ncclDevComm dc, const __grid_constant__ symnccl_kargs a) {
  uint64_t epoch;
  if (!enter_cta(a, dc.lsaRank, dc.lsaSize, epoch)) return;
  const PacketLaunch<T, F> k(dc.lsaSize, dc.lsaRank, epoch, a);
  const int n = k.n, me = k.me;

  // my items into row `me` of every peer's slot
  const Peers row =
      Peers::of(a.region_win, k.call.slot_off + (size_t)me * a.row_bytes);
  for (size_t i = F::worker(); i < k.items; i += F::workers()) {
    const typename F::Item it = F::load(k.in, i, a.count, k.in_al, k.flag);
    for (int q = 0; q < n; q++)
      if (q != me) F::send(row(q) + i * F::kItemBytes + k.lane, it, k.flag);
  }

  // my slot's rows, reduced in rank order as they arrive
  const char* mine = Peers::of(a.region_win, k.call.slot_off)(me);
  bool ok = true;
  for (size_t i = F::worker(); i < k.items && ok; i += F::workers())
    F::put(k.out, i, a.count, k.out_al,
           reduce_item<T, F>(mine + i * F::kItemBytes + k.lane, a.row_bytes,
                             k.in, i, a.count, k.in_al, me, n, a.op, k.flag,
                             a, ok));

  end_call(a.epochs, k.call);
}

// The two-shot's phases, each one pass over one slice of `per` items per
// rank; a reduce-scatter is phases 1 and 2 (without the sends of the
// result), an all-gather the sends of phase 2 (of the own input) and phase
// 3. Half rows: phase-1 rows [source rank r] at r * half, phase-2 rows
// [slice q] at (n + q) * half.

// 1. slice q of my input -> rank q, row `me` (peers in rotated order)
template <typename T, typename F>
__device__ __forceinline__ void scatter_slices(const PacketLaunch<T, F>& k,
                                               const symnccl_kargs& a,
                                               const Peers& slot, size_t half,
                                               size_t per) {
  for (int d = 1; d < k.n; d++) {
    const int q = (k.me + d) % k.n;
    char* row = slot.at((size_t)k.me * half)(q);
    for (size_t j = F::worker(); j < per && q * per + j < k.items;
         j += F::workers())
      F::send(row + j * F::kItemBytes + k.lane,
              F::load(k.in, q * per + j, a.count, k.in_al, k.flag), k.flag);
  }
}

// 2. my slice reduced in rank order as the rows arrive, the result to every
// rank's phase-2 row `me` and to my output (ok: as F::recv's; nothing is
// sent once it is down)
template <typename T, typename F>
__device__ __forceinline__ void reduce_slice(const PacketLaunch<T, F>& k,
                                             const symnccl_kargs& a,
                                             const Peers& slot, size_t half,
                                             size_t per, bool& ok) {
  const char* mine = slot(k.me);
  const Peers res = slot.at((size_t)(k.n + k.me) * half);
  for (size_t j = F::worker(); j < per && k.me * per + j < k.items && ok;
       j += F::workers()) {
    const size_t i = k.me * per + j;
    const size_t at = j * F::kItemBytes + k.lane;
    const typename F::Item r =
        reduce_item<T, F>(mine + at, half, k.in, i, a.count, k.in_al, k.me,
                          k.n, a.op, k.flag, a, ok);
    if (!ok) break;
    for (int q = 0; q < k.n; q++)
      if (q != k.me) F::send(res(q) + at, r, k.flag);
    F::put(k.out, i, a.count, k.out_al, r);
  }
}

// 3. every other slice from its owner's phase-2 row, into my output
template <typename T, typename F>
__device__ __forceinline__ void gather_slices(const PacketLaunch<T, F>& k,
                                              const symnccl_kargs& a,
                                              const Peers& slot, size_t half,
                                              size_t per, bool& ok) {
  const char* mine = slot(k.me);
  for (int d = 1; d < k.n && ok; d++) {
    const int q = (k.me + d) % k.n;
    const char* row = mine + (size_t)(k.n + q) * half;
    for (size_t j = F::worker(); j < per && q * per + j < k.items && ok;
         j += F::workers())
      F::put(k.out, q * per + j, a.count, k.out_al,
             F::recv(row + j * F::kItemBytes + k.lane, k.flag, a, k.me, k.n,
                     q, ok));
  }
}

template <typename T, typename F>
__global__ void __launch_bounds__(512)
    packet_two_shot(ncclDevComm dc, const __grid_constant__ symnccl_kargs a) {
  uint64_t epoch;
  if (!enter_cta(a, dc.lsaRank, dc.lsaSize, epoch)) return;
  const PacketLaunch<T, F> k(dc.lsaSize, dc.lsaRank, epoch, a);
  const size_t half = a.row_bytes / 2;
  const size_t per = (k.items + k.n - 1) / k.n;  // items per slice
  const Peers slot = Peers::of(a.region_win, k.call.slot_off);
  bool ok = true;
  scatter_slices(k, a, slot, half, per);
  reduce_slice(k, a, slot, half, per, ok);
  gather_slices(k, a, slot, half, per, ok);
  end_call(a.epochs, k.call);
}

// --------------------------------------------- reduce-scatter, all-gather
//
// Both are one-shots on the all-reduce one-shot's slots, flags and call
// counters, with the same row layout (rank r's item i at row r, item i), so
// any call type may follow any other on a communicator. A launch covers
// elements [0, count) of every slice: the host points src and out at the
// chunk's start, and slices lie slice_stride elements apart. Every rank
// receives packets from every peer in every call (each slice holds at
// least one item), so the one-shot's argument for two slots holds as is.
//
// reduce_scatter: slice q of my input goes to rank q (row `me`), and my
//   slice is reduced in rank order 0..n-1 as the rows arrive (my own part
//   read from my input), into out: the bits of block `me` of the
//   all-reduce of the same inputs. In place (out = my slice of the input)
//   is safe: the worker that reads an item of my slice writes it.
// all_gather: my input goes to every peer (row `me`) and into my slice of
//   out; slice q of out takes rank q's row as it arrives. The host runs it
//   on bytes (SYMNCCL_DT_BYTES), so it moves every dtype. In place (my
//   input = my slice of out) is safe: each worker rewrites what it read.

__device__ __forceinline__ bool aligned8(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 7) == 0;
}

template <typename T, typename F>
__global__ void __launch_bounds__(512)
    packet_reduce_scatter(ncclDevComm dc,
                          const __grid_constant__ symnccl_kargs a) {
  uint64_t epoch;
  if (!enter_cta(a, dc.lsaRank, dc.lsaSize, epoch)) return;
  const PacketLaunch<T, F> k(dc.lsaSize, dc.lsaRank, epoch, a);
  const int n = k.n, me = k.me;
  const Peers slot = Peers::of(a.region_win, k.call.slot_off);

  // slice q of my input into row `me` of rank q's slot (rotated order)
  for (int d = 1; d < n; d++) {
    const int q = (me + d) % n;
    const T* in = k.in + (size_t)q * a.slice_stride;
    const bool al = aligned8(in);
    char* row = slot(q) + (size_t)me * a.row_bytes;
    for (size_t i = F::worker(); i < k.items; i += F::workers())
      F::send(row + i * F::kItemBytes + k.lane,
              F::load(in, i, a.count, al, k.flag), k.flag);
  }

  // my slice, reduced in rank order as the rows arrive
  const T* own = k.in + (size_t)me * a.slice_stride;
  const bool own_al = aligned8(own);
  const char* mine = slot(me);
  bool ok = true;
  for (size_t i = F::worker(); i < k.items && ok; i += F::workers())
    F::put(k.out, i, a.count, k.out_al,
           reduce_item<T, F>(mine + i * F::kItemBytes + k.lane, a.row_bytes,
                             own, i, a.count, own_al, me, n, a.op, k.flag,
                             a, ok));

  end_call(a.epochs, k.call);
}

template <typename T, typename F>
__global__ void __launch_bounds__(512)
    packet_all_gather(ncclDevComm dc,
                      const __grid_constant__ symnccl_kargs a) {
  uint64_t epoch;
  if (!enter_cta(a, dc.lsaRank, dc.lsaSize, epoch)) return;
  const PacketLaunch<T, F> k(dc.lsaSize, dc.lsaRank, epoch, a);
  const int n = k.n, me = k.me;
  const Peers slot = Peers::of(a.region_win, k.call.slot_off);

  // my input into row `me` of every peer's slot, and into my slice of out
  T* own = k.out + (size_t)me * a.slice_stride;
  const bool own_al = aligned8(own);
  for (size_t i = F::worker(); i < k.items; i += F::workers()) {
    const typename F::Item it = F::load(k.in, i, a.count, k.in_al, k.flag);
    for (int q = 0; q < n; q++)
      if (q != me)
        F::send(slot(q) + (size_t)me * a.row_bytes + i * F::kItemBytes +
                    k.lane,
                it, k.flag);
    F::put(own, i, a.count, own_al, it);
  }

  // every peer's row into its slice of out (rotated order)
  const char* mine = slot(me);
  bool ok = true;
  for (int d = 1; d < n && ok; d++) {
    const int q = (me + d) % n;
    T* dst = k.out + (size_t)q * a.slice_stride;
    const bool al = aligned8(dst);
    const char* row = mine + (size_t)q * a.row_bytes;
    for (size_t i = F::worker(); i < k.items && ok; i += F::workers())
      F::put(dst, i, a.count, al,
             F::recv(row + i * F::kItemBytes + k.lane, k.flag, a, me, n, q,
                     ok));
  }

  end_call(a.epochs, k.call);
}

SYMNCCL_END

#endif  // SYMNCCL_KERNELS_PACKET_CUH
