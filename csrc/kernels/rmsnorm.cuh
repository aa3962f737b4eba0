// all_reduce + residual add + RMSNorm in one kernel (all_reduce_rmsnorm),
// on one_shot's skeleton (lsa.cuh) and symnccl's own bounded Barrier
// (primitives.cuh).
//
// one_shot_rmsnorm: x holds `rows` rows of H elements (this rank's partial
//   sums), residual and out_h rows of H, weight H elements. For every row:
//     s = x summed over the ranks in rank order 0..n-1 (reduce_ranks, in
//         Acc<T>, rounded to T: the bits of all_reduce),
//     h = T(s + residual)                       -> out_h (the new residual)
//     r = rsqrt(sum(h * h) / H + eps)           (fp32, from h as stored)
//     y = T(T(h * r) * weight)                  -> out
//   which is vLLM's fused_add_rms_norm and torch's rms_norm composition
//   (the normalised value rounded to T before the weight; a no-op for
//   float32). 16-bit floats compute h, T(h * r) and y's product a word's
//   pair at once (Half2, reduce.cuh: fp32's bits rounded to T). With
//   a.quant, out is float8_e4m3fn: q = fp8(y * (1 / s)),
//   saturated to +-448 (NaN stays NaN), as vLLM's fused norm + quant
//   kernels convert; s is a.scale[0] (static), or the row's
//   max(amax(|y|) / 448, 1 / (448 * 512)), stored to a.scale[row]
//   (dynamic, vLLM's per-token scale).
//
//   Steps: each CTA takes whole rows (row i goes to CTA i % grid on every
//   rank) and copies its rows of x into the staging window; entry barrier
//   (the same CTA of every peer staged the same rows); each thread loads
//   its vectors of the row from every rank (ld.cg), adds the residual,
//   stores h and keeps up to kKeep vectors in registers (beyond that it
//   reads back its own h from out_h); a block reduction of the row's sum of
//   squares (fixed order: lanes by xor shuffles, then warps 0..w-1, the
//   same on every thread, rank and launch); y; exit barrier (no peer still
//   reads my staging rows when the next kernel overwrites them).
//
// add_rmsnorm: the same rows with no peer, run for every launch with
//   a.local (one rank, or x holds an all-reduce's sum already: the
//   composed path's add+norm): nothing staged, no barrier, no call
//   counter. The rows of one SM must be in flight together to reach HBM's
//   bandwidth (one 512-thread CTA per SM, waiting for each row's loads
//   before it issued the next, read ~1.4 TB/s on H100), so: at most 64
//   registers a thread (two 512-thread CTAs per SM), a grid of as many
//   CTAs as are resident at once (SYMNCCL_RMSNORM_LOCAL_CTAS) whose rows
//   go round them, and each CTA's next row loaded while it reduces and
//   stores this one. Its first row is loaded past the PDL wait (x may be
//   the kernel before's output) but before the entry's verdict (local
//   memory only: a failed communicator's launch stores nothing).
//
// two_shot_rmsnorm: the same rows, split among the ranks: rank q reduces
//   and normalises rows [q * per, q * per + per) (per = ceil(rows / n)),
//   reading them from every rank's staging, and stores each y and h vector
//   into every rank's result rows (the staging window after the staged x);
//   exit barrier; each rank copies the result rows into out and out_h.
//   Moves (n-1)/n of x in and 2 (n-1)/n of it out per rank over NVLink,
//   against one_shot's (n-1) in. The residual and weight each rank reads
//   are its own: they must be the same on every rank (tensor parallelism's
//   replicated residual stream), and then the bits are one_shot's. No FP8
//   output.
//
// Bits: a row's arithmetic depends on the block only (the host derives it
// from H and the dtype), never on the grid; every rank runs it on the same
// inputs, so every rank's y and h are the same bits, and add_rmsnorm gives
// the bits of the one-shot for the same sums.
//
// Requirements: H a multiple of 8 (a row is whole 16-byte vectors, so
// every staged row starts 16-byte aligned); x, residual, out, out_h and
// weight of any alignment (element-wise loads and stores when any is not
// 16-byte aligned); out and out_h do not overlap (out_h may be residual,
// out may be x); block <= 512; one_shot and two_shot: 2+ ranks, grid <=
// SYMNCCL_MAX_CTAS, rows * H * sizeof(T) within the staging area
// (two_shot: three times that); add_rmsnorm: grid <=
// SYMNCCL_LOCAL_MAX_CTAS. Float32, float16, bfloat16 (unit FLOAT).
#ifndef SYMNCCL_KERNELS_RMSNORM_CUH
#define SYMNCCL_KERNELS_RMSNORM_CUH

#include "packet.cuh"
#include "primitives.cuh"

SYMNCCL_BEGIN

// 16-byte vectors of h a thread keeps in registers between the sum of
// squares and the normalisation: a row of 2 * 512 vectors (H = 8192
// bf16/fp16, 4096 fp32) never reads out_h back.
constexpr int kRmsKeep = 2;

// op(a, b) of one float per thread over the CTA, from 0, in a fixed
// order; every thread gets the same bits. `buf`: 32 floats of shared
// memory, alternating by row parity between two such (one __syncthreads
// per row: a thread can write the next row's partial only after every
// thread read this row's).
template <typename Op>
__device__ __forceinline__ float block_reduce(float v, float* buf, Op op) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1)
    v = op(v, __shfl_xor_sync(0xffffffffu, v, m));
  const int warps = (int)(blockDim.x >> 5);
  if ((threadIdx.x & 31) == 0) buf[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0.f;
  for (int w = 0; w < warps; w++) s = op(s, buf[w]);
  return s;
}

// The row's sum of squares.
__device__ __forceinline__ float block_sum(float v, float* buf) {
  return block_reduce(v, buf, [](float a, float b) { return a + b; });
}

// The row's largest |y| (dynamic FP8 scales).
__device__ __forceinline__ float block_max(float v, float* buf) {
  return block_reduce(v, buf, [](float a, float b) { return fmaxf(a, b); });
}

constexpr float kFp8Max = 448.f;
constexpr float kFp8MinScale = 1.f / (448.f * 512.f);

template <typename T>
__device__ __forceinline__ float abs_max(uint4 w) {
  typename Pack<T, 16>::U u;
  u.raw = w;
  float m = 0.f;
#pragma unroll
  for (int k = 0; k < Pack<T, 16>::kElems; k++)
    m = fmaxf(m, fabsf((float)Acc<T>::to(u.t[k])));
  return m;
}

// Vector v of y (E elements of T) as E float8_e4m3fn bytes at q + v * E.
// aligned: q is E-byte aligned.
template <typename T>
__device__ __forceinline__ void store_fp8(uint8_t* q, size_t v, uint4 y,
                                          float inv, bool aligned) {
  constexpr int E = Pack<T, 16>::kElems;
  typename Pack<T, 16>::U u;
  u.raw = y;
  union {
    uint8_t b[E];
    uint32_t w[E / 4];
  } o;
#pragma unroll
  for (int k = 0; k < E; k++)
    o.b[k] = __nv_cvt_float_to_fp8((float)Acc<T>::to(u.t[k]) * inv,
                                   __NV_SATFINITE, __NV_E4M3);
  uint8_t* p = q + v * E;
  if (!aligned) {
#pragma unroll
    for (int k = 0; k < E; k++) p[k] = o.b[k];
  } else if constexpr (E == 8) {
    *reinterpret_cast<uint2*>(p) = make_uint2(o.w[0], o.w[1]);
  } else {
    *reinterpret_cast<uint32_t*>(p) = o.w[0];
  }
}

// h = T(s + residual), elementwise, in fp32 (s: the sum, rounded to T),
// on a pack of P bytes (16: a vector; 8: an LL128 word).
template <typename T, int P = 16>
__device__ __forceinline__ Raw<P> add_residual(Raw<P> sw, Raw<P> rw) {
  return add_packs<T, P>(sw, rw);
}

template <typename T>
struct RmsRow {
  Peers in;         // every rank's row 0 (x itself when not staged)
  int n;            // ranks reduced (1 when not staged)
  bool in_aligned;  // the rows read through `in` are 16-byte aligned
  bool aligned;     // residual, out, out_h, weight all 16-byte aligned
  size_t H;

  // h's vector v of row r (reduced, plus residual), rounded to T; adds its
  // squares to ss.
  __device__ __forceinline__ uint4 h(size_t r, size_t v, const T* res) const {
    Accum<T, 16, OpSum> acc[1];
    const size_t row_off = r * H * sizeof(T);
    reduce_ranks<T, 16, 1>(
        n,
        [&](int q, uint4(&raw)[1]) {
          raw[0] = load_pack<16, true>(
              reinterpret_cast<const T*>(in(q) + row_off), v, H, in_aligned);
        },
        acc);
    return add_residual<T>(acc[0].result(SYMNCCL_OP_SUM, n),
                           load_pack<16>(res + r * H, v, H, aligned));
  }
};

// The squares of a vector's elements summed in fp32, elements 0..E-1.
template <typename T>
__device__ __forceinline__ float sum_squares(uint4 w) {
  float s = 0.f;
  if constexpr (Half2<T>::kOf) {
    Pack<uint32_t, 16>::U u;   // 32-bit words, each a pair of T
    u.raw = w;
#pragma unroll
    for (int k = 0; k < Pack<uint32_t, 16>::kElems; k++) {
      const float2 f = floats_of<T>(u.t[k]);
      s += f.x * f.x;
      s += f.y * f.y;
    }
  } else {
    typename Pack<T, 16>::U u;
    u.raw = w;
#pragma unroll
    for (int k = 0; k < Pack<T, 16>::kElems; k++) {
      const float f = (float)Acc<T>::to(u.t[k]);
      s += f * f;
    }
  }
  return s;
}

// y = T(T(h * rstd) * w), elementwise, in fp32 (16-bit floats: T(h *
// rstd) a pair at once, then the paired product with w: Half2's bits).
template <typename T>
__device__ __forceinline__ uint4 normalise(uint4 hw, uint4 ww, float rstd) {
  if constexpr (Half2<T>::kOf) {
    Pack<uint32_t, 16>::U h, w, y;   // 32-bit words, each a pair of T
    h.raw = hw;
    w.raw = ww;
#pragma unroll
    for (int k = 0; k < Pack<uint32_t, 16>::kElems; k++) {
      const float2 f = floats_of<T>(h.t[k]);
      y.t[k] = mul_pairs<T>(round_pair<T>(f.x * rstd, f.y * rstd), w.t[k]);
    }
    return y.raw;
  } else {
    typename Pack<T, 16>::U h, w, y;
    h.raw = hw;
    w.raw = ww;
#pragma unroll
    for (int k = 0; k < Pack<T, 16>::kElems; k++) {
      const T t = Acc<T>::from((float)Acc<T>::to(h.t[k]) * rstd);
      y.t[k] = Acc<T>::from((float)Acc<T>::to(t) * (float)Acc<T>::to(w.t[k]));
    }
    return y.raw;
  }
}

// The row's y as FP8 (a.quant): its scale first (dynamic: a block
// reduction of |y|, y recomputed from h, which costs no load for the kept
// vectors), then y * (1 / scale).
template <typename T>
__device__ __forceinline__ void quantise_row(const symnccl_kargs& a, size_t r,
                                             float rstd,
                                             const uint4 (&keep)[kRmsKeep],
                                             const uint4 (&wk)[kRmsKeep],
                                             const T* hr, float* red) {
  const size_t H = a.row_len, rvec = H / Pack<T, 16>::kElems;
  const size_t tid = threadIdx.x, bd = blockDim.x;
  const T* w = static_cast<const T*>(a.weight);
  uint8_t* qr = static_cast<uint8_t*>(a.out) + r * H;
  const bool aligned =
      ((reinterpret_cast<uintptr_t>(a.out) | reinterpret_cast<uintptr_t>(hr) |
        reinterpret_cast<uintptr_t>(w)) &
       15) == 0;
  const bool q_aligned =
      (reinterpret_cast<uintptr_t>(a.out) & (Pack<T, 16>::kElems - 1)) == 0;
  float s;
  if (a.quant == SYMNCCL_QUANT_STATIC) {
    s = a.scale[0];
  } else {
    float m = 0.f;
#pragma unroll
    for (int u = 0; u < kRmsKeep; u++)
      if (tid + u * bd < rvec)
        m = fmaxf(m, abs_max<T>(normalise<T>(keep[u], wk[u], rstd)));
    for (size_t v = tid + kRmsKeep * bd; v < rvec; v += bd)
      m = fmaxf(
          m, abs_max<T>(normalise<T>(load_pack<16>(hr, v, H, aligned),
                                     load_pack<16>(w, v, H, aligned), rstd)));
    s = fmaxf(block_max(m, red) / kFp8Max, kFp8MinScale);
    if (tid == 0) a.scale[r] = s;
  }
  const float inv = 1.f / s;
#pragma unroll
  for (int u = 0; u < kRmsKeep; u++)
    if (tid + u * bd < rvec)
      store_fp8<T>(qr, tid + u * bd, normalise<T>(keep[u], wk[u], rstd), inv,
                   q_aligned);
  for (size_t v = tid + kRmsKeep * bd; v < rvec; v += bd)
    store_fp8<T>(qr, v,
                 normalise<T>(load_pack<16>(hr, v, H, aligned),
                              load_pack<16>(w, v, H, aligned), rstd),
                 inv, q_aligned);
}

// The body of both kernels with peers (2+ ranks; a launch with no peer
// runs add_rmsnorm). kTwo (two_shot_rmsnorm): rank q normalises rows
// [q * per, q * per + per) only and stores
// their y and h into every rank's result rows in the staging window (after
// the staged x: y at mid_offset, h after it); after the exit barrier each
// rank copies its result rows into out and out_h. CTA b stages, and copies
// out, rows q * per + j for every q and every j = b mod grid: the rows that
// CTA b of every rank reads and writes, so the per-CTA barriers order them.
template <typename T, bool kTwo>
__device__ __forceinline__ void rmsnorm_body(const ncclDevComm& dc,
                                             const symnccl_kargs& a) {
  constexpr int E = Pack<T, 16>::kElems;
  __shared__ float s_sum[2][32], s_max[2][32];
  const int n = dc.lsaSize;
  const int me = dc.lsaRank;
  const Entry en = enter(a, me, n);
  const uint64_t e = en.epoch;
  constexpr bool two = kTwo;
  const T* src = static_cast<const T*>(a.src);
  const T* res = static_cast<const T*>(a.residual);
  const T* w = static_cast<const T*>(a.weight);
  T* out = static_cast<T*>(a.out);
  T* out_h = static_cast<T*>(a.out_h);
  const size_t H = a.row_len;
  const size_t rows = a.count / H;
  const size_t rvec = H / E;  // H % 8 == 0: whole vectors
  const bool src_aligned = (reinterpret_cast<uintptr_t>(src) & 15) == 0;
  const bool aligned =
      ((reinterpret_cast<uintptr_t>(res) | reinterpret_cast<uintptr_t>(w) |
        reinterpret_cast<uintptr_t>(out) | reinterpret_cast<uintptr_t>(out_h)) &
       15) == 0;
  const size_t tid = threadIdx.x, bd = blockDim.x;
  // two: rows per rank, and this rank's
  const size_t per = two ? (rows + n - 1) / n : rows;
  const size_t lo = two ? (size_t)me * per : 0;
  const size_t own = lo >= rows ? 0 : rows - lo < per ? rows - lo : per;
  // two: y rows at mid(q), h rows hoff bytes after them
  const Peers mid = two ? Peers::of(a.mid_win, a.mid_offset) : Peers{};
  const size_t hoff = rows * H * sizeof(T);
  const bool mid_aligned = (a.mid_offset & 15) == 0;
  Barrier bar = Barrier::of(a, me, n);
  RmsRow<T> row;
  row.H = H;
  row.aligned = aligned;
  row.in = Peers::of(a.win, a.win_offset);
  row.n = n;
  row.in_aligned = (a.win_offset & 15) == 0;
  // x into my staging rows: the rows the same CTA of every peer reads
  // after the barrier
  T* mine = reinterpret_cast<T*>(row.in(me));
  if (en.ok)
    for (int q = 0; q < (two ? n : 1); q++)
      for (size_t j = blockIdx.x; j < per; j += gridDim.x) {
        const size_t r = (size_t)q * per + j;
        if (r >= rows) break;
        for (size_t v = tid; v < rvec; v += bd)
          store_pack<16>(mine + r * H, v, H, row.in_aligned,
                         load_pack<16>(src + r * H, v, H, src_aligned));
      }
  if (!bar.sync(e + 1, a, me, n, en.ok)) return;
  // h and y of row r, vector v: into out_h and out, or (two) into every
  // rank's result rows
  auto put_h = [&](size_t r, size_t v, uint4 hv) {
    if (two)
      for (int q = 0; q < n; q++)
        store_pack<16>(reinterpret_cast<T*>(mid(q) + hoff) + r * H, v, H,
                       mid_aligned, hv);
    else
      store_pack<16>(out_h + r * H, v, H, aligned, hv);
  };
  auto get_h = [&](size_t r, size_t v) {
    return two ? load_pack<16>(
                     reinterpret_cast<const T*>(mid(me) + hoff) + r * H, v, H,
                     mid_aligned)
               : load_pack<16>(out_h + r * H, v, H, aligned);
  };
  auto put_y = [&](size_t r, size_t v, uint4 yv) {
    if (two)
      for (int q = 0; q < n; q++)
        store_pack<16>(reinterpret_cast<T*>(mid(q)) + r * H, v, H, mid_aligned,
                       yv);
    else
      store_pack<16>(out + r * H, v, H, aligned, yv);
  };

  int parity = 0;
  for (size_t j = blockIdx.x; j < own; j += gridDim.x, parity ^= 1) {
    const size_t r = lo + j;
    uint4 keep[kRmsKeep], wk[kRmsKeep];
    // all the loads of the kept vectors (and their weights) first, no
    // store between them, so they are in flight together; then the stores
#pragma unroll
    for (int u = 0; u < kRmsKeep; u++)
      if (tid + u * bd < rvec) {
        keep[u] = row.h(r, tid + u * bd, res);
        wk[u] = load_pack<16>(w, tid + u * bd, H, aligned);
      }
    float ss = 0.f;
#pragma unroll
    for (int u = 0; u < kRmsKeep; u++)
      if (tid + u * bd < rvec) {
        ss += sum_squares<T>(keep[u]);
        put_h(r, tid + u * bd, keep[u]);
      }
    for (size_t v = tid + kRmsKeep * bd; v < rvec; v += bd) {
      const uint4 hv = row.h(r, v, res);
      ss += sum_squares<T>(hv);
      put_h(r, v, hv);
    }
    const float total = block_sum(ss, s_sum[parity]);
    const float rstd = rsqrtf(total / (float)H + a.eps);
    if (!two && a.quant != SYMNCCL_QUANT_NONE) {
      quantise_row(a, r, rstd, keep, wk, out_h + r * H, s_max[parity]);
      continue;
    }
#pragma unroll
    for (int u = 0; u < kRmsKeep; u++)
      if (tid + u * bd < rvec)
        put_y(r, tid + u * bd, normalise<T>(keep[u], wk[u], rstd));
    // past the kept vectors: this thread's own h, read back
    for (size_t v = tid + kRmsKeep * bd; v < rvec; v += bd)
      put_y(r, v,
            normalise<T>(get_h(r, v), load_pack<16>(w, v, H, aligned), rstd));
  }
  if (!bar.sync(e + 2, a, me, n)) return;
  if (threadIdx.x == 0) a.epochs[blockIdx.x] = e + 2;
  if (!two) return;
  // every rank's results for the rows this CTA staged have landed
  const T* my_y = reinterpret_cast<const T*>(mid(me));
  const T* my_h = reinterpret_cast<const T*>(mid(me) + hoff);
  for (int q = 0; q < n; q++)
    for (size_t j = blockIdx.x; j < per; j += gridDim.x) {
      const size_t r = (size_t)q * per + j;
      if (r >= rows) break;
      for (size_t v = tid; v < rvec; v += bd) {
        store_pack<16>(out + r * H, v, H, aligned,
                       load_pack<16, true>(my_y + r * H, v, H, mid_aligned));
        store_pack<16>(out_h + r * H, v, H, aligned,
                       load_pack<16, true>(my_h + r * H, v, H, mid_aligned));
      }
    }
}

template <typename T>
__global__ void __launch_bounds__(512)
    one_shot_rmsnorm(ncclDevComm dc, const __grid_constant__ symnccl_kargs a) {
  rmsnorm_body<T, false>(dc, a);
}

template <typename T>
__global__ void __launch_bounds__(512)
    two_shot_rmsnorm(ncclDevComm dc, const __grid_constant__ symnccl_kargs a) {
  rmsnorm_body<T, true>(dc, a);
}

// ll_rmsnorm: one_shot_rmsnorm's rows on LL packets (packet.cuh), with no
// barrier: the decode sizes, where one_shot's staging copy and two
// barriers cost more than the bytes. Vector v (16 bytes) of row r of x is
// LL items 2 (r rvec + v) and the one after it, sent by the thread that
// reduces it to row `me` of every peer's slot in the LL region, as
// packet_one_shot sends a message; then each row is reduced in rank order
// 0..n-1 as its packets land (the own part read from x), and normalised
// as one_shot_rmsnorm normalises them: the same bits. A CTA sends every
// row it owns before it waits for any, so no CTA waits for a peer's CTA
// that waits in turn (every CTA's packets are out before its first wait).
// Slots, flags and call counters are the LL family's: the grid is the
// family's fixed grid (SYMNCCL_LL_CTAS), every CTA counts every call, rows
// go round the CTAs. A row takes one_shot_rmsnorm's block (a.row_block, a
// thread per vector, derived from H), so its arithmetic is that block's;
// where a row is one pass (a vector a thread), a CTA holds several rows at
// once (RowGroups), up to SYMNCCL_WIDE_MAX_THREADS threads of 64 registers
// (kWide: a CTA still takes one SM, as 512 threads of 128 do). A wait
// that gave up leaves this thread's `ok` down: it stores no h after it,
// and the CTA stores no y for the row. kQuant: a.quant, a kernel of its
// own (as add_rmsnorm's), so the plain kernel carries no FP8 code.
// lamport_rmsnorm: the same rows as Lamport packets (packet.cuh), a vector
// one 16-byte packet with no flag, in the Lamport region, on its family's
// slots and counters: the link carries the rows once, not twice; float32,
// float16 and bfloat16 (the NaN sentinel), with the bits of every other
// kernel. Both are rows_on_packets below, over their vector wire (VecLL,
// VecLamport).
// Requirements:
// rows * H * sizeof(T) <= row_bytes / 2 (ll; lamport: row_bytes);
// row_block and the CTA as launch.cu checks them (whole warps, <= 512, <=
// the row's vectors rounded up to a warp; whole groups; the wide CTA's
// rows one pass); the rest as one_shot_rmsnorm's.

// A row's 16-byte vector on the wire: send() it to a peer's slot at p,
// look() once whether the vector at p has landed (d: its data), rearm()
// the slot at p after it was taken; `flag` is what a wait that gives up
// records (the call's flag).
struct VecLL {   // two LL packets, the call's flag in each 8-byte half
  static constexpr size_t kBytes = 2 * LL::kItemBytes;
  uint64_t flag;
  __device__ static VecLL of(uint32_t call_flag) {
    return {LL::wire_flag(call_flag)};
  }
  template <typename T>
  __device__ void send(char* p, uint4 d) const {
    LL::send(p, {{(uint64_t)d.x | (uint64_t)d.y << 32}}, flag);
    LL::send(p + LL::kItemBytes, {{(uint64_t)d.z | (uint64_t)d.w << 32}},
             flag);
  }
  __device__ bool look(const char* p, uint4& d) const {
    uint64_t lo, hi;   // both loads issued, whatever the first one saw
    const bool got_lo = LL::look(p, flag, lo);
    const bool got_hi = LL::look(p + LL::kItemBytes, flag, hi);
    d = make_uint4((uint32_t)lo, (uint32_t)(lo >> 32), (uint32_t)hi,
                   (uint32_t)(hi >> 32));
    return got_lo && got_hi;
  }
  __device__ static void rearm(char*) {}   // flags need no clearing
};

struct VecLamport {   // one Lamport packet
  static constexpr size_t kBytes = Lamport::kItemBytes;
  uint64_t flag;
  __device__ static VecLamport of(uint32_t call_flag) { return {call_flag}; }
  template <typename T>
  __device__ void send(char* p, uint4 d) const {
    Lamport::send<T>(p, d);
  }
  __device__ bool look(const char* p, uint4& d) const {
    return Lamport::look(p, d);
  }
  __device__ static void rearm(char* p) { Lamport::rearm(p); }
};

// The rows of one CTA of ll_rmsnorm and lamport_rmsnorm, and this
// thread's place in them. A row takes bd threads (a.row_block), thread w
// its vectors w, w + bd, ... as in one_shot_rmsnorm; a CTA of G * bd
// threads holds G rows at once, group g a row. CTA b's rows are b, b +
// grid, ... (as every other kernel's); group g takes the CTA's rows g, g +
// G, ..., one a round. 32 bits: a launch's rows fit its packet region.
struct RowGroups {
  unsigned rvec;     // vectors of a row
  unsigned bd, G;    // threads a row, rows at once
  unsigned g, w;     // my group, my thread in it (g >= G: no row)
  unsigned rows;     // this CTA's rows
  unsigned rounds;   // ceil(rows / G), the same on every thread

  __device__ static RowGroups of(const symnccl_kargs& a, size_t rows_all,
                                 size_t rvec) {
    RowGroups k;
    k.rvec = (unsigned)rvec;
    k.bd = (unsigned)a.row_block;
    k.G = blockDim.x / k.bd;
    k.g = threadIdx.x / k.bd;
    k.w = threadIdx.x % k.bd;
    k.rows = rows_all > blockIdx.x
                 ? (unsigned)((rows_all - blockIdx.x - 1) / gridDim.x + 1)
                 : 0;
    k.rounds = (k.rows + k.G - 1) / k.G;
    return k;
  }
  // my group's row of round i, if it has one
  __device__ bool row(unsigned i, unsigned& r) const {
    const unsigned j = i * G + g;
    r = blockIdx.x + j * gridDim.x;
    return g < G && j < rows;
  }
  // my vector of pass u exists
  __device__ bool has(unsigned u) const { return w + u * bd < rvec; }
};

// op over my group's threads' floats, in block_reduce's order for a block
// of bd threads (lanes by xor shuffles, then warps 0..bd/32-1 from 0):
// every thread of the group gets the same bits. buf: a float per warp of
// the CTA. Every thread of the CTA calls it (one __syncthreads).
template <typename Op>
__device__ __forceinline__ float group_reduce(const RowGroups& k, float v,
                                              float* buf, Op op) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1)
    v = op(v, __shfl_xor_sync(0xffffffffu, v, m));
  if ((threadIdx.x & 31) == 0) buf[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0.f;
  if (k.g < k.G)
    for (unsigned m = 0; m < k.bd / 32; m++)
      s = op(s, buf[k.g * k.bd / 32 + m]);
  return s;
}

// The decode shape of rows_on_packets (T rows of a call on as many CTAs,
// the grid's; docs/PERFORMANCE.md, 'Kernel periods'): a row a CTA of
// row_block threads (no row groups), every row on its own CTA, whole
// aligned vectors (x, residual, weight, out and out_h 16-byte aligned, H a
// multiple of a vector) and at most kKeep of them a thread. Uniform over
// the grid: every CTA takes the same path. (A rank decides from its own
// pointers: the packets lie where the general path puts them either way.)
template <typename T>
__device__ __forceinline__ bool decode_shape(const symnccl_kargs& a,
                                             unsigned H, bool aligned,
                                             int keep) {
  constexpr unsigned E = Pack<T, 16>::kElems;
  return aligned && H % E == 0 && blockDim.x == (unsigned)a.row_block &&
         H / E <= (unsigned)keep * blockDim.x &&
         a.count <= (size_t)gridDim.x * H;
}

// rows_on_packets for the decode shape: its arithmetic in its order (the
// same helpers, the same vectors a thread, the same block sum), hence its
// bits, without what the general path spends its instructions on there
// (the rows' tails, the row groups' divisions and rounds, the weights
// through shared memory): at T 1 the row's SM issues the call's critical
// path. CTA b has row b (none past the call's rows); thread t its vectors
// t and t + blockDim.x of it, kept in registers. kN: the ranks, 2 (its
// loops unrolled), or 0 for n.
template <typename T, typename Wire, int kKeep, int kN>
__device__ __forceinline__ void decode_row(const symnccl_kargs& a, int n_,
                                           int me, unsigned H, const T* x,
                                           const T* res, const T* w, T* out,
                                           T* out_h, const Peers& slot,
                                           const Wire& wire, float* s_sum) {
  constexpr unsigned E = Pack<T, 16>::kElems;
  constexpr size_t kVec = Wire::kBytes;
  const int n = kN ? kN : n_;
  const unsigned bd = blockDim.x, t = threadIdx.x, rvec = H / E;
  const unsigned r = blockIdx.x;
  if ((size_t)(r + 1) * H > a.count) return;   // no row: the whole CTA
  // my vectors of the row: t + u * bd (u < kKeep) while has(u); vector v
  // of the row is vector r * rvec + v of x, residual, out and out_h, and
  // of the row's packets in a slot's row
  auto has = [&](int u) { return t + (unsigned)u * bd < rvec; };
  const size_t i0 = (size_t)r * rvec + t;
  const uint4* xv4 = reinterpret_cast<const uint4*>(x);
  const uint4* rv4 = reinterpret_cast<const uint4*>(res);
  const uint4* wv4 = reinterpret_cast<const uint4*>(w);
  // row `me` of every peer's slot; row q of mine
  const size_t at = (size_t)me * a.row_bytes + i0 * kVec;
  char* mine = slot(me) + i0 * kVec;

  // x first and sent at once (the peers wait for it), then what the norm
  // needs, in flight during the trip
  uint4 xv[kKeep], rv[kKeep], wv[kKeep], keep[kKeep];
#pragma unroll
  for (int u = 0; u < kKeep; u++)
    if (has(u)) xv[u] = xv4[i0 + u * bd];
#pragma unroll(kN ? kN : 1)
  for (int q = 0; q < n; q++)
    if (q != me)
#pragma unroll
      for (int u = 0; u < kKeep; u++)
        if (has(u))
          wire.template send<T>(slot(q) + at + (size_t)u * bd * kVec, xv[u]);
#pragma unroll
  for (int u = 0; u < kKeep; u++)
    if (has(u)) {
      rv[u] = rv4[i0 + u * bd];
      wv[u] = wv4[t + u * bd];
    }

  // the ranks folded in order 0..n-1, each peer's vectors in one wait,
  // then rearmed (rows_on_packets' sums; two ranks: add_packs, their
  // bits); a wait that gave up ends the waiting; h and its squares
  // the running sum: kN 2, rank 0's vector, then the sum; else Accum's
  using Sum =
      typename std::conditional<kN == 2, uint4, Accum<T, 16, OpSum>>::type;
  Sum sum[kKeep];
  bool ok = true;
#pragma unroll(kN ? kN : 1)
  for (int q = 0; q < n; q++) {
    uint4 d[kKeep];
    if (q == me) {
#pragma unroll
      for (int u = 0; u < kKeep; u++) d[u] = xv[u];
    } else if (ok) {
      char* from = mine + (size_t)q * a.row_bytes;
      ok = bounded_wait(
          [&] {
            bool all = true;
#pragma unroll
            for (int u = 0; u < kKeep; u++)
              if (has(u))
                all &= wire.look(from + (size_t)u * bd * kVec, d[u]);
            return all;
          },
          a, me, n, {SYMNCCL_WAIT_PACKETS, q, wire.flag});
      if (ok)
#pragma unroll
        for (int u = 0; u < kKeep; u++)
          if (has(u)) Wire::rearm(from + (size_t)u * bd * kVec);
    }
#pragma unroll
    for (int u = 0; u < kKeep; u++)
      if (has(u)) {
        if constexpr (kN == 2)
          sum[u] = q == 0 ? d[u] : add_packs<T, 16>(sum[u], d[u]);
        else if (q == 0)
          sum[u].set(d[u]);
        else
          sum[u].fold(d[u]);
      }
  }
  float ss = 0.f;
#pragma unroll
  for (int u = 0; u < kKeep; u++)
    if (has(u)) {
      if constexpr (kN == 2)
        keep[u] = add_residual<T>(sum[u], rv[u]);
      else
        keep[u] = add_residual<T>(sum[u].result(SYMNCCL_OP_SUM, n), rv[u]);
      ss += sum_squares<T>(keep[u]);
      if (ok) reinterpret_cast<uint4*>(out_h)[i0 + u * bd] = keep[u];
    }

  // one_shot_rmsnorm's block sum: this CTA is its block
  const float rstd = rsqrtf(block_sum(ss, s_sum) / (float)H + a.eps);
  if (!__syncthreads_and(ok)) return;
#pragma unroll
  for (int u = 0; u < kKeep; u++)
    if (has(u))
      reinterpret_cast<uint4*>(out)[i0 + u * bd] =
          normalise<T>(keep[u], wv[u], rstd);
}

// kWide: the wide CTA (64 registers a thread), whose rows are one pass
// (a vector a thread: launch.cu checks rvec <= bd), kept in registers;
// else 512 threads of 128 registers keep kRmsKeep vectors of h a thread
// and read the rest back from out_h.
template <typename T, bool kQuant, typename Wire, bool kWide>
__device__ __forceinline__ void rows_on_packets(
    ncclDevComm dc, const symnccl_kargs& a) {
  __shared__ float s_sum[SYMNCCL_WIDE_MAX_THREADS / 32];
  __shared__ float s_max[SYMNCCL_WIDE_MAX_THREADS / 32];
  const int n = dc.lsaSize, me = dc.lsaRank;
  uint64_t epoch;
  if (!enter_cta(a, me, n, epoch)) return;
  const PacketCall call(epoch, a.region_offset, n, a.row_bytes);
  const Wire wire = Wire::of(call.flag);
  const T* x = static_cast<const T*>(a.src);
  const T* res = static_cast<const T*>(a.residual);
  const T* w = static_cast<const T*>(a.weight);
  T* out = static_cast<T*>(a.out);
  T* out_h = static_cast<T*>(a.out_h);
  const unsigned H = (unsigned)a.row_len;  // within a packet row
  if constexpr (!kQuant && !kWide) {
    const bool all_al =
        ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(res) |
          reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(out) |
          reinterpret_cast<uintptr_t>(out_h)) &
         15) == 0;
    if (decode_shape<T>(a, H, all_al, kRmsKeep)) {
      const Peers slot = Peers::of(a.region_win, call.slot_off);
      if (n == 2)
        decode_row<T, Wire, kRmsKeep, 2>(a, n, me, H, x, res, w, out, out_h,
                                         slot, wire, s_sum);
      else
        decode_row<T, Wire, kRmsKeep, 0>(a, n, me, H, x, res, w, out, out_h,
                                         slot, wire, s_sum);
      end_call(a.epochs, call);
      return;
    }
  }
  const RowGroups k = RowGroups::of(a, a.count / H, H / Pack<T, 16>::kElems);
  const unsigned rvec = k.rvec, bd = k.bd;
  constexpr int kKeep = kWide ? 1 : kRmsKeep;
  // my vectors past the kept ones: from v on, while rvec
  const unsigned past = kWide ? rvec : k.w + kKeep * bd;
  const bool x_al = (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  const bool aligned =
      ((reinterpret_cast<uintptr_t>(res) | reinterpret_cast<uintptr_t>(w) |
        reinterpret_cast<uintptr_t>(out) | reinterpret_cast<uintptr_t>(out_h)) &
       15) == 0;
  constexpr size_t kVec = Wire::kBytes;  // a vector's bytes on the wire
  const Peers slot = Peers::of(a.region_win, call.slot_off);

  // what does not come from peers, in flight during the sends and the
  // trip: the kept vectors' weights (the same every row; group 0 stores
  // them into shared memory after its sends, every group reads them at
  // its y) and the first round's residual
  __shared__ uint4 s_w[kKeep * SYMNCCL_MAX_THREADS];
  uint4 wk[kKeep], rk[kKeep];
  unsigned r;
  auto fetch_res = [&](unsigned i) {
    unsigned ri;
    if (k.row(i, ri))
#pragma unroll
      for (int u = 0; u < kKeep; u++)
        if (k.has(u))
          rk[u] = load_pack<16>(res + (size_t)ri * H, k.w + u * bd, H,
                                aligned);
  };
  if (k.g == 0)
#pragma unroll
    for (int u = 0; u < kKeep; u++)
      if (k.has(u)) wk[u] = load_pack<16>(w, k.w + u * bd, H, aligned);
  fetch_res(0);

  // my rows' vectors into row `me` of every peer's slot, all before any
  // wait
  const Peers to = slot.at((size_t)me * a.row_bytes);
  for (unsigned i = 0; i < k.rounds; i++)
    if (k.row(i, r))
      for (unsigned v = k.w; v < rvec; v += bd) {
        const uint4 d = load_pack<16>(x + (size_t)r * H, v, H, x_al);
        for (int q = 0; q < n; q++)
          if (q != me)
            wire.template send<T>(to(q) + ((size_t)r * rvec + v) * kVec, d);
      }
  if (k.g == 0)
#pragma unroll
    for (int u = 0; u < kKeep; u++)
      if (k.has(u)) s_w[u * bd + k.w] = wk[u];

  // Each round: my group's row reduced in rank order as its packets land,
  // then normalised: rmsnorm_body's row loop, the same arithmetic in the
  // same order, and add_rmsnorm's y stores (kept apart: a helper shared
  // with rmsnorm_body made ptxas spill one_shot_rmsnorm's float32 unit,
  // one shared with add_rmsnorm its float16 unit: 16 bytes each way). A
  // thread whose wait gave up stores no more h; the CTA stores no y for
  // the row (__syncthreads_and).
  char* mine = slot(me);
  bool ok = true;
  // the sums of U vectors of row r, v0 + u * bd: a peer's U vectors
  // polled in one wait (then rearmed), ranks folded in order 0..n-1
  auto sums = [&](unsigned r, unsigned v0, auto& s) {
    constexpr int U = sizeof(s) / sizeof(s[0]);
    Accum<T, 16, OpSum> acc[U];
    uint4 own[U], d[U];
#pragma unroll
    for (int u = 0; u < U; u++)
      if (v0 + u * bd < rvec)
        own[u] = load_pack<16>(x + (size_t)r * H, v0 + u * bd, H, x_al);
    for (int q = 0; q < n; q++) {
      if (q != me && ok) {
        char* p = mine + (size_t)q * a.row_bytes +
                  ((size_t)r * rvec + v0) * kVec;
        ok = bounded_wait(
            [&] {
              bool all = true;
#pragma unroll
              for (int u = 0; u < U; u++)
                if (v0 + u * bd < rvec)
                  all &= wire.look(p + (size_t)u * bd * kVec, d[u]);
              return all;
            },
            a, me, n, {SYMNCCL_WAIT_PACKETS, q, wire.flag});
        if (ok) {
#pragma unroll
          for (int u = 0; u < U; u++)
            if (v0 + u * bd < rvec) Wire::rearm(p + (size_t)u * bd * kVec);
        }
      }
#pragma unroll
      for (int u = 0; u < U; u++)
        if (v0 + u * bd < rvec) {
          const uint4 v = q == me ? own[u] : d[u];
          if (q == 0)
            acc[u].set(v);
          else
            acc[u].fold(v);
        }
    }
#pragma unroll
    for (int u = 0; u < U; u++) s[u] = acc[u].result(SYMNCCL_OP_SUM, n);
  };
  for (unsigned i = 0; i < k.rounds; i++) {
    const bool live = k.row(i, r);
    uint4 keep[kKeep];
    float ss = 0.f;
    if (live) {
      sums(r, k.w, keep);
#pragma unroll
      for (int u = 0; u < kKeep; u++)
        if (k.has(u)) {
          keep[u] = add_residual<T>(keep[u], rk[u]);
          ss += sum_squares<T>(keep[u]);
          if (ok)
            store_pack<16>(out_h + (size_t)r * H, k.w + u * bd, H, aligned,
                           keep[u]);
        }
      for (unsigned v = past; v < rvec; v += bd) {
        uint4 sv[1];
        sums(r, v, sv);
        const uint4 hv = add_residual<T>(
            sv[0], load_pack<16>(res + (size_t)r * H, v, H, aligned));
        ss += sum_squares<T>(hv);
        if (ok) store_pack<16>(out_h + (size_t)r * H, v, H, aligned, hv);
      }
    }
    fetch_res(i + 1);   // in flight during the norm
    const float rstd =
        rsqrtf(group_reduce(k, ss, s_sum, [](float p, float q) {
                 return p + q;
               }) / (float)H + a.eps);
    if (!__syncthreads_and(ok)) break;
    // y of my vectors: the kept ones from registers, the rest from h read
    // back
    auto each_y = [&](auto&& f) {
#pragma unroll
      for (int u = 0; u < kKeep; u++)
        if (live && k.has(u))
          f(k.w + u * bd, normalise<T>(keep[u], s_w[u * bd + k.w], rstd));
      if (live)
        for (unsigned v = past; v < rvec; v += bd)
          f(v, normalise<T>(
                   load_pack<16>(out_h + (size_t)r * H, v, H, aligned),
                   load_pack<16>(w, v, H, aligned), rstd));
    };
    if constexpr (kQuant) {
      // the row's scale first (dynamic: a reduction of |y|, y recomputed
      // from h), then y * (1 / scale): quantise_row's arithmetic
      float s;
      if (a.quant == SYMNCCL_QUANT_STATIC) {
        s = a.scale[0];
      } else {
        float m = 0.f;
        each_y([&](unsigned, uint4 y) { m = fmaxf(m, abs_max<T>(y)); });
        s = fmaxf(group_reduce(k, m, s_max,
                               [](float p, float q) { return fmaxf(p, q); }) /
                      kFp8Max,
                  kFp8MinScale);
        if (live && k.w == 0) a.scale[r] = s;
      }
      const float inv = 1.f / s;
      uint8_t* qr = static_cast<uint8_t*>(a.out) + (size_t)r * H;
      const bool q_aligned = (reinterpret_cast<uintptr_t>(a.out) &
                              (Pack<T, 16>::kElems - 1)) == 0;
      each_y([&](unsigned v, uint4 y) {
        store_fp8<T>(qr, v, y, inv, q_aligned);
      });
    } else {
      each_y([&](unsigned v, uint4 y) {
        store_pack<16>(out + (size_t)r * H, v, H, aligned, y);
      });
    }
  }
  end_call(a.epochs, call);
}

// kWide: the wide CTA (rows of one pass, several a CTA), else 512 threads
// of 128 registers (a row a CTA). The host picks by the CTA it sizes
// (launch.c, row_launches); the entry by a.threads (table.h).
template <typename T, bool kQuant, bool kWide>
__global__ void __launch_bounds__(kWide ? SYMNCCL_WIDE_MAX_THREADS
                                        : SYMNCCL_MAX_THREADS)
    ll_rmsnorm(ncclDevComm dc, const __grid_constant__ symnccl_kargs a) {
  rows_on_packets<T, kQuant, VecLL, kWide>(dc, a);
}

template <typename T, bool kQuant, bool kWide>
__global__ void __launch_bounds__(kWide ? SYMNCCL_WIDE_MAX_THREADS
                                        : SYMNCCL_MAX_THREADS)
    lamport_rmsnorm(ncclDevComm dc, const __grid_constant__ symnccl_kargs a) {
  rows_on_packets<T, kQuant, VecLamport, kWide>(dc, a);
}

// ll128_rmsnorm: ll_rmsnorm's rows in LL128 lines (packet.cuh): the link
// carries 16/15 of the rows instead of LL's 2x, for the sizes between
// ll_rmsnorm's and one_shot_rmsnorm's (a few hundred KiB to a few MiB),
// where LL's bytes and one_shot's staging copy and two barriers both cost.
// Row r of the launch takes items [r * ipr, r * ipr + ipr) of a slot's
// row (ipr = the items of one row: every row starts on an item); rank
// me's go to row `me` of every peer's slot. The CTA that owns the row
// (row i: CTA i % grid) sends its items, those of all its rows dealt round
// its warps, a warp an item, before it waits for any, as ll_rmsnorm. Then
// each warp reduces the same items in rank order 0..n-1 as they land
// (reduce_item, as packet_one_shot; its own part read from x), adds the
// residual and stores h into out_h, word by word. An LL128 lane's words do
// not fall on the norm's 16-byte vectors, so after one __syncthreads
// (which also votes on `ok`) the norm reads each row's h back from out_h
// in one_shot_rmsnorm's mapping (a thread per vector, vectors t, t + bd,
// ...): the sum of squares, the block sum and y are one_shot_rmsnorm's
// arithmetic in its order, hence its bits. A warp whose wait gave up
// stores no h after it, and the CTA stores no y. The block is
// one_shot_rmsnorm's (derived from H); slots, flags, call counters and the
// fixed grid are the LL128 family's. Requirements: rows * ipr items within
// a slot's row (the host's chunks, symnccl_packet_max_count), the rest as
// one_shot_rmsnorm's. (Launch bounds (512, 1): with (512) alone ptxas held
// the float32 kernel to 64 registers and spilled 216 bytes.)
template <typename T, bool kQuant>
__global__ void __launch_bounds__(512, 1)
    ll128_rmsnorm(ncclDevComm dc, const __grid_constant__ symnccl_kargs a) {
  __shared__ float s_sum[2][32], s_max[2][32];
  const int n = dc.lsaSize, me = dc.lsaRank;
  uint64_t epoch;
  if (!enter_cta(a, me, n, epoch)) return;
  const PacketCall call(epoch, a.region_offset, n, a.row_bytes);
  const uint64_t flag = LL128::wire_flag(call.flag);
  const T* x = static_cast<const T*>(a.src);
  const T* res = static_cast<const T*>(a.residual);
  const T* w = static_cast<const T*>(a.weight);
  T* out = static_cast<T*>(a.out);
  T* out_h = static_cast<T*>(a.out_h);
  const size_t H = a.row_len, rows = a.count / H;
  const size_t rvec = H / Pack<T, 16>::kElems;
  const size_t ipr = packet_items<LL128>(H * sizeof(T));
  const size_t tid = threadIdx.x, bd = blockDim.x;
  const size_t warp = tid / 32, warps = bd / 32, lane = LL128::lane_offset();
  // the rows' words (8 bytes) and vectors (16)
  const bool x_al = aligned8(x);
  const bool w_al = aligned8(res) && aligned8(out_h);
  const bool aligned =
      ((reinterpret_cast<uintptr_t>(res) | reinterpret_cast<uintptr_t>(w) |
        reinterpret_cast<uintptr_t>(out) | reinterpret_cast<uintptr_t>(out_h)) &
       15) == 0;
  const Peers slot = Peers::of(a.region_win, call.slot_off);
  // my rows' items, j = k * ipr + b for item b of my k-th row (row
  // blockIdx.x + k * grid), dealt round the warps
  const size_t mine = rows > blockIdx.x
                          ? (rows - blockIdx.x + gridDim.x - 1) / gridDim.x
                          : 0;
  auto row_of = [&](size_t j) { return blockIdx.x + j / ipr * gridDim.x; };

  // my rows' items into row `me` of every peer's slot
  const Peers to = slot.at((size_t)me * a.row_bytes);
  for (size_t j = warp; j < mine * ipr; j += warps) {
    const size_t r = row_of(j), b = j % ipr;
    const LL128::Item it = LL128::load(x + r * H, b, H, x_al, flag);
    for (int q = 0; q < n; q++)
      if (q != me)
        LL128::send(to(q) + (r * ipr + b) * LL128::kItemBytes + lane, it,
                    flag);
  }

  // the kept vectors' weights (the same every row), in flight meanwhile
  uint4 wk[kRmsKeep];
#pragma unroll
  for (int u = 0; u < kRmsKeep; u++)
    if (tid + u * bd < rvec)
      wk[u] = load_pack<16>(w, tid + u * bd, H, aligned);

  // h of my items: the sum in rank order, plus the residual, rounded
  const char* slots = slot(me);
  bool ok = true;
  for (size_t j = warp; j < mine * ipr && ok; j += warps) {
    const size_t r = row_of(j), b = j % ipr;
    const LL128::Item rw = LL128::load(res + r * H, b, H, w_al, 0);
    const LL128::Item s = reduce_item<T, LL128>(
        slots + (r * ipr + b) * LL128::kItemBytes + lane, a.row_bytes,
        x + r * H, b, H, x_al, me, n, SYMNCCL_OP_SUM, flag, a, ok);
    if (!ok) break;
    LL128::Item h;
#pragma unroll
    for (int k = 0; k < LL128::kWords; k++)
      h.w[k] = add_residual<T, 8>(s.w[k], rw.w[k]);
    LL128::put(out_h + r * H, b, H, w_al, h);
  }

  // my rows' h are in out_h (this CTA's stores): one_shot_rmsnorm's norm,
  // row by row, unless a wait gave up; y stored as ll_rmsnorm stores it
  // (written out in each kernel: ll_rmsnorm says why)
  if (__syncthreads_and(ok)) {
    int parity = 0;
    for (size_t r = blockIdx.x; r < rows; r += gridDim.x, parity ^= 1) {
      const T* hr = out_h + r * H;
      uint4 keep[kRmsKeep];
      float ss = 0.f;
#pragma unroll
      for (int u = 0; u < kRmsKeep; u++)
        if (tid + u * bd < rvec)
          keep[u] = load_pack<16>(hr, tid + u * bd, H, aligned);
#pragma unroll
      for (int u = 0; u < kRmsKeep; u++)
        if (tid + u * bd < rvec) ss += sum_squares<T>(keep[u]);
      for (size_t v = tid + kRmsKeep * bd; v < rvec; v += bd)
        ss += sum_squares<T>(load_pack<16>(hr, v, H, aligned));
      const float rstd =
          rsqrtf(block_sum(ss, s_sum[parity]) / (float)H + a.eps);
      if constexpr (kQuant) {
        quantise_row(a, r, rstd, keep, wk, hr, s_max[parity]);
      } else {
#pragma unroll
        for (int u = 0; u < kRmsKeep; u++)
          if (tid + u * bd < rvec)
            store_pack<16>(out + r * H, tid + u * bd, H, aligned,
                           normalise<T>(keep[u], wk[u], rstd));
        for (size_t v = tid + kRmsKeep * bd; v < rvec; v += bd)
          store_pack<16>(out + r * H, v, H, aligned,
                         normalise<T>(load_pack<16>(hr, v, H, aligned),
                                      load_pack<16>(w, v, H, aligned), rstd));
      }
    }
  }
  end_call(a.epochs, call);
}

// SYMNCCL_LOCAL_THREADS_PER_SM threads per SM (two CTAs of 512): at most
// 64 registers a thread. kQuant:
// a.quant (a kernel of its own, so the FP8 path costs the plain one no
// registers).
template <typename T, bool kQuant>
__global__ void __launch_bounds__(512, SYMNCCL_LOCAL_THREADS_PER_SM / 512)
    add_rmsnorm(ncclDevComm dc, const __grid_constant__ symnccl_kargs a) {
  __shared__ float s_sum[2][32], s_max[2][32];
  const T* x = static_cast<const T*>(a.src);
  const T* res = static_cast<const T*>(a.residual);
  const T* w = static_cast<const T*>(a.weight);
  T* out = static_cast<T*>(a.out);
  T* out_h = static_cast<T*>(a.out_h);
  const size_t H = a.row_len;
  const size_t rows = a.count / H;
  const size_t rvec = H / Pack<T, 16>::kElems;
  const bool aligned =
      ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(res) |
        reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(out) |
        reinterpret_cast<uintptr_t>(out_h)) &
       15) == 0;
  const size_t tid = threadIdx.x, bd = blockDim.x;
  // the kept vectors of row r's x and residual (none past the last row):
  // in flight while the row before is reduced
  uint4 nx[kRmsKeep], nr[kRmsKeep];
  auto fetch = [&](size_t r) {
#pragma unroll
    for (int u = 0; u < kRmsKeep; u++)
      if (r < rows && tid + u * bd < rvec) {
        nx[u] = load_pack<16>(x + r * H, tid + u * bd, H, aligned);
        nr[u] = load_pack<16>(res + r * H, tid + u * bd, H, aligned);
      }
  };
  // x may be the output of the kernel before (the composed path's
  // all-reduce): its stores are ours to read only past the PDL wait
  pdl_wait(a.pdl_early);
  fetch(blockIdx.x);
  if (!__syncthreads_and(enter_uncounted(a, dc.lsaRank, dc.lsaSize))) return;
  int parity = 0;
  for (size_t r = blockIdx.x; r < rows; r += gridDim.x, parity ^= 1) {
    uint4 keep[kRmsKeep], wk[kRmsKeep];
#pragma unroll
    for (int u = 0; u < kRmsKeep; u++)
      if (tid + u * bd < rvec) {
        keep[u] = add_residual<T>(nx[u], nr[u]);
        wk[u] = load_pack<16>(w, tid + u * bd, H, aligned);
      }
    fetch(r + gridDim.x);
    float ss = 0.f;
#pragma unroll
    for (int u = 0; u < kRmsKeep; u++)
      if (tid + u * bd < rvec) {
        ss += sum_squares<T>(keep[u]);
        store_pack<16>(out_h + r * H, tid + u * bd, H, aligned, keep[u]);
      }
    for (size_t v = tid + kRmsKeep * bd; v < rvec; v += bd) {
      const uint4 hv =
          add_residual<T>(load_pack<16>(x + r * H, v, H, aligned),
                          load_pack<16>(res + r * H, v, H, aligned));
      ss += sum_squares<T>(hv);
      store_pack<16>(out_h + r * H, v, H, aligned, hv);
    }
    const float rstd = rsqrtf(block_sum(ss, s_sum[parity]) / (float)H + a.eps);
    if constexpr (kQuant) {
      quantise_row(a, r, rstd, keep, wk, out_h + r * H, s_max[parity]);
    } else {
#pragma unroll
      for (int u = 0; u < kRmsKeep; u++)
        if (tid + u * bd < rvec)
          store_pack<16>(out + r * H, tid + u * bd, H, aligned,
                         normalise<T>(keep[u], wk[u], rstd));
      for (size_t v = tid + kRmsKeep * bd; v < rvec; v += bd)
        store_pack<16>(
            out + r * H, v, H, aligned,
            normalise<T>(load_pack<16>(out_h + r * H, v, H, aligned),
                         load_pack<16>(w, v, H, aligned), rstd));
    }
  }
}

SYMNCCL_END

#endif  // SYMNCCL_KERNELS_RMSNORM_CUH
